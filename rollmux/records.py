"""Typed records of the runtime control plane: job lifecycle, job and move records (RollMux §4.2, §5).

One owner each (docs/ARCHITECTURE.md "Who owns what"):

- :class:`JobState` is the job lifecycle, an ordered enum: ``admitted < running < finished |
  failed``, changed only by the transitions of :data:`TRANSITIONS` (an illegal one raises
  :class:`IllegalTransition`); :meth:`JobState.is_active` says whether the job holds nodes.
- :class:`JobRecord` is what the GlobalScheduler keeps per job, checkpoints, and what the HTTP
  API returns (``GET /v1/jobs``; the app validates its 2xx replies against this model). The
  group a job is in and its nodes are the policy's (``InterGroupScheduler``); the record's
  ``group_id`` / ``placement`` fields are written from the policy's table when it changes
  (admission, departure re-packing) and never edited elsewhere.
- :class:`MoveRecord` is one departure re-packing move (``InterGroupScheduler.repack``), kept in
  the moved job's record and listed in the departure answer.
- Decision and refusal codes are :class:`rollmux.codes.Code`.

Pure: no Ray import; every value here is JSON-able through ``model_dump(mode="json")``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollmux.measured import MeasuredPhases

__all__ = ["JobState", "IllegalTransition", "TRANSITIONS", "ACTIVE_STATES", "NodePlacement", "MoveRecord",
           "JobRecord", "QueueEntry", "explain_failure", "queue_places", "queued_records", "with_queue_place"]


class IllegalTransition(ValueError):
    """A job state change the lifecycle does not allow (e.g. ``finished -> running``)."""


class JobState(str, enum.Enum):
    """A job's lifecycle, in order: (queued ->) admitted -> running -> finished | failed
    (admitted -> expired when no driver attaches within the scheduler's ``attach_timeout_s``;
    queued -> cancelled when it is withdrawn from the admission queue, admitted -> cancelled when
    it departs before any driver ran it, queued -> failed when it can never be admitted). ``queued``: held by the admission queue of a bounded cluster, no
    nodes yet (:mod:`rollmux.admission_queue`). ``preempted``: an admitted or running job stopped at
    its iteration boundary for a job of a higher class (:mod:`rollmux.preemption`): it holds no
    nodes and waits in the admission queue; re-admitted (``preempted -> admitted``) it resumes
    from its state.

    The only way a state changes is a transition of :data:`TRANSITIONS` (:meth:`to` refuses any
    other with :class:`IllegalTransition`); :meth:`advance` is the same for events that may
    arrive late (a no-op when the job is already there or past it). Members compare by that
    order (``JobState.ADMITTED < JobState.RUNNING``). ``str`` valued, so
    ``JobState.RUNNING == "running"``. The driver's local view of its job (``rollmux.Job.state``)
    is the same enum: admitted until its first phase, running, then finished | failed.
    """

    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    EXPIRED = "expired"  # admitted, but no driver attached within the attach timeout
    CANCELLED = "cancelled"  # withdrawn before it ran: from the admission queue, or admitted and never started
    PREEMPTED = "preempted"  # stopped at an iteration boundary for a higher class, back in the queue

    @property
    def rank(self) -> int:
        return _RANK[self]

    def is_active(self) -> bool:
        """True while the job holds nodes in a co-execution group (admitted or running)."""
        return self in ACTIVE_STATES

    def is_ended(self) -> bool:
        return self.rank >= _RANK[JobState.FINISHED]

    def can(self, to: "JobState | str") -> bool:
        """Whether the lifecycle allows ``self -> to``."""
        return JobState(to) in TRANSITIONS[self]

    def to(self, to: "JobState | str") -> "JobState":
        """The state after the transition ``self -> to``. Raises :class:`IllegalTransition` when
        :data:`TRANSITIONS` does not allow it (e.g. out of an ended state)."""
        to = JobState(to)
        if to not in TRANSITIONS[self]:
            allowed = ", ".join(sorted(str(s) for s in TRANSITIONS[self])) or "none: it has ended"
            raise IllegalTransition(f"a {self} job cannot become {to} (allowed from {self}: {allowed})")
        return to

    def advance(self, to: "JobState | str") -> "JobState":
        """The state after an event saying ``to`` that may arrive late or twice (a report from a
        controller crossing the job's end): unchanged when the job is already at ``to`` or past
        it (or ended), else :meth:`to` (which refuses an illegal change)."""
        to = JobState(to)
        if self.is_ended() or to.rank <= self.rank:
            return self
        return self.to(to)

    def __lt__(self, other: object) -> bool:  # type: ignore[override]
        if not isinstance(other, JobState):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:  # type: ignore[override]
        if not isinstance(other, JobState):
            return NotImplemented
        return self.rank <= other.rank

    def __str__(self) -> str:
        return self.value


_RANK = {JobState.QUEUED: -1, JobState.ADMITTED: 0, JobState.RUNNING: 1, JobState.FINISHED: 2, JobState.FAILED: 2,
         JobState.EXPIRED: 2, JobState.CANCELLED: 2, JobState.PREEMPTED: 1}
#: The states in which a job holds nodes (:meth:`JobState.is_active`).
ACTIVE_STATES: frozenset[JobState] = frozenset({JobState.ADMITTED, JobState.RUNNING})
#: The lifecycle: every allowed state change (nothing leaves an ended state).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.ADMITTED, JobState.FAILED, JobState.CANCELLED}),
    JobState.ADMITTED: frozenset({JobState.RUNNING, JobState.FINISHED, JobState.FAILED, JobState.EXPIRED,
                                  JobState.CANCELLED, JobState.PREEMPTED}),
    JobState.RUNNING: frozenset({JobState.FINISHED, JobState.FAILED, JobState.PREEMPTED}),
    JobState.PREEMPTED: frozenset({JobState.ADMITTED, JobState.FAILED, JobState.CANCELLED}),
    JobState.FINISHED: frozenset(), JobState.FAILED: frozenset(), JobState.EXPIRED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class NodePlacement(BaseModel):
    """A job's nodes: rollout node ids (e.g. ``rollout-0``) and training node ids (``train-0``)."""

    model_config = ConfigDict(extra="forbid")

    rollout_nodes: list[str] = Field(description="rollout node ids, e.g. rollout-0")
    train_nodes: list[str] = Field(description="training node ids, e.g. train-0")


class MoveRecord(BaseModel):
    """One move of a job to another group (RollMux §4.2 extension: departure re-packing
    ``InterGroupScheduler.repack``, neighbourhood re-optimisation, the SLO watch), with its drain
    off the old group's nodes (:mod:`rollmux.drain`)."""

    model_config = ConfigDict(extra="forbid")

    job_id: Optional[str] = Field(default=None, description="the moved job")
    from_group: str
    to_group: str
    placement: Optional[NodePlacement] = Field(default=None, description="its nodes in the new group")
    move_s: Optional[float] = Field(default=None, description="predicted host-state copy time, s")
    at: Optional[float] = Field(default=None, description="when the move was decided, Unix time, s")
    trigger: Optional[str] = Field(default=None, description="the job whose departure triggered it")
    # its drain off the old group's nodes (rollmux.drain; written by the GlobalScheduler's job store alone);
    # a record written before drains were kept has no from_nodes: nothing to drain
    from_nodes: list[str] = Field(default_factory=list, description="its nodes in the old group: fenced for other "
                                  "groups' members until it drained there (rollmux.drain)")
    stopped_at_s: Optional[float] = Field(default=None, description="when the old group's controller removed it at "
                                          "its iteration boundary, Unix time, s")
    drained_at_s: Optional[float] = Field(default=None, description="when its old nodes became free for others, "
                                          "Unix time, s")
    drained: Optional[str] = Field(default=None, description="how its old nodes became free (rollmux.drain.Drain)")


_QUEUE_FIELDS = ("queue_position", "queued_at", "waited_s")
_OPTIONAL_FIELDS = _QUEUE_FIELDS + ("measured_phases", "slo_action", "priority_class", "tenant",
                                    "admission")  # listed only when set


class JobRecord(BaseModel):
    """A job as the GlobalScheduler tracks it: state, group and placement, iterations done,
    predicted vs measured phase times (s), slowdown vs SLO, and the moves it went through.

    ``predicted``: the policy's profile, ``{t_roll_s, t_train_s, t_sync_s, t_solo_s}`` (s).
    ``measured``: running means over iterations, ``{t_iter_s, t_solo_s}`` (s), reported by the
    group's controller. ``slowdown``: measured co-executed / solo iteration time.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    job_id: str
    state: JobState = Field(description='"queued" | "admitted" | "running" | "preempted" | "finished" | "failed" | '
                            '"expired" | "cancelled"')
    group_id: Optional[str] = Field(default=None, description="current group (the last one once ended)")
    placement: Optional[NodePlacement] = None
    controller: Optional[str] = Field(default=None, description="the group's GroupController actor name")
    slo: Optional[float] = None
    iterations_done: int = 0
    predicted: Optional[dict[str, Optional[float]]] = None
    predicted_slowdown: Optional[float] = Field(default=None, description="worst-case co-executed / solo iteration time")
    measured: Optional[dict[str, Optional[float]]] = None
    slowdown: Optional[float] = Field(default=None, description="measured co-executed / solo iteration time")
    admission_id: Optional[str] = Field(default=None, description="token of this admission: a re-used job id "
                                        "gets a new one, so workers never resume a previous run's state")
    error: Optional[str] = Field(default=None, description="why the job failed, for people: what was lost, what "
                                 "happened to its state, what to do (:func:`explain_failure`)")
    error_detail: Optional[str] = Field(default=None, description="the raw error the failure was reported with")
    admitted_at: Optional[float] = Field(default=None, description="Unix time, s")
    ended_at: Optional[float] = Field(default=None, description="Unix time, s")
    moves: list[MoveRecord] = []
    spec_sha256: Optional[str] = Field(default=None, description="SHA-256 of the admitted spec (checkpoint only)")
    decision: Optional[dict[str, Any]] = Field(
        default=None, description="the admission decision as first answered, replayed to a retry (checkpoint only)")
    admission: Optional[dict[str, Any]] = Field(
        default=None, description="why the job was placed where it runs, from its admission decision: strategy "
        "(direct | scale_out | isolated ...), group_id, reason, delta_usd_per_h, and rejected: the placements in "
        "existing groups it was not given and why (at most 4; null when it was admitted with ?explain=chosen, the "
        "HTTP default, which explains the chosen placement only: explain says which)")
    queue_position: Optional[int] = Field(default=None, description="place in the admission queue, 1 = next (queued only)")
    queued_at: Optional[float] = Field(default=None, description="when the job entered the admission queue, Unix time, s")
    waited_s: Optional[float] = Field(default=None, description="time spent in the admission queue, s (so far, "
                                      "while queued)")
    measured_phases: Optional[MeasuredPhases] = Field(
        default=None, description="the job's reported phase times per iteration, a sliding window (rollmux.measured); "
        "checkpointed with the record")
    slo_action: Optional[dict[str, Any]] = Field(
        default=None, description="the SLO watch's last decision about this job on measured phase times: action "
        "(move | move_neighbour | scale_out | isolate | slo_at_risk), reason, group_id, to_group, mover, "
        "predicted_slowdown, slo, at (Unix time, s)")
    priority_class: Optional[str] = Field(default=None, description="the job's priority class (rollmux.preemption)")
    tenant: Optional[str] = Field(default=None, description="the tenant whose quota the job counts against")
    borrowed: bool = Field(default=False, description="admitted beyond its tenant's quota, on borrowed capacity "
                           "(the first preempted when the owner needs it)")
    preemptions: list[dict[str, Any]] = Field(
        default_factory=list, description="each preemption (rollmux.preemption.PreemptionRecord): at_s (Unix time, s), by_job, by_class, lost_gpu_h (GPU-hours "
        "its re-load costs), reason, iteration (iterations done when it stopped), resumed_at_s (Unix time, s, or null), group_id and nodes "
        "(where it ran), stopped_at_s / drained_at_s (Unix time, s, or null: its controller removed it at its iteration "
        "boundary / its nodes became free for others) and drained (how)")

    def is_active(self) -> bool:
        return self.state.is_active()

    def _skip(self) -> set[str]:
        return ({k for k in _OPTIONAL_FIELDS if getattr(self, k) is None} | (set() if self.moves else {"moves"})
                | (set() if self.preemptions else {"preemptions"}) | (set() if self.borrowed else {"borrowed"}))

    def public(self) -> dict[str, Any]:
        """The JSON-able form the scheduler answers (``moves`` only once moved; the queue fields
        only for a job that went through the admission queue; without the checkpoint-only
        ``spec_sha256`` / ``decision``)."""
        return self.model_dump(mode="json", exclude={"spec_sha256", "decision", *self._skip()})

    def answered(self) -> "JobRecord":
        """The record as the scheduler answers it: a copy without the checkpoint-only
        ``spec_sha256`` / ``decision`` (its :meth:`public` form is the same)."""
        return self.model_copy(update={"spec_sha256": None, "decision": None})

    def stored(self) -> dict[str, Any]:
        """The JSON-able form the checkpoint keeps: :meth:`public` plus the checkpoint-only fields."""
        return self.model_dump(mode="json", exclude=self._skip() or None)

    def note_iteration(self, iterations_done: int, t_iter_s: Optional[float], t_solo_s: Optional[float],
                       slowdown: Optional[float]) -> None:
        """Fold one ``iteration`` report in: the count never goes back; ``measured`` keeps running
        means of ``t_iter_s`` / ``t_solo_s`` over the iterations (s)."""
        self.iterations_done = max(self.iterations_done, int(iterations_done))
        n = max(1, self.iterations_done)
        m = dict(self.measured or {"t_iter_s": 0.0, "t_solo_s": 0.0})
        for k, v in (("t_iter_s", t_iter_s), ("t_solo_s", t_solo_s)):
            if v is not None:
                m[k] = m[k] + (float(v) - m[k]) / n
        self.measured = m
        self.slowdown = slowdown


@dataclass(frozen=True)
class QueueEntry:
    """One job in the admission queue as the GlobalScheduler publishes it (line order)."""

    job_id: str
    slo: Optional[float]  # slowdown SLO, x its solo iteration time
    queued_at: float  # when it entered the queue, Unix time, s
    reason: str  # why it does not fit now
    gpus: int  # the GPUs it needs: the backfill size a replica's dry-run compares
    priority_class: Optional[str] = None
    tenant: Optional[str] = None


def queue_places(queue: Sequence[QueueEntry], now: float) -> dict[str, dict[str, Any]]:
    """Each job's place in the admission queue (``queue`` in line order): ``{job_id:
    {queue_position, queued_at, waited_s}}``, with the 1-based position, ``queued_at`` (Unix s)
    and ``waited_s`` at ``now`` (s). Every job in the line has one, also a preempted job waiting
    to resume."""
    return {q.job_id: {"queue_position": i, "queued_at": q.queued_at, "waited_s": max(0.0, now - q.queued_at)}
            for i, q in enumerate(queue, start=1)}


def with_queue_place(rec: JobRecord, places: dict[str, dict[str, Any]]) -> JobRecord:
    """A job's record with its place in the admission queue (:func:`queue_places`) when it is a
    preempted job waiting there (the one kind of job that has a record and a place in the line);
    else the record as it is."""
    place = places.get(rec.job_id) if rec.state == JobState.PREEMPTED else None
    return rec if place is None else rec.model_copy(update=place)


def queued_records(queue: Sequence[QueueEntry], now: float) -> list[JobRecord]:
    """Job records of the admission queue (``queue`` in line order, jobs without a record of
    their own): state ``queued`` and the place (:func:`queue_places`)."""
    places = queue_places(queue, now)
    return [JobRecord(job_id=q.job_id, state=JobState.QUEUED, slo=q.slo, **places[q.job_id],
                      priority_class=q.priority_class, tenant=q.tenant) for q in queue]


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NODE = re.compile(r"\b((?:rollout|train)-\d+)\b")
_IDS = re.compile(r"\(?\b(?:actor_id|ActorID|Actor ID|pid|ip|node_id)[=: ]+[^\s,)]+[,)]?", re.I)


def explain_failure(raw: Optional[str], nodes: tuple[str, ...] = ()) -> str:
    """A failure reason for people from a raw error (a Ray traceback, a controller message):
    what was lost (the node or actor), what happened to the job's state, what to do. Colour
    codes and actor / process ids are dropped; the raw text belongs in ``error_detail``.

    ``nodes``: the job's nodes (named when the error does not say which node was lost)."""
    text = _ANSI.sub("", raw or "").strip()
    low = text.lower()
    named = _NODE.findall(text)
    where = named[0] if named else (", ".join(nodes) if nodes else "one of its nodes")
    resubmit = "Submit the job again to start it from step 1."
    if "driver lost" in low or "no heartbeat" in low:
        lease = re.search(r"lease ([0-9.]+)s", text)
        return ("the job's driver stopped reporting" + (f" for longer than its {lease.group(1)} s lease" if lease else "")
                + " (killed, or its host was lost) and the job was evicted; its nodes were released and its "
                "stored state discarded. " + resubmit)
    if "worker died" in low or "actordied" in low or "actor died" in low or "rayactorerror" in low \
            or "worker on" in low and "lost" in low or "actorunavailableerror" in low or "actor is restarting" in low \
            or "is not hosted on" in low or "workerimpl." in low and "keyerror" in low:
        # also a restarted worker: a call that reached it while it restarted, or one that found
        # the job's state gone from it (KeyError: not hosted)
        return (f"the worker on {where} was lost; the job's state went with it. {resubmit}")
    if "out of memory" in low or "outofmemory" in low or "oom" in low.split():
        return (f"a worker on {where} ran out of memory; the job's state on it is lost. Lower the job's memory "
                f"(batch, model) or give it more nodes. {resubmit}")
    if "controller is unavailable" in low:
        return ("the job's group controller stayed unavailable; the job stopped between phases (its stored state "
                f"on the workers was released). {resubmit}")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith((" ", "Traceback"))), "")
    first = " ".join(_IDS.sub("", first).split()).strip(" ,;:") or "unknown error"
    return f"the job failed: {first[:300]}. " + resubmit
