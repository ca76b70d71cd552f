"""The HTTP face's types: response models, the replica's settings and the error answer.

Every 2xx reply of the admission API is validated against its model here (``JobView`` is the
scheduler's own :class:`rollmux.records.JobRecord`, ``MoveView`` its
:class:`rollmux.records.MoveRecord`); every non-2xx answer is an :class:`ApiError` as JSON
``{"error": <kind>, "detail": <reason>}``. The codes of an admission's ``explanation`` are
:class:`rollmux.codes.Code` values.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Optional

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from rollmux.answers import Admission
from rollmux.codes import Code
from rollmux.config import ServeConfig
from rollmux.models import JobSpec
from rollmux.records import JobRecord, MoveRecord

#: default bound on a request body, bytes (a job spec is well under 2 KB).
MAX_REQUEST_BYTES = 64 * 1024


# ----------------------------------------------------------------------------- response models
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(_Open):
    """Every non-2xx answer: ``error`` kind (e.g. ``not_admitted``, ``invalid_request``) and a reason."""

    error: str
    detail: str


class PlacementView(_Open):
    rollout_nodes: list[str] = Field(description="rollout node ids, e.g. rollout-0")
    train_nodes: list[str] = Field(description="training node ids, e.g. train-0")


class Explanation(_Open):
    """Why the scheduler decided so (RollMux Alg. 1): strategy, candidates compared, groups pruned."""

    code: str = Field(description=" | ".join(f'"{c.value}"' for c in Code))
    reason: str
    strategy: Optional[str] = Field(default=None, description='"direct" | "scale_out" | "isolated"')
    candidates: list[Any] = []
    pruned: list[Any] = []


class AdmissionView(_Open):
    """An admission decision as returned by ``POST /v1/jobs`` (201) and ``:dry-run`` (200)."""

    job_id: str
    admitted: bool
    dry_run: bool
    group_id: Optional[str] = None
    placement: Optional[PlacementView] = None
    marginal_cost_usd_per_h: Optional[float] = Field(default=None, description="Cost(G') - Cost(G), USD/h")
    predicted_slowdowns: dict[str, Optional[float]] = Field(
        default={}, description="worst-case co-executed / solo iteration time per group member"
    )
    explanation: Explanation
    latency_ms: Optional[float] = Field(default=None, description="scheduler decision time, ms")
    queued: bool = Field(default=False, description="held by the admission queue (202)")
    queue_position: Optional[int] = Field(default=None, description="place in the admission queue, 1 = next")
    preempted: list[str] = Field(default=[], description="lower-class jobs preempted (at their next iteration "
                                 "boundary, back in the admission queue) to admit this job")
    admitted_from_queue: list[str] = Field(default=[], description="queued jobs admitted in the same write into the "
                                           "room the preemption freed beyond this job's need (class order)")


class SubmitRequest(JobSpec):
    """``POST /v1/jobs`` body: a :class:`rollmux.models.JobSpec` plus ``queue``."""

    queue: bool = Field(default=False, description="on a bounded cluster, hold the job in the admission queue "
                        "when it does not fit now (202) instead of refusing it (409 retry_later)")


#: One departure re-packing move: the scheduler's own record type (validated on the way out).
MoveView = MoveRecord
#: A job as the scheduler tracks it: the scheduler's own :class:`rollmux.records.JobRecord`
#: (state, group and placement, iterations, predicted vs measured phase times, slowdown vs SLO,
#: moves). ``GET /v1/jobs`` replies are validated against it.
JobView = JobRecord


class DepartureView(_Open):
    """``DELETE /v1/jobs/{id}``: what the departure released and which jobs departure re-packing moved."""

    job_id: str
    state: str = Field(description='the job\'s state now: "finished", or "cancelled" for a job withdrawn before it '
                       'ran (queued, or admitted and never started)')
    released_nodes: list[str] = Field(default=[], description="nodes the cluster no longer uses (incl. dissolved groups')")
    group_dissolved: bool = Field(default=False, description="the job's own group ceased to exist")
    dissolved_groups: list[str] = Field(default=[], description="every group that ceased to exist")
    moves: list[MoveView] = Field(default=[], description="jobs moved into other groups to lower the $/h")


class GroupView(_Open):
    """A co-execution group: members, nodes, cost (USD/h), natural cycle, busiest-node load, slack (s)."""

    group_id: str
    members: list[str] = []
    rollout_nodes: list[str] = []
    train_nodes: list[str] = []
    cost_usd_per_h: Optional[float] = None
    t_cycle_s: Optional[float] = None
    t_load_s: Optional[float] = None
    slack_s: Optional[float] = None


class HealthView(_Open):
    ok: bool
    jobs: Optional[int] = None
    groups: Optional[int] = None


# ----------------------------------------------------------------------------- settings, errors
class AppSettings(BaseModel):
    """What a Serve replica needs; the token travels only as its SHA-256."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)
    token_sha256: str = Field(min_length=64, max_length=64)
    open_read_routes: bool = True
    open_read_rate_per_s: float = Field(default=50.0, gt=0, le=1_000_000, allow_inf_nan=False)
    open_read_burst: int = Field(default=100, ge=1, le=1_000_000)
    scheduler_name: Optional[str] = None
    request_timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_request_bytes: int = Field(default=MAX_REQUEST_BYTES, ge=1024, le=16 << 20)
    max_pending_writes: int = Field(default=256, ge=1, le=100_000)

    @classmethod
    def from_config(cls, cfg: ServeConfig, token: str) -> "AppSettings":
        """Raises ValueError when ``token`` is empty (admission must be protected)."""
        if not token:
            raise ValueError("an API token is required (set $ROLLMUX_API_TOKEN or token_file in configs/serve.yaml)")
        return cls(
            token_sha256=_sha256(token),
            open_read_routes=cfg.open_read_routes,
            open_read_rate_per_s=cfg.open_read_rate_per_s,
            open_read_burst=cfg.open_read_burst,
            scheduler_name=cfg.scheduler_name,
            request_timeout_s=cfg.request_timeout_s,
            max_request_bytes=cfg.max_request_bytes,
            max_pending_writes=cfg.max_pending_writes,
        )


