"""GlobalScheduler: the single owner of RollMux's group table on a Ray cluster (RollMux §4.2, §5).

One named, detached actor (``rollmux-global-scheduler`` in namespace ``rollmux``, get-if-exists,
``max_restarts=-1``). It admits jobs by calling the policy (:class:`rollmux.admission.
InterGroupScheduler`, Alg. 1; no second copy here), tracks each job's lifecycle
(:class:`rollmux.records.JobState`: admitted -> running -> finished | failed, changed only by its
transitions) in one :class:`rollmux.records.JobRecord` per job, and releases nodes on departure
or failure. It is composed of parts, each in its own module:

- :class:`actors.scheduler.job_store.JobStore`: the job records, their one writer (state transitions,
  progress, moves); where a job is placed is the policy's fact, read for every view while the
  job is active and frozen into the record when it ends;
- :class:`actors.scheduler.reconciler.Reconciler`: pushes of each group's target membership to its
  controller (never waited for) and the releases of ended jobs' workers, through an injected
  :class:`actors.scheduler.reconciler.HandleFactory` (``RayHandles`` on a cluster; fakes in unit tests);
- :class:`actors.scheduler.snapshot_log.SnapshotLog`: the published snapshot the Serve replicas follow;
- the admission queue (:mod:`actors.scheduler.admission_queue`) and the re-optimisation
  (:mod:`actors.scheduler.reopt`) parts;
- here: the checkpoint (:mod:`actors.scheduler.checkpoint`, one write-ahead record per state change, with
  group commit for the HTTP path) and the admission / departure / report flows.

The singleton never waits on a controller, except :meth:`GlobalSchedulerImpl.attach` (a driver
asking to run its job), which awaits, bounded, the acknowledgement of the membership it pushed,
so the driver attaches to a controller that already knows it. The *target state* (job records +
the policy's snapshot) is checkpointed to a KV store (:mod:`actors.scheduler.kv`; Ray GCS internal KV by
default, a file directory with ``checkpoint_path``) first (a crash before the write means the
change never happened, after it that it did; a failed write rolls the change back; a bad
checkpoint refuses to start); then each touched group's controller gets the group's membership
pushed. A failing reconcile pass is logged and the loop goes on; its duration is the gauge
``rollmux_reconcile_seconds``. Controllers are created lazily, when a job's driver attaches. A
restarted scheduler restores the checkpoint and re-finds the named, detached controllers. No
admitted job is lost when the actor dies.

Contract (actors/scheduler/README.md "GlobalScheduler actor contract"): the public methods return
JSON-able dicts / lists (the control-plane ones take and return :mod:`rollmux.messages`);
refusals are values (``AdmissionDecision.to_dict()`` with ``admitted: False`` and a
:class:`rollmux.codes.Code`), not exceptions. Codes besides the policy's (ok | never |
retry_later): ``invalid`` (spec fails validation) and ``duplicate`` (the job id is admitted or
running with a different spec; the same spec again gets the original decision, ``replayed:
True``). Ended jobs' workers are told to drop the job's state; admitted jobs that no driver
attaches to expire (:meth:`GlobalSchedulerImpl.expire_unattached`); a failed job's ``error`` is
written for people (:func:`rollmux.records.explain_failure`), the raw error kept in ``error_detail``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import threading
import time
from typing import Any, Optional

from pydantic import ValidationError

from actors.scheduler.checkpoint import Checkpoint, CheckpointError  # noqa: F401  (CheckpointError re-exported)
from actors.handles import start_actor
from actors.scheduler.job_store import MAX_FINISHED_RECORDS, JobStore, spec_sha256  # noqa: F401  (MAX_FINISHED_RECORDS re-exported)
from actors.scheduler.kv import make_kv
from actors.ops.metrics import RollmuxMetrics
from actors.naming import (  # noqa: F401  (NAMESPACE, SCHEDULER_NAME, get_scheduler re-exported)
    NAMESPACE, SCHEDULER_NAME, control_plane_resources, controller_name, ensure_ray, get_scheduler,
)
from actors.scheduler.reconciler import (  # noqa: F401  (re-exported)
    ATTACH_PUSH_TIMEOUT_S, PUSH_RETRY_S, RECONCILE_FULL_S, RECONCILE_S, HandleFactory, RayHandles, Reconciler,
)
from actors.scheduler.commit import COMPACTION_MODES, GROUP_COMMIT_WINDOW_S, CommitPart  # noqa: F401  (re-exported)
from actors.scheduler.priority import PriorityPart
from actors.scheduler.admission_queue import QueuePart
from actors.scheduler.reopt import ReoptPart
from actors.scheduler.slo_watch import SloPart
from actors.scheduler.snapshot_log import SNAPSHOT_LOG, SnapshotLog  # noqa: F401  (re-exported)
from rollmux.admission import AdmissionDecision, InterGroupScheduler, SchedulerConfig, load_scheduler_config
from rollmux.admission_queue import QUEUE_AHEAD_REASON, AdmissionQueue, what_if
from rollmux.codes import Code
from rollmux.config import ConfigError
from rollmux.messages import (
    AttachTicket, EventKind, MemberTarget, MembershipPush, ProgressReport, RuntimeEvent, parse_report,
)
from rollmux.models import ClusterSpec, JobSpec
from rollmux.nodes import node_index
from rollmux.drain import fenced_nodes
from rollmux.records import JobRecord, JobState

log = logging.getLogger("rollmux.scheduler")

QUERY_TIMEOUT_S = 10.0  # the one query that reads a controller (group_timeline), s
DISSOLVED_TIMELINES_KEPT = 64  # timelines of dissolved groups kept for group_timeline


def _locked(fn):
    """Run a public method under the scheduler's lock (the reconcile thread reads the state)."""

    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        with self._lock:
            return fn(self, *args, **kwargs)

    return run


