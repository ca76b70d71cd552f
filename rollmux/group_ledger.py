"""The bookkeeping of one co-execution group at run time (RollMux §4.3, §5.1), pure and typed.

:class:`GroupLedger` is everything the ``GroupController`` actor (:mod:`actors.scheduler.group_controller`)
decides, without asyncio or Ray: it owns

- the members (:class:`Member`: nodes, SLO, driver heartbeat, per-iteration phase times) and the
  jobs that left (``gone``: reason) or leave at their iteration boundary (``moving``);
- the phase grants (``grants``: the one answer to "is a phase of job X running here"; keyed by job
  and pool, since an asynchronous job's rollout and training run at once, :mod:`rollmux.staleness`);
- the round-robin queues (:class:`rollmux.round_robin.RoundRobinQueues`), which own the phase
  order, the queue iteration count and whether a queued job has a sync phase; the round-robin
  order is the *planned* one (:meth:`GroupLedger.set_order`: the order admission's SLO check
  simulated, pushed by the GlobalScheduler with the membership), not the order drivers attach;
- the iteration-boundary rule for a job moved by departure re-packing or preempted (:meth:`remove`),
  and the fence that keeps a member off nodes a job of another group, preempted or moved off them,
  has not drained yet (:meth:`set_fenced`, pushed by the GlobalScheduler; the rule is
  :func:`rollmux.drain.fenced_nodes`);
- the long-tail choice (:class:`rollmux.intra_group.LongTailPolicy`, :meth:`progress`);
- the slowdown accounting (measured co-executed / solo iteration time, :meth:`slowdown`) and the
  timeline of phase records.

Time comes from an injected ``clock`` (seconds, epoch by default), so tests drive it directly.
Mutating methods return typed effects (:data:`Effect`: a :class:`Report` to the GlobalScheduler,
a metric such as :class:`PhaseSwitched`) that the actor carries out; the ledger itself calls
nothing outside this package. Permits are :class:`rollmux.messages.Grant` values and the phases'
records :class:`rollmux.messages.PhaseRecord` values.

The iteration count is the driver's (``rollmux.Job.iteration``, the one owner): each grant
carries the index the driver asked with; a member's ``iterations_done`` here is *derived* from
the grant of its last completed iteration (index + 1), and the queues' own turn counter
(``RoundRobinQueues.iteration``, restarted with a controller) is reported as ``turns``, never as
the job's iterations.

Errors: :class:`PermitError` when a permit cannot be granted (not a member, left, moved, out of
order).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from rollmux.intra_group import LongTailPolicy
from rollmux.ledger_effects import Effect, JobLeft, PhaseSwitched, Report, SyncBytes, TimelineChanged
from rollmux.messages import AbortOutcome, Grant, PhaseRecord, ProgressReport, RuntimeEvent, EventKind, TailDecision
from rollmux.models import pool_of_phase
from rollmux.round_robin import RoundRobinQueues
from rollmux.staleness import phase_version, solo_iteration_s

__all__ = ["GroupLedger", "Member", "Effect", "Report", "JobLeft", "TimelineChanged", "PhaseSwitched", "SyncBytes",
           "PermitError", "MAX_TIMELINE", "HEARTBEAT_S", "DEFAULT_LEASE_S"]

MAX_TIMELINE = 100_000
DEFAULT_LEASE_S = 30.0  # a driver silent this long (no heartbeat, no phase running) is evicted
HEARTBEAT_S = 2.0  # drivers heart-beat this often
MOVED_PREFIX = "moved"
#: the reason a preempted job leaves (rollmux.records.JobState.PREEMPTED): at its iteration boundary too
PREEMPTED_PREFIX = "preempted"


class PermitError(RuntimeError):
    """A permit cannot be granted: the job left the group (failed / departed / moved) or asked
    out of order."""


@dataclass
class Member:
    """One member of the group as its controller sees it.

    ``has_sync`` is the declared value while the job is pending; once it joined the queues
    (``active``) the queues own it (:meth:`GroupLedger.has_sync`). ``iterations_done`` is
    derived: the index carried by the grant of the job's last completed iteration, + 1 (the
    driver owns the count). ``phase_s``: seconds of the job's own phases in the current
    iteration; ``iter_s`` / ``solo_s``: per finished iteration, wall time from its rollout grant
    to its last phase's end, and the sum of its phases (s).
    """

    rollout_nodes: list[str]
    train_nodes: list[str]
    slo: Optional[float] = None
    has_sync: bool = True
    active: bool = False
    heartbeat: Optional[float] = None
    confirmed: bool = False  # this ledger granted it a phase (its queue position is this ledger's own)
    driver: Optional[str] = None  # the driver's process identity (a Ray job id), if it told
    max_staleness: int = 0  # the job's staleness bound k (rollmux.staleness; pushed with the membership)
    streams: set = field(default_factory=set)  # pools this ledger granted it a phase on (an async job's resume)
    fenced: frozenset[str] = frozenset()  # nodes it may not start a phase on yet (a preempted / moved job drains there)
    iterations_done: int = 0  # derived from the grants (see the class docstring)
    iter_start: Optional[float] = None
    phase_s: dict[str, float] = field(default_factory=dict)
    iter_s: list[float] = field(default_factory=list)
    solo_s: list[float] = field(default_factory=list)
    # the current iteration's rollout at the long-tail trigger (s from its grant, unfinished responses,
    # whether migration acted): what the SLO watch's prediction needs (rollmux.measured.reported_sample)
    tail: Optional[tuple[float, int, bool]] = None

    def slowdown(self) -> Optional[float]:
        """Measured co-executed / solo iteration time over the finished iterations (None before one)."""
        solo = sum(self.solo_s)
        return sum(self.iter_s) / solo if solo > 0 else None


@dataclass
class _Held:
    """A grant this ledger issued and that was not released yet."""

    grant: Grant
    turn: int  # the queues' completed iterations of the job when it was granted (its iteration ends when they grow)
    started: bool = False  # the worker began the phase (the lease then waits for its release)
    migrated: bool = False  # a long-tail decision was taken for this rollout



class GroupLedger:
    """Membership, grants and accounting of one co-execution group (see the module docstring).

    Args:
        group_id: the group's id.
        long_tail: the long-tail migration policy (RollMux §4.3; trigger at 80% by default).
        migrate: act on a long-tail decision (release the rollout's queue slots) instead of only
            recording it.
        lease_s: driver lease (s); 0 disables eviction.
        clock: seconds now (``time.time`` by default).
    """

    def __init__(self, group_id: str, *, long_tail: Optional[LongTailPolicy] = None, migrate: bool = False,
                 lease_s: float = DEFAULT_LEASE_S, clock: Callable[[], float] = time.time,
                 address: Optional[str] = None):
        self.group_id = group_id
        self.address = address  # the controller actor's name, stamped on every grant (where it is released)
        self.long_tail = long_tail or LongTailPolicy()
        self.migrate = migrate
        self.lease_s = float(lease_s)
        self.clock = clock
        self.rr = RoundRobinQueues()
        self.t0 = clock()
        self.members: dict[str, Member] = {}
        self.gone: dict[str, str] = {}  # job_id -> why it left ("failed: ...", "departed", "moved to <g>")
        self.moving: dict[str, str] = {}  # job_id -> "moved to <g>" (due at its iteration boundary)
        self.grants: dict[tuple[str, str], _Held] = {}  # (job_id, pool) -> the grant of its phase there (not released yet)
        self.migrations: list[TailDecision] = []
        self.timeline: list[dict] = []
        self.pending: list[Effect] = []  # effects of state changes not returned by the call (take_effects)
        self._occ_records: list[dict] = []  # one per phase and node, seconds since t0 (occupancy)
        self._occ_nodes: dict[str, dict[str, float]] = {"rollout": {}, "train": {}}

    # ---- membership
    def is_member(self, job_id: str) -> bool:
        """Known and not gone."""
        return job_id in self.members and job_id not in self.gone

    def is_queued(self, job_id: str) -> bool:
        return job_id in self.rr.job_ids

    def add(self, job_id: str, rollout_nodes: list[str], train_nodes: list[str], *, has_sync: bool = True,
            slo: Optional[float] = None, max_staleness: int = 0) -> bool:
        """Record an admitted member (pending until its driver attaches; ``max_staleness``: its
        staleness bound k). Idempotent: for a current member, True only when a deferred move of it
        is cancelled (it moved back)."""
        if self.is_member(job_id):
            return self.moving.pop(job_id, None) is not None
        self.gone.pop(job_id, None)
        self.members[job_id] = Member(list(rollout_nodes), list(train_nodes), slo=slo, has_sync=has_sync,
                                      max_staleness=int(max_staleness))
        return True

    def activate(self, job_id: str) -> None:
        """The job's driver is here: it joins its nodes' queues (once) at its place in the planned
        round-robin order (:meth:`set_order`; the end of the attach order without a plan) and its
        lease starts. Raises PermitError for a non-member or a job that left (saying so if it moved)."""
        m = self.members.get(job_id)
        if m is None or job_id in self.gone:
            why = self.gone.get(job_id, "not a member of this group")
            if why.startswith(MOVED_PREFIX):
                raise PermitError(f"group {self.group_id}: job {job_id!r} moved to another group ({why}); "
                                  "re-attach to the group in its scheduler record")
            raise PermitError(f"group {self.group_id}: job {job_id!r} cannot attach: {why}")
        if not m.active:
            self.rr.add_job(job_id, m.rollout_nodes, m.train_nodes, has_sync=m.has_sync, max_staleness=m.max_staleness)
            m.active = True
        m.heartbeat = self.clock()

    def set_order(self, order: list[str]) -> bool:
        """Plan the round-robin order of the members (job ids, first to last): the order the
        admission SLO check simulated (RollMux §4.2 Alg. 1 line 10 with
        :func:`rollmux.admission.best_round_robin_order`). Queued jobs take their planned places
        at once (a running phase is never pre-empted); a job attaching later joins at its place.
        Returns True when the plan changed."""
        order = [j for j in dict.fromkeys(order)]
        if tuple(order) == self.rr.planned_order:
            return False
        self.rr.set_order(order)
        return True

    @property
    def order(self) -> tuple[str, ...]:
        """The planned round-robin order (empty: attach order)."""
        return self.rr.planned_order

    def has_sync(self, job_id: str) -> bool:
        """Whether the job has a sync phase (the queues' value once it is queued)."""
        if self.is_queued(job_id):
            return self.rr.has_sync(job_id)
        return self.members[job_id].has_sync

    def set_has_sync(self, job_id: str, has_sync: bool) -> bool:
        """Declare whether the job has a sync phase (False if not a member)."""
        if job_id not in self.members:
            return False
        self.members[job_id].has_sync = bool(has_sync)
        if self.is_queued(job_id):
            self.rr.set_has_sync(job_id, has_sync)
        return True

    def heartbeat(self, job_id: str, driver: Optional[str] = None) -> bool:
        """Driver liveness (``driver``: its process identity, kept for :meth:`late_drivers`);
        False when the job is no longer a member."""
        if not self.is_member(job_id):
            return False
        m = self.members[job_id]
        m.heartbeat = self.clock()
        if driver:
            m.driver = driver
        return True

    def set_fenced(self, job_id: str, nodes) -> bool:
        """The nodes of ``job_id`` on which it may not start a phase yet (the GlobalScheduler's
        target state: a job of another group preempted or moved off them has not drained there,
        :mod:`rollmux.drain`; empty lifts the fence).
        :meth:`try_grant` holds back a phase that needs one of them. Returns True when the fence
        changed (False too for a non-member)."""
        m = self.members.get(job_id)
        new = frozenset(nodes)
        if m is None or m.fenced == new:
            return False
        m.fenced = new
        return True

    def late_drivers(self, late_s: float) -> dict[str, str]:
        """Queued jobs with no phase running whose driver (of known identity) has not
        heart-beaten for ``late_s`` seconds: job id -> driver identity. The controller asks the
        cluster whether those drivers' processes still exist (:meth:`expired` ``dead_drivers``)."""
        now = self.clock()
        return {j: m.driver for j in self.rr.job_ids if (m := self.members[j]).driver
                and not self._started(j) and m.heartbeat is not None
                and now - m.heartbeat > late_s}

    def remove(self, job_id: str, reason: str = "departed") -> bool:
        """Drop the job from every queue (departure / failure). False if it was not a member.

        ``reason`` starting with ``"moved"`` (departure re-packing moved the job) or
        ``"preempted"`` (a higher class needs its nodes): the removal takes effect at the job's
        *iteration boundary* (never half an iteration): a job in the middle of a meta-iteration
        (a phase granted or running, or its next phase is training / sync) keeps its slots until
        its iteration's last phase is released. An asynchronous job is not granted rollouts ahead
        meanwhile, so its pipeline drains to such a boundary (:meth:`try_grant`). A job between iterations leaves now. When a
        moved or preempted job actually leaves (now or at its boundary) the GlobalScheduler is
        told (a :class:`Report` of a ``stopped`` :class:`rollmux.messages.RuntimeEvent` with this
        group's id): no phase of it runs here any more, which starts the bound on its drain
        off this group's nodes (:func:`rollmux.drain.drain_overdue`).
        """
        if not self.is_member(job_id):
            return False
        if reason.startswith((MOVED_PREFIX, PREEMPTED_PREFIX)) and self.is_queued(job_id) and \
                (self.rr.is_running(job_id) or self.rr.next_phase(job_id) != "rollout"):
            self.moving[job_id] = reason
            return True
        self.moving.pop(job_id, None)
        if self.is_queued(job_id):
            self.rr.remove_job(job_id)
        for pool in ("rollout", "train"):
            self.grants.pop((job_id, pool), None)
        self.gone[job_id] = reason
        # its per-job totals in this group's recorder (sync bytes) go with it; it may come back
        self.pending.append(JobLeft(job_id))
        if reason.startswith((MOVED_PREFIX, PREEMPTED_PREFIX)):  # nothing of it runs here: its drain's bound starts
            self.pending.append(Report(job_id, RuntimeEvent(EventKind.STOPPED, group_id=self.group_id)))
        return True

    def mark_gone(self, job_id: str, reason: str) -> bool:
        """Record that ``job_id`` left this group although this ledger never knew it as a member
        (e.g. a target-state push that lists it as gone overtook, and so superseded, the older push
        that added it: calls to an async actor may run out of submission order). Its driver's
        later call is then told why (e.g. that it moved) instead of "not a member". False (and
        nothing changed) for a known job: :meth:`remove` handles those."""
        if job_id in self.members or job_id in self.gone:
            return False
        self.gone[job_id] = reason
        if reason.startswith((MOVED_PREFIX, PREEMPTED_PREFIX)):  # nothing of it runs here: its drain's bound starts
            self.pending.append(Report(job_id, RuntimeEvent(EventKind.STOPPED, group_id=self.group_id)))
        return True

    def take_effects(self) -> list[Effect]:
        """Effects queued by state changes (e.g. a job leaving), for the actor to carry out."""
        out, self.pending = self.pending, []
        return out

    def expired(self, dead_drivers: frozenset[str] | set[str] = frozenset()) -> tuple[list[str], list[Effect]]:
        """Evict queued jobs whose driver has not heart-beaten for ``lease_s`` while none of their
        phases runs on a worker (a crashed driver must not stall its group-mates); also frees a
        permit granted to a driver that died before using it. ``dead_drivers``: driver
        identities the cluster says no longer exist (:meth:`late_drivers`): their jobs are
        evicted now, without waiting for the lease. Returns (evicted ids, effects)."""
        if self.lease_s <= 0:
            return [], []
        now = self.clock()
        out, effects = [], []
        for j in list(self.rr.job_ids):
            m = self.members[j]
            if self._started(j) or m.heartbeat is None:
                continue  # a phase running on a worker always ends with a release
            if m.driver is not None and m.driver in dead_drivers:
                err = (f"driver lost: its process exited (Ray driver {m.driver} is dead); "
                       f"no heartbeat for {now - m.heartbeat:.1f}s")
            elif now - m.heartbeat <= self.lease_s:
                continue
            else:
                err = f"driver lost: no heartbeat for {now - m.heartbeat:.1f}s (lease {self.lease_s:.1f}s)"
            self.remove(j, f"failed: {err}")
            out.append(j)
            effects.append(Report(j, RuntimeEvent(EventKind.FAILED, error=err)))
        return out, effects

    # ---- permits
    def _started(self, job_id: str) -> bool:
        return any(h is not None and h.started for h in (self.grants.get((job_id, p)) for p in ("rollout", "train")))

    def try_grant(self, job_id: str, phase: str, iteration: Optional[int], waited_since: float) -> Optional[Grant]:
        """Grant ``phase`` of a queued ``job_id`` if the queues let it start now, else None.

        ``iteration``: the driver's own iteration index (the one owner of the count; the grant
        carries it). None (a caller that does not count, e.g. a test of the queues): the queues'
        count of the job's completed iterations. None too while the phase needs a node the job is
        fenced off (:meth:`set_fenced`; it keeps its place in the queues and is granted once the
        fence lifts). Raises PermitError when the job is not queued here or asks a phase out of order.
        """
        if not self.is_queued(job_id):
            self.activate(job_id)
        m = self.members[job_id]
        if self.rr.max_staleness(job_id) > 0:
            return self._try_grant_async(job_id, m, phase, iteration, waited_since)
        nxt = self.rr.next_phase(job_id)
        if nxt != phase and not m.confirmed and not self.rr.is_running(job_id):
            # a restarted controller: the driver's own report says where the job is in its
            # meta-iteration (the phase it asks for is its next one); resume it there
            try:
                if not self.rr.resume(job_id, phase, None if iteration is None else int(iteration)):
                    return None  # another job's phase holds its training nodes: ask again when it ends
                nxt = phase
            except ValueError:
                pass
        if nxt != phase:
            raise PermitError(f"group {self.group_id}: job {job_id!r} asked for {phase} but its next phase is {nxt}")
        return self._grant(job_id, m, phase, iteration, waited_since)

    def _try_grant_async(self, job_id: str, m: Member, phase: str, iteration: Optional[int],
                         waited_since: float) -> Optional[Grant]:
        """:meth:`try_grant` of an asynchronous job: its rollout stream and its training stream
        ask on their own (``iteration``: the rollout's own index for a rollout). A restarted
        controller resumes each stream on its first request (:meth:`RoundRobinQueues.resume`).
        A job due to move (or be preempted) is granted no rollout ahead, so its pipeline drains."""
        pool = pool_of_phase(phase)
        if pool not in m.streams and iteration is not None:
            idx = self.rr.rollouts(job_id) if phase == "rollout" else self.rr.iteration(job_id)
            if idx != int(iteration) and not self.rr.is_running(job_id, phase):
                try:
                    if not self.rr.resume(job_id, phase, int(iteration)):
                        return None
                except ValueError:
                    pass
        if phase not in self.rr.next_phases(job_id):
            raise PermitError(f"group {self.group_id}: job {job_id!r} asked for {phase} but may ask for "
                              f"{', '.join(self.rr.next_phases(job_id)) or 'nothing (its phases run)'}")
        if phase == "rollout" and job_id in self.moving:
            return None  # drain: no rollout ahead while the job is due to leave at its iteration boundary
        return self._grant(job_id, m, phase, iteration, waited_since)

    def _grant(self, job_id: str, m: Member, phase: str, iteration: Optional[int], waited_since: float) -> Optional[Grant]:
        """Grant ``phase`` if the queues have it ready and none of its nodes is fenced, else None."""
        ready = next((r for r in self.rr.ready() if r.job_id == job_id and r.phase == phase), None)
        if ready is None or m.fenced.intersection(ready.nodes):
            return None
        rp = self.rr.grant(job_id, phase)
        now = self.clock()
        it = rp.iteration if iteration is None else int(iteration)
        version = phase_version(phase, it, self.rr.max_staleness(job_id))
        grant = Grant(job_id=job_id, group_id=self.group_id, phase=phase, pool=rp.pool, nodes=tuple(rp.nodes),
                      iteration=it, granted_at=now, waited_s=now - waited_since, controller=self.address,
                      version=version)
        self.grants[(job_id, rp.pool)] = _Held(grant, turn=self.rr.iteration(job_id))
        m.confirmed = True
        m.streams.add(rp.pool)
        if phase == "rollout" and m.iter_start is None:
            m.iter_start = now
        return grant

    def grant_of(self, job_id: str, pool: str = "train") -> Optional[Grant]:
        """The job's grant on ``pool`` not released yet (None: no phase of it is granted there)."""
        held = self.grants.get((job_id, pool))
        return None if held is None else held.grant

    def phase_started(self, job_id: str, phase: str) -> bool:
        """The worker began the granted phase (the lease then waits for its release)."""
        held = self.grants.get((job_id, pool_of_phase(phase)))
        if held is None or held.grant.phase != phase:
            return False
        held.started = True
        return True

    def release(self, grant: Grant, record: PhaseRecord) -> tuple[dict, list[Effect]]:
        """The releaser (:attr:`Grant.releaser`) gives ``grant`` back with what the phase did.

        A successful phase moves the job on in the queues (at its iteration's end: the iteration
        is accounted, a deferred move takes effect); a failed one removes the job (group-mates
        continue) and reports the failure, except a phase interrupted by a lost worker
        (``record.lost``): the job keeps its place and the phase is granted again (redone from
        its start on the job's last committed state). A release of a grant this ledger does not
        hold (e.g. issued before a controller restart) is recorded but changes nothing. Returns
        (the timeline record, effects); the record's ``iteration`` is the grant's.
        """
        job_id, phase = grant.job_id, grant.phase
        held = self.grants.pop((job_id, pool_of_phase(phase)), None)
        ok = bool(record.ok)
        now = self.clock()
        rec = {"job_id": job_id, "phase": phase, "group_id": self.group_id, "pool": pool_of_phase(phase),
               "iteration": (held.grant if held is not None else grant).iteration, **record.to_dict(), "ok": ok}
        rec["start_s"] = (record.start if record.start is not None else self.t0) - self.t0
        rec["end_s"] = (record.end if record.end is not None else now) - self.t0
        if len(self.timeline) < MAX_TIMELINE:
            self.timeline.append(rec)
        effects = self._account(rec, held)
        if held is not None and self.is_queued(job_id):
            if not ok and record.lost:  # the worker (or a peer) was lost: redo, not failure
                try:
                    self.rr.abort(job_id, phase)
                except ValueError:
                    pass
            elif ok:
                try:
                    self.rr.on_phase_done(job_id, phase)
                except ValueError:
                    pass  # a stale or duplicate release must not break the group
                if phase != "rollout" and self.rr.iteration(job_id) > held.turn:
                    effects += self._iteration_done(job_id, rec)
                    if job_id in self.moving:  # iteration boundary: a deferred move takes effect
                        self.remove(job_id, self.moving.pop(job_id))
            else:
                self.remove(job_id, f"failed: {record.error}")
                effects.append(Report(job_id, RuntimeEvent(EventKind.FAILED, error=record.error, phase=phase)))
        return rec, effects

    def abort(self, job_id: str, phase: str, reason: str) -> tuple[AbortOutcome, list[Effect]]:
        """The driver lost the worker running ``phase`` of ``job_id`` (``reason``: what was lost)
        and will redo the phase from its start on the job's last committed state.

        Returns (:class:`rollmux.messages.AbortOutcome`: ``aborted``, the grant was withdrawn,
        the phase is granted again when ready; ``done``, the phase was already released as done
        (the worker was lost after its release), so it must not run again; ``none``, no grant
        here (e.g. a restarted controller, or the worker already reported the loss): ask for the
        phase again), effects. Raises PermitError for a job that is not a member (or left)."""
        if not self.is_member(job_id):
            raise PermitError(f"group {self.group_id}: job {job_id!r} is not a member: "
                              f"{self.gone.get(job_id, 'not a member of this group')}")
        held = self.grants.get((job_id, pool_of_phase(phase)))
        if held is not None and held.grant.phase == phase:
            g = held.grant
            rec, effects = self.release(g, PhaseRecord(ok=False, lost=True, error=reason, start=g.granted_at,
                                                       end=self.clock()))
            return AbortOutcome.ABORTED, effects
        # (an asynchronous job's rollout is always among its next phases: it is asked again, "none")
        if held is None and self.is_queued(job_id) and not self.rr.is_running(job_id, phase) \
                and self.members[job_id].confirmed and phase not in self.rr.next_phases(job_id):
            return AbortOutcome.DONE, []
        return AbortOutcome.NONE, []

    def _account(self, rec: dict, held: Optional[_Held]) -> list[Effect]:
        """Per-node occupancy records of the phase (busy / bubble seconds are computed from the
        group's timeline over its lifetime so far, :func:`rollmux.occupancy.occupancy`, by the
        metrics sink), the phase switch, and the job's own phase time of this iteration."""
        dur = max(0.0, rec["end_s"] - rec["start_s"])
        pool = rec["pool"]
        for node in (held.grant.nodes if held is not None else [rec.get("node")]):
            if node is None or len(self._occ_records) >= MAX_TIMELINE:
                continue
            self._occ_nodes[pool].setdefault(str(node), 1.0)
            self._occ_records.append({"pool": pool, "node": str(node), "start_s": rec["start_s"],
                                      "end_s": rec["end_s"], "gpus": rec.get("gpus")})
        effects: list[Effect] = [TimelineChanged(self.group_id, self._occ_records,
                                                 {p: dict(n) for p, n in self._occ_nodes.items()},
                                                 (0.0, self.clock() - self.t0))]
        if rec.get("switch") in ("warm", "cold", "moved"):
            effects.append(PhaseSwitched(rec["switch"], float(rec.get("switch_s") or 0.0)))
        if rec.get("sync_cross_bytes") is not None:
            effects.append(SyncBytes(rec["job_id"], int(rec["sync_cross_bytes"])))
        m = self.members.get(rec["job_id"])
        if m is not None and rec["ok"]:
            m.phase_s[rec["phase"]] = m.phase_s.get(rec["phase"], 0.0) + dur
        return effects

    def _iteration_done(self, job_id: str, rec: dict) -> list[Effect]:
        m = self.members[job_id]
        m.iterations_done = int(rec["iteration"]) + 1  # derived: the grant's index (the driver's count) + 1
        end = rec["end"] if rec.get("end") is not None else self.clock()
        iter_s = end - (m.iter_start or end)
        if m.max_staleness == 0:
            solo_s = sum(m.phase_s.values())  # the job's own phase time: its iteration alone
        else:  # an asynchronous job's rollouts overlap its trainings alone too (rollmux.staleness)
            p = m.phase_s
            solo_s = solo_iteration_s(p.get("rollout", 0.0), p.get("train", 0.0), p.get("sync", 0.0), m.max_staleness)
        phases = dict(m.phase_s)
        cold = not m.iter_s  # its first iteration in this group: the cold start (admission or a move)
        m.iter_s.append(iter_s)
        m.solo_s.append(solo_s)
        tail, m.tail = m.tail, None
        m.iter_start, m.phase_s = end, {}
        # per-job series are exported by the GlobalScheduler alone (it gets this report)
        return [Report(job_id, ProgressReport(m.iterations_done, t_iter_s=iter_s, t_solo_s=solo_s,
                                              slowdown=m.slowdown(), t_roll_s=phases.get("rollout"),
                                              t_train_s=phases.get("train"), t_sync_s=phases.get("sync"),
                                              cold_start=cold,
                                              t_trigger_s=None if tail is None else tail[0],
                                              tail_responses=None if tail is None else tail[1],
                                              tail_migrated=None if tail is None else tail[2]))]

    def slowdown(self, job_id: str) -> Optional[float]:
        m = self.members.get(job_id)
        return None if m is None else m.slowdown()

    # ---- runtime hook: long-tail migration
    def progress(self, job_id: str, done: int, total: int) -> Optional[TailDecision]:
        """Generation progress of the running rollout; a migration decision once per rollout
        (``LongTailPolicy.should_migrate``, RollMux §4.3): the tail / freed worker split, the next
        rollout waiting, and whether the queue slots were released (``acted``)."""
        held = self.grants.get((job_id, "rollout"))
        if held is None or held.grant.phase != "rollout" or held.migrated:
            return None
        if not self.long_tail.should_migrate(done, total):
            return None
        tail, freed = self.long_tail.split_workers(list(held.grant.nodes))
        # the same rule as the simulator's model: act only if another member waits for these nodes
        waiting = list(self.rr.waiting_for(job_id))
        held.migrated = True
        acted = False
        if self.migrate and waiting:
            try:
                self.rr.release(job_id)
                acted = True
            except ValueError:
                pass
        m = self.members.get(job_id)
        if m is not None:
            m.tail = (max(0.0, self.clock() - held.grant.granted_at), total - done, acted)
        decision = TailDecision(job_id=job_id, iteration=held.grant.iteration, done=done, total=total, t=self.clock(),
                                next_rollout=(waiting or [None])[0], tail_workers=tuple(tail),
                                freed_workers=tuple(freed), acted=acted)
        self.migrations.append(decision)
        return decision

    # ---- queries
    def queues(self) -> dict[str, list[str]]:
        return {n: list(self.rr.queue(n)) for n in self.rr.nodes}

    def status(self) -> dict:
        """Members, per-node queues, next phases, iterations, departed/failed jobs, migrations."""
        jobs = {}
        for j in self.rr.job_ids:
            m = self.members[j]
            # iterations_done: derived from the grants (the driver's count); turns: the queues' own
            # counter of this controller instance (restarts with it), not the job's iterations
            jobs[j] = {"next_phase": self.rr.next_phase(j), "running": self.rr.is_running(j),
                       "iterations_done": m.iterations_done, "turns": self.rr.iteration(j), "fenced": sorted(m.fenced),
                       "rollout_nodes": m.rollout_nodes, "train_nodes": m.train_nodes, "slowdown": m.slowdown()}
            if m.max_staleness:  # an asynchronous job: both streams
                jobs[j].update(max_staleness=m.max_staleness, next_phases=list(self.rr.next_phases(j)),
                               rollouts=self.rr.rollouts(j))
        pending = [j for j, m in self.members.items() if not m.active and j not in self.gone]
        return {"group_id": self.group_id, "jobs": jobs, "pending": pending, "gone": dict(self.gone),
                "moving": dict(self.moving), "queues": self.queues(), "order": list(self.order),
                "migrations": [d.to_dict() for d in self.migrations], "timeline_len": len(self.timeline)}
