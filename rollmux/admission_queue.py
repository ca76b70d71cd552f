"""Admission queue for bounded clusters: hold a job that does not fit now, admit it on a departure.

On a cluster with a bounded number of nodes, Alg. 1 refuses a job with ``code="retry_later"``
when no group can take it and the pools have no free nodes for a new group. Schedulers of
shared GPU clusters (Kueue, Slurm, Volcano) queue such a job instead of refusing it;
:class:`AdmissionQueue` is that queue, used the same way by the cluster's GlobalScheduler and
by the simulator's bounded replay (one implementation).

Order and backfill (:meth:`AdmissionQueue.drain`, called after every departure):

* Jobs are tried in arrival order, each through the *same* Alg. 1 decision
  (:meth:`rollmux.admission.InterGroupScheduler.decide`, then ``commit``): a job that fits now is
  admitted, one refused ``retry_later`` stays in its place, one refused ``never`` (it can never
  fit, e.g. the cluster shrank) leaves the queue with its decision.
* Backfill: behind a job that does not fit, only *smaller* jobs are tried (GPU demand
  ``num_rollout_gpus + num_train_gpus`` no larger than every blocked job ahead of them), so a
  small job fills a hole while a larger one never overtakes a blocked job (no starvation by
  bigger jobs). ``backfill=False``: strict FIFO, the first blocked job stops the pass.
* A pass tries at most ``scan_limit`` jobs (bounds a departure's work on a long queue).
* A new arrival goes through the same rule (:meth:`may_try_now`): it is decided at once only
  when the queue is empty or it is no larger than every queued job; otherwise it queues behind.

Pure policy: no Ray import; times are caller-supplied seconds (wall clock on the cluster,
simulated time in the replay). Source: RollMux §4.2 (Alg. 1 admission); queueing and EASY-style
backfill as in batch schedulers (Slurm ``sched/backfill``, Kueue ``BestEffortFIFO``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from rollmux.answers import Admission
from rollmux.codes import Code
from rollmux.models import JobSpec, PhaseProfile

# The scheduler (rollmux.admission.InterGroupScheduler) is passed in, never imported here: the
# policy module builds queues from its config (SchedulerConfig.queue_*), so no import circle.
InterGroupScheduler = Any
AdmissionDecision = Any

__all__ = ["AdmissionQueue", "QueuedJob", "QueueFull", "DrainResult", "job_gpus", "may_try_now", "what_if",
           "QUEUE_AHEAD_REASON"]


class QueueFull(ValueError):
    """The queue holds ``max_jobs`` jobs already (answered 429 over HTTP)."""


def job_gpus(spec: JobSpec) -> int:
    """A job's GPU demand, the backfill size: ``num_rollout_gpus + num_train_gpus``."""
    return int(spec.num_rollout_gpus) + int(spec.num_train_gpus)


def may_try_now(spec: JobSpec, held_gpus: list[int], backfill: bool) -> bool:
    """Whether a new arrival may be decided at once instead of queueing behind held jobs
    (``held_gpus``: the GPU demand of each held job): the line is empty, or (with ``backfill``)
    the job is no larger than every held job."""
    if not held_gpus:
        return True
    return bool(backfill) and job_gpus(spec) <= min(held_gpus)


def QUEUE_AHEAD_REASON(n_held: int) -> str:  # noqa: N802 - a message template
    """The reason a newcomer waits behind ``n_held`` queued jobs."""
    return (f"{n_held} queued jobs are ahead and this job is larger than one of them "
            "(admission queue order)")


def what_if(sched: "InterGroupScheduler", spec: JobSpec, held_gpus: list[int], *, backfill: bool, queue: bool,
            explain: str = "full") -> Admission:
    """The dry-run answer for ``spec`` (nothing changes; the job id is neither admitted nor
    queued): a ``retry_later`` refusal when queued jobs go first (:func:`may_try_now`), else the
    policy's decision (``sched.decide``, Alg. 1) as ``AdmissionDecision.answer(explain)``; with
    ``queue``, ``would_queue`` set where ``POST /v1/jobs`` would hold the job. The scheduler
    actor and the Serve replicas (from their snapshot copy of the table) both answer with this
    one function. Source: RollMux §4.2, Alg. 1."""
    t0 = time.perf_counter()
    from rollmux.admission import AdmissionDecision
    from rollmux.preemption import unknown_class

    if (bad := unknown_class(sched.config, spec)) is not None:
        return AdmissionDecision(job_id=spec.job_id, admitted=False, code=Code.INVALID, reason=f"invalid job spec: {bad}",
                                 policy=sched.policy, delta_usd_per_h=None, field="priority_class",
                                 latency_ms=(time.perf_counter() - t0) * 1e3).answer()  # type: ignore[arg-type]
    if not may_try_now(spec, held_gpus, backfill):
        d = AdmissionDecision(job_id=spec.job_id, admitted=False, code=Code.RETRY_LATER,
                              reason=QUEUE_AHEAD_REASON(len(held_gpus)), policy=sched.policy,
                              delta_usd_per_h=None, latency_ms=(time.perf_counter() - t0) * 1e3).answer()  # type: ignore[arg-type]
        return d.replace(would_queue=True) if queue else d
    out = sched.decide(spec).answer(explain)
    return out.replace(would_queue=True) if queue and out.retry_later else out


