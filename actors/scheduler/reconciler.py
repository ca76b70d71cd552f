"""The GlobalScheduler's reconciler: converge every group's controller to the target state.

The scheduler never waits on a controller (Ray Serve's controller contract: hard state is
checkpointed, soft state is pushed). After a change is checkpointed, each touched group's
controller gets the group's whole target membership (a :class:`rollmux.messages.MembershipPush`,
stamped with an increasing ``seq`` so a late push never undoes a newer one) without waiting
(:meth:`Reconciler.push`); :meth:`Reconciler.reconcile_once` (the scheduler's reconcile thread,
every ``RECONCILE_S``) clears acknowledged pushes and re-sends failed or overdue ones; every
``RECONCILE_FULL_S`` every group with a controller is re-pushed, so a restarted controller
converges. Workers of ended jobs are told to drop their state (:meth:`Reconciler.release_workers_once`).

Every actor the reconciler reaches comes from an injected :class:`HandleFactory`
(:class:`RayHandles` on a cluster), so the reconcile path runs in unit tests without Ray
(``tests/factories.py``: ``FakeHandles``). The target state itself is the scheduler's
(``target(group_id) -> MembershipPush``, given to the reconciler).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Protocol

from actors.naming import NAMESPACE, controller_name, hosted_key
from rollmux.messages import MembershipPush, TimelineEntry

log = logging.getLogger("rollmux.scheduler")

__all__ = ["RECONCILE_S", "RECONCILE_FULL_S", "PUSH_RETRY_S", "ATTACH_PUSH_TIMEOUT_S", "HandleFactory", "RayHandles",
           "Reconciler"]

RECONCILE_S = 1.0  # the reconcile loop's period, s
RECONCILE_FULL_S = 15.0  # every group's controller is re-pushed this often, s
PUSH_RETRY_S = 10.0  # an unacknowledged push is sent again after this long, s
ATTACH_PUSH_TIMEOUT_S = 30.0  # how long an attach waits for the controller to acknowledge its membership, s


class PushAck(Protocol):
    """A push in flight (:class:`actors.handles.Pending`): finished yet, and its answer."""

    def done(self) -> bool: ...

    def result(self, timeout_s: Optional[float] = None) -> Any: ...


class ControllerLike(Protocol):
    """What the reconciler calls on a group's controller (:class:`actors.handles.ControllerHandle`)."""

    def push(self, push: MembershipPush) -> PushAck: ...

    async def timeline_async(self, timeout_s: float) -> list[TimelineEntry]: ...


class WorkerLike(Protocol):
    """What the reconciler calls on a worker (:class:`actors.handles.WorkerHandle`)."""

    def unregister_job_nowait(self, key: str, admission: Optional[str] = None) -> Any: ...


class HandleFactory(Protocol):
    """Where the scheduler's actors come from (injected; :class:`RayHandles` on a cluster)."""

    def controller(self, group_id: str) -> Optional[ControllerLike]:
        """The group's live controller, or None when it has none."""

    def create_controller(self, group_id: str) -> ControllerLike:
        """Create (or find) the group's controller."""

    def leftover_groups(self) -> set[str]:
        """Group ids of this scheduler's controllers that exist now (named actors)."""

    def worker(self, node: str) -> Optional[WorkerLike]:
        """The node's worker, or None when it does not exist."""


class RayHandles:
    """The handle factory of a scheduler on a Ray cluster: controllers by their names
    (:func:`actors.naming.controller_name`), created with ``controller_kw``."""

    def __init__(self, scheduler_name: str, controller_kw: Optional[dict] = None):
        self.name = scheduler_name
        self.controller_kw = dict(controller_kw or {})

    def controller(self, group_id: str):
        from actors.handles import ActorLost, ControllerHandle

        h = ControllerHandle.of_group(group_id, self.name)
        try:
            h.actor  # noqa: B018  (looked up now: None when the group has no controller)
        except ActorLost:
            return None
        return h

    def create_controller(self, group_id: str):
        from actors.scheduler.group_controller import create_controller

        return create_controller(group_id, self.name, **self.controller_kw)

    def leftover_groups(self) -> set[str]:
        import ray

        prefix = controller_name("group-0", self.name).rsplit("group-0", 1)[0]
        try:
            names = ray.util.list_named_actors(all_namespaces=True)
        except Exception:
            return set()
        out = set()
        for a in names:
            name = a.get("name", "") if isinstance(a, dict) else str(a)
            ns = a.get("namespace", NAMESPACE) if isinstance(a, dict) else NAMESPACE
            if ns == NAMESPACE and name.startswith(prefix + "group-"):
                out.add(name[len(prefix):])
        return out

    def worker(self, node: str):
        from actors.handles import ActorLost, WorkerHandle

        h = WorkerHandle.of_node(node)
        try:
            h.actor  # noqa: B018
        except ActorLost:
            return None
        return h