class GlobalSchedulerImpl(CommitPart, QueuePart, ReoptPart, SloPart, PriorityPart):
    """The scheduler's logic (plain class, wrapped by :func:`get_or_create_scheduler`).

    Args:
        cluster: the cluster spec (dict or :class:`ClusterSpec`).
        checkpoint_path: directory for a :class:`actors.scheduler.kv.FileKV`; ``None`` uses Ray's GCS KV.
        name: this actor's name (checkpoint key and controller-name prefix).
        config: the scheduler settings (:class:`rollmux.admission.SchedulerConfig` or its dict);
            default ``configs/scheduler.yaml`` (the file ``rollmux simulate --config`` reads
            too). Raises :class:`rollmux.config.ConfigError` for a bad file.
        policy / max_group_size / seed / repack_on_departure: override the config's values when
            given (a copy of the config with them). The whole config is kept in the checkpoint
            (a restored scheduler keeps its settings).
        kv: an explicit :class:`actors.scheduler.kv.KVStore` (unit tests: ``MemoryKV``).
        handles: where the controllers and workers come from (:class:`actors.scheduler.reconciler.HandleFactory`);
            default :class:`actors.scheduler.reconciler.RayHandles` (named actors on the Ray cluster).
        metrics: the metrics recorder (default a :class:`actors.ops.metrics.RollmuxMetrics` flushing
            every ``metrics_flush_s``, exporting Ray metrics unless ``metrics_enabled`` is False).
        reconcile_s: period of the reconcile thread, s (None: no thread; the caller runs
            :meth:`reconcile_once` and the other passes itself, e.g. a unit test).
        controller_kw: keyword arguments of new GroupControllers (e.g. ``lease_s``, ``migrate``).
        compaction: where a due compaction of the checkpoint log runs: ``"inline"`` (inside the
            write that makes it due: deterministic, unit tests), ``"background"`` (a compactor
            thread, off every reply path: :func:`get_or_create_scheduler`'s default) or
            ``"manual"`` (off the reply path; the caller runs :meth:`compact_pending`).
        reopt_worker: where the admissions' re-optimisation solves run (:mod:`actors.scheduler.reopt_worker`):
            ``"thread"`` (the thread calling :meth:`reoptimise_pending`) or ``"process"`` (a child
            process: the solves never take the actor's interpreter lock;
            :func:`get_or_create_scheduler`'s default).
    """

    def __init__(self, cluster: dict | ClusterSpec, checkpoint_path: Optional[str] = None, *,
                 name: str = SCHEDULER_NAME, policy: Optional[str] = None, max_group_size: Optional[int] = None,
                 seed: Optional[int] = None, kv=None, handles: Optional[HandleFactory] = None,
                 metrics: Optional[RollmuxMetrics] = None, metrics_flush_s: float = 1.0, metrics_enabled: bool = True,
                 reconcile_s: Optional[float] = RECONCILE_S, controller_kw: Optional[dict] = None,
                 repack_on_departure: Optional[bool] = None, config: Optional[dict | SchedulerConfig] = None,
                 compaction: str = "inline", reopt_worker: str = "thread"):
        if compaction not in COMPACTION_MODES:
            raise ValueError(f"compaction must be one of {', '.join(COMPACTION_MODES)}, not {compaction!r}")
        self.compaction = compaction
        if reopt_worker not in ("thread", "process"):
            raise ValueError(f"reopt_worker must be 'thread' or 'process', not {reopt_worker!r}")
        self.reopt_worker = reopt_worker
        self._compact_wake = threading.Event()
        self.cluster = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.model_validate(cluster)
        self.name = name
        self.kv = kv if kv is not None else make_kv(checkpoint_path, namespace=NAMESPACE)
        self.metrics = metrics if metrics is not None else RollmuxMetrics(flush_interval_s=metrics_flush_s,
                                                                          enabled=metrics_enabled)
        self.job_store = JobStore(name, lambda: self.igs)
        self.restored = False
        self._lock = threading.RLock()
        # timelines handed over by exiting controllers of dissolved groups (group_timeline)
        self._dissolved_timelines: collections.OrderedDict[str, list[dict]] = collections.OrderedDict()
        # group commit (the HTTP path's admit_batched / depart_batched): changes wait here for ONE write
        self._defer = False
        self._pending_jobs: dict[str, None] = {}
        self._pending_groups: dict[str, None] = {}
        self._pending_push: dict[str, None] = {}
        self._dropped: list[str] = []
        self._queue_dirty = False
        self._waiters: list[Any] = []  # asyncio futures of the batch being collected
        self._flush_scheduled = False
        self._written: Optional[dict] = None  # the last write-ahead record (its group snapshots are published)
        self.snapshots = SnapshotLog()  # the published snapshot (Serve replicas answer reads from it)
        self._reopt_pending: dict[str, str] = {}  # admitted job -> its group, to re-optimise (reconcile thread)
        self._reopt_forget: list[str] = []  # departed jobs the admissions' solver forgets at its next pass
        self.store = Checkpoint(self.kv, name)
        self.queue: Optional[AdmissionQueue] = None
        state = self.store.load()  # raises CheckpointError (naming the store) for a bad checkpoint
        if state is not None:
            self._load_state(state)
            self.restored = True
            if self.igs.config.runtime_refusals():  # an older release's checkpoint: the runtime never did it
                log.warning("restored config: %s; running with per_job_allocations: off, what this runtime always did",
                            "; ".join(self.igs.config.runtime_refusals()))
                self.igs.config = self.igs.config.overridden(per_job_allocations="off")
            if self.store._legacy:  # a version-1 checkpoint: rewritten as a base once
                self.store.create(self._full_state())
        else:
            base = load_scheduler_config() if config is None else SchedulerConfig.model_validate(
                config.model_dump() if isinstance(config, SchedulerConfig) else config)
            overrides = {k: v for k, v in {"policy": policy, "max_group_size": max_group_size, "seed": seed,
                                           "repack_on_departure": repack_on_departure}.items() if v is not None}
            cfg = SchedulerConfig.model_validate({**base.model_dump(), **overrides})
            refused = cfg.runtime_refusals()  # a setting the runtime cannot carry out is refused, never ignored
            if refused:
                raise ConfigError("the cluster's runtime cannot carry out these scheduler settings: " + "; ".join(refused))
            self.igs = InterGroupScheduler(self.cluster, config=cfg)
            self.store.create(self._full_state())
        self.queue = AdmissionQueue.from_config(self.igs.config)
        legacy_queue = self.kv.get(self._qkey())  # the previous layout kept the line under its own key
        self.queue.restore(state["queue"] if state is not None and state.get("queue") is not None else legacy_queue)
        for jid in [q.job_id for q in self.queue.jobs()]:  # (previous layout) admitted before a crash between two writes
            if jid in self.job_store and self.job_store.get(jid).state.is_active():
                self.queue.remove(jid)
        if legacy_queue is not None:  # the line moves into a base (one put), then the old key goes
            self.store.compact(self._full_state())
            self.kv.delete(self._qkey())
        # new GroupControllers carry the config's long-tail settings; explicit controller_kw wins
        self.controller_kw = {**self.igs.config.controller_settings(), **dict(controller_kw or {})}
        self.reconciler = Reconciler(name, handles if handles is not None else RayHandles(name, self.controller_kw),
                                     self._target, lambda gid: self.igs.group_snapshot(gid) is not None)
        self._stop = threading.Event()
        self._reconciler_thread: Optional[threading.Thread] = None
        self._compactor_thread: Optional[threading.Thread] = None
        if compaction == "background":
            self._compactor_thread = threading.Thread(target=self._compact_loop, name="rollmux-compactor", daemon=True)
            self._compactor_thread.start()
        self._refind_controllers()
        if reconcile_s:
            self._reconcile_s = float(reconcile_s)
            self._reconciler_thread = threading.Thread(target=self._reconcile_loop, name="rollmux-reconcile",
                                                       daemon=True)
            self._reconciler_thread.start()

    # ---- parts and views
    @property
    def jobs(self) -> dict[str, JobRecord]:
        """Every job record by id, in admission order (read it; :class:`JobStore` writes it)."""
        return self.job_store.records

    @property
    def epoch(self) -> str:
        return self.snapshots.epoch

    @property
    def version(self) -> int:
        return self.snapshots.version

    def _group_id(self, rec: JobRecord) -> Optional[str]:
        return self.job_store.group_id(rec)

    def _view(self, rec: JobRecord) -> JobRecord:
        return self.job_store.view(rec)

    def _qkey(self) -> str:
        """The admission queue's KV key of the previous layout (read once, moved into a base and
        deleted): the line now travels in the write-ahead record of the commit that changes it."""
        return f"{self.store.prefix}.queue"

    @staticmethod
    def _stored(rec: JobRecord) -> dict:
        return JobStore.stored(rec)

    # ---- controllers: target state, asynchronous pushes, the reconcile loop (actors.scheduler.reconciler)
    def _target(self, group_id: str) -> MembershipPush:
        """The membership a group's controller must converge to: its active members (in the
        planned round-robin order: the policy's member order, which admission's SLO check
        simulated) and the jobs that left it, with the reason (``departed``, ``failed``, ``moved to
        <group>``); ``dissolved`` once the group no longer exists. ``seq`` is the reconciler's.
        Each member carries the nodes it may not start a phase on yet (``fenced``: a job of
        another group preempted or moved off them has not drained there, :func:`rollmux.drain.fenced_nodes`)."""
        members, gone = [], {}
        draining = self._draining()  # preempted / moved jobs whose old nodes are not free yet (PriorityPart)
        for rec in self.jobs.values():
            gid = self._group_id(rec)
            if gid == group_id and rec.state.is_active():
                pl = self._view(rec).placement
                fenced = (fenced_nodes(draining, group_id, (*pl.rollout_nodes, *pl.train_nodes), rec.job_id)
                          if draining else ())
                members.append(MemberTarget(rec.job_id, tuple(pl.rollout_nodes), tuple(pl.train_nodes), rec.slo,
                                            fenced))
            elif gid == group_id:
                gone[rec.job_id] = "departed" if rec.state == JobState.FINISHED else str(rec.state)
            elif any(m.from_group == group_id for m in rec.moves):
                gone[rec.job_id] = f"moved to {gid}"
        try:  # the planned round-robin order: the group's member order in the policy's table
            rank = {j: i for i, j in enumerate(self.igs.group(group_id).job_ids)}
            members.sort(key=lambda m: rank.get(m.job_id, len(rank)))
        except KeyError:
            pass
        return MembershipPush(group_id, tuple(members), gone, 0, self.igs.group_snapshot(group_id) is None)

    def _push(self, groups, lookup: bool = False) -> None:
        """Send each group's target membership to its controller, if it has one; never waits.
        Inside a group commit the pushes wait for the batch's write (target state first)."""
        if self._defer and not lookup:
            self._pending_push.update(dict.fromkeys(groups))
            return
        self.reconciler.push(groups, lookup=lookup)

    def reconcile_once(self) -> dict:
        """One reconcile pass: acknowledged pushes are cleared; failed or overdue ones are sent
        again. Returns ``{pushed, acked}``. Waits on nothing."""
        with self._lock:
            acked, redo = self.reconciler.take_acks()
            again = self.reconciler.settle(acked, redo)
        return {"pushed": again, "acked": [g for g, _ in acked]}

    def release_workers_once(self) -> list[tuple[str, str]]:
        """Tell the workers of jobs that ended to drop their state (fire and forget; see
        :meth:`actors.scheduler.reconciler.Reconciler.send_releases`). Returns the (job, node) pairs sent."""
        with self._lock:
            todo = self.reconciler.take_releases()
        return self.reconciler.send_releases(todo)

    def _reconcile_loop(self) -> None:
        """Converge every controller to the target state; a failing pass is logged, never fatal."""
        last_full = time.monotonic()
        while not self._stop.wait(self._reconcile_s):
            t0 = time.perf_counter()
            try:
                if time.monotonic() - last_full >= RECONCILE_FULL_S:
                    last_full = time.monotonic()
                    # every group with a controller (a restarted controller keeps its handle)
                    with self._lock:
                        self._push([g for g in self.job_store.active_by_group() if self.reconciler.has_controller(g)])
                self.reoptimise_pending()
                self.slo_watch_pending()
                self.drain_overdue_pending()
                self.reconcile_once()
                self.expire_unattached()
                self.release_workers_once()
            except Exception:
                log.exception("reconcile pass failed; continuing")
            self.metrics.reconcile(time.perf_counter() - t0)

    def _refind_controllers(self) -> None:
        """After a (re)start: re-find each group's controller and push its target state (also the
        groups jobs moved out of, so a crash between the checkpoint and a push loses no move, and
        groups dissolved while no scheduler ran: told so, their controllers exit)."""
        groups = set(self.job_store.active_by_group())
        groups |= {m.from_group for r in self.jobs.values() if r.state.is_active() for m in r.moves}
        groups |= self.reconciler.leftover_groups()
        self._push(sorted(groups), lookup=True)

    def close(self) -> None:
        """Stop the reconcile and compactor threads (tests; the actor otherwise lives until killed)."""
        self._stop.set()
        self._compact_wake.set()
        if self._reopt_planner is not None:
            self._reopt_planner.close()

    @_locked
    def membership(self, group_id: str) -> MembershipPush:
        """The group's target membership as a push with the next sequence number (what a
        restarted controller pulls)."""
        return self.reconciler.next_push(group_id)

    @_locked
    def group_members(self, group_id: str) -> list[dict]:
        """Active members of a group: ``job_id, rollout_nodes, train_nodes, slo`` (planned
        round-robin order)."""
        return [m.to_dict() for m in self._target(group_id).members]

    @_locked
    def ensure_controller(self, group_id: str) -> str:
        """Create (if needed) the group's GroupController and push its members (not waited for);
        its name. Raises KeyError for a group without an active job. (Drivers use :meth:`attach`.)"""
        if group_id not in self.job_store.active_by_group():
            raise KeyError(f"no active job in group {group_id!r}")
        self.reconciler.controller(group_id, create=True)
        self._push([group_id])
        return controller_name(group_id, self.name)

    async def attach(self, job_id: str) -> Optional[AttachTicket]:
        """A driver is about to run ``job_id``: its record, and the name of its group's
        controller, created if needed, which holds the job's membership when this returns (the
        push is awaited, at most ``ATTACH_PUSH_TIMEOUT_S``; a controller not answering by then
        pulls the membership itself when the driver calls, ``pushed: False``). Controllers are
        created here, lazily, so admissions that never run (HTTP what-if traffic, benchmarks)
        start no actors. None for an unknown job; an ended job's ticket has no controller."""
        with self._lock:
            rec = self.job_store.get(job_id)
            if rec is None:
                return None
            view = self._view(rec)
            if not rec.state.is_active() or view.group_id is None:
                return AttachTicket(view.public(), None)
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
        return AttachTicket(view.public(), controller_name(gid, self.name), pushed)

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
            return self._refusal(jid, Code.INVALID, f"invalid job spec: {e}", t0, dry_run)
        bad = self._class_refusal(job)
        if bad:
            return self._refusal(job.job_id, Code.INVALID, f"invalid job spec: {bad}", t0, dry_run)
        sha = spec_sha256(job)
        old = self.job_store.get(job.job_id)
        if old is not None and old.state.is_active():
            if old.spec_sha256 == sha and old.decision is not None:  # a retry: the original decision, again
                now = self._view(old)  # with where the job is now (a re-packing may have moved it)
                return {**old.decision, "group_id": now.group_id, "replayed": True,
                        "placement": now.placement.model_dump(mode="json") if now.placement else None}
            return self._refusal(job.job_id, Code.DUPLICATE, f"job {job.job_id!r} is already {old.state} with a "
                                 "different spec", t0, dry_run)
        if job.job_id in self.queue:
            return self._refusal(job.job_id, Code.DUPLICATE, f"job {job.job_id!r} is already queued (position "
                                 f"{self.queue.position(job.job_id)})", t0, dry_run)
        if dry_run:  # the same function answers the Serve replicas' dry-runs from their snapshot copy
            return what_if(self.igs, job, [q.gpus for q in self.queue.jobs()], backfill=self.queue.backfill,
                           queue=queue, explain=explain)
        quota = self._quota(job)  # the tenant's quota (rollmux.preemption)
        if not quota.ok:
            if queue and not quota.never:
                return self._enqueue(job, quota.reason, t0)
            return self._refusal(job.job_id, Code.NEVER if quota.never else Code.RETRY_LATER, quota.reason, t0, dry_run)
        if not self.queue.may_try_now(job):  # queued jobs first: a larger newcomer waits behind them
            why = QUEUE_AHEAD_REASON(len(self.queue))
            if queue:
                return self._enqueue(job, why, t0)
            return self._refusal(job.job_id, Code.RETRY_LATER, why, t0, dry_run)
        decision = self.igs.decide(job)
        out = decision.to_dict(explain)
        if not out.get("admitted") and out.get("code") == Code.RETRY_LATER:  # a higher class may preempt
            pre = self._try_preempt(job, t0, sha, explain, queue)
            if pre is not None:
                return pre
        if queue and not out.get("admitted") and out.get("code") == Code.RETRY_LATER:
            return self._enqueue(job, out.get("reason", ""), t0, out)
        if not out.get("admitted"):
            self.metrics.admission(Code(out["code"]).outcome if out.get("code") else "refused", out.get("latency_ms", 0.0))
            return out
        # one checkpoint write commits it; a failed write undoes it (group commit: the batch's
        # failed write restores the last written state instead, so no per-admission copy is taken)
        with contextlib.nullcontext() if self._defer else self._transaction():
            grp = self.igs.commit(decision)
            self._admitted(job, out, t0, grp, sha=sha)
        return out

    def _admitted(self, job: JobSpec, out: dict, t0: float, grp, queued=None, sha: Optional[str] = None) -> None:
        """Record a committed admission (``grp``: the group the policy committed it to): the job
        record (with its queue wait when ``queued``), checkpoint, controller push, metrics."""
        gid = out["group_id"] = grp.group_id if grp is not None else out["group_id"]
        member = self.igs.member(job.job_id)
        borrowed = self._quota(job).borrowing  # beyond its tenant's quota: borrowed capacity
        rec = self.job_store.admitted(job, out, member.profile if member is not None else None, sha=sha, queued=queued,
                                      borrowed=borrowed)
        if queued is not None:
            self.metrics.queue_wait(rec.waited_s)
        self._checkpoint(jobs=(job.job_id,), groups=(gid,))  # target state first, then act
        self._note_admission(job.job_id, gid)
        self._push([gid])
        self.metrics.admission(Code.OK.outcome, out.get("latency_ms", (time.perf_counter() - t0) * 1e3))
        self.metrics.job(job.job_id, slo=job.slo, iterations=0)
        self._cost_metrics(gid)
        out["latency_ms"] = out.get("latency_ms", (time.perf_counter() - t0) * 1e3)

    def _refusal(self, job_id, code: Code, reason: str, t0: float, dry_run: bool) -> dict:
        """A refusal of the scheduler itself (``invalid`` | ``duplicate`` | ...) as an AdmissionDecision."""
        ms = (time.perf_counter() - t0) * 1e3
        if not dry_run:
            self.metrics.admission(code.outcome, ms)
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
            return self._cancel_queued(job_id)
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
        rec = self.job_store.get(job_id)
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
            self._forget(job_id)
            moves = self._departure_moves(gid, job_id)
            released = sorted(before - self._nodes_in_use(), key=lambda n: (n.split("-")[0], node_index(n)))
            now = time.time()
            if final.placement is not None:  # its workers drop its state (reconcile loop)
                self.reconciler.release(job_id, rec.admission_id,
                                        [*final.placement.rollout_nodes, *final.placement.train_nodes])
            self.job_store.end(rec, state, error, final, now)
            self.metrics.job_ended(job_id)
            done = self._record_moves(moves, job_id, now)
            touched = list(dict.fromkeys([gid] + [g for m in done for g in (m.from_group, m.to_group)]))
            self._checkpoint(jobs=(job_id, *[m.job_id for m in done]), groups=tuple(touched))
        self._push(touched)
        self._moved_metrics(touched, len(done))
        dissolved = [g for g in touched if self.igs.group_snapshot(g) is None]
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
        late = [j for j, r in self.job_store.records.items()
                if r.state == JobState.ADMITTED and r.admitted_at is not None and now - r.admitted_at > limit]
        for j in late:
            self._end(j, JobState.EXPIRED, f"expired: no driver attached within {limit:g} s of admission; its "
                      "nodes were released. Submit the job again to run it.")
        return late

    def _nodes_in_use(self) -> set[str]:
        return {n for g in self.igs.groups for n in (*g.rollout_nodes, *g.train_nodes)}

    @_locked
    def report(self, job_id: str, event: RuntimeEvent | ProgressReport | dict) -> Optional[dict]:
        """Runtime reports (:mod:`rollmux.messages`, or their dict form ``{"event": ...}``): a
        :class:`ProgressReport` (one measured iteration: iterations_done, t_iter_s, t_solo_s,
        slowdown); a :class:`RuntimeEvent` ``running``, ``finished`` (departure) or ``failed``
        (error; departure), the last two with the driver's final iteration count; of a preempted
        or moved job ``stopped`` (the controller of its old group, ``group_id``, removed it at its
        iteration boundary) and ``drained`` (its driver exported its state from that group's
        workers: its nodes there are free for others; :mod:`rollmux.drain`).
        Returns the job record."""
        rec = self.job_store.get(job_id)
        if rec is None:
            return None
        msg = parse_report(event)
        if isinstance(msg, ProgressReport):  # also after the end: events from controller and driver may cross
            with self._transaction():
                self.job_store.note_progress(rec, msg)
                self._checkpoint(jobs=(job_id,))  # progress is written with the event that changes it
            rec = self.job_store.get(job_id)
            self.metrics.job(job_id, iterations=rec.iterations_done, slowdown=rec.slowdown)
            self._note_slo_check(job_id)  # re-checked on measured times by the reconcile thread (SloPart)
        elif msg.kind in (EventKind.STOPPED, EventKind.DRAINED):  # a preempted / moved job's drain (PriorityPart)
            self._drain_report(job_id, msg)
        elif msg.kind == EventKind.RUNNING:
            if rec.state == JobState.ADMITTED:
                with self._transaction():
                    self.job_store.transition(rec, JobState.RUNNING)
                    self._checkpoint(jobs=(job_id,))
        else:
            self._drain_report(job_id, msg)  # its controller evicted it / its driver ended: nothing of it runs
            self.job_store.note_final_count(rec, msg.iterations_done)
            st = JobState.FINISHED if msg.kind == EventKind.FINISHED else JobState.FAILED
            self._end(job_id, st, None if st == JobState.FINISHED else (msg.error or "failed"))
        return self._view(rec).public()

    # ---- queries
    @_locked
    def list_jobs(self) -> list[dict]:
        """Every job record (admission order), then the queued jobs (line order)."""
        return [self._view(r).public() for r in self.jobs.values()] + [
            v for v in self._queued_views() if v["job_id"] not in self.jobs]  # a preempted job: its record

    @_locked
    def get_job(self, job_id: str) -> Optional[dict]:
        r = self.job_store.get(job_id)
        if r is None and job_id in self.queue:
            return next(v for v in self._queued_views() if v["job_id"] == job_id)
        return None if r is None else self._view(r).public()

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

    # ---- the published snapshot (Serve replicas answer reads from it: actors.scheduler.snapshot_log) and group commit
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
        self.snapshots.publish(views, {g: self._group_view(g) for g in gids},
                               self._queue_view() if queue_changed else None, policy)

    def _full_snapshot(self, policy: bool = False) -> dict:
        out = {"epoch": self.epoch, "version": self.version, "full": True, "cluster": self.cluster.model_dump(mode="json"),
               "jobs": {j: self._view(r).public() for j, r in self.jobs.items()},
               "groups": {g.group_id: self._group_view(g.group_id) for g in self.igs.groups},
               "queue": self._queue_view()}
        if policy:
            out["policy"] = {"header": self.igs.snapshot_header(),
                             "groups": {g.group_id: self.igs.group_snapshot(g.group_id) for g in self.igs.groups}}
        return out

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
        await self.snapshots.wait_newer(epoch, version, wait_s)
        with self._lock:
            return self.snapshots.changes(epoch, version, policy, lambda: self._full_snapshot(policy))

    @_locked
    def list_groups(self) -> list[dict]:
        """Groups: members, nodes, Cost(G) USD/h, T_cycle, T_load and slack (T_cycle - T_load)."""
        return [self._group_view(g.group_id) for g in self.igs.groups]

    @_locked
    def health(self) -> dict:
        return {"ok": True, "jobs": self.job_store.active(), "groups": len(self.igs.groups), "queued": len(self.queue),
                "snapshot_version": self.version, "restored": self.restored, "name": self.name,
                "unacked_pushes": len(self.reconciler.dirty), "checkpoint_seq": self.store.seq,
                "checkpoint_base_seq": self.store.base_seq, "compactions_inline": self.compactions_inline,
                "compactions_off_reply": self.compactions_off_reply, "reopt_planned": self.reopt_planned,
                "reopt_applied": self.reopt_applied, "reopt_stale": self.reopt_stale}

    async def group_timeline(self, group_id: str) -> list[dict]:
        """The timeline recorded by a group's controller (also after the group dissolved). An
        operator query: awaited (the actor keeps serving other calls meanwhile), bounded by
        QUERY_TIMEOUT_S. This ``async`` method (with :meth:`attach`, :meth:`snapshot_since` and
        the batched writes) makes the actor an async actor: its other methods are plain functions
        that run to completion on its event loop and never wait on a controller."""
        with self._lock:
            kept = self._dissolved_timelines.get(group_id)
            h = None if kept is not None else self.reconciler.controller(group_id)
        if kept is not None:
            return list(kept)
        if h is None:
            return []
        return await h.timeline_async(QUERY_TIMEOUT_S)

    @_locked
    def keep_timeline(self, group_id: str, records: list[dict]) -> bool:
        """Keep the timeline a dissolved group's controller hands over as it exits (the last
        ``DISSOLVED_TIMELINES_KEPT`` groups, in memory: an operator query, not checkpointed)."""
        self._dissolved_timelines[group_id] = list(records)
        self._dissolved_timelines.move_to_end(group_id)
        while len(self._dissolved_timelines) > DISSOLVED_TIMELINES_KEPT:
            self._dissolved_timelines.popitem(last=False)
        return True

    def cluster_spec(self) -> dict:
        return self.cluster.model_dump(mode="json")


