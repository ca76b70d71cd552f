"""GroupController: runs one co-execution group's meta-iterations (RollMux §4.3, §5.1).

An async Ray actor (one per group, named ``rollmux-group-<gid>``, detached). It drives the pure
:class:`rollmux.round_robin.RoundRobinQueues` (one FIFO queue per node, round-robin admission
order) with real events:

- ``acquire(job_id, phase)`` blocks (an ``asyncio.Event`` per job) until the phase is ready in the
  queues, then grants the permit;
- ``release(job_id, phase, record)`` (called by the worker that ran the phase) records the phase
  in the timeline and enqueues the job's next phase (``on_phase_done``); a failed phase removes
  the job from the queues so its group-mates keep iterating, and tells the GlobalScheduler;
- ``remove_job(job_id, "moved to <group>")`` (departure re-packing moved the job): the removal
  waits for the job's iteration boundary; afterwards its ``acquire`` raises PermitError saying
  it moved, which tells the driver to re-attach to its new group;
- ``progress(job_id, done, total)`` (runtime hook) decides long-tail migration with the policy's
  :class:`rollmux.intra_group.LongTailPolicy` (trigger fraction, default 0.8, DESIGN.md
  "Long-tail migration"); the decision (with the policy's tail / freed worker split) is recorded,
  and with ``migrate=True`` the rollout's queue slots are released (``RoundRobinQueues.release``)
  so the next queued rollout may start.

Timeline records: ``job_id, phase, pool, node, iteration, start, end`` (epoch seconds),
``start_s, end_s`` (seconds since the controller started), ``switch`` (warm | cold),
``switch_s``, ``run_s``, ``offload_s``, ``ok``, ``error``. ``switch`` is ``moved`` for a job's first
phase on a node after departure re-packing moved it there (builder + the state carried over). Metrics: pool busy / bubble seconds,
phase switches (kind); job iterations / slowdown go to the GlobalScheduler, which alone exports
the per-job series (see :mod:`actors.metrics`).

State is soft: a restarted controller (``max_restarts=-1``) starts with empty queues and re-reads
the group's members from the GlobalScheduler (whose checkpoint is the source of truth) when an
unknown job calls; drivers re-join the queues on their next call. Permits granted before the
restart are forgotten (their late releases are recorded but change nothing).
"""

from __future__ import annotations

import asyncio
import time
from typing import Optional

from rollmux.intra_group import LongTailPolicy
from rollmux.round_robin import RoundRobinQueues

from actors import NAMESPACE  # noqa: E402  (re-exported)
DEFAULT_ACQUIRE_TIMEOUT_S = 3600.0
MAX_TIMELINE = 100_000
DEFAULT_LEASE_S = 30.0  # a driver silent this long (no heartbeat, no phase running) is evicted
HEARTBEAT_S = 2.0  # drivers heart-beat this often


def controller_name(group_id: str, scheduler_name: Optional[str] = None) -> str:
    """Actor name of a group's controller: ``rollmux-group-<n>`` for policy group id ``group-<n>``
    (``rollmux-group-<gid>`` otherwise); a non-default scheduler's name replaces ``rollmux``."""
    from actors.global_scheduler import SCHEDULER_NAME

    prefix = scheduler_name if scheduler_name and scheduler_name != SCHEDULER_NAME else "rollmux"
    return f"{prefix}-{group_id}" if group_id.startswith("group-") else f"{prefix}-group-{group_id}"


class PermitError(RuntimeError):
    """A permit cannot be granted: the job left the group (failed / departed) or asked out of order."""


