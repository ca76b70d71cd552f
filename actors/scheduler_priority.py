"""The GlobalScheduler's priority part: tenant quotas at admission and preemption of lower classes.

The rules are the pure policy :mod:`rollmux.preemption` (also what ``rollmux simulate --priorities``
replays); this part (:class:`PriorityPart`, mixed into ``GlobalSchedulerImpl``) applies them to
the scheduler's records:

* Its :class:`rollmux.preemption.PriorityBook` is derived from the records every time (the active
  jobs, each with its spec from the policy's table, admission time and borrowed flag): no state of
  its own to checkpoint, restore or roll back.
* Preempting a job (:meth:`PriorityPart._preempt_one`) is one committed change: the policy
  releases its nodes, its record becomes ``preempted`` (with ``at``, ``by_job``, ``by_class``,
  ``lost_gpu_h``, ``iteration``), its spec goes back into the admission queue, and the target
  state its group's controller converges to lists it as gone with reason ``preempted``: the
  controller removes it at its iteration boundary (:meth:`rollmux.group_ledger.GroupLedger.remove`),
  never inside an iteration. Its driver, refused its next permit, exports the job's state from its
  workers (the workers are freed) and waits until the queue re-admits the job; it then registers
  the state on its new workers and goes on (:meth:`actors.runtime_client.ScheduledRuntime._rehome`).
"""

from __future__ import annotations

import time
from typing import Optional

from rollmux.codes import Code
from rollmux.models import JobSpec
from rollmux.preemption import (
    PreemptionRecord, PriorityBook, QuotaVerdict, Running, class_of, retry_order, unknown_class,
)
from rollmux.records import JobState

__all__ = ["PriorityPart"]


class PriorityPart:
    """Quota and preemption methods of the GlobalScheduler (uses its records, policy, queue and
    checkpoint; see the module docstring)."""

    def _book(self) -> PriorityBook:
        """The quota / preemption view of the active jobs now."""
        book = PriorityBook(self.igs.config, self.cluster)
        for jid, rec in self.job_store.records.items():
            m = self.igs.member(jid) if rec.state.is_active() else None
            if m is not None:
                book.admitted(m.spec, rec.admitted_at or 0.0, borrowed=rec.borrowed)
        return book

    def _quota(self, job: JobSpec) -> QuotaVerdict:
        """The job's quota verdict now; without tenant quotas in the config always ok (the
        admission path then builds no book: O(1))."""
        if not self.igs.config.tenants:
            return QuotaVerdict(ok=True)
        return self._book().check(job)

    def _class_refusal(self, job: JobSpec) -> Optional[str]:
        """Why the job's priority class is refused (names the field), or None."""
        return unknown_class(self.igs.config, job)

    def _quota_gate(self, spec: JobSpec) -> Optional[str]:
        """The reason a queued job may not start now (its tenant's quota), or None: the queue's
        drain gate (:meth:`rollmux.admission_queue.AdmissionQueue.drain`)."""
        v = self._quota(spec)
        return None if v.ok else v.reason

    def _try_preempt(self, job: JobSpec, t0: float, sha: Optional[str], explain: str, queue: bool,
                     queued=None) -> Optional[dict]:
        """``job`` did not fit: preempt the cheapest allowed set of lower-class jobs and admit it
        (:meth:`rollmux.preemption.PriorityBook.plan`). Returns the admission answer with
        ``preempted: [job ids]``, or None when nothing may be preempted for it (the caller
        queues or refuses as before). All of it is one group-committed write. ``queued``: the
        job's entry in the admission queue (a retry after a departure): it leaves the line when
        its plan is carried out, and goes back (same arrival time) if it still does not fit."""
        book = self._book()
        plan = book.plan(job, self.igs)
        if plan is None or len(self.queue) + len(plan.victims) > self.queue.max_jobs:
            return None
        defer, self._defer = self._defer, True
        try:
            if queued is not None:
                self.queue.remove(queued.job_id)
                self._queue_dirty = True
            for v in plan.victims:
                self._preempt_one(v, job, plan.reason)
            decision = self.igs.decide(job)
            out = decision.to_dict(explain)
            if out.get("admitted"):
                grp = self.igs.commit(decision)
                self._admitted(job, out, t0, grp, sha=sha, queued=queued)
            elif queued is not None:
                self.queue.push(job, queued.enqueued_at, reason=out.get("reason", ""))
            elif queue and out.get("code") == Code.RETRY_LATER:
                out = self._enqueue(job, out.get("reason", ""), t0, out)
            out["preempted"] = plan.victim_ids
        finally:
            self._defer = defer
        if not defer:
            self._flush(force=True)
        return out

    def _retry_preemption(self) -> list[str]:
        """After a departure (and the queue's drain): the first queued jobs of a class above some
        running preemptible job try preemption again (:func:`rollmux.preemption.retry_order`).
        Returns the jobs admitted so."""
        if not len(self.queue):
            return []
        started = []
        for q in retry_order(self.queue.jobs(), self._book().running.values()):
            if q.job_id not in self.queue or self._quota_gate(q.spec):
                continue
            out = self._try_preempt(q.spec, time.perf_counter(), None, "chosen", True, queued=q)
            if out is not None and out.get("admitted"):
                started.append(q.job_id)
        return started

    def _preempt_one(self, v: Running, by: JobSpec, reason: str) -> None:
        """Preempt running job ``v`` for ``by`` (see the module docstring): one checkpointed change."""
        rec = self.job_store.get(v.job_id)
        final = self._view(rec)
        gid = final.group_id
        spec = self.igs.member(v.job_id).spec
        now = time.time()
        with self._transaction():
            self.igs.depart(v.job_id)
            self._forget(v.job_id)
            entry = PreemptionRecord(at_s=now, by_job=by.job_id, by_class=class_of(self.igs.config, by),
                                     lost_gpu_h=v.lost_gpu_h, reason=reason).to_dict()
            self.job_store.preempt(rec, final, entry)
            self.queue.push(spec, now, reason=f"preempted by {by.job_id}")
            self._queue_dirty = True
            self._checkpoint(jobs=(v.job_id,), groups=(gid,))
        self._push([gid])
        self._queue_metrics()
        self.metrics.preemption(rec.priority_class or class_of(self.igs.config, spec))

    def _preempted_ids(self) -> list[str]:
        return [j for j, r in self.job_store.records.items() if r.state == JobState.PREEMPTED]
