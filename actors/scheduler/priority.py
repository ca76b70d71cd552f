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
  the state on its new workers and goes on (:meth:`actors.driver.runtime_client.ScheduledRuntime._rehome`).
* The newcomer is admitted at once, but no job of another group starts a phase on the victim's
  nodes until the victim has *drained* there (:mod:`rollmux.drain`, :func:`rollmux.drain.fenced_nodes`):
  its preemption record (written by the job store alone, :meth:`actors.scheduler.job_store.JobStore.note_drain`)
  keeps its group and nodes; its controller reports when it removed it at its boundary
  (``stopped``), its driver when it exported the state (``drained``); a failure / end report of the
  job drains it too (its controller evicted it: its driver was lost), as does
  :func:`rollmux.drain.drain_overdue` (reconcile loop, :meth:`PriorityPart.drain_overdue_pending`);
  a job whose group had no controller (no driver ever attached: nothing ran) is drained at once.
  The fence travels in the target state (:class:`rollmux.messages.MemberTarget` ``fenced``): the
  newcomer's controller grants no phase on a fenced node; each drain re-pushes the groups on its
  nodes. A *moved* job's drain off its old group's nodes (its :class:`rollmux.records.MoveRecord`,
  recorded by ``ReoptPart._record_moves``) takes the same steps through the same methods here:
  the drains are one mechanism, whatever took the job off its nodes.
"""

from __future__ import annotations

import time
from typing import Optional

from rollmux.codes import Code
from rollmux.messages import EventKind, RuntimeEvent
from rollmux.models import JobSpec
from rollmux.drain import Drain, drain_overdue, drains_of
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
        pl = final.placement
        nodes = tuple(dict.fromkeys([*pl.rollout_nodes, *pl.train_nodes])) if pl is not None else ()
        # no controller for its group: no driver ever attached, so nothing of it runs: drained now
        idle = not self.reconciler.has_controller(gid)
        with self._transaction():
            self.igs.depart(v.job_id)
            self._forget(v.job_id)
            entry = PreemptionRecord(at_s=now, by_job=by.job_id, by_class=class_of(self.igs.config, by),
                                     lost_gpu_h=v.lost_gpu_h, reason=reason, group_id=gid, nodes=nodes,
                                     stopped_at_s=now if idle else None, drained_at_s=now if idle else None,
                                     drained="no driver" if idle else None).to_dict()
            self.job_store.preempt(rec, final, entry)
            self.queue.push(spec, now, reason=f"preempted by {by.job_id}")
            self._queue_dirty = True
            self._checkpoint(jobs=(v.job_id,), groups=(gid,))
        self._push([gid])
        self._queue_metrics()
        self.metrics.preemption(rec.priority_class or class_of(self.igs.config, spec))

    # ---- drains: a preempted or moved job's old nodes are free for others once it drained there
    # (rollmux.drain; one rule for both, see the module docstring)
    def _draining(self) -> list[Drain]:
        """Every drain (a preemption's or a move's) not complete yet, from the records (no own state)."""
        return [d for r in self.job_store.records.values() if r.preemptions or r.moves for d in drains_of(r)
                if d.draining]

    def _groups_on(self, nodes: set[str]) -> list[str]:
        return [g.group_id for g in self.igs.groups if nodes.intersection((*g.rollout_nodes, *g.train_nodes))]

    def _note_drain(self, job_id: str, *, stopped: bool = False, drained: Optional[str] = None,
                    group_id: Optional[str] = None, now: Optional[float] = None) -> list[str]:
        """Record a step of ``job_id``'s drains off group ``group_id`` (None: all its drains;
        ``stopped``: removed by that group's controller at its boundary; ``drained``: how its nodes
        there became free), one checkpointed change (none when nothing changes), then push the
        groups on the freed nodes (their fences lift). ``now``: Unix time, s. Returns the freed
        nodes (sorted); nothing when the job has no such drain in progress."""
        rec = self.job_store.get(job_id)
        if rec is None or not any(d.draining for d in drains_of(rec)):
            return []
        now = time.time() if now is None else now
        with self._transaction():
            changed, freed = self.job_store.note_drain(rec, now, stopped=stopped, drained=drained, group_id=group_id)
            if changed:
                self._checkpoint(jobs=(job_id,))
        if freed:
            self._push(self._groups_on(freed))
        return sorted(freed)

    def _drain_report(self, job_id: str, msg: RuntimeEvent) -> None:
        """A report that moves a preempted or moved job's drain on: ``stopped`` (the controller of
        ``msg.group_id`` removed it at its boundary), ``drained`` (its driver exported its state
        from the workers of ``msg.group_id``; None: from every old home, a preempted job's driver,
        which runs nowhere until re-admitted), ``failed`` / ``finished`` (its controller evicted
        it or its driver ended: nothing of it runs anywhere, its driver let go of its state)."""
        if msg.kind == EventKind.STOPPED:
            self._note_drain(job_id, stopped=True, group_id=msg.group_id)
        elif msg.kind == EventKind.DRAINED:
            self._note_drain(job_id, drained="exported", group_id=msg.group_id)
        elif msg.kind in (EventKind.FAILED, EventKind.FINISHED):
            why = f"driver lost: {msg.error}" if msg.kind == EventKind.FAILED else "its driver ended"
            self._note_drain(job_id, drained=why[:500])

    def drain_overdue_pending(self, now: Optional[float] = None, grace_s: Optional[float] = None,
                              max_s: Optional[float] = None) -> list[str]:
        """Complete the drains that are overdue (:func:`rollmux.drain.drain_overdue`: stopped more
        than ``grace_s`` seconds ago without the driver reporting its state exported, or no stop
        within ``max_s`` of the decision); the reconcile loop calls this. ``now``: Unix time, s.
        Returns the ids of their jobs."""
        now = time.time() if now is None else now
        cfg = self.igs.config  # the bounds of the settings (modelled time x the time factor on emulated accelerators)
        grace_s = cfg.drain_grace_s if grace_s is None else grace_s
        max_s = cfg.drain_max_s if max_s is None else max_s
        with self._lock:
            due: dict[tuple[str, Optional[str]], str] = {}
            for rec in self.job_store.records.values():
                if rec.preemptions or rec.moves:
                    for d in drains_of(rec):
                        why = drain_overdue(d, now, grace_s, max_s)
                        if why is not None:
                            due.setdefault((d.job_id, d.group_id), why)
            for (jid, gid), why in due.items():
                self._note_drain(jid, drained=why, group_id=gid, now=now)
        return list(dict.fromkeys(j for j, _ in due))

    def _preempted_ids(self) -> list[str]:
        return [j for j, r in self.job_store.records.items() if r.state == JobState.PREEMPTED]