def get_or_create_scheduler(cluster: Optional[ClusterSpec | dict] = None, *, checkpoint_path: Optional[str] = None,
                            name: str = SCHEDULER_NAME, **kw):
    """The named, detached GlobalScheduler (created if absent; ``max_restarts=-1``).

    ``cluster`` defaults to ``configs/cluster_local.yaml``. Connects to Ray (``RAY_ADDRESS`` or
    ``auto``) if this process is not connected. Extra ``kw`` (config, policy, max_group_size,
    seed, compaction (default ``"background"``), reopt_worker (default ``"process"``), ...) go to
    the constructor. Returns Ray's actor handle (wrap it in
    :class:`actors.handles.SchedulerHandle` to call it).
    """
    ensure_ray()
    if cluster is None:
        from rollmux.config import CONFIG_DIR, load_cluster

        cluster = load_cluster(CONFIG_DIR / "cluster_local.yaml")
    spec = cluster.model_dump(mode="json") if isinstance(cluster, ClusterSpec) else cluster
    if isinstance(kw.get("config"), SchedulerConfig):
        kw["config"] = kw["config"].model_dump()
    kw.setdefault("compaction", "background")  # the checkpoint's compaction never on a reply path
    kw.setdefault("reopt_worker", "process")  # re-optimisation solves never take the actor's interpreter lock
    return start_actor(GlobalSchedulerImpl, (spec, checkpoint_path), {"name": name, **kw}, name=name,
                       namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
                       resources=control_plane_resources(), max_restarts=-1, max_task_retries=0)


# The actor class under its contract name (wrap with ray.remote, or use get_or_create_scheduler).
GlobalScheduler = GlobalSchedulerImpl