class Reconciler:
    """Pushes of target membership to the groups' controllers, and worker releases.

    Args:
        scheduler_name: the scheduler's actor name (hosting keys of its jobs on the workers).
        handles: the :class:`HandleFactory`.
        target: ``target(group_id) -> MembershipPush`` (the scheduler's target state; ``seq`` is
            stamped here).
        exists: ``exists(group_id) -> bool``: the group is in the policy's table.

    Not thread-safe by itself: the scheduler calls it under its lock, except the waiting part of
    :meth:`reconcile_once`.
    """

    def __init__(self, scheduler_name: str, handles: HandleFactory, target: Callable[[str], MembershipPush],
                 exists: Callable[[str], bool]):
        self.name = scheduler_name
        self.handles = handles
        self._target = target
        self._exists = exists
        self.controllers: dict[str, ControllerLike] = {}  # group_id -> controller handle (soft; groups with one)
        self.dirty: dict[str, int] = {}  # group_id -> seq of the push not yet acknowledged
        self.inflight: dict[str, tuple[int, PushAck, float]] = {}  # group_id -> (seq, the call, sent at)
        self.seq = time.time_ns()  # push sequence (increasing across restarts)
        self.releases: list[tuple[str, Optional[str], list[str]]] = []  # (job, admission, nodes) to release

    # ---- controllers
    def controller(self, group_id: str, create: bool = False, lookup: bool = True) -> Optional[ControllerLike]:
        """The group's controller: cached; else looked up (``lookup``; off on the admission /
        departure path, where only cached handles are used); created when ``create``."""
        h = self.controllers.get(group_id)
        if h is None and (lookup or create):
            h = self.handles.controller(group_id)
            if h is None:
                if not create:
                    return None
                h = self.handles.create_controller(group_id)
            self.controllers[group_id] = h
        return h

    def has_controller(self, group_id: str) -> bool:
        return group_id in self.controllers

    def next_push(self, group_id: str) -> MembershipPush:
        """The group's target membership with the next sequence number."""
        self.seq += 1
        t = self._target(group_id)
        return MembershipPush(t.group_id, t.members, t.gone, self.seq, t.dissolved)

    def push(self, groups, lookup: bool = False) -> dict[str, int]:
        """Send each group's target membership to its controller, if it has one; never waits.
        ``lookup``: also find controllers not cached yet (restart, reconcile thread). Returns
        group -> the sequence number sent."""
        sent = {}
        for gid in dict.fromkeys(groups):
            h = self.controller(gid, lookup=lookup)
            if h is None:  # no controller (yet, or any more): nothing to converge until one is created
                self.dirty.pop(gid, None)
                self.inflight.pop(gid, None)
                continue
            p = self.next_push(gid)
            try:
                ack = h.push(p)
            except Exception as e:  # the handle is stale: the next reconcile pass looks it up again
                log.warning("push to the controller of %s failed: %s", gid, e)
                self.controllers.pop(gid, None)
                self.dirty[gid] = p.seq
                continue
            self.dirty[gid] = p.seq
            self.inflight[gid] = (p.seq, ack, time.monotonic())
            sent[gid] = p.seq
        return sent

    def take_acks(self) -> tuple[list[tuple[str, int]], list[str]]:
        """Which pushes in flight were acknowledged and which must be sent again (failed, or
        overdue after PUSH_RETRY_S). Waits on nothing."""
        acked, redo = [], []
        for gid, (seq, ack, sent) in dict(self.inflight).items():
            if ack.done():
                try:
                    ack.result(0)
                    acked.append((gid, seq))
                except Exception as e:  # the controller died or raised: push again
                    log.warning("controller of %s did not take push %d: %s", gid, seq, e)
                    redo.append(gid)
            elif time.monotonic() - sent > PUSH_RETRY_S:
                redo.append(gid)
        return acked, redo

    def settle(self, acked: list[tuple[str, int]], redo: list[str]) -> list[str]:
        """Clear acknowledged pushes and re-send the dirty ones; returns the groups re-pushed."""
        for gid, seq in acked:
            if self.inflight.get(gid, (None,))[0] == seq:
                self.inflight.pop(gid, None)
            if self.dirty.get(gid) == seq:
                del self.dirty[gid]
            if not self._exists(gid) and gid not in self.dirty:
                self.controllers.pop(gid, None)  # a dissolved group's controller has its final state
        # a named, detached controller keeps its handle across restarts: re-push with it (a
        # slow start is not a death; dropping the handle here would forget the group)
        again = [g for g in self.dirty if g not in self.inflight or g in redo]
        self.push(again, lookup=True)
        return again

    def leftover_groups(self) -> set[str]:
        """Groups of this scheduler that no longer exist but still have a live controller (the
        scheduler died between a group's end and its last push)."""
        return {g for g in self.handles.leftover_groups() if not self._exists(g)}

    async def timeline(self, group_id: str, timeout_s: float) -> list[TimelineEntry]:
        h = self.controller(group_id)
        if h is None:
            return []
        return await h.timeline_async(timeout_s)

    # ---- workers of ended jobs
    def release(self, job_id: str, admission: Optional[str], nodes: list[str]) -> None:
        """Queue the release of an ended job's state on its workers (sent by the reconcile loop)."""
        self.releases.append((job_id, admission, nodes))

    def take_releases(self) -> list[tuple[str, Optional[str], list[str]]]:
        todo, self.releases = self.releases, []
        return todo

    def send_releases(self, todo: list[tuple[str, Optional[str], list[str]]]) -> list[tuple[str, str]]:
        """Tell the workers of jobs that ended (finished, failed, evicted, expired) to drop their
        state (``unregister_job``: stored state, pending weights, sync endpoint, cold-start file),
        also when the driver died and never said goodbye. Fire and forget; a worker that does not
        exist hosts nothing. Returns the (job, node) pairs sent."""
        sent = []
        for job_id, admission, nodes in todo:
            for node in dict.fromkeys(nodes):
                try:
                    w = self.handles.worker(node)
                    if w is None:
                        continue
                    w.unregister_job_nowait(hosted_key(job_id, self.name), admission)
                    sent.append((job_id, node))
                except Exception as e:
                    log.warning("release of %s on %s failed: %s", job_id, node, e)
        return sent
