"""The GlobalScheduler's priority rules: tenant quotas at admission and preemption of lower classes.

The rules are the pure policy :mod:`rollmux.preemption` (also what ``rollmux simulate --priorities``
replays); :class:`PriorityRules` applies them to the scheduler's records:

* Its :class:`rollmux.preemption.PriorityBook` is derived from the records every time (the active
  jobs, each with its spec from the policy's table, admission time and borrowed flag): no state of
  its own to checkpoint, restore or roll back.
* Preempting a job (:meth:`PriorityRules.preempt`) is one committed change: the policy releases
  its nodes, its record becomes ``preempted`` (with a :class:`rollmux.preemption.PreemptionRecord`:
  ``at_s``, ``by_job``, ``by_class``, ``lost_gpu_h``, ``iteration``, and the group and nodes it
  drains off), its spec goes back into the admission queue, and the target state its group's
  controller converges to lists it as gone with reason ``preempted``: the controller removes it
  at its iteration boundary (:meth:`rollmux.group_ledger.GroupLedger.remove`), never inside an
  iteration. Its driver, refused its next permit, exports the job's state from its workers (the
  workers are freed) and waits until the queue re-admits the job; it then registers the state on
  its new workers and goes on (:meth:`actors.driver.runtime_client.ScheduledRuntime._rehome`).
* The newcomer is admitted at once, but no job of another group starts a phase on the victim's
  nodes until the victim has drained there (:mod:`actors.scheduler.drains`).

When preemption is tried (for a newcomer that did not fit, and again for queued jobs of a higher
class after a change) is the admission pipeline's (:mod:`actors.scheduler.pipeline`).
"""

from __future__ import annotations

import time
from typing import Optional

from actors.scheduler.admission_queue import QueueService
from actors.scheduler.commit import Commit
from actors.scheduler.job_store import JobStore
from actors.scheduler.policy_ref import PolicyRef
from rollmux.models import JobSpec
from rollmux.preemption import (
    PreemptionPlan, PreemptionRecord, PriorityBook, QuotaVerdict, Running, class_of, unknown_class,
)

__all__ = ["PriorityRules"]


class PriorityRules:
    """Quotas and preemption of one scheduler (see the module docstring).

    Args:
        policy / jobs / queue / commit: the table, the records, the admission queue and the unit
            of work a preemption is written with.
        has_controller: ``has_controller(group_id)``: the group's controller exists (a driver attached).
        forget: ``forget(job_id)``: a job left the table (the re-optimiser's solver caches).
        metrics: the metrics recorder.
    """

    def __init__(self, policy: PolicyRef, jobs: JobStore, queue: QueueService, commit: Commit, has_controller,
                 forget, metrics):
        self.policy, self.jobs, self.queue, self.commit = policy, jobs, queue, commit
        self.has_controller, self.forget, self.metrics = has_controller, forget, metrics

    def book(self) -> PriorityBook:
        """The quota / preemption view of the active jobs now."""
        igs = self.policy.igs
        book = PriorityBook(igs.config, self.policy.cluster)
        for jid, rec in self.jobs.records.items():
            m = igs.member(jid) if rec.state.is_active() else None
            if m is not None:
                book.admitted(m.spec, rec.admitted_at or 0.0, borrowed=rec.borrowed)
        return book

    @property
    def quotas(self) -> bool:
        """Tenant quotas are configured (else no job is ever held by one)."""
        return bool(self.policy.config.tenants)

    def quota(self, job: JobSpec) -> QuotaVerdict:
        """The job's quota verdict now; without tenant quotas in the config always ok (the
        admission path then builds no book: O(1))."""
        if not self.policy.config.tenants:
            return QuotaVerdict(ok=True)
        return self.book().check(job)

    def class_refusal(self, job: JobSpec) -> Optional[str]:
        """Why the job's priority class is refused (names the field), or None."""
        return unknown_class(self.policy.config, job)

    def gate(self, spec: JobSpec) -> Optional[str]:
        """The reason a queued job may not start now (its tenant's quota), or None: the queue's
        drain gate (:meth:`rollmux.admission_queue.AdmissionQueue.drain`)."""
        v = self.quota(spec)
        return None if v.ok else v.reason

    def plan(self, job: JobSpec) -> Optional[PreemptionPlan]:
        """The cheapest allowed set of lower-class jobs to preempt so that ``job`` (which did not
        fit) fits (:meth:`rollmux.preemption.PriorityBook.plan`), or None: nothing may be
        preempted for it, or the victims would overfill the admission queue."""
        plan = self.book().plan(job, self.policy.igs)
        if plan is None or len(self.queue) + len(plan.victims) > self.queue.line.max_jobs:
            return None
        return plan

    def preempt(self, v: Running, by: JobSpec, reason: str) -> None:
        """Preempt running job ``v`` for ``by`` (see the module docstring): one checkpointed change."""
        rec = self.jobs.get(v.job_id)
        igs = self.policy.igs
        final = self.jobs.view(rec)
        gid = final.group_id
        spec = igs.member(v.job_id).spec
        now = time.time()
        pl = final.placement
        nodes = tuple(dict.fromkeys([*pl.rollout_nodes, *pl.train_nodes])) if pl is not None else ()
        # no controller for its group: no driver ever attached, so nothing of it runs: drained now
        idle = not self.has_controller(gid)
        with self.commit.transaction():
            self.policy.igs.depart(v.job_id)
            self.forget(v.job_id)
            entry = PreemptionRecord(at_s=now, by_job=by.job_id, by_class=class_of(self.policy.config, by),
                                     lost_gpu_h=v.lost_gpu_h, reason=reason, group_id=gid, nodes=nodes,
                                     stopped_at_s=now if idle else None, drained_at_s=now if idle else None,
                                     drained="no driver" if idle else None).to_dict()
            self.jobs.preempt(rec, entry)
            self.queue.preempted(spec, by.job_id, now)
            self.commit.mark(jobs=(v.job_id,), groups=(gid,))
        self.commit.push([gid])
        self.queue.note_metrics()
        self.metrics.preemption(rec.priority_class or class_of(self.policy.config, spec))
