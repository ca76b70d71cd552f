"""GlobalScheduler: the single owner of RollMux's group table on a Ray cluster (RollMux §4.2, §5).

One named, detached actor (``rollmux-global-scheduler`` in namespace ``rollmux``, get-if-exists,
``max_restarts=-1``). It admits jobs by calling the policy (:class:`rollmux.admission.
InterGroupScheduler`, Alg. 1; no second copy here), tracks each job's lifecycle
(:class:`rollmux.records.JobState`: admitted -> running -> finished | failed) in one
:class:`rollmux.records.JobRecord` per job, and releases nodes on departure or failure. After a
departure it calls the policy's departure re-packing (``InterGroupScheduler.repack``); the moves
it commits are appended to the moved jobs' records (:class:`rollmux.records.MoveRecord`).

Where a job is placed is the policy's fact: a record's ``group_id`` / ``placement`` /
``controller`` are read from the policy's table while the job is active and frozen into the
record when it ends. Controller names derive from the group id (:func:`actors.naming.controller_name`).

The singleton never waits on a controller. The *target state* (job records + the policy's
snapshot) is checkpointed to a KV store (:mod:`actors.kv`; Ray GCS internal KV by default, a
file directory with ``checkpoint_path``) first, as ONE write-ahead record per state change
(:mod:`actors.checkpoint`: a crash before the write means the change never happened, after it
that it did; a failed write rolls the change back; a bad checkpoint refuses to start); then each touched group's controller gets the
group's target membership pushed asynchronously (``GroupController.sync_members``, stamped with
an increasing sequence number so a late push never undoes a newer one), and a reconcile thread
re-pushes until each push is acknowledged and, every ``RECONCILE_FULL_S``, re-pushes every
group (a restarted controller converges). A failing reconcile pass is logged and the loop goes
on; its duration is the gauge ``rollmux_reconcile_seconds``. Controllers are created lazily,
when a job's driver attaches (``ensure_controller``). A restarted scheduler restores the
checkpoint and re-finds the named, detached controllers. No admitted job is lost when the actor
dies.

Contract (docs/ARCHITECTURE.md "GlobalScheduler actor contract"): every method returns
JSON-able dicts / lists; refusals are values (``AdmissionDecision.to_dict()`` with ``admitted:
False`` and a ``code``), not exceptions. Codes besides the policy's (ok | never | retry_later):
``invalid`` (spec fails validation) and ``duplicate`` (the job id is admitted or running with a
different spec; the same spec again gets the original decision, ``replayed: True``). Ended jobs'
workers are told to drop the job's state (:meth:`release_workers_once`); admitted jobs that no
driver attaches to expire (:meth:`expire_unattached`); a failed job's ``error`` is written for
people (:func:`rollmux.records.explain_failure`), the raw error kept in ``error_detail``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import threading
import time
import uuid
from typing import Any, Optional

from pydantic import ValidationError

from actors.checkpoint import Checkpoint, CheckpointError  # noqa: F401  (CheckpointError re-exported)
from actors.kv import make_kv
from actors.metrics import RollmuxMetrics
from actors.naming import (  # noqa: F401  (NAMESPACE, SCHEDULER_NAME, get_scheduler re-exported)
    NAMESPACE, SCHEDULER_NAME, control_plane_resources, controller_name, ensure_ray, get_actor, get_scheduler,
    hosted_key,
)
from rollmux.admission import AdmissionDecision, InterGroupScheduler, SchedulerConfig, load_scheduler_config
from rollmux.admission_queue import QUEUE_AHEAD_REASON, AdmissionQueue, QueueFull, what_if
from rollmux.models import ClusterSpec, JobSpec
from rollmux.nodes import node_index
from rollmux.records import JobRecord, JobState, MoveRecord, NodePlacement, explain_failure, queued_records

log = logging.getLogger("rollmux.scheduler")

MAX_FINISHED_RECORDS = 5000
RECONCILE_S = 1.0  # the reconcile loop's period, s
RECONCILE_FULL_S = 15.0  # every group's controller is re-pushed this often, s
PUSH_RETRY_S = 10.0  # an unacknowledged push is sent again after this long, s
QUERY_TIMEOUT_S = 10.0  # the one query that reads a controller (group_timeline), s
GROUP_COMMIT_WINDOW_S = 0.002  # a batch of the HTTP path's decisions collects this long before its one write, s
SNAPSHOT_LOG = 4096  # published deltas kept for replicas catching up (older: a full snapshot)


def _locked(fn):
    """Run a public method under the scheduler's lock (the reconcile thread reads the state)."""

    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        with self._lock:
            return fn(self, *args, **kwargs)

    return run