def _finite(x: Any) -> Any:
    """JSON-safe copy: non-finite floats (inf / NaN, e.g. an unbounded slowdown) become ``None``."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _sha256(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


class ApiError(Exception):
    """An error answered as ``status`` with JSON ``{"error": kind, "detail": detail, **extra}``."""

    def __init__(self, status: int, kind: str, detail: str, **extra: Any):
        super().__init__(detail)
        self.status, self.kind, self.detail, self.extra = status, kind, detail, extra

    def response(self) -> JSONResponse:
        headers = ({"Retry-After": str(self.extra.pop("retry_after_s", 5))} if self.status in (429, 503)
                   else ({"WWW-Authenticate": "Bearer"} if self.status == 401 else None))
        return JSONResponse({"error": self.kind, "detail": self.detail, **self.extra}, status_code=self.status, headers=headers)



def admission_view(d: Admission, dry_run: bool) -> dict:
    """The JSON answer of ``POST /v1/jobs`` / ``:dry-run`` (:class:`AdmissionView`) from the
    scheduler's (or this replica's) typed decision: the one place it is serialised (non-finite
    floats -> null)."""
    out = d.to_dict()
    return _finite({
        "job_id": d.job_id,
        "admitted": d.admitted,
        "dry_run": dry_run,
        "group_id": d.group_id,
        "placement": out["placement"],
        "marginal_cost_usd_per_h": d.delta_usd_per_h,
        "predicted_slowdowns": out["predicted_slowdowns"],
        "explanation": {
            "code": out["code"],
            "reason": d.reason,
            "strategy": d.strategy,
            "candidates": out["candidates"],
            "pruned": out["pruned"],
            **({"candidates_listed": d.candidates_listed, "pruned_groups": d.pruned_groups}
               if d.candidates_listed else {}),
        },
        "latency_ms": d.latency_ms,
        "queued": d.queued,
        "queue_position": d.queue_position,
        "preempted": list(d.preempted or ()),
        "admitted_from_queue": list(d.admitted_from_queue),
    })
