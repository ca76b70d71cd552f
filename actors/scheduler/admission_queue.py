"""The GlobalScheduler's admission queue part: hold, drain, cancel, publish (bounded clusters).

On a cluster with bounded pools Alg. 1 refuses a job that fits nowhere now with ``retry_later``;
with ``queue=True`` the scheduler holds it instead in one :class:`rollmux.admission_queue.
AdmissionQueue` (the pure policy, also used by ``rollmux simulate --queue``). This part of the
scheduler (:class:`QueuePart`, mixed into ``GlobalSchedulerImpl``) owns the queue and whether
it changed since the last checkpoint write (``_queue_dirty``: the next write carries the whole
queue in the same write-ahead record as the change that altered it). After every departure the
queue is drained through the same Alg. 1 decision (:meth:`QueuePart._drain_queue`).
"""

from __future__ import annotations

import time
from typing import Optional

from rollmux.admission_queue import QueueFull
from rollmux.codes import Code
from rollmux.models import JobSpec
from rollmux.records import JobState, queued_records

__all__ = ["QueuePart"]


class QueuePart:
    """The admission-queue methods of the GlobalScheduler (uses its job store, checkpoint,
    metrics and policy; see the module docstring)."""

    queue = None  # the AdmissionQueue (set by the scheduler's constructor)
    _queue_dirty = False

    def _enqueue(self, job: JobSpec, reason: str, t0: float, decision: Optional[dict] = None) -> dict:
        """Hold ``job`` in the admission queue (checkpointed with the queue); the answer is the
        decision with code ``queued`` and ``queue_position``, or ``queue_full``."""
        base = dict(decision or {})
        try:
            pos = self.queue.push(job, time.time(), reason=reason)
        except QueueFull as e:
            out = self._refusal(job.job_id, Code.QUEUE_FULL, str(e), t0, False)
            return {**out, "candidates": base.get("candidates", []), "pruned": base.get("pruned", [])}
        self._queue_dirty = True
        self._checkpoint()
        self._queue_metrics()
        ms = (time.perf_counter() - t0) * 1e3
        self.metrics.admission(Code.QUEUED.outcome, ms)
        return {**base, "job_id": job.job_id, "admitted": False, "code": Code.QUEUED, "queued": True,
                "queue_position": pos, "reason": f"queued at position {pos}: {reason}",
                "latency_ms": base.get("latency_ms", ms), "policy": self.igs.policy}

    def _cancel_queued(self, job_id: str) -> dict:
        """Withdraw a queued job (``queued -> cancelled``; it never had a record, except a
        preempted job waiting to resume: its record ends ``preempted -> cancelled``)."""
        self.queue.remove(job_id)
        rec = self.job_store.get(job_id)
        if rec is not None and rec.state == JobState.PREEMPTED:
            self.job_store.transition(rec, JobState.CANCELLED)
            rec.ended_at = time.time()
            self._checkpoint(jobs=(job_id,))
        self._queue_dirty = True
        self._checkpoint()
        self._queue_metrics()
        return {"job_id": job_id, "state": str(JobState.QUEUED.to(JobState.CANCELLED)), "released_nodes": [],
                "group_dissolved": False, "dissolved_groups": [], "moves": []}

    def _queue_metrics(self) -> None:
        self.metrics.queue(len(self.queue), self.queue.oldest_wait_s(time.time()))

    def _drain_queue(self) -> list[str]:
        """After a departure: admit queued jobs into the freed room (in order, with backfill,
        through Alg. 1: :meth:`rollmux.admission_queue.AdmissionQueue.drain`); a queued job that
        can never fit ends as ``failed`` with the reason. Returns the admitted job ids."""
        if not len(self.queue):
            return []
        defer, self._defer = self._defer, True  # the admissions of one pass: one checkpoint write
        try:
            t0 = time.perf_counter()
            res = self.queue.drain(self.igs, time.time(), gate=self._quota_gate)
            if res.tried:
                self._queue_dirty = True
            for q, d in res.admitted:
                self._admitted(q.spec, d.to_dict(), t0, self.igs.group_of(q.job_id), queued=q)
            now = time.time()
            for q, d in res.dropped:
                self.job_store.left_queue_failed(q.job_id, q.spec.slo, q.enqueued_at, d.reason, now)
                self._checkpoint(jobs=(q.job_id,))
            more = self._retry_preemption()  # the table changed: a queued higher class may preempt now
            self._queue_metrics()
        finally:
            self._defer = defer
        if not defer:
            self._flush()
        return [q.job_id for q, _ in res.admitted] + more

    def _queue_view(self) -> list[dict]:
        """The admission queue as published: ``job_id, slo, queued_at, reason, gpus`` in line order
        (``gpus``: the backfill size a replica's dry-run compares, :func:`rollmux.admission_queue.job_gpus`)."""
        from rollmux.preemption import class_of, tenant_of

        cfg = self.igs.config
        return [{"job_id": q.job_id, "slo": q.spec.slo, "queued_at": q.enqueued_at, "reason": q.reason, "gpus": q.gpus,
                 "priority_class": class_of(cfg, q.spec), "tenant": tenant_of(cfg, q.spec)}
                for q in self.queue.jobs()]

    def _queued_views(self, now: Optional[float] = None) -> list[dict]:
        return queued_records(self._queue_view(), time.time() if now is None else now)