@dataclass
class QueuedJob:
    """One held job: its spec, optional planning profile (the replay's), enqueue time (s), the
    arrival sequence number and the last reason it did not fit."""

    spec: JobSpec
    enqueued_at: float
    seq: int
    profile: Optional[PhaseProfile] = None
    reason: str = ""
    attempts: int = 0
    rank: int = 0  # priority class rank (0 = highest): the line is ordered by (rank, seq)

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def gpus(self) -> int:
        return job_gpus(self.spec)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (checkpoint); the profile is not kept (re-estimated from the spec)."""
        return {"spec": self.spec.model_dump(mode="json"), "enqueued_at": self.enqueued_at, "seq": self.seq,
                "reason": self.reason, "attempts": self.attempts}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QueuedJob":
        return cls(spec=JobSpec.model_validate(d["spec"]), enqueued_at=float(d["enqueued_at"]), seq=int(d["seq"]),
                   reason=str(d.get("reason", "")), attempts=int(d.get("attempts", 0)))


@dataclass
class DrainResult:
    """What one :meth:`AdmissionQueue.drain` pass did: admitted ``(job, decision)`` pairs (already
    committed to the scheduler, in admission order), jobs dropped as ``never`` fitting, and how
    many decisions it took."""

    admitted: list[tuple[QueuedJob, "AdmissionDecision"]] = field(default_factory=list)
    dropped: list[tuple[QueuedJob, "AdmissionDecision"]] = field(default_factory=list)
    tried: int = 0


class AdmissionQueue:
    """Jobs waiting for room on a bounded cluster, in arrival order (see the module docstring).

    Args:
        max_jobs: most jobs held (>= 1); :meth:`push` raises :class:`QueueFull` beyond.
        backfill: try smaller jobs behind a blocked one (default) or stop at the first blocked.
        scan_limit: most decisions per :meth:`drain` pass (>= 1).
    Raises:
        ValueError: a bound below 1.
    """

    @classmethod
    def from_config(cls, cfg: Any) -> "AdmissionQueue":
        """An empty queue with a :class:`rollmux.admission.SchedulerConfig`'s ``queue_max_jobs``,
        ``queue_backfill`` and ``queue_scan_limit``."""
        from rollmux.preemption import rank_of

        return cls(cfg.queue_max_jobs, backfill=cfg.queue_backfill, scan_limit=cfg.queue_scan_limit,
                   rank_of=lambda spec: rank_of(cfg, spec))

    def __init__(self, max_jobs: int = 1000, *, backfill: bool = True, scan_limit: int = 64,
                 rank_of: Optional[Any] = None) -> None:
        if max_jobs < 1 or scan_limit < 1:
            raise ValueError(f"max_jobs and scan_limit must be >= 1, got {max_jobs}, {scan_limit}")
        self.max_jobs, self.backfill, self.scan_limit = int(max_jobs), bool(backfill), int(scan_limit)
        #: priority class rank of a spec (0 = highest; :func:`rollmux.preemption.rank_of`): the line
        #: holds higher classes first, arrival order within a class; None: one class
        self.rank_of = rank_of or (lambda spec: 0)
        self._jobs: dict[str, QueuedJob] = {}  # insertion order = arrival order
        self._seq = 0

    # --- queries -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def jobs(self) -> list[QueuedJob]:
        """The held jobs, first in line first."""
        return list(self._jobs.values())

    def get(self, job_id: str) -> Optional[QueuedJob]:
        return self._jobs.get(job_id)

    def positions(self) -> dict[str, int]:
        """``{job_id: position}``, 1 = first in line."""
        return {j: i for i, j in enumerate(self._jobs, start=1)}

    def position(self, job_id: str) -> Optional[int]:
        """1-based place in line, None if not queued (O(queue length))."""
        return self.positions().get(job_id)

    def waits_s(self, now: float) -> dict[str, float]:
        """Seconds each held job has waited at ``now``."""
        return {j: max(0.0, now - q.enqueued_at) for j, q in self._jobs.items()}

    def oldest_wait_s(self, now: float) -> float:
        """Wait of the first job in line at ``now``, s (0 when empty)."""
        first = next(iter(self._jobs.values()), None)
        return 0.0 if first is None else max(0.0, now - first.enqueued_at)

    def may_try_now(self, spec: JobSpec, gate: Optional[Any] = None) -> bool:
        """Whether a new arrival may be decided at once instead of queueing behind held jobs of its
        class or higher: none is held, or (with backfill) the job is no larger than every one.
        ``gate(spec)``: the reason a held job may not start whatever the room (its tenant's quota),
        or None, as in :meth:`drain`: a gated job blocks no one here either."""
        r = self.rank_of(spec)
        held = [q.gpus for q in self._jobs.values() if q.rank <= r and not (gate is not None and gate(q.spec))]
        return may_try_now(spec, held, self.backfill)

    # --- changes -----------------------------------------------------------------------------------
    def push(self, spec: JobSpec, now: float, *, profile: Optional[PhaseProfile] = None, reason: str = "") -> int:
        """Hold ``spec`` at the end of the line; returns its 1-based position.

        Raises:
            QueueFull: ``max_jobs`` jobs are held already.
            ValueError: the job id is queued already, or ``now`` is not finite.
        """
        if spec.job_id in self._jobs:
            raise ValueError(f"job {spec.job_id!r} is queued already")
        if not math.isfinite(now):
            raise ValueError(f"enqueue time must be finite, got {now}")
        if len(self._jobs) >= self.max_jobs:
            raise QueueFull(f"the admission queue holds {len(self._jobs)} jobs (queue_max_jobs); retry later")
        self._seq += 1
        q = QueuedJob(spec=spec, enqueued_at=float(now), seq=self._seq, profile=profile, reason=reason,
                      rank=self.rank_of(spec))
        if not self._jobs or next(reversed(self._jobs.values())).rank <= q.rank:
            self._jobs[spec.job_id] = q
            return len(self._jobs)
        line = list(self._jobs.values())
        pos = next(i for i, o in enumerate(line) if o.rank > q.rank)
        line.insert(pos, q)
        self._jobs = {o.job_id: o for o in line}
        return pos + 1

    def remove(self, job_id: str) -> Optional[QueuedJob]:
        """Take a job out of the line (cancelled); None if it was not queued."""
        return self._jobs.pop(job_id, None)

    def drain(self, sched: "InterGroupScheduler", now: float, gate: Optional[Any] = None) -> DrainResult:
        """One admission pass over the line after a departure (see the module docstring): each
        tried job goes through ``sched.decide`` (Alg. 1) and, when admitted, ``sched.commit``.
        Returns what was admitted (committed) and dropped; the caller records them. ``now`` is
        only stamped on the jobs' ``attempts`` bookkeeping (waits are ``now - enqueued_at``).
        ``gate(spec)``: a reason the job may not start now whatever the room (its tenant's quota,
        :mod:`rollmux.preemption`), or None; a gated job keeps its place and blocks no one."""
        out = DrainResult()
        blocked = math.inf  # smallest GPU demand of a blocked job ahead
        for q in list(self._jobs.values()):
            if out.tried >= self.scan_limit:
                break
            if blocked < math.inf and (not self.backfill or q.gpus > blocked):
                if not self.backfill:
                    break
                continue
            why = gate(q.spec) if gate is not None else None
            if why:
                q.reason = why
                continue
            d = sched.decide(q.spec, q.profile)
            out.tried += 1
            q.attempts += 1
            if d.admitted:
                sched.commit(d)
                del self._jobs[q.job_id]
                out.admitted.append((q, d))
            elif d.code == Code.RETRY_LATER:
                q.reason = d.reason
                blocked = min(blocked, q.gpus)
            else:  # never fits (or a duplicate id): it leaves the line with its decision
                del self._jobs[q.job_id]
                out.dropped.append((q, d))
        return out

    # --- checkpoint ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-able state: ``{"seq": n, "jobs": [QueuedJob.to_dict(), ...]}`` in line order."""
        return {"seq": self._seq, "jobs": [q.to_dict() for q in self._jobs.values()]}

    def restore(self, snap: Optional[dict[str, Any]]) -> None:
        """Replace the line with a :meth:`snapshot` (None or empty: an empty line)."""
        self._jobs = {}
        snap = snap or {}
        for d in snap.get("jobs", []):
            q = QueuedJob.from_dict(d)
            q.rank = self.rank_of(q.spec)
            self._jobs[q.job_id] = q
        self._seq = max([int(snap.get("seq", 0))] + [q.seq for q in self._jobs.values()])
