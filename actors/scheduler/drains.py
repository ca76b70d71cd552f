"""The GlobalScheduler's drains: a preempted or moved job's old nodes are free for others once it drained there.

The rule is the pure policy :mod:`rollmux.drain`, one mechanism whatever took the job off its
nodes (a preemption, :mod:`actors.scheduler.priority`; a move, :mod:`actors.scheduler.reopt`). The
newcomer is admitted at once, but no job of another group starts a phase on the old nodes until
the job has *drained* there: its preemption or move record (written by the job store alone,
:meth:`actors.scheduler.job_store.JobStore.note_drain`) keeps the group and nodes; the old group's
controller reports when it removed the job at its iteration boundary (``stopped``), its driver
when it exported the state (``drained``); a failure / end report of the job drains it too (its
controller evicted it: its driver was lost), as does :func:`rollmux.drain.drain_overdue` (the
reconcile loop, :meth:`Drains.overdue_pending`); a job whose old group had no controller (no
driver ever attached: nothing ran) is drained at once. The fence travels in the target state
(:class:`rollmux.messages.MemberTarget` ``fenced``); each drain re-pushes the groups on its nodes.
:class:`Drains` has no state of its own: every drain is read from the records.
"""

from __future__ import annotations

import time
from typing import Optional

from actors.scheduler.commit import Commit
from actors.scheduler.job_store import JobStore
from actors.scheduler.policy_ref import PolicyRef
from rollmux.drain import Drain, drain_overdue, drains_of
from rollmux.messages import EventKind, RuntimeEvent

__all__ = ["Drains"]


class Drains:
    """The drains of one scheduler's jobs (see the module docstring).

    Args:
        policy / jobs: the table (which groups use the freed nodes) and the records.
        commit: the unit of work each drain step is written with.
        lock: the scheduler's lock (taken by :meth:`overdue_pending`, which the reconcile thread calls).
    """

    def __init__(self, policy: PolicyRef, jobs: JobStore, commit: Commit, lock):
        self.policy, self.jobs, self.commit, self.lock = policy, jobs, commit, lock

    def draining(self) -> list[Drain]:
        """Every drain (a preemption's or a move's) not complete yet."""
        return [d for r in self.jobs.records.values() if r.preemptions or r.moves for d in drains_of(r) if d.draining]

    def note(self, job_id: str, *, stopped: bool = False, drained: Optional[str] = None,
             group_id: Optional[str] = None, now: Optional[float] = None) -> list[str]:
        """Record a step of ``job_id``'s drains off group ``group_id`` (None: all its drains;
        ``stopped``: removed by that group's controller at its boundary; ``drained``: how its nodes
        there became free), one checkpointed change (none when nothing changes), then push the
        groups on the freed nodes (their fences lift). ``now``: Unix time, s. Returns the freed
        nodes (sorted); nothing when the job has no such drain in progress."""
        rec = self.jobs.get(job_id)
        if rec is None or not any(d.draining for d in drains_of(rec)):
            return []
        now = time.time() if now is None else now
        with self.commit.transaction():
            changed, freed = self.jobs.note_drain(rec, now, stopped=stopped, drained=drained, group_id=group_id)
            if changed:
                self.commit.mark(jobs=(job_id,))
        if freed:
            self.commit.push(self.policy.groups_on(freed))
        return sorted(freed)

    def report(self, job_id: str, msg: RuntimeEvent) -> None:
        """A report that moves a preempted or moved job's drain on: ``stopped`` (the controller of
        ``msg.group_id`` removed it at its boundary), ``drained`` (its driver exported its state
        from the workers of ``msg.group_id``; None: from every old home, a preempted job's driver,
        which runs nowhere until re-admitted), ``failed`` / ``finished`` (its controller evicted
        it or its driver ended: nothing of it runs anywhere, its driver let go of its state)."""
        if msg.kind == EventKind.STOPPED:
            self.note(job_id, stopped=True, group_id=msg.group_id)
        elif msg.kind == EventKind.DRAINED:
            self.note(job_id, drained="exported", group_id=msg.group_id)
        elif msg.kind in (EventKind.FAILED, EventKind.FINISHED):
            why = f"driver lost: {msg.error}" if msg.kind == EventKind.FAILED else "its driver ended"
            self.note(job_id, drained=why[:500])

    def overdue_pending(self, now: Optional[float] = None, grace_s: Optional[float] = None,
                        max_s: Optional[float] = None) -> list[str]:
        """Complete the drains that are overdue (:func:`rollmux.drain.drain_overdue`: stopped more
        than ``grace_s`` seconds ago without the driver reporting its state exported, or no stop
        within ``max_s`` of the decision); the reconcile loop calls this. ``now``: Unix time, s.
        Returns the ids of their jobs."""
        now = time.time() if now is None else now
        cfg = self.policy.config  # the settings' bounds (modelled time x the time factor on emulated accelerators)
        grace_s = cfg.drain_grace_s if grace_s is None else grace_s
        max_s = cfg.drain_max_s if max_s is None else max_s
        with self.lock:
            due: dict[tuple[str, Optional[str]], str] = {}
            for rec in self.jobs.records.values():
                if rec.preemptions or rec.moves:
                    for d in drains_of(rec):
                        why = drain_overdue(d, now, grace_s, max_s)
                        if why is not None:
                            due.setdefault((d.job_id, d.group_id), why)
            for (jid, gid), why in due.items():
                self.note(jid, drained=why, group_id=gid, now=now)
        return list(dict.fromkeys(j for j, _ in due))
