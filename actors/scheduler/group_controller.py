"""GroupController: runs one co-execution group's meta-iterations (RollMux §4.3, §5.1).

An async Ray actor (one per group, named ``rollmux-group-<gid>``, detached). Every decision is
the pure :class:`rollmux.group_ledger.GroupLedger` (membership, grants, the iteration-boundary
rule of a moved job, the long-tail choice, slowdown accounting, the timeline); this actor only
adds asyncio (an ``asyncio.Event`` per job that waits for a permit, the lease watchdog) and Ray
calls (reports to the GlobalScheduler, metrics):

- ``acquire(job_id, phase)`` blocks until the ledger grants the phase (a
  :class:`rollmux.messages.Grant`);
- ``release(grant, record)`` (called by the grant's releaser, the worker that ran the phase on
  ``grant.nodes[0]``: :class:`rollmux.messages.Releaser` says why) records the phase and
  enqueues the job's next phase; a failed phase removes the job so its group-mates keep
  iterating, and tells the GlobalScheduler;
- ``remove_job(job_id, "moved to <group>")`` (departure re-packing moved the job): the removal
  waits for the job's iteration boundary; afterwards its ``acquire`` raises PermitError saying
  it moved, which tells the driver to re-attach to its new group; a job the push lists as gone
  ``preempted`` leaves at its boundary too; the leaving of either is reported (``stopped``, with
  this group: the start of its drain's bound, :mod:`rollmux.drain`);
- a member the push fences off some nodes (a job of another group preempted or moved off them has
  not drained there: :func:`rollmux.drain.fenced_nodes`) is granted no phase on them until a push lifts it;
- ``progress(RolloutProgress)`` (runtime hook) decides long-tail migration (trigger
  fraction, default 0.8, RollMux §4.3); with ``migrate=True`` the rollout's queue slots are
  released so the next queued rollout may start.

Timeline records: ``job_id, phase, pool, node, iteration, start, end`` (epoch seconds),
``start_s, end_s`` (seconds since the controller started), ``switch`` (warm | cold | moved),
``switch_s``, ``run_s``, ``offload_s``, ``ok``, ``error``. Metrics: pool busy / bubble seconds,
phase switches (kind); job iterations / slowdown go to the GlobalScheduler, which alone exports
the per-job series (see :mod:`actors.ops.metrics`).

State is soft: the GlobalScheduler pushes the group's membership (a
:class:`rollmux.messages.MembershipPush`; its checkpoint is the truth) before a driver attaches,
and its reconcile loop re-pushes until acknowledged; a restarted controller (``max_restarts=-1``)
pulls one from the scheduler when a job it does not know calls; drivers re-join the queues on
their next call. Permits granted before the restart are forgotten (their
late releases are recorded but change nothing). Every Ray call goes through
:mod:`actors.handles`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from actors.handles import ControllerHandle, SchedulerHandle, start_actor
from actors.naming import NAMESPACE, control_plane_resources, controller_name  # noqa: F401  (re-exported)
from rollmux.group_ledger import (  # noqa: F401  (re-exported)
    DEFAULT_LEASE_S, HEARTBEAT_S, MAX_TIMELINE, Effect, GroupLedger, JobLeft, PermitError, PhaseSwitched, Report,
    SyncBytes, TimelineChanged,
)
from rollmux.intra_group import LongTailPolicy
from rollmux.messages import (
    AbortOutcome, AttachReply, ControllerStatus, Grant, MembershipAck, MembershipPush, PhaseRecord, RolloutProgress,
    TailDecision, TimelineEntry,
)
from rollmux.models import pool_of_phase

log = logging.getLogger("rollmux.controller")

DEFAULT_ACQUIRE_TIMEOUT_S = 3600.0
EXIT_GRACE_S = 2.0  # a dissolved group's controller exits this long after its last member left
HANDOVER_TIMEOUT_S = 5.0  # waiting for the scheduler to take a dissolved group's timeline, s
DRIVER_LATE_S = 2 * HEARTBEAT_S  # a driver this late is checked against the cluster's list of live drivers


def dead_ray_drivers(drivers: set[str]) -> set[str]:
    """Which of ``drivers`` (Ray job ids, hex) the cluster's job table marks dead: their driver
    process exited (killed, crashed). Uses Ray's GCS job table (``ray._private.state.jobs``; no
    public API without the dashboard); an unknown id or a failing lookup counts as alive (the
    lease stays the last resort)."""
    try:
        from ray._private import state

        rows = state.jobs()
    except Exception as e:
        log.warning("could not read the cluster's job table: %s", e)
        return set()
    return {r["JobID"] for r in rows if r.get("JobID") in drivers and r.get("IsDead")}


class GroupControllerImpl:
    """The controller actor (plain class; wrapped with ``ray.remote`` by :func:`create_controller`).

    Args:
        group_id: the co-execution group id.
        scheduler_name: the GlobalScheduler to report iterations / failures to (None: no reports).
        migrate: act on long-tail decisions (release the rollout's queue slots) instead of only recording.
        tail_trigger_fraction / tail_gpus / migration_overhead_s: the long-tail settings
            (:class:`rollmux.intra_group.LongTailPolicy`; the scheduler passes
            ``configs/scheduler.yaml``'s via ``SchedulerConfig.controller_settings``).
        lease_s: driver lease; an attached job whose driver stops heart-beating this long while
            none of its phases runs is evicted and reported failed (0 disables). Keep it several
            heartbeat periods (``HEARTBEAT_S``) long.
        metrics_enabled: False records metric totals only (unit tests without Ray).
        clock: seconds now (the ledger's clock; ``time.time`` by default).
    """

    def __init__(self, group_id: str, scheduler_name: Optional[str] = None, *, migrate: bool = False,
                 tail_trigger_fraction: float = 0.8, tail_gpus: int = 1, migration_overhead_s: float = 2.0,
                 metrics_flush_s: float = 1.0, lease_s: float = DEFAULT_LEASE_S, metrics_enabled: bool = True,
                 clock=time.time):
        from actors.ops.metrics import RollmuxMetrics

        self.group_id = group_id
        self.scheduler_name = scheduler_name
        self.ledger = GroupLedger(group_id, long_tail=LongTailPolicy(tail_trigger_fraction, tail_gpus, migration_overhead_s),
                                  migrate=migrate, lease_s=lease_s, clock=clock,
                                  address=controller_name(group_id, scheduler_name))
        self.metrics = RollmuxMetrics(flush_interval_s=metrics_flush_s, enabled=metrics_enabled)
        self._events: dict[tuple[str, str], asyncio.Event] = {}  # (job, pool): set on every change
        # the GlobalScheduler (looked up by name again when it died); None: no reports
        self._sched = SchedulerHandle(name=scheduler_name) if scheduler_name else None
        self._watchdog: Optional[asyncio.Task] = None
        self._seq = -1  # the last reconcile push applied
        self.closed = False
        self.dissolved = False  # the newest push said the group no longer exists
        self._exit_task: Optional[asyncio.Task] = None
        self.exit_grace_s = EXIT_GRACE_S

    @property
    def timeline(self) -> list[TimelineEntry]:
        """The group's timeline (the ledger's rows, typed)."""
        return [TimelineEntry.of(r) for r in self.ledger.timeline]

    @property
    def long_tail(self) -> LongTailPolicy:
        """The ledger's long-tail migration settings."""
        return self.ledger.long_tail

    @property
    def migrate(self) -> bool:
        """Whether long-tail decisions release the rollout's queue slots."""
        return self.ledger.migrate

    # ---- effects of the ledger (the only calls out besides the membership pull)
    def _apply(self, effects: list[Effect] = ()) -> None:
        for e in [*effects, *self.ledger.take_effects()]:
            if isinstance(e, Report):
                if self._sched is not None:  # fire and forget: a report is soft state
                    self._sched.report_nowait(e.job_id, e.message)
            elif isinstance(e, TimelineChanged):
                self.metrics.group_timeline(e.group_id, e.records, e.nodes, e.window)
            elif isinstance(e, PhaseSwitched):
                self.metrics.phase_switch(e.kind, e.seconds)
            elif isinstance(e, SyncBytes):
                self.metrics.sync_cross_bytes(e.job_id, e.nbytes)
            elif isinstance(e, JobLeft):
                self.metrics.job_ended(e.job_id, ignore_late=False)

    def _wake_all(self) -> None:
        for ev in self._events.values():
            ev.set()

    # ---- membership
    async def add_job(self, job_id: str, rollout_nodes: list[str], train_nodes: list[str], *,
                      has_sync: bool = True, slo: Optional[float] = None) -> bool:
        """Record an admitted member (pending: it joins the queues when its driver attaches, so an
        admitted job without a running driver never blocks its group-mates). Idempotent."""
        out = self.ledger.add(job_id, rollout_nodes, train_nodes, has_sync=has_sync, slo=slo)
        self._wake_all()
        return out

    async def sync_members(self, push: MembershipPush) -> MembershipAck:
        """Reconcile (pushed by the GlobalScheduler, never awaited there): add the push's members
        (pending until their drivers attach; listed in the planned round-robin order, which the
        queues take, :meth:`GroupLedger.set_order`; each with the nodes it is fenced off until a
        job preempted or moved off them drained, :meth:`GroupLedger.set_fenced`) and drop its
        ``gone`` jobs (job_id -> reason, e.g. ``"moved to group-3"`` at the job's iteration
        boundary, ``"departed"``). A push older
        than one already applied (its ``seq``) is ignored (``stale: True``): Ray does not keep an
        async actor's calls in submission order, so an older push may arrive after a newer one.
        Each push is the whole target state, so the newest alone is enough (a job it lists as
        gone is recorded as gone even when the push that added it was the stale one).
        ``dissolved``: the group no longer exists (every member departed or moved): once none of
        its jobs is queued here (a moved job leaves at its iteration boundary) the controller
        exits after ``EXIT_GRACE_S`` (:meth:`_exit_when_empty`); a newer push without it cancels
        that. Idempotent. Returns the :class:`rollmux.messages.MembershipAck`."""
        return self._apply_push(push)

    def _apply_push(self, push: MembershipPush) -> MembershipAck:
        if push.seq <= self._seq:
            return MembershipAck(stale=True)
        self._seq = push.seq
        added = [m.job_id for m in push.members
                 if self.ledger.add(m.job_id, list(m.rollout_nodes), list(m.train_nodes), slo=m.slo,
                                    max_staleness=m.max_staleness)]
        # each push is the group's whole target state, so the newest one alone decides: a job it
        # lists as gone is recorded as gone even if the (older, now stale) push adding it never ran
        removed = [j for j, why in push.gone.items() if self.ledger.remove(j, why) or self.ledger.mark_gone(j, why)]
        reordered = self.ledger.set_order(list(push.order))  # the planned round-robin order
        # nodes a member may not start a phase on yet (a job preempted / moved off them has not drained)
        refenced = [m.job_id for m in push.members if self.ledger.set_fenced(m.job_id, m.fenced)]
        self._apply()
        if added or removed or reordered or refenced:
            self._wake_all()
        self.dissolved = bool(push.dissolved) and not push.members
        if self.dissolved and (self._exit_task is None or self._exit_task.done()):
            self._exit_task = asyncio.get_event_loop().create_task(self._exit_when_empty())
        return MembershipAck(tuple(added), tuple(removed))

    def _empty(self) -> bool:
        return not self.ledger.rr.job_ids and not self.ledger.grants

    async def _exit_when_empty(self) -> None:
        """A dissolved group's controller ends itself (no leaked actor): once no job is queued
        here and ``exit_grace_s`` later still none (late calls of moved drivers are answered
        meanwhile; after the exit they find no actor and follow their record), or at the latest
        after two driver leases plus a minute. Cancelled by a newer push for a live group."""
        limit = time.monotonic() + 2 * max(self.ledger.lease_s, 0.0) + 60.0
        while self.dissolved and not self.closed:
            await asyncio.sleep(self.exit_grace_s)
            if not self.dissolved:
                return
            if self._empty() or time.monotonic() > limit:
                break
        if not self.dissolved or self.closed:
            return
        log.info("group %s dissolved: its controller exits", self.group_id)
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        try:
            self.metrics.flush()
        except Exception:
            pass
        await self._hand_over_timeline()
        self._kill_self()

    async def _hand_over_timeline(self) -> None:
        """Give the scheduler this group's timeline before exiting, so ``group_timeline`` still
        answers for a dissolved group (an operator query; soft state: lost if the scheduler is
        unreachable for ``HANDOVER_TIMEOUT_S``)."""
        if self._sched is None:
            return
        pending = self._sched.keep_timeline_nowait(self.group_id, self.timeline)
        if pending is None:
            return
        try:
            await asyncio.wait_for(pending, timeout=HANDOVER_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001  (the exit goes on: the timeline is soft state)
            log.warning("group %s: timeline not handed to the scheduler: %s", self.group_id, e)

    def _kill_self(self) -> None:
        """End this actor for good (not restarted). Overridden by tests without Ray."""
        import ray

        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def _recover_members(self, job_id: str) -> None:
        """A job this controller does not know: pull the group's membership from the
        GlobalScheduler and apply it as a push. The fallback only: the scheduler pushes a job's
        membership and waits for its acknowledgement before its driver attaches
        (``GlobalSchedulerImpl.attach``), so this runs after a controller restart (its state is
        soft) or when that acknowledgement did not come in time."""
        if job_id in self.ledger.members or self._sched is None:
            return
        try:
            self._apply_push(await self._sched.membership(self.group_id))
        except Exception as e:  # scheduler unreachable: the caller reports "not a member"
            self._sched.forget()
            log.warning("group %s: could not recover members for %s: %s", self.group_id, job_id, e)

    async def attach(self, job_id: str, *, has_sync: Optional[bool] = None, driver: Optional[str] = None) -> AttachReply:
        """The job's driver attached: the job joins its nodes' queues at its place in the planned
        round-robin order pushed with the membership (attach order for jobs not in the plan). ``has_sync=False``: its empty sync slot ends with training.
        Raises PermitError for a job that is not a member (or already left)."""
        await self._recover_members(job_id)
        if has_sync is not None:
            self.ledger.set_has_sync(job_id, has_sync)
        self.ledger.activate(job_id)
        self.ledger.heartbeat(job_id, driver)
        self._ensure_watchdog()
        self._wake_all()
        return AttachReply(self.group_id, {n: tuple(q) for n, q in self.ledger.queues().items()}, self.ledger.lease_s)

    async def configure_job(self, job_id: str, *, has_sync: bool = True) -> bool:
        """Declare whether the job has a sync phase (False if not a member)."""
        await self._recover_members(job_id)
        return self.ledger.set_has_sync(job_id, has_sync)

    async def heartbeat(self, job_id: str, driver: Optional[str] = None) -> bool:
        """Driver liveness (its lease; ``driver``: the driver's Ray job id, so that its death is
        seen before the lease ends); False when the job is no longer a member."""
        await self._recover_members(job_id)
        return self.ledger.heartbeat(job_id, driver)

    async def remove_job(self, job_id: str, reason: str = "departed") -> bool:
        """Drop the job from every queue (departure / failure). False if it was not a member.
        ``"moved ..."``: effective at the job's iteration boundary (:meth:`GroupLedger.remove`)."""
        out = self.ledger.remove(job_id, reason)
        self._apply()
        self._wake_all()
        return out

    # ---- lease watchdog
    def _ensure_watchdog(self) -> None:
        if (self._watchdog is None or self._watchdog.done()) and self.ledger.lease_s > 0 and not self.closed:
            self._watchdog = asyncio.get_event_loop().create_task(self._watch())
            self._watchdog.add_done_callback(self._watchdog_ended)

    def _watchdog_ended(self, task: asyncio.Task) -> None:
        """Never silent: a watchdog that ended with an exception is logged and started again."""
        if task.cancelled() or self.closed:
            return
        exc = task.exception()
        if exc is not None:
            log.error("group %s: lease watchdog died (%r); restarting it", self.group_id, exc)
            self._watchdog = None
            self._ensure_watchdog()

    async def _watch(self) -> None:
        """Evict queued jobs whose driver stopped heart-beating for ``lease_s`` (see
        :meth:`GroupLedger.expired`), or sooner: a driver late by ``DRIVER_LATE_S`` whose Ray
        job the cluster reports dead (its process exited) is evicted at once. A failing pass is
        logged and the loop goes on."""
        while not self.closed:
            await asyncio.sleep(min(1.0, self.ledger.lease_s / 3))
            try:
                dead: set[str] = set()
                late = self.ledger.late_drivers(DRIVER_LATE_S)
                if late:
                    dead = await asyncio.get_event_loop().run_in_executor(None, dead_ray_drivers, set(late.values()))
                evicted, effects = self.ledger.expired(dead)
                self._apply(effects)
                if evicted:
                    self._wake_all()
            except Exception:
                log.exception("group %s: lease watchdog pass failed; continuing", self.group_id)

    # ---- permits
    async def phase_started(self, job_id: str, phase: str) -> bool:
        """The worker began the granted phase (the lease then waits for its release)."""
        return self.ledger.phase_started(job_id, phase)

    async def acquire(self, job_id: str, phase: str, timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
                      iteration: Optional[int] = None, has_sync: Optional[bool] = None) -> Grant:
        """Block until ``phase`` of ``job_id`` may run, then grant it.

        ``iteration``: the driver's own iteration index (the one owner of the count: the grant
        carries it; the queues' count restarts with a restarted controller); ``has_sync``:
        whether the job has a sync phase (re-declared on every call so a restarted controller
        knows it). Returns the :class:`rollmux.messages.Grant` (its releaser: the worker running
        the phase on ``nodes[0]``).
        Raises PermitError: the job is not (or no longer) a member, or asks a phase out of order;
        TimeoutError after ``timeout_s``.
        """
        t_start = self.ledger.clock()
        deadline = time.monotonic() + timeout_s
        self.ledger.heartbeat(job_id)  # a calling driver is alive
        ev = self._events.setdefault((job_id, pool_of_phase(phase)), asyncio.Event())  # an async job's two streams wait apart
        for _ in range(10_000_000):  # bounded; each pass waits for a state change
            if not self.ledger.is_queued(job_id):
                await self._recover_members(job_id)
                if has_sync is not None:
                    self.ledger.set_has_sync(job_id, has_sync)
                self.ledger.activate(job_id)  # raises PermitError for a non-member / a job that left
                self._ensure_watchdog()
            grant = self.ledger.try_grant(job_id, phase, iteration, t_start)
            if grant is not None:
                return grant
            ev.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"group {self.group_id}: no permit for {job_id}/{phase} within {timeout_s:.0f}s")
            try:
                await asyncio.wait_for(ev.wait(), timeout=min(left, 5.0))
            except asyncio.TimeoutError:
                pass
        raise TimeoutError("acquire loop bound reached")  # pragma: no cover

    async def release(self, grant: Grant, record: PhaseRecord) -> TimelineEntry:
        """The grant's releaser (the worker that ran the phase) gives ``grant`` back with what the
        phase did (:class:`rollmux.messages.PhaseRecord`).

        A successful phase enqueues the job's next phase; a failed one removes the job from the
        queues (group-mates continue) and reports the failure to the GlobalScheduler.
        Returns the stored timeline record.
        """
        rec, effects = self.ledger.release(grant, record)
        self._apply(effects)
        self._wake_all()
        return TimelineEntry.of(rec)

    async def abort_phase(self, job_id: str, phase: str, reason: str) -> AbortOutcome:
        """The driver lost the worker running ``phase`` and will redo it from the job's last
        committed state (:meth:`GroupLedger.abort`): ``"aborted"`` (permit withdrawn),
        ``"done"`` (the phase was released before the loss: do not run it again) or ``"none"``.
        Raises PermitError for a job that is not a member."""
        await self._recover_members(job_id)
        out, effects = self.ledger.abort(job_id, phase, reason)
        self._apply(effects)
        self._wake_all()
        return out

    # ---- runtime hook: long-tail migration
    async def progress(self, report: RolloutProgress) -> Optional[TailDecision]:
        """Generation progress of the running rollout; returns a migration decision once per rollout.

        The rollout is tail-bound per ``LongTailPolicy.should_migrate`` (RollMux §4.3).
        """
        decision = self.ledger.progress(report.job_id, report.done, report.total)
        if decision is not None and decision.acted:
            self._wake_all()
        return decision

    # ---- queries
    async def get_timeline(self, since: int = 0) -> list[TimelineEntry]:
        """Timeline records from index ``since``."""
        return [TimelineEntry.of(r) for r in self.ledger.timeline[since:]]

    async def status(self) -> ControllerStatus:
        """Members, per-node queues, next phases, iterations, departed/failed jobs, migrations."""
        return ControllerStatus.of(self.ledger.status(), tuple(self.ledger.migrations), self.metrics.totals)

    async def ping(self) -> str:
        return self.group_id


def create_controller(group_id: str, scheduler_name: Optional[str] = None, **kw) -> ControllerHandle:
    """Get or create the named, detached controller of ``group_id`` (async actor, 0 CPUs); its
    handle. ``kw``: the controller's keyword settings (``lease_s``, ``migrate``, ...)."""
    name = controller_name(group_id, scheduler_name)
    actor = start_actor(GroupControllerImpl, (group_id, scheduler_name), kw, name=name, namespace=NAMESPACE,
                        lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=-1,
                        resources=control_plane_resources(), max_concurrency=1000)
    return ControllerHandle(actor, name=name)