class GlobalSchedulerImpl:
    """The scheduler's logic (plain class, wrapped by :func:`get_or_create_scheduler`).

    Args:
        cluster: the cluster spec (dict or :class:`ClusterSpec`).
        checkpoint_path: directory for a :class:`actors.kv.FileKV`; ``None`` uses Ray's GCS KV.
        name: this actor's name (checkpoint key and controller-name prefix).
        config: the scheduler settings (:class:`rollmux.admission.SchedulerConfig` or its dict);
            default ``configs/scheduler.yaml`` (the file ``rollmux simulate --config`` reads
            too). Raises :class:`rollmux.config.ConfigError` for a bad file.
        policy / max_group_size / seed / repack_on_departure: override the config's values when
            given (a copy of the config with them). The whole config is kept in the checkpoint
            (a restored scheduler keeps its settings).
        kv: an explicit :class:`actors.kv.KVStore` (unit tests: ``MemoryKV``).
        create_controllers: False for unit tests without Ray (no GroupControllers, no reconcile thread).
        controller_kw: keyword arguments of new GroupControllers (e.g. ``lease_s``, ``migrate``).
    """

    def __init__(self, cluster: dict | ClusterSpec, checkpoint_path: Optional[str] = None, *,
                 name: str = SCHEDULER_NAME, policy: Optional[str] = None, max_group_size: Optional[int] = None,
                 seed: Optional[int] = None, kv=None, create_controllers: bool = True, metrics_flush_s: float = 1.0,
                 controller_kw: Optional[dict] = None, repack_on_departure: Optional[bool] = None,
                 config: Optional[dict | SchedulerConfig] = None):
        self.cluster = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.model_validate(cluster)
        self.name = name
        self.kv = kv if kv is not None else make_kv(checkpoint_path, namespace=NAMESPACE)
        self.create_controllers = create_controllers
        self.controller_kw = dict(controller_kw or {})
        self.metrics = RollmuxMetrics(flush_interval_s=metrics_flush_s, enabled=create_controllers)
        self.jobs: dict[str, JobRecord] = {}
        self.restored = False
        self._lock = threading.RLock()
        self._handles: dict[str, Any] = {}  # group_id -> controller handle (soft; groups with a controller)
        self._dirty: dict[str, int] = {}  # group_id -> seq of the push not yet acknowledged
        self._inflight: dict[str, tuple[int, Any, float]] = {}  # group_id -> (seq, ObjectRef, sent at)
        self._seq = time.time_ns()  # push sequence (increasing across restarts)
        # group commit (the HTTP path's admit_batched / depart_batched): changes wait here for ONE write
        self._defer = False
        self._pending_jobs: dict[str, None] = {}
        self._pending_groups: dict[str, None] = {}
        self._pending_push: dict[str, None] = {}
        self._dropped: list[str] = []
        self._queue_dirty = False
        self._waiters: list[Any] = []  # asyncio futures of the batch being collected
        self._flush_scheduled = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # the published snapshot: one version per commit, deltas kept for Serve replicas
        self.epoch = uuid.uuid4().hex
        self.version = 0
        self._deltas: collections.deque[dict] = collections.deque(maxlen=SNAPSHOT_LOG)
        self._published: Optional[asyncio.Event] = None
        self._written: Optional[dict] = None
        self._ended_since_prune = True  # a job ended since ended records were last counted (O(jobs) scan)  # the last write-ahead record (its group snapshots are published)
        self._reopt_pending: dict[str, str] = {}  # admitted job -> its group, to re-optimise (reconcile thread)
        self._releases: list[tuple[str, Optional[str], list[str]]] = []  # (job, admission, nodes) to release
        self.release_workers = create_controllers  # ended jobs' workers are told to drop their state
        self.store = Checkpoint(self.kv, name)
        self.queue: Optional[AdmissionQueue] = None
        state = self.store.load()  # raises CheckpointError (naming the store) for a bad checkpoint
        if state is not None:
            self._load_state(state)
            self.restored = True
            if self.store._legacy:  # a version-1 checkpoint: rewritten as a base once
                self.store.create(self._full_state())
        else:
            base = load_scheduler_config() if config is None else SchedulerConfig.model_validate(
                config.model_dump() if isinstance(config, SchedulerConfig) else config)
            overrides = {k: v for k, v in {"policy": policy, "max_group_size": max_group_size, "seed": seed,
                                           "repack_on_departure": repack_on_departure}.items() if v is not None}
            cfg = SchedulerConfig.model_validate({**base.model_dump(), **overrides})
            self.igs = InterGroupScheduler(self.cluster, config=cfg)
            self.store.create(self._full_state())
        self.queue = AdmissionQueue.from_config(self.igs.config)
        legacy_queue = self.kv.get(self._qkey())  # the previous layout kept the line under its own key
        self.queue.restore(state["queue"] if state is not None and state.get("queue") is not None else legacy_queue)
        for jid in [q.job_id for q in self.queue.jobs()]:  # (previous layout) admitted before a crash between two writes
            if jid in self.jobs and self.jobs[jid].state.is_active():
                self.queue.remove(jid)
        if legacy_queue is not None:  # the line moves into a base (one put), then the old key goes
            self.store.compact(self._full_state())
            self.kv.delete(self._qkey())
        # new GroupControllers carry the config's long-tail settings; explicit controller_kw wins
        self.controller_kw = {**self.igs.config.controller_settings(), **self.controller_kw}
        self._stop = threading.Event()
        self._reconciler: Optional[threading.Thread] = None
        if self.create_controllers:
            self._refind_controllers()
            self._reconciler = threading.Thread(target=self._reconcile_loop, name="rollmux-reconcile", daemon=True)
            self._reconciler.start()

    # ---- where a job is (the policy's table)
    def _group_id(self, rec: JobRecord) -> Optional[str]:
        if rec.state.is_active():
            g = self.igs.group_of(rec.job_id)
            return None if g is None else g.group_id
        return rec.group_id

    def _view(self, rec: JobRecord) -> JobRecord:
        """The record with its placement read from the policy (active) or as frozen (ended)."""
        if not rec.state.is_active():
            return rec
        m = self.igs.member(rec.job_id)
        if m is None:
            return rec
        gid = self.igs.group_of(rec.job_id).group_id
        return rec.model_copy(update={
            "group_id": gid, "controller": controller_name(gid, self.name),
            "placement": NodePlacement(rollout_nodes=list(m.placement.rollout_nodes),
                                       train_nodes=list(m.placement.train_nodes))})

    def _active_by_group(self) -> dict[str, list[JobRecord]]:
        """Active records per group, in the records' admission order."""
        out: dict[str, list[JobRecord]] = {}
        for rec in self.jobs.values():
            gid = self._group_id(rec) if rec.state.is_active() else None
            if gid is not None:
                out.setdefault(gid, []).append(rec)
        return out

    def _qkey(self) -> str:
        """The admission queue's KV key of the previous layout (read once, moved into a base and
        deleted): the line now travels in the write-ahead record of the commit that changes it."""
        return f"{self.store.prefix}.queue"

    @staticmethod
    def _stored(rec: JobRecord) -> dict:
        """What the checkpoint keeps of a record: an active job's placement is the policy's
        (stored in its group), so only an ended job's frozen placement is written."""
        if rec.state.is_active():
            rec = rec.model_copy(update={"group_id": None, "placement": None, "controller": None})
        return rec.stored()

    # ---- checkpoint: a base snapshot plus a write-ahead log, one atomic write per state change
    def _delta(self, jobs: tuple = (), groups: tuple = (), dropped: tuple = (), queue: bool = False) -> dict:
        """What one state change wrote: the given job records and groups (None: gone), the
        policy's snapshot header, the records dropped from the table and, when
        ``queue``, the whole admission queue (in the same record: one atomic put)."""
        return {"header": self.igs.snapshot_header(),
                "groups": {gid: self.igs.group_snapshot(gid) for gid in groups},
                "jobs": {j: self._stored(self.jobs[j]) for j in jobs if j in self.jobs}, "dropped": list(dropped),
                **({"queue": self.queue.snapshot()} if queue else {})}

    def _checkpoint(self, jobs: tuple = (), groups: tuple = ()) -> None:
        """Commit a state change of ``jobs`` / ``groups``: at once, or (inside :meth:`admit_batched` /
        :meth:`depart_batched`, group commit) with the batch being collected, in ONE write for the
        batch. Either way every change waiting is written, then published (:meth:`snapshot_since`)."""
        self._pending_jobs.update(dict.fromkeys(jobs))
        self._pending_groups.update(dict.fromkeys(groups))
        if not self._defer:
            self._flush(force=True)

    def _flush(self, force: bool = False) -> None:
        """Write every change waiting (one checkpoint write), publish it as the next snapshot
        version, push the touched groups' controllers and release the batch's waiters. A failed
        write restores the last written state (nothing of the batch happened) and fails the waiters."""
        jobs, groups = tuple(self._pending_jobs), tuple(self._pending_groups)
        queue_changed, pushes, waiters = self._queue_dirty, tuple(self._pending_push), self._waiters
        self._pending_jobs, self._pending_groups, self._pending_push, self._waiters = {}, {}, {}, []
        self._queue_dirty = False
        if not (force or jobs or groups or queue_changed or waiters):
            return
        try:
            self._write(jobs, groups, queue_changed)
        except Exception as e:
            log.exception("checkpoint write failed: the batch of %d waiting calls is undone", len(waiters))
            self._reload()
            self._resolve(waiters, e)
            raise
        dropped, self._dropped = self._dropped, []
        self._publish(jobs, groups, dropped, queue_changed)
        self._push(pushes)
        self._resolve(waiters, None)

    def _reload(self) -> None:
        """Back to the last written state after a failed write (the uncommitted changes never happened)."""
        state = self.store.load()
        if state is not None:
            self._load_state(state)
            self.queue.restore(state.get("queue"))
        self._ended_since_prune = True
        self._publish_full()

    def _write(self, jobs: tuple = (), groups: tuple = (), queue: bool = False) -> None:
        """Commit one state change: ONE write-ahead record (:class:`actors.checkpoint.Checkpoint`)
        carrying the changed job records and groups and, when ``queue``, the admission queue (a
        crash before it: the change never happened; after it: it did). Records of ended jobs beyond MAX_FINISHED_RECORDS are
        dropped in the same record. Raises (and the caller rolls back) when the store fails."""
        drop: tuple = ()
        if self._ended_since_prune:  # only a change that ended a job can push the ended records over the bound
            done = [j for j, r in self.jobs.items() if not r.state.is_active()]
            drop = tuple(done[: max(0, len(done) - MAX_FINISHED_RECORDS)])
        delta = self._delta(jobs, groups, drop, queue)
        self.store.append(delta)
        self._written = delta  # its header and group snapshots are published as they were written
        for j in drop:
            self.jobs.pop(j, None)
        self._dropped.extend(drop)
        self._ended_since_prune = False
        if self.store.wants_compaction():  # the change is committed: a failing compaction is retried later
            try:
                self.store.compact(self._full_state())
            except Exception:
                log.exception("checkpoint compaction failed; the write-ahead records stay and it is retried")

    def _full_state(self) -> dict:
        return {"header": self.igs.snapshot_header(),
                "groups": {g.group_id: self.igs.group_snapshot(g.group_id) for g in self.igs.groups},
                "jobs": {j: self._stored(r) for j, r in self.jobs.items()},
                "queue": None if self.queue is None else self.queue.snapshot()}

    def _load_state(self, state: dict) -> None:
        """Rebuild the policy's table and the job records from a restored state (see
        :meth:`actors.checkpoint.Checkpoint.load`)."""
        groups = [g for g in state["groups"].values() if g]
        self.igs = InterGroupScheduler.restore(self.cluster, {**state["header"], "groups": groups})
        jobs = {}
        for raw in state["jobs"].values():
            rec = JobRecord.model_validate(raw)
            jobs[rec.job_id] = rec
        self.jobs = dict(sorted(jobs.items(), key=lambda kv: kv[1].admitted_at or 0.0))

    @contextlib.contextmanager
    def _transaction(self):
        """Roll the policy's table and the active records back when the body raises (e.g. the
        checkpoint write failed): a state change that was not committed did not happen."""
        saved = self.igs.snapshot()
        jobs = {j: r.model_copy(deep=True) if r.state.is_active() else r for j, r in self.jobs.items()}
        try:
            yield
        except Exception:
            self.igs = InterGroupScheduler.restore(self.cluster, saved)
            self.jobs = jobs
            raise

    # ---- controllers: handles, asynchronous pushes, the reconcile loop
    def _controller(self, group_id: str, create: bool = False, lookup: bool = True):
        """The group's controller handle: cached; else looked up by name (``lookup``; off on the
        admission / departure path, where only cached handles are used); created when ``create``."""
        if not self.create_controllers:
            return None
        h = self._handles.get(group_id)
        if h is None and (lookup or create):
            try:
                h = get_actor(controller_name(group_id, self.name))
            except ValueError:
                if not create:
                    return None
                from actors.group_controller import create_controller

                h = create_controller(group_id, self.name, **self.controller_kw)
            self._handles[group_id] = h
        return h

    def _target(self, group_id: str) -> tuple[list[dict], dict[str, str]]:
        """The membership a group's controller must converge to: its active members (in the
        planned round-robin order: the policy's member order, which admission's SLO check
        simulated) and the jobs that left it, with the reason (``departed``, ``failed``, ``moved to
        <group>``)."""
        members, gone = [], {}
        for rec in self.jobs.values():
            gid = self._group_id(rec)
            if gid == group_id and rec.state.is_active():
                pl = self._view(rec).placement
                members.append({"job_id": rec.job_id, "rollout_nodes": pl.rollout_nodes,
                                "train_nodes": pl.train_nodes, "slo": rec.slo})
            elif gid == group_id:
                gone[rec.job_id] = "departed" if rec.state == JobState.FINISHED else str(rec.state)
            elif any(m.from_group == group_id for m in rec.moves):
                gone[rec.job_id] = f"moved to {gid}"
        try:  # the planned round-robin order: the group's member order in the policy's table
            rank = {j: i for i, j in enumerate(self.igs.group(group_id).job_ids)}
            members.sort(key=lambda m: rank.get(m["job_id"], len(rank)))
        except KeyError:
            pass
        return members, gone

    def _push(self, groups, lookup: bool = False) -> None:
        """Send each group's target membership to its controller, if it has one; never waits.
        ``lookup``: also find controllers not cached yet by name (restart, reconcile thread).
        Inside a group commit the pushes wait for the batch's write (target state first)."""
        if self._defer and not lookup:
            self._pending_push.update(dict.fromkeys(groups))
            return
        for gid in dict.fromkeys(groups):
            h = self._controller(gid, lookup=lookup)
            if h is None:  # no controller (yet, or any more): nothing to converge until one is created
                self._dirty.pop(gid, None)
                self._inflight.pop(gid, None)
                continue
            self._seq += 1
            members, gone = self._target(gid)
            try:
                ref = h.sync_members.remote(members, gone, self._seq,
                                            dissolved=self.igs.group_snapshot(gid) is None)
            except Exception as e:  # the handle is stale: the next reconcile pass looks it up again
                log.warning("push to the controller of %s failed: %s", gid, e)
                self._handles.pop(gid, None)
                self._dirty[gid] = self._seq
                continue
            self._dirty[gid] = self._seq
            self._inflight[gid] = (self._seq, ref, time.monotonic())

    def reconcile_once(self) -> dict:
        """One reconcile pass: acknowledged pushes are cleared; failed or overdue ones are sent
        again (``full``: every group with a controller is re-pushed). Returns ``{pushed, acked}``.
        Waits on nothing (``ray.wait`` with timeout 0)."""
        import ray

        with self._lock:
            inflight = dict(self._inflight)
        acked, redo = [], []
        if inflight:
            refs = [v[1] for v in inflight.values()]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready_ids = {r.hex() for r in ready}
            for gid, (seq, ref, sent) in inflight.items():
                if ref.hex() in ready_ids:
                    try:
                        ray.get(ref, timeout=0)
                        acked.append((gid, seq))
                    except Exception as e:  # the controller died or raised: push again
                        log.warning("controller of %s did not take push %d: %s", gid, seq, e)
                        redo.append(gid)
                elif time.monotonic() - sent > PUSH_RETRY_S:
                    redo.append(gid)
        with self._lock:
            for gid, seq in acked:
                if self._inflight.get(gid, (None,))[0] == seq:
                    self._inflight.pop(gid, None)
                if self._dirty.get(gid) == seq:
                    del self._dirty[gid]
                if self.igs.group_snapshot(gid) is None and gid not in self._dirty:
                    self._handles.pop(gid, None)  # a dissolved group's controller has its final state
            # a named, detached controller keeps its handle across restarts: re-push with it (a
            # slow start is not a death; dropping the handle here would forget the group)
            again = [g for g in self._dirty if g not in self._inflight or g in redo]
            self._push(again, lookup=True)
        return {"pushed": again, "acked": [g for g, _ in acked]}

    def release_workers_once(self, lookup=None) -> list[tuple[str, str]]:
        """Tell the workers of jobs that ended (finished, failed, evicted, expired) to drop their
        state (``unregister_job``: stored state, pending weights, sync endpoint, cold-start file),
        also when the driver died and never said goodbye. Fire and forget; a worker that does not
        exist hosts nothing. ``lookup``: name -> handle (default :func:`actors.naming.get_actor`).
        Returns the (job, node) pairs sent."""
        from actors.naming import worker_name

        lookup = lookup or get_actor
        with self._lock:
            todo, self._releases = self._releases, []
        sent = []
        for job_id, admission, nodes in todo:
            for node in dict.fromkeys(nodes):
                try:
                    lookup(worker_name(node)).unregister_job.remote(hosted_key(job_id, self.name), admission)
                    sent.append((job_id, node))
                except ValueError:
                    continue
                except Exception as e:
                    log.warning("release of %s on %s failed: %s", job_id, node, e)
        return sent

    def _reconcile_loop(self) -> None:
        """Converge every controller to the target state; a failing pass is logged, never fatal."""
        last_full = time.monotonic()
        while not self._stop.wait(RECONCILE_S):
            t0 = time.perf_counter()
            try:
                if time.monotonic() - last_full >= RECONCILE_FULL_S:
                    last_full = time.monotonic()
                    # every group with a controller (a restarted controller keeps its handle)
                    with self._lock:
                        self._push([g for g in self._active_by_group() if g in self._handles])
                self.reoptimise_pending()
                self.reconcile_once()
                self.expire_unattached()
                self.release_workers_once()
            except Exception:
                log.exception("reconcile pass failed; continuing")
            self.metrics.reconcile(time.perf_counter() - t0)

    def _refind_controllers(self) -> None:
        """After a (re)start: re-find each group's controller and push its target state (also the
        groups jobs moved out of, so a crash between the checkpoint and a push loses no move)."""
        groups = set(self._active_by_group())
        groups |= {m.from_group for r in self.jobs.values() if r.state.is_active() for m in r.moves}
        groups |= self._leftover_controllers()  # groups dissolved while no scheduler ran: told so, they exit
        self._push(sorted(groups), lookup=True)

    def _leftover_controllers(self) -> set[str]:
        """Groups of this scheduler that no longer exist but still have a live controller (the
        scheduler died between a group's end and its last push)."""
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
                gid = name[len(prefix):]
                if self.igs.group_snapshot(gid) is None:
                    out.add(gid)
        return out

    def close(self) -> None:
        """Stop the reconcile thread (tests; the actor otherwise lives until killed)."""
        self._stop.set()

    @_locked
    def group_members(self, group_id: str) -> list[dict]:
        """Active members of a group: ``job_id, rollout_nodes, train_nodes, slo`` (planned
        round-robin order)."""
        return self._target(group_id)[0]

    @_locked
    def ensure_controller(self, group_id: str) -> str:
        """Create (if needed) the group's GroupController and push its members; its name.

        Controllers are created lazily, when a job's driver attaches, so admissions that never run
        (HTTP what-if traffic, benchmarks) start no actors. Does not wait for the controller (a
        controller asked by a job it does not know yet reads :meth:`group_members`). Raises
        KeyError for a group without an active job."""
        if group_id not in self._active_by_group():
            raise KeyError(f"no active job in group {group_id!r}")
        self._controller(group_id, create=True)
        self._push([group_id])
        return controller_name(group_id, self.name)

    # ---- admission
    @_locked
    def admit(self, spec: dict, dry_run: bool = False, queue: bool = False, explain: str = "full") -> dict:
        """Admit (or, with ``dry_run``, only evaluate) a job: ``AdmissionDecision.to_dict()``.

        On admission the job record and its group are checkpointed, then the group's controller
        (if it exists) gets the new membership pushed; the admission's neighbourhood is
        re-optimised afterwards, off the admission path (:meth:`reoptimise_pending`). ``queue``: a job that does not fit now
        (``retry_later``) is held by the admission queue (:mod:`rollmux.admission_queue`) instead
        of refused: code ``queued`` with ``queue_position``; a full queue refuses with code
        ``queue_full``. While jobs are queued, a new job larger than a queued one waits behind it
        (code ``retry_later`` without ``queue``). ``explain="chosen"``: an admission lists only the
        chosen candidate (:meth:`rollmux.admission.AdmissionDecision.to_dict`). Source: RollMux
        §4.2, Alg. 1.
        """
        t0 = time.perf_counter()
        try:
            job = JobSpec.model_validate(spec)
        except ValidationError as e:
            jid = spec.get("job_id") if isinstance(spec, dict) else None
            return self._refusal(jid, "invalid", f"invalid job spec: {e}", t0, dry_run)
        sha = hashlib.sha256(json.dumps(job.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
        old = self.jobs.get(job.job_id)
        if old is not None and old.state.is_active():
            if old.spec_sha256 == sha and old.decision is not None:  # a retry: the original decision, again
                now = self._view(old)  # with where the job is now (a re-packing may have moved it)
                return {**old.decision, "group_id": now.group_id, "replayed": True,
                        "placement": now.placement.model_dump(mode="json") if now.placement else None}
            return self._refusal(job.job_id, "duplicate", f"job {job.job_id!r} is already {old.state} with a "
                                 "different spec", t0, dry_run)
        if job.job_id in self.queue:
            return self._refusal(job.job_id, "duplicate", f"job {job.job_id!r} is already queued (position "
                                 f"{self.queue.position(job.job_id)})", t0, dry_run)
        if dry_run:  # the same function answers the Serve replicas' dry-runs from their snapshot copy
            return what_if(self.igs, job, [q.gpus for q in self.queue.jobs()], backfill=self.queue.backfill,
                           queue=queue, explain=explain)
        if not self.queue.may_try_now(job):  # queued jobs first: a larger newcomer waits behind them
            why = QUEUE_AHEAD_REASON(len(self.queue))
            if queue:
                return self._enqueue(job, why, t0)
            return self._refusal(job.job_id, "retry_later", why, t0, dry_run)
        decision = self.igs.decide(job)
        out = decision.to_dict(explain)
        if queue and not out.get("admitted") and out.get("code") == "retry_later":
            return self._enqueue(job, out.get("reason", ""), t0, out)
        if not out.get("admitted"):
            self.metrics.admission(out.get("code", "refused"), out.get("latency_ms", 0.0))
            return out
        # one checkpoint write commits it; a failed write undoes it (group commit: the batch's
        # failed write restores the last written state instead, so no per-admission copy is taken)
        with contextlib.nullcontext() if self._defer else self._transaction():
            grp = self.igs.commit(decision)
            self._admitted(job, out, t0, grp, sha=sha)
        return out

    def _enqueue(self, job: JobSpec, reason: str, t0: float, decision: Optional[dict] = None) -> dict:
        """Hold ``job`` in the admission queue (checkpointed with the queue); the answer is the
        decision with code ``queued`` and ``queue_position``, or ``queue_full``."""
        base = dict(decision or {})
        try:
            pos = self.queue.push(job, time.time(), reason=reason)
        except QueueFull as e:
            out = self._refusal(job.job_id, "queue_full", str(e), t0, False)
            return {**out, "candidates": base.get("candidates", []), "pruned": base.get("pruned", [])}
        self._queue_dirty = True
        self._checkpoint()
        self._queue_metrics()
        ms = (time.perf_counter() - t0) * 1e3
        self.metrics.admission("queued", ms)
        return {**base, "job_id": job.job_id, "admitted": False, "code": "queued", "queued": True,
                "queue_position": pos, "reason": f"queued at position {pos}: {reason}",
                "latency_ms": base.get("latency_ms", ms), "policy": self.igs.policy}

    def _queue_metrics(self) -> None:
        self.metrics.queue(len(self.queue), self.queue.oldest_wait_s(time.time()))

    def _admitted(self, job: JobSpec, out: dict, t0: float, grp, queued=None, sha: Optional[str] = None) -> None:
        """Record a committed admission (``grp``: the group the policy committed it to): the job
        record (with its queue wait when ``queued``), checkpoint, controller push, metrics."""
        gid = out["group_id"] = grp.group_id if grp is not None else out["group_id"]
        member = self.igs.member(job.job_id)
        prof = member.profile if member is not None else None
        self.jobs.pop(job.job_id, None)  # a re-admitted id goes to the end (admission order)
        self.jobs[job.job_id] = JobRecord(
            job_id=job.job_id, state=JobState.ADMITTED, slo=job.slo, admission_id=uuid.uuid4().hex,
            predicted=None if prof is None else {"t_roll_s": prof.t_roll_s, "t_train_s": prof.t_train_s,
                                                 "t_sync_s": prof.t_sync_s, "t_solo_s": prof.t_solo_s},
            predicted_slowdown=(out.get("predicted_slowdowns") or {}).get(job.job_id), admitted_at=time.time(),
            spec_sha256=sha or hashlib.sha256(json.dumps(job.model_dump(mode="json"), sort_keys=True).encode()).hexdigest(),
            decision={k: v for k, v in out.items() if k not in ("candidates", "pruned")})
        if queued is not None:
            rec = self.jobs[job.job_id]
            rec.queued_at, rec.waited_s = queued.enqueued_at, max(0.0, rec.admitted_at - queued.enqueued_at)
            self.metrics.queue_wait(rec.waited_s)
        self._checkpoint(jobs=(job.job_id,), groups=(gid,))  # target state first, then act
        self._reopt_pending[job.job_id] = gid  # re-optimised by the reconcile thread, off the admission path
        self._push([gid])
        self.metrics.admission("admitted", out.get("latency_ms", (time.perf_counter() - t0) * 1e3))
        self.metrics.job(job.job_id, slo=job.slo, iterations=0)
        self._cost_metrics(gid)
        out["latency_ms"] = out.get("latency_ms", (time.perf_counter() - t0) * 1e3)

    def _drain_queue(self) -> list[str]:
        """After a departure: admit queued jobs into the freed room (in order, with backfill,
        through Alg. 1: :meth:`rollmux.admission_queue.AdmissionQueue.drain`); a queued job that
        can never fit ends as ``failed`` with the reason. Returns the admitted job ids."""
        if not len(self.queue):
            return []
        defer, self._defer = self._defer, True  # the admissions of one pass: one checkpoint write
        try:
            t0 = time.perf_counter()
            res = self.queue.drain(self.igs, time.time())
            if res.tried:
                self._queue_dirty = True
            for q, d in res.admitted:
                self._admitted(q.spec, d.to_dict(), t0, self.igs.group_of(q.job_id), queued=q)
            now = time.time()
            for q, d in res.dropped:
                self.jobs.pop(q.job_id, None)
                self._ended_since_prune = True
                self.jobs[q.job_id] = JobRecord(job_id=q.job_id, state=JobState.FAILED, slo=q.spec.slo, queued_at=q.enqueued_at,
                                                waited_s=now - q.enqueued_at, ended_at=now,
                                                error=f"left the admission queue, it can never be admitted: {d.reason}")
                self._checkpoint(jobs=(q.job_id,))
            self._queue_metrics()
        finally:
            self._defer = defer
        if not defer:
            self._flush()
        return [q.job_id for q, _ in res.admitted]

    def _refusal(self, job_id, code: str, reason: str, t0: float, dry_run: bool) -> dict:
        """A refusal of the scheduler itself (``invalid`` | ``duplicate``) as an AdmissionDecision."""
        ms = (time.perf_counter() - t0) * 1e3
        if not dry_run:
            self.metrics.admission(code, ms)
        d = AdmissionDecision(job_id=job_id, admitted=False, code=code, reason=reason, policy=self.igs.policy,
                              delta_usd_per_h=None, latency_ms=ms)
        return d.to_dict()

    def _cost_metrics(self, gid: str) -> None:
        g = self.igs.group_snapshot(gid)
        if g is not None:
            self.metrics.group_cost(gid, self.igs.group(gid).cost_usd_per_h(self.cluster))

    # ---- departure / lifecycle
    @_locked
    def depart(self, job_id: str) -> Optional[dict]:
        """The job leaves its group (finished, or removed by an operator): nodes are released.

        Returns ``{job_id, state, released_nodes, group_dissolved, dissolved_groups, moves}``
        (``moves``: the departure re-packing moves carried out, as :class:`MoveRecord` dicts);
        None for an unknown job id. A queued job leaves the admission queue (``state``:
        ``cancelled``). Queued jobs that fit into the freed room are admitted (``admitted_from_queue``).
        """
        if job_id in self.queue:
            self.queue.remove(job_id)
            self._queue_dirty = True
            self._checkpoint()
            self._queue_metrics()
            return {"job_id": job_id, "state": "cancelled", "released_nodes": [], "group_dissolved": False,
                    "dissolved_groups": [], "moves": []}
        return self._end(job_id, JobState.FINISHED, None)

    def _end(self, job_id: str, state: JobState, error: Optional[str]) -> Optional[dict]:
        """Departure or failure of ``job_id``: the policy releases its nodes, then re-packs
        (:meth:`rollmux.admission.InterGroupScheduler.repack`, departure re-packing) and
        re-optimises the departure's neighbourhood (``reoptimise``); the moves
        it committed are appended to the moved jobs' records; records and checkpoint first
        (target state), then asynchronous pushes to the touched groups' controllers.
        ``released_nodes`` is the net set of nodes the cluster no longer uses (the departed job's
        and those of groups dissolved by moves); ``dissolved_groups`` every group that ceased to
        exist (``group_dissolved``: the job's own). A job that already ended gets
        ``already_ended: True`` and its ``state`` (nothing changes)."""
        rec = self.jobs.get(job_id)
        if rec is None:
            return None
        if not rec.state.is_active():
            return {"job_id": job_id, "state": str(rec.state), "already_ended": True, "released_nodes": [],
                    "group_dissolved": False, "dissolved_groups": [], "moves": []}
        # the departure and the queued jobs it lets in are ONE write-ahead record (group commit)
        defer, self._defer = self._defer, True
        try:
            out = self._end_deferred(job_id, rec, state, error)
        finally:
            self._defer = defer
        if not defer:
            self._flush(force=True)
        return out

    def _end_deferred(self, job_id: str, rec: JobRecord, state: JobState, error: Optional[str]) -> dict:
        """:meth:`_end` with its writes collected (the caller flushes them as one record)."""
        final = self._view(rec)  # freeze where it was before the policy forgets it
        gid = final.group_id
        before = self._nodes_in_use()
        with self._transaction():  # one checkpoint write commits it; a failed write undoes it
            self.igs.depart(job_id)
            self._solver().forget(job_id)
            try:
                moves = list(self.igs.repack(gid))
                moves += self.igs.reoptimise(gid, solver=self._solver())
            except Exception:  # the policy rolls a failed attempt back; the departure itself stands
                log.exception("departure re-packing after %s failed; no job moved", job_id)
                moves = []
            released = sorted(before - self._nodes_in_use(), key=lambda n: (n.split("-")[0], node_index(n)))
            now = time.time()
            rec.group_id, rec.placement, rec.controller = final.group_id, final.placement, final.controller
            if self.release_workers and final.placement is not None:  # its workers drop its state (reconcile loop)
                self._releases.append((job_id, rec.admission_id,
                                       [*final.placement.rollout_nodes, *final.placement.train_nodes]))
            rec.state, rec.ended_at = state, now
            self._ended_since_prune = True
            self.metrics.job_ended(job_id)
            if state == JobState.FAILED:  # a reason for people; the raw error kept apart
                pl = final.placement
                rec.error = explain_failure(error, tuple(pl.rollout_nodes + pl.train_nodes) if pl else ())
                rec.error_detail = error
            else:
                rec.error = error
            done = self._record_moves(moves, job_id, now)
            touched = list(dict.fromkeys([gid] + [g for m in done for g in (m.from_group, m.to_group)]))
            self._checkpoint(jobs=(job_id, *[m.job_id for m in done]), groups=tuple(touched))
        self._push(touched)
        self.metrics.job_moves(len(done))
        dissolved = [g for g in touched if self.igs.group_snapshot(g) is None]
        for g in touched:
            if g in dissolved:
                self.metrics.group_dissolved(g)
            else:
                self._cost_metrics(g)
        started = self._drain_queue()  # the freed room goes to queued jobs
        return {"job_id": job_id, "state": str(state), "released_nodes": released, "group_dissolved": gid in dissolved,
                "dissolved_groups": dissolved, "moves": [m.model_dump(mode="json") for m in done],
                **({"admitted_from_queue": started} if started else {})}

    @_locked
    def expire_unattached(self, now: Optional[float] = None) -> list[str]:
        """Expire admitted jobs whose driver has not attached (reported ``running``) within the
        config's ``attach_timeout_s``: each is one departure (nodes released, one checkpoint
        write) ending in state ``expired``. Returns the expired job ids. Called by the reconcile
        loop; 0 disables."""
        limit = self.igs.config.attach_timeout_s
        if not limit:
            return []
        now = time.time() if now is None else now
        late = [j for j, r in self.jobs.items()
                if r.state == JobState.ADMITTED and r.admitted_at is not None and now - r.admitted_at > limit]
        for j in late:
            self._end(j, JobState.EXPIRED, f"expired: no driver attached within {limit:g} s of admission; its "
                      "nodes were released. Submit the job again to run it.")
        return late

    @_locked
    def reoptimise_pending(self) -> list[dict]:
        """Re-optimise the neighbourhoods of the admissions since the last call
        (:meth:`rollmux.admission.InterGroupScheduler.reoptimise`; the reconcile thread calls this
        every pass, so an admission's answer never waits for it). A newcomer whose driver has not
        started yet (state ``admitted``) has no state to copy. Moves are recorded, checkpointed and
        pushed as a departure's are. Returns the moves as :class:`MoveRecord` dicts."""
        pending, self._reopt_pending = self._reopt_pending, {}
        out = []
        for jid, gid in pending.items():
            rec = self.jobs.get(jid)
            if rec is None or not rec.state.is_active() or self.igs.group_of(jid) is None:
                continue
            gid = self.igs.group_of(jid).group_id
            try:
                with self._transaction():  # one checkpoint write commits the moves; a failed write undoes them
                    try:
                        moves = list(self.igs.reoptimise(gid, fresh=jid if rec.state == JobState.ADMITTED else None,
                                                         solver=self._solver()))
                    except Exception:  # the policy rolls a failed attempt back; nothing moved
                        log.exception("re-optimisation after admitting %s failed; no job moved", jid)
                        moves = []
                    if not moves:
                        continue
                    done = self._record_moves(moves, jid, time.time())
                    touched = list(dict.fromkeys([gid] + [g for m in done for g in (m.from_group, m.to_group)]))
                    self._checkpoint(jobs=tuple(m.job_id for m in done), groups=tuple(touched))  # target state first
            except Exception:  # the write failed: rolled back, nothing moved (a later admission retries)
                log.exception("checkpoint of the re-optimisation after admitting %s failed; no job moved", jid)
                continue
            self._push(touched)
            self.metrics.job_moves(len(done))
            for g in touched:
                if self.igs.group_snapshot(g) is None:
                    self.metrics.group_dissolved(g)
                else:
                    self._cost_metrics(g)
            out += [m.model_dump(mode="json") for m in done]
        return out

    def _solver(self):
        """The set-partitioning solver of the policy's neighbourhood re-optimisation (its layout
        cache lives as long as this actor; departed jobs' layouts are dropped)."""
        if getattr(self, "_opt", None) is None:
            from rollmux.baselines import OptimalPartition

            cfg = self.igs.config
            self._opt = OptimalPartition(self.cluster, max_group_size=cfg.max_group_size,
                                         exact_max_jobs=max(2, cfg.reopt_max_jobs), time_limit_s=2.0)
        return self._opt

    def _record_moves(self, moves: list[dict], trigger: str, now: float) -> list[MoveRecord]:
        """Append the policy's moves to the moved jobs' records, with the policy's predicted
        slowdown in the new group."""
        done = []
        for mv in moves:
            r = self.jobs[mv["job_id"]]
            m = MoveRecord(job_id=mv["job_id"], from_group=mv["from_group"], to_group=mv["to_group"],
                           placement=NodePlacement(rollout_nodes=list(mv["placement"]["rollout_nodes"]),
                                                   train_nodes=list(mv["placement"]["train_nodes"])),
                           move_s=mv.get("move_s"), at=now, trigger=trigger)
            r.moves = [*r.moves, m]
            r.predicted_slowdown = self.igs.group_stats(m.to_group)["predicted_slowdowns"].get(m.job_id)
            done.append(m)
        return done

    def _nodes_in_use(self) -> set[str]:
        return {n for g in self.igs.groups for n in (*g.rollout_nodes, *g.train_nodes)}

    @_locked
    def report(self, job_id: str, event: dict) -> Optional[dict]:
        """Runtime events: ``running``, ``iteration`` (iterations_done, t_iter_s, t_solo_s,
        slowdown), ``finished`` (departure), ``failed`` (error; departure). Returns the job record."""
        rec = self.jobs.get(job_id)
        if rec is None:
            return None
        kind = event.get("event")
        if kind == "running" and rec.state == JobState.ADMITTED:
            with self._transaction():
                rec.state = JobState.RUNNING
                self._checkpoint(jobs=(job_id,))
        elif kind == "iteration":  # also after the end: events from controller and driver may cross
            with self._transaction():
                rec.state = rec.state.advance(JobState.RUNNING)
                rec.note_iteration(int(event.get("iterations_done", 0)), event.get("t_iter_s"),
                                   event.get("t_solo_s"), event.get("slowdown"))
                self._checkpoint(jobs=(job_id,))  # progress is written with the event that changes it
            rec = self.jobs[job_id]
            self.metrics.job(job_id, iterations=rec.iterations_done, slowdown=rec.slowdown)
        elif kind in (JobState.FINISHED, JobState.FAILED):
            if event.get("iterations_done") is not None:
                rec.iterations_done = max(rec.iterations_done, int(event["iterations_done"]))
            st = JobState(kind)
            self._end(job_id, st, None if st == JobState.FINISHED else (event.get("error") or "failed"))
        return self._view(rec).public()

    # ---- queries
    @_locked
    def list_jobs(self) -> list[dict]:
        """Every job record (admission order), then the queued jobs (line order)."""
        return [self._view(r).public() for r in self.jobs.values()] + self._queued_views()

    @_locked
    def get_job(self, job_id: str) -> Optional[dict]:
        r = self.jobs.get(job_id)
        if r is None and job_id in self.queue:
            return next(v for v in self._queued_views() if v["job_id"] == job_id)
        return None if r is None else self._view(r).public()

    def _queue_view(self) -> list[dict]:
        """The admission queue as published: ``job_id, slo, queued_at, reason, gpus`` in line order
        (``gpus``: the backfill size a replica's dry-run compares, :func:`rollmux.admission_queue.job_gpus`)."""
        return [{"job_id": q.job_id, "slo": q.spec.slo, "queued_at": q.enqueued_at, "reason": q.reason, "gpus": q.gpus}
                for q in self.queue.jobs()]

    def _queued_views(self, now: Optional[float] = None) -> list[dict]:
        return queued_records(self._queue_view(), time.time() if now is None else now)

    def _group_view(self, gid: str) -> Optional[dict]:
        """A group as ``GET /v1/groups`` lists it (None once dissolved)."""
        try:
            st = self.igs.group_stats(gid)
        except KeyError:
            return None
        return {"group_id": gid, "members": st["members"], "rollout_nodes": st["rollout_nodes"],
                "train_nodes": st["train_nodes"], "cost_usd_per_h": st["cost_usd_per_h"],
                "t_cycle_s": st["t_cycle_s"], "t_load_s": st["t_load_s"], "slack_s": st["slack_s"],
                "controller": controller_name(gid, self.name)}

    # ---- the published snapshot (Serve replicas answer reads from it) and group commit
    def _publish(self, jobs: tuple, groups: tuple, dropped: list, queue_changed: bool) -> None:
        """Publish one committed change as the next version: the views of the changed jobs (and
        of every member of a changed group), of the changed groups (None: gone) and the queue."""
        gids = dict.fromkeys(groups)
        for j in jobs:
            rec = self.jobs.get(j)
            if rec is not None and (g := self._group_id(rec)) is not None:
                gids[g] = None
        jids = dict.fromkeys(jobs)
        for g in gids:
            try:
                grp = self.igs.group(g)
            except KeyError:
                continue
            jids.update(dict.fromkeys(m.spec.job_id for m in grp.members))
        views = {j: (None if (r := self.jobs.get(j)) is None else self._view(r).public()) for j in jids}
        views.update({j: None for j in dropped})
        # the policy's table changes exactly by the groups the write-ahead record carries
        written, self._written = self._written or {}, None
        policy = {"header": written.get("header") or self.igs.snapshot_header(), "groups": dict(written.get("groups", {}))}
        self.version += 1
        self._deltas.append({"version": self.version, "jobs": views, "groups": {g: self._group_view(g) for g in gids},
                             "queue": self._queue_view() if queue_changed else None, "policy": policy})
        self._wake()

    def _publish_full(self) -> None:
        """The next version replaces everything (after a restore): replicas fetch a full snapshot."""
        self.version += 1
        self._deltas.clear()
        self._deltas.append({"version": self.version, "full": True})
        self._wake()

    def _full_snapshot(self, policy: bool = False) -> dict:
        out = {"epoch": self.epoch, "version": self.version, "full": True, "cluster": self.cluster.model_dump(mode="json"),
               "jobs": {j: self._view(r).public() for j, r in self.jobs.items()},
               "groups": {g.group_id: self._group_view(g.group_id) for g in self.igs.groups},
               "queue": self._queue_view()}
        if policy:
            out["policy"] = {"header": self.igs.snapshot_header(),
                             "groups": {g.group_id: self.igs.group_snapshot(g.group_id) for g in self.igs.groups}}
        return out

    def _wake(self) -> None:
        """Wake the replicas waiting in :meth:`snapshot_since` (from any thread)."""
        if self._loop is None:
            return

        def fire() -> None:
            ev, self._published = self._published, asyncio.Event()
            if ev is not None:
                ev.set()

        try:
            self._loop.call_soon_threadsafe(fire)
        except RuntimeError:  # the loop closed (actor shutting down)
            pass

    def _resolve(self, waiters: list, err: Optional[BaseException]) -> None:
        version = self.version

        def done(f) -> None:
            if not f.done():
                f.set_exception(err) if err is not None else f.set_result(version)

        for f in waiters:  # each on its own event loop (the actor has one)
            f.get_loop().call_soon_threadsafe(done, f)

    async def snapshot_since(self, epoch: Optional[str], version: int, wait_s: float = 5.0,
                             policy: bool = False) -> dict:
        """The published state changes after ``version`` of ``epoch`` (this actor instance's id):
        ``{epoch, version, full: False, jobs: {id: view | None}, groups: {id: view | None},
        queue: [..] | None}`` (None: gone / unchanged), or everything (``full: True``) when the
        caller is new, of another instance, or too far behind. ``policy``: also the policy
        table's changes, ``policy: {header, groups: {id: group snapshot | None}}`` (what a
        replica answering dry-runs follows; only callers that ask pay for it). Waits up to ``wait_s`` for a new
        version when the caller is current (a long poll: the waiting costs the actor nothing).
        Versions count commits: a reply is at most one commit old."""
        self._loop = asyncio.get_running_loop()
        if epoch == self.epoch and version == self.version and wait_s > 0:
            if self._published is None:
                self._published = asyncio.Event()
            try:
                await asyncio.wait_for(self._published.wait(), timeout=min(float(wait_s), 60.0))
            except asyncio.TimeoutError:
                pass
        with self._lock:
            first = self._deltas[0]["version"] if self._deltas else self.version + 1
            newer = list(itertools.islice(self._deltas, max(0, version + 1 - first), None))  # versions are consecutive
            if (epoch != self.epoch or version > self.version or any(d.get("full") for d in newer)
                    or (newer and newer[0]["version"] != version + 1)):
                return self._full_snapshot(policy)
            out: dict = {"epoch": self.epoch, "version": self.version, "full": False, "jobs": {}, "groups": {},
                         "queue": None}
            if policy:
                out["policy"] = {"header": None, "groups": {}}
            for d in newer:
                out["jobs"].update(d["jobs"])
                out["groups"].update(d["groups"])
                if d["queue"] is not None:
                    out["queue"] = d["queue"]
                if policy:
                    out["policy"]["header"] = d["policy"]["header"]
                    out["policy"]["groups"].update(d["policy"]["groups"])
            return out

    async def admit_batched(self, spec: dict, dry_run: bool = False, queue: bool = False,
                            explain: str = "chosen") -> dict:
        """:meth:`admit` with group commit (the HTTP path): the decision is taken at once, in
        arrival order; its checkpoint write is shared with the other decisions of the batch
        (collected for ``GROUP_COMMIT_WINDOW_S`` and while the previous write runs) and the call
        returns once that write is done, with ``snapshot_version`` (the published version that
        contains it). A failed write: code ``unavailable`` (nothing of the batch happened).
        ``explain``: ``"chosen"`` (default) or ``"full"`` candidate list of an admission."""
        out = await self._batched(self.admit, spec, dry_run, queue, explain)
        if "unavailable" in out:
            return {"job_id": spec.get("job_id") if isinstance(spec, dict) else None, "admitted": False,
                    "code": "unavailable", "reason": out["unavailable"]}
        return out

    async def admit_many(self, calls: list) -> list[dict]:
        """Several :meth:`admit_batched` calls in ONE actor call (a Serve replica's batch of
        ``POST /v1/jobs``: ``[[spec, dry_run, queue, explain], ...]``): decided one at a time in list
        order, sharing the group commit's write; the answers in the same order."""
        return list(await asyncio.gather(*(self.admit_batched(*c) for c in calls)))

    async def depart_batched(self, job_id: str) -> Optional[dict]:
        """:meth:`depart` with group commit (see :meth:`admit_batched`); ``{"unavailable": reason}``
        when the batch's write failed (the departure did not happen)."""
        return await self._batched(self.depart, job_id)

    async def _batched(self, fn, *args):
        loop = self._loop = asyncio.get_running_loop()
        with self._lock:
            self._defer = True
            try:
                out = fn(*args)
            finally:
                self._defer = False
            if not (self._pending_jobs or self._pending_groups or self._queue_dirty):
                if isinstance(out, dict):
                    out["snapshot_version"] = self.version
                return out
            fut = loop.create_future()
            self._waiters.append(fut)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.create_task(self._flush_soon())
        try:
            version = await fut
        except Exception as e:  # the batch's write failed: nothing of it happened
            return {"unavailable": f"the checkpoint write failed ({type(e).__name__}: {e}); nothing changed, retry"}
        if isinstance(out, dict):
            out["snapshot_version"] = version
        return out

    async def _flush_soon(self) -> None:
        await asyncio.sleep(GROUP_COMMIT_WINDOW_S)
        with self._lock:
            self._flush_scheduled = False
            try:
                self._flush()
            except Exception:  # logged by _flush; the waiters got the error
                pass

    @_locked
    def list_groups(self) -> list[dict]:
        """Groups: members, nodes, Cost(G) USD/h, T_cycle, T_load and slack (T_cycle - T_load)."""
        return [self._group_view(g.group_id) for g in self.igs.groups]

    @_locked
    def health(self) -> dict:
        return {"ok": True, "jobs": sum(r.state.is_active() for r in self.jobs.values()),
                "groups": len(self.igs.groups), "queued": len(self.queue), "snapshot_version": self.version, "restored": self.restored, "name": self.name,
                "unacked_pushes": len(self._dirty)}

    async def group_timeline(self, group_id: str) -> list[dict]:
        """The timeline recorded by a group's controller (also after the group dissolved). An
        operator query: awaited (the actor keeps serving other calls meanwhile), bounded by
        QUERY_TIMEOUT_S. This ``async`` method makes the actor an async actor: its other methods
        are plain functions that run to completion on its event loop and never wait on a
        controller."""
        import asyncio

        with self._lock:
            h = self._controller(group_id)
        if h is None:
            return []
        return await asyncio.wait_for(h.get_timeline.remote(), timeout=QUERY_TIMEOUT_S)

    def cluster_spec(self) -> dict:
        return self.cluster.model_dump(mode="json")


def get_or_create_scheduler(cluster: Optional[ClusterSpec | dict] = None, *, checkpoint_path: Optional[str] = None,
                            name: str = SCHEDULER_NAME, **kw):
    """The named, detached GlobalScheduler (created if absent; ``max_restarts=-1``).

    ``cluster`` defaults to ``configs/cluster_local.yaml``. Connects to Ray (``RAY_ADDRESS`` or
    ``auto``) if this process is not connected. Extra ``kw`` (config, policy, max_group_size,
    seed, ...) go to the constructor. Returns the actor handle.
    """
    import ray

    ensure_ray()
    if cluster is None:
        from rollmux.config import CONFIG_DIR, load_cluster

        cluster = load_cluster(CONFIG_DIR / "cluster_local.yaml")
    spec = cluster.model_dump(mode="json") if isinstance(cluster, ClusterSpec) else cluster
    if isinstance(kw.get("config"), SchedulerConfig):
        kw["config"] = kw["config"].model_dump()
    cls = ray.remote(GlobalSchedulerImpl)
    return cls.options(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
                       resources=control_plane_resources(), max_restarts=-1, max_task_retries=0).remote(spec, checkpoint_path, name=name, **kw)


# The actor class under its contract name (wrap with ray.remote, or use get_or_create_scheduler).
GlobalScheduler = GlobalSchedulerImpl