class GroupControllerImpl:
    """The controller's logic (plain class; wrapped with ``ray.remote`` by :func:`create_controller`).

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
    """

    def __init__(self, group_id: str, scheduler_name: Optional[str] = None, *, migrate: bool = False,
                 tail_trigger_fraction: float = 0.8, tail_gpus: int = 1, migration_overhead_s: float = 2.0,
                 metrics_flush_s: float = 1.0,
                 lease_s: float = DEFAULT_LEASE_S, metrics_enabled: bool = True):
        from actors.metrics import RollmuxMetrics

        self.group_id = group_id
        self.scheduler_name = scheduler_name
        self.migrate = migrate
        self.long_tail = LongTailPolicy(tail_trigger_fraction, tail_gpus, migration_overhead_s)
        self.rr = RoundRobinQueues()
        self.t0 = time.time()
        self.timeline: list[dict] = []
        self.members: dict[str, dict] = {}
        self.gone: dict[str, str] = {}  # job_id -> reason it left (failed: ..., departed)
        self.running: dict[str, dict] = {}  # job_id -> grant
        self.moving: dict[str, str] = {}  # job_id -> "moved to <group>" (removal due at its iteration boundary)
        self.migrations: list[dict] = []
        self._events: dict[str, asyncio.Event] = {}
        self._occ_records: list[dict] = []  # one per phase and node, seconds since t0
        self._occ_nodes: dict[str, dict[str, float]] = {"rollout": {}, "train": {}}
        self.metrics = RollmuxMetrics(flush_interval_s=metrics_flush_s, enabled=metrics_enabled)
        self.closed = False
        self.lease_s = float(lease_s)
        self._watchdog = None

    # ---- membership
    async def add_job(self, job_id: str, rollout_nodes: list[str], train_nodes: list[str], *,
                      has_sync: bool = True, slo: Optional[float] = None) -> bool:
        """Record an admitted member (pending: it joins the queues when its driver attaches, so an
        admitted job without a running driver never blocks its group-mates). Idempotent."""
        if job_id in self.members and job_id not in self.gone:
            return self.moving.pop(job_id, None) is not None  # moved back before it left: it stays
        self.gone.pop(job_id, None)
        self.members[job_id] = {"rollout_nodes": list(rollout_nodes), "train_nodes": list(train_nodes),
                                "slo": slo, "has_sync": has_sync, "active": False, "heartbeat": None,
                                "iterations": 0, "iter_start": None, "phase_s": {}, "iter_s": [], "solo_s": []}
        self._wake_all()
        return True

    async def _recover_members(self, job_id: str) -> None:
        """A job this controller does not know (e.g. after a restart: its state is soft): ask the
        GlobalScheduler for the group's active members and re-add them (pending)."""
        if job_id in self.members or not self.scheduler_name:
            return
        try:
            import ray

            sched = ray.get_actor(self.scheduler_name, namespace=NAMESPACE)
            for r in await sched.group_members.remote(self.group_id):
                if r["job_id"] not in self.members:
                    await self.add_job(r["job_id"], r["rollout_nodes"], r["train_nodes"], slo=r.get("slo"))
        except Exception:  # scheduler unreachable: the caller reports "not a member"
            pass

    def _activate(self, job_id: str) -> None:
        m = self.members.get(job_id)
        if m is None or job_id in self.gone:
            why = self.gone.get(job_id, "not a member of this group")
            if why.startswith("moved"):
                raise PermitError(f"group {self.group_id}: job {job_id!r} moved to another group ({why}); "
                                  "re-attach to the group in its scheduler record")
            raise PermitError(f"group {self.group_id}: job {job_id!r} cannot attach: {why}")
        if not m["active"]:
            self.rr.add_job(job_id, m["rollout_nodes"], m["train_nodes"], has_sync=m["has_sync"])
            m["active"] = True
        m["heartbeat"] = time.time()
        self._ensure_watchdog()

    async def attach(self, job_id: str, *, has_sync: Optional[bool] = None) -> dict:
        """The job's driver attached: the job joins the end of its nodes' queues (round-robin
        order = attach order). ``has_sync=False``: its empty sync slot ends with training.
        Raises PermitError for a job that is not a member (or already left)."""
        await self._recover_members(job_id)
        if has_sync is not None:
            self._set_has_sync(job_id, has_sync)
        self._activate(job_id)
        self._wake_all()
        return {"group_id": self.group_id, "queues": {n: list(self.rr.queue(n)) for n in self.rr.nodes},
                "lease_s": self.lease_s}

    async def configure_job(self, job_id: str, *, has_sync: bool = True) -> bool:
        """Declare whether the job has a sync phase (False if not a member)."""
        await self._recover_members(job_id)
        if job_id not in self.members:
            return False
        self._set_has_sync(job_id, has_sync)
        return True

    def _set_has_sync(self, job_id: str, has_sync: bool) -> None:
        """Record whether the job has a sync phase, in the member table and (if it is in them)
        in the round-robin queues, which end a sync-less job's turn with its training."""
        if job_id in self.members:
            self.members[job_id]["has_sync"] = bool(has_sync)
        if job_id in self.rr.job_ids:
            self.rr.set_has_sync(job_id, has_sync)

    async def heartbeat(self, job_id: str) -> bool:
        """Driver liveness (its lease); False when the job is no longer a member."""
        await self._recover_members(job_id)
        m = self.members.get(job_id)
        if m is None or job_id in self.gone:
            return False
        m["heartbeat"] = time.time()
        return True

    def _ensure_watchdog(self) -> None:
        if self._watchdog is None and self.lease_s > 0:
            self._watchdog = asyncio.get_event_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Evict active jobs whose driver stopped heart-beating for ``lease_s`` unless a worker is
        running one of their phases (a crashed driver must not stall its group-mates, DESIGN.md
        "Isolation"); this also frees a permit granted to a driver that died before using it."""
        while not self.closed:
            await asyncio.sleep(min(1.0, self.lease_s / 3))
            now = time.time()
            for j in list(self.rr.job_ids):
                m = self.members[j]
                if self.running.get(j, {}).get("started") or m["heartbeat"] is None \
                        or now - m["heartbeat"] <= self.lease_s:
                    continue  # a phase running on a worker always ends with a release
                err = f"driver lost: no heartbeat for {now - m['heartbeat']:.1f}s (lease {self.lease_s:.1f}s)"
                self._remove(j, f"failed: {err}")
                self._report(j, {"event": "failed", "error": err})

    async def phase_started(self, job_id: str, phase: str) -> bool:
        """The worker began the granted phase (the lease then waits for its release)."""
        g = self.running.get(job_id)
        if g is None or g["phase"] != phase:
            return False
        g["started"] = True
        return True

    async def remove_job(self, job_id: str, reason: str = "departed") -> bool:
        """Drop the job from every queue (departure / failure). False if it was not a member.

        ``reason`` starting with ``"moved"`` (departure re-packing moved the job to another group):
        the removal takes effect at the job's *iteration boundary*. A job in the middle of a
        meta-iteration (a phase granted or running, or its next phase is training / sync) keeps
        its slots here until its iteration's last phase is released; its later ``acquire`` then
        raises PermitError saying it moved. A job between iterations (or never attached) leaves now.
        """
        return self._remove(job_id, reason)

    def _remove(self, job_id: str, reason: str) -> bool:
        if job_id not in self.members or job_id in self.gone:
            return False
        if reason.startswith("moved") and job_id in self.rr.job_ids and \
                (self.rr.is_running(job_id) or self.rr.next_phase(job_id) != "rollout"):
            self.moving[job_id] = reason  # mid-iteration: leave at the boundary (see remove_job)
            return True
        self.moving.pop(job_id, None)
        if job_id in self.rr.job_ids:
            self.rr.remove_job(job_id)
        self.running.pop(job_id, None)
        self.gone[job_id] = reason
        self.metrics.job_ended(job_id, ignore_late=False)  # its per-job totals here (sync bytes) go with it
        self._wake_all()
        return True

    def _wake_all(self) -> None:
        for ev in self._events.values():
            ev.set()

    # ---- permits
    async def acquire(self, job_id: str, phase: str, timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
                      iteration: Optional[int] = None, has_sync: Optional[bool] = None) -> dict:
        """Block until ``phase`` of ``job_id`` may run, then grant it.

        ``iteration``: the driver's own iteration index (kept in the records; the queues' count
        restarts with a restarted controller); ``has_sync``: whether the job has a sync phase
        (re-declared on every call so a restarted controller knows it). Returns ``{job_id, phase, pool, nodes, iteration,
        granted_at, waited_s, group_id}``.
        Raises PermitError: the job is not (or no longer) a member, or asks a phase out of order;
        TimeoutError after ``timeout_s``.
        """
        t_start = time.time()
        deadline = t_start + timeout_s
        if job_id in self.members:
            self.members[job_id]["heartbeat"] = t_start  # a calling driver is alive
        ev = self._events.setdefault(job_id, asyncio.Event())
        for _ in range(10_000_000):  # bounded; each pass waits for a state change
            if job_id not in self.rr.job_ids:
                await self._recover_members(job_id)
                if has_sync is not None:
                    self._set_has_sync(job_id, has_sync)
                self._activate(job_id)  # raises PermitError for a non-member / a job that left
            nxt = self.rr.next_phase(job_id)
            if nxt != phase:
                raise PermitError(f"group {self.group_id}: job {job_id!r} asked for {phase} but its next phase is {nxt}")
            if any(r.job_id == job_id for r in self.rr.ready()):
                rp = self.rr.grant(job_id, phase)
                grant = {"job_id": job_id, "phase": phase, "pool": rp.pool, "nodes": list(rp.nodes),
                         "iteration": rp.iteration if iteration is None else int(iteration),
                         "rr_iteration": rp.iteration, "granted_at": time.time(),
                         "waited_s": time.time() - t_start, "group_id": self.group_id}
                self.running[job_id] = grant
                m = self.members[job_id]
                if phase == "rollout" and m["iter_start"] is None:
                    m["iter_start"] = grant["granted_at"]
                return grant
            ev.clear()
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError(f"group {self.group_id}: no permit for {job_id}/{phase} within {timeout_s:.0f}s")
            try:
                await asyncio.wait_for(ev.wait(), timeout=min(left, 5.0))
            except asyncio.TimeoutError:
                pass
        raise TimeoutError("acquire loop bound reached")  # pragma: no cover

    async def release(self, job_id: str, phase: str, record: dict) -> dict:
        """The worker finished ``phase`` (``record``: node, start, end, switch, switch_s, ok, error, ...).

        A successful phase enqueues the job's next phase; a failed one removes the job from the
        queues (group-mates continue) and reports the failure to the GlobalScheduler.
        Returns the stored timeline record.
        """
        grant = self.running.pop(job_id, None)
        ok = bool(record.get("ok", True))
        rec = {"job_id": job_id, "phase": phase, "group_id": self.group_id,
               "pool": "rollout" if phase == "rollout" else "train",
               "iteration": grant["iteration"] if grant else record.get("iteration"), **record, "ok": ok}
        rec["start_s"] = rec.get("start", self.t0) - self.t0
        rec["end_s"] = rec.get("end", time.time()) - self.t0
        if len(self.timeline) < MAX_TIMELINE:
            self.timeline.append(rec)
        self._account(rec, grant)
        if grant is not None and job_id in self.rr.job_ids:  # a release without our grant changes nothing
            if ok:
                try:
                    self.rr.on_phase_done(job_id, phase)
                except ValueError:
                    pass  # a stale or duplicate release must not break the group
                if self.rr.iteration(job_id) > grant["rr_iteration"]:
                    self._iteration_done(job_id, rec)
                    if job_id in self.moving:  # iteration boundary: a deferred move takes effect
                        self._remove(job_id, self.moving.pop(job_id))
            else:
                self._remove(job_id, f"failed: {record.get('error')}")
                self._report(job_id, {"event": "failed", "error": record.get("error"), "phase": phase})
        self._wake_all()
        return rec

    def _account(self, rec: dict, grant: Optional[dict]) -> None:
        dur = max(0.0, rec["end_s"] - rec["start_s"])
        pool = rec["pool"]
        for node in (grant or {}).get("nodes", [rec.get("node")]):
            if node is None or len(self._occ_records) >= MAX_TIMELINE:
                continue
            self._occ_nodes[pool].setdefault(str(node), 1.0)
            self._occ_records.append({"pool": pool, "node": str(node), "start_s": rec["start_s"],
                                      "end_s": rec["end_s"], "gpus": rec.get("gpus")})
        # busy / bubble from the timeline over the group's lifetime so far (rollmux.occupancy)
        self.metrics.group_timeline(self.group_id, self._occ_records,
                                    {p: dict(n) for p, n in self._occ_nodes.items()}, (0.0, time.time() - self.t0))
        if rec.get("switch") in ("warm", "cold", "moved"):
            self.metrics.phase_switch(rec["switch"], float(rec.get("switch_s") or 0.0))
        if rec.get("sync_cross_bytes") is not None:
            self.metrics.sync_cross_bytes(rec["job_id"], int(rec["sync_cross_bytes"]))
        m = self.members.get(rec["job_id"])
        if m is not None and rec["ok"]:
            m["phase_s"][rec["phase"]] = m["phase_s"].get(rec["phase"], 0.0) + dur

    def _iteration_done(self, job_id: str, rec: dict) -> None:
        m = self.members[job_id]
        m["iterations"] = int(rec["iteration"]) + 1 if rec.get("iteration") is not None else m["iterations"] + 1
        end = rec.get("end", time.time())
        iter_s = end - (m["iter_start"] or end)
        solo_s = sum(m["phase_s"].values())  # the job's own phase time: its iteration alone
        m["iter_s"].append(iter_s)
        m["solo_s"].append(solo_s)
        m["iter_start"], m["phase_s"] = end, {}
        slowdown = (sum(m["iter_s"]) / sum(m["solo_s"])) if sum(m["solo_s"]) > 0 else None
        # per-job series are exported by the GlobalScheduler alone (it gets this report): one series per job
        self._report(job_id, {"event": "iteration", "iterations_done": m["iterations"], "t_iter_s": iter_s,
                              "t_solo_s": solo_s, "slowdown": slowdown})

    def _report(self, job_id: str, event: dict) -> None:
        if not self.scheduler_name:
            return
        try:
            import ray

            ray.get_actor(self.scheduler_name, namespace=NAMESPACE).report.remote(job_id, event)
        except Exception:  # scheduler restarting: the event is soft state
            pass

    # ---- runtime hook: long-tail migration
    async def progress(self, job_id: str, done: int, total: int) -> Optional[dict]:
        """Generation progress of the running rollout; returns a migration decision once per rollout.

        The rollout is tail-bound per ``LongTailPolicy.should_migrate`` (RollMux §4.3).
        """
        grant = self.running.get(job_id)
        if grant is None or grant["phase"] != "rollout" or grant.get("migrated"):
            return None
        if not self.long_tail.should_migrate(done, total):
            return None
        tail, freed = self.long_tail.split_workers(grant["nodes"])
        # the same rule as the simulator's model: act only if another member waits for these nodes
        waiting = list(self.rr.waiting_for(job_id))
        decision = {"job_id": job_id, "iteration": grant["iteration"], "done": done, "total": total,
                    "t": time.time(), "next_rollout": (waiting or [None])[0],
                    "tail_workers": list(tail), "freed_workers": list(freed), "acted": False}
        grant["migrated"] = True
        if self.migrate and decision["next_rollout"] is not None:
            try:
                self.rr.release(job_id)
                decision["acted"] = True
                self._wake_all()
            except ValueError:
                pass
        self.migrations.append(decision)
        return decision

    # ---- queries
    async def get_timeline(self, since: int = 0) -> list[dict]:
        """Timeline records from index ``since``."""
        return self.timeline[since:]

    async def status(self) -> dict:
        """Members, per-node queues, next phases, iterations, departed/failed jobs, migrations."""
        jobs = {}
        for j in self.rr.job_ids:
            m = self.members[j]
            jobs[j] = {"next_phase": self.rr.next_phase(j), "running": self.rr.is_running(j),
                       "iterations": self.rr.iteration(j), "rollout_nodes": m["rollout_nodes"],
                       "train_nodes": m["train_nodes"],
                       "slowdown": (sum(m["iter_s"]) / sum(m["solo_s"])) if sum(m["solo_s"]) > 0 else None}
        pending = [j for j, m in self.members.items() if not m["active"] and j not in self.gone]
        return {"group_id": self.group_id, "jobs": jobs, "pending": pending, "gone": dict(self.gone),
                "moving": dict(self.moving),
                "queues": {n: list(self.rr.queue(n)) for n in self.rr.nodes},
                "migrations": list(self.migrations), "timeline_len": len(self.timeline),
                "metrics": {k: dict(v) for k, v in self.metrics.totals.items()}}

    async def ping(self) -> str:
        return self.group_id


def create_controller(group_id: str, scheduler_name: Optional[str] = None, **kw):
    """Get or create the named, detached controller of ``group_id`` (async actor, 0 CPUs)."""
    import ray

    from actors.runtime_client import control_plane_resources

    cls = ray.remote(GroupControllerImpl)
    return cls.options(name=controller_name(group_id, scheduler_name), namespace=NAMESPACE,
                       lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=-1,
                       resources=control_plane_resources(), max_concurrency=1000).remote(group_id, scheduler_name, **kw)
