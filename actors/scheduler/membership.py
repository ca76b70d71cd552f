"""The GlobalScheduler's target state per co-execution group, and the controllers that converge to it.

What each group's GroupController must know (:meth:`Membership.target`: its members in the
planned round-robin order, with the nodes each may not start a phase on yet, and the jobs that
left it, with the reason) is derived from the job records and the policy's table every time;
:class:`actors.scheduler.reconciler.Reconciler` pushes it (never waited for) and re-sends it until
acknowledged. Controllers are created lazily, when a job's driver attaches
(:meth:`Membership.attach`), so admissions that never run start no actors; a restarted scheduler
re-finds the named, detached controllers (:meth:`Membership.refind_controllers`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from actors.naming import controller_name
from actors.scheduler.commit import Commit
from actors.scheduler.drains import Drains
from actors.scheduler.job_store import JobStore
from actors.scheduler.policy_ref import PolicyRef
from actors.scheduler.reconciler import ATTACH_PUSH_TIMEOUT_S, Reconciler
from rollmux.drain import fenced_nodes
from rollmux.messages import AttachTicket, MemberTarget, MembershipPush
from rollmux.records import JobState

log = logging.getLogger("rollmux.scheduler")

__all__ = ["Membership"]


class Membership:
    """Target membership and controllers of one scheduler's groups (see the module docstring).

    Args:
        name: the scheduler's actor name (controller names derive from it).
        policy / jobs: the table and the records the target state is derived from.
        drains: the drains in progress (their nodes are fenced for other groups' members).
        commit: where pushes wait for the write of the change that caused them.
        reconciler: the controllers and the pushes in flight.
        lock: the scheduler's lock (:meth:`attach` holds it except while it waits for the push).
    """

    def __init__(self, name: str, policy: PolicyRef, jobs: JobStore, drains: Drains, commit: Commit,
                 reconciler: Reconciler, lock):
        self.name, self.policy, self.jobs, self.drains, self.commit = name, policy, jobs, drains, commit
        self.reconciler, self.lock = reconciler, lock

    def target(self, group_id: str) -> MembershipPush:
        """The membership a group's controller must converge to: its active members (in the
        planned round-robin order: the policy's member order, which admission's SLO check
        simulated) and the jobs that left it, with the reason (``departed``, ``failed``, ``moved to
        <group>``); ``dissolved`` once the group no longer exists. ``seq`` is the reconciler's.
        Each member carries the nodes it may not start a phase on yet (``fenced``: a job of
        another group preempted or moved off them has not drained there, :func:`rollmux.drain.fenced_nodes`)."""
        members, gone = [], {}
        draining = self.drains.draining()  # preempted / moved jobs whose old nodes are not free yet
        try:  # each member's staleness bound (its spec, in the policy's table)
            bound = {m.spec.job_id: m.spec.max_staleness for m in self.policy.igs.group(group_id).members}
        except KeyError:
            bound = {}
        for rec in self.jobs.records.values():
            gid = self.jobs.last_group(rec)  # (a preempted job waiting: the group it was preempted from)
            if gid == group_id and rec.state.is_active():
                pl = self.jobs.view(rec).placement
                fenced = (fenced_nodes(draining, group_id, (*pl.rollout_nodes, *pl.train_nodes), rec.job_id)
                          if draining else ())
                members.append(MemberTarget(rec.job_id, tuple(pl.rollout_nodes), tuple(pl.train_nodes), rec.slo,
                                            fenced, bound.get(rec.job_id, 0)))
            elif gid == group_id:
                # a departure, also of an admitted job withdrawn before it ran, is "departed" to its controller
                departed = rec.state == JobState.FINISHED or (rec.state == JobState.CANCELLED and not rec.preemptions)
                gone[rec.job_id] = "departed" if departed else str(rec.state)
            elif any(m.from_group == group_id for m in rec.moves):
                gone[rec.job_id] = f"moved to {gid}"
        igs = self.policy.igs
        try:  # the planned round-robin order: the group's member order in the policy's table
            rank = {j: i for i, j in enumerate(igs.group(group_id).job_ids)}
            members.sort(key=lambda m: rank.get(m.job_id, len(rank)))
        except KeyError:
            pass
        return MembershipPush(group_id, tuple(members), gone, 0, igs.group_snapshot(group_id) is None)

    def refind_controllers(self) -> None:
        """After a (re)start: re-find each group's controller and push its target state (also the
        groups jobs moved out of, so a crash between the checkpoint and a push loses no move, and
        groups dissolved while no scheduler ran: told so, their controllers exit)."""
        groups = set(self.jobs.active_by_group())
        groups |= {m.from_group for r in self.jobs.records.values() if r.state.is_active() for m in r.moves}
        groups |= self.reconciler.leftover_groups()
        self.commit.push(sorted(groups), lookup=True)

    def push_all(self) -> None:
        """Every group with a controller gets its target again (a restarted controller keeps its handle)."""
        self.commit.push([g for g in self.jobs.active_by_group() if self.reconciler.has_controller(g)])

    def ensure_controller(self, group_id: str) -> str:
        """Create (if needed) the group's GroupController and push its members (not waited for);
        its name. Raises KeyError for a group without an active job."""
        if group_id not in self.jobs.active_by_group():
            raise KeyError(f"no active job in group {group_id!r}")
        self.reconciler.controller(group_id, create=True)
        self.commit.push([group_id])
        return controller_name(group_id, self.name)

    async def attach(self, job_id: str) -> Optional[AttachTicket]:
        """A driver is about to run ``job_id``: its record, and the name of its group's
        controller, created if needed, which holds the job's membership when this returns (the
        push is awaited, at most ``ATTACH_PUSH_TIMEOUT_S``; a controller not answering by then
        pulls the membership itself when the driver calls, ``pushed: False``). None for an
        unknown job; an ended job's ticket has no controller."""
        with self.lock:
            rec = self.jobs.get(job_id)
            if rec is None:
                return None
            view = self.jobs.view(rec).model_copy(deep=True)  # (an ended job's view is its record: not shared)
            if not rec.state.is_active() or view.group_id is None:
                return AttachTicket(view, None)
            gid = view.group_id
            self.reconciler.controller(gid, create=True)
            self.reconciler.push([gid])
            ack = self.reconciler.inflight.get(gid, (None, None))[1]
        pushed = False
        if ack is not None:
            try:
                await asyncio.wait_for(ack, timeout=ATTACH_PUSH_TIMEOUT_S)
                pushed = True
            except Exception as e:  # the controller starts slowly or restarts: it pulls the membership
                log.warning("attach of %s: the controller of %s did not acknowledge its membership (%s)", job_id, gid, e)
        return AttachTicket(view, controller_name(gid, self.name), pushed)
