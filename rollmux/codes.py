"""Admission decision and refusal codes: one ``str``-valued enum (RollMux §4.2, Alg. 1).

Every place that says why a job was (not) admitted uses :class:`Code`: the decision records
(``AdmissionDecision.code``, the scheduler's own refusals), the admission queue, the HTTP face
(which maps a code to a status: :data:`HTTP_STATUS`), the metrics (the ``outcome`` label of
``rollmux_admission_decisions_total``: :attr:`Code.outcome`) and the actors. A member compares
equal to its string (``Code.RETRY_LATER == "retry_later"``) and JSON-encodes as it, so records,
checkpoints and HTTP bodies read and write the same text as before the enum existed.

Pure: no Ray import.
"""

from __future__ import annotations

import enum

__all__ = ["Code", "HTTP_STATUS"]


class Code(str, enum.Enum):
    """Why a job was (not) admitted.

    Policy codes (the decision of Alg. 1): ``ok`` admitted; ``never`` the job can never be
    admitted on this cluster (its state fits no node, its SLO is unreachable even alone);
    ``retry_later`` it does not fit now (bounded pools). Admission queue: ``queued`` held in
    line (not a refusal), ``queue_full`` the line is full. The scheduler's own refusals:
    ``invalid`` the spec fails validation, ``duplicate`` the id is live with another spec,
    ``unavailable`` the checkpoint write failed (nothing changed; retry).
    """

    OK = "ok"
    NEVER = "never"
    RETRY_LATER = "retry_later"
    QUEUED = "queued"
    QUEUE_FULL = "queue_full"
    INVALID = "invalid"
    DUPLICATE = "duplicate"
    UNAVAILABLE = "unavailable"

    @property
    def outcome(self) -> str:
        """The ``outcome`` label of ``rollmux_admission_decisions_total``: ``admitted`` for
        :attr:`OK`, otherwise the code itself."""
        return "admitted" if self is Code.OK else self.value

    def __str__(self) -> str:
        return self.value


#: The HTTP status each code is answered with by ``POST /v1/jobs`` (``serve_app``): 201 for an
#: admission (200 when it is a replayed decision or a dry run), 202 queued, 409 a refusal by the
#: policy or a duplicate id, 422 invalid, 429 queue full, 503 unavailable.
HTTP_STATUS: dict[Code, int] = {
    Code.OK: 201, Code.QUEUED: 202, Code.NEVER: 409, Code.RETRY_LATER: 409, Code.DUPLICATE: 409,
    Code.INVALID: 422, Code.QUEUE_FULL: 429, Code.UNAVAILABLE: 503,
}
