"""GlobalScheduler: the single owner of RollMux's group table on a Ray cluster (RollMux §4.2, §5).

One named, detached actor (``rollmux-global-scheduler`` in namespace ``rollmux``, get-if-exists,
``max_restarts=-1``). It admits jobs by calling the policy (:class:`rollmux.admission.
InterGroupScheduler`, Alg. 1; no second copy here), tracks each job's lifecycle
(:class:`rollmux.records.JobState`: admitted -> running -> finished | failed, changed only by its
transitions) in one :class:`rollmux.records.JobRecord` per job, and releases nodes on departure
or failure.

In the manner of Ray Serve's controller (which builds its ``*StateManager`` objects from explicit
collaborators and only delegates to them), the actor is composed of services, each built here
from the collaborators it names, none reaching into another's state:

- :class:`actors.scheduler.policy_ref.PolicyRef`: the policy's table (replaced on restore and rollback);
- :class:`actors.scheduler.job_store.JobStore`: the job records and their one writer;
- :class:`actors.scheduler.commit.Commit`: the unit of work (one write-ahead record per state change,
  group commit for the HTTP path, what waits for the next write, compaction);
- :class:`actors.scheduler.views.Views`: job / group / queue views and the published snapshot the
  Serve replicas follow (:class:`actors.scheduler.snapshot_log.SnapshotLog`);
- :class:`actors.scheduler.admission_queue.QueueService`: the admission queue of a bounded cluster;
- :class:`actors.scheduler.priority.PriorityRules`: tenant quotas and preemption;
- :class:`actors.scheduler.pipeline.AdmissionPipeline`: every admission as one sequence of named steps;
- :class:`actors.scheduler.lifecycle.Lifecycle`: reports, departures, failures, expiry;
- :class:`actors.scheduler.drains.Drains`: a preempted or moved job's old nodes, fenced until drained;
- :class:`actors.scheduler.reopt.Reoptimiser` and :class:`actors.scheduler.slo_watch.SloWatch`:
  re-packing, re-optimisation and the SLO watch (moves);
- :class:`actors.scheduler.membership.Membership` and :class:`actors.scheduler.reconciler.Reconciler`:
  each group's target membership, pushed to its controller through an injected
  :class:`actors.scheduler.reconciler.HandleFactory` (``RayHandles`` on a cluster; fakes in unit tests).

The singleton never waits on a controller, except :meth:`GlobalSchedulerImpl.attach` (a driver
asking to run its job), which awaits, bounded, the acknowledgement of the membership it pushed,
so the driver attaches to a controller that already knows it. The *target state* (job records +
the policy's snapshot) is checkpointed to a KV store (:mod:`actors.scheduler.kv`; Ray GCS internal KV by
default, a file directory with ``checkpoint_path``) first (a crash before the write means the
change never happened, after it that it did; a failed write rolls the change back; a bad
checkpoint refuses to start); then each touched group's controller gets the group's membership
pushed. A failing reconcile pass is logged and the loop goes on; its duration is the gauge
``rollmux_reconcile_seconds``. A restarted scheduler restores the checkpoint and re-finds the
named, detached controllers. No admitted job is lost when the actor dies.

Contract (actors/scheduler/README.md "GlobalScheduler actor contract"): the public methods take
and return the typed messages of :mod:`rollmux.messages` (its answers: :mod:`rollmux.answers`;
a job is answered as its :class:`rollmux.records.JobRecord`), never a dict; refusals are values
(an :class:`rollmux.answers.Admission` with ``admitted`` False and a :class:`rollmux.codes.Code`),
not exceptions. Codes besides the policy's (ok | never |
retry_later): ``invalid`` (spec fails validation) and ``duplicate`` (the job id is admitted or
running with a different spec; the same spec again gets the original decision, ``replayed:
True``). Ended jobs' workers are told to drop the job's state; admitted jobs that no driver
attaches to expire (:meth:`GlobalSchedulerImpl.expire_unattached`); a failed job's ``error`` is
written for people (:func:`rollmux.records.explain_failure`), the raw error kept in ``error_detail``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from typing import Optional

from actors.handles import start_actor
from actors.naming import (  # noqa: F401  (NAMESPACE, SCHEDULER_NAME, get_scheduler re-exported)
    NAMESPACE, SCHEDULER_NAME, control_plane_resources, controller_name, ensure_ray, get_scheduler,
)
from actors.ops.metrics import RollmuxMetrics
from actors.scheduler.admission_queue import QueueService
from actors.scheduler.checkpoint import Checkpoint, CheckpointError  # noqa: F401  (CheckpointError re-exported)
from actors.scheduler.commit import COMPACTION_MODES, GROUP_COMMIT_WINDOW_S, Commit, full_state, load_state  # noqa: F401
from actors.scheduler.drains import Drains
from actors.scheduler.job_store import MAX_FINISHED_RECORDS, JobStore, spec_sha256  # noqa: F401  (re-exported)
from actors.scheduler.kv import make_kv
from actors.scheduler.lifecycle import Lifecycle
from actors.scheduler.membership import Membership
from actors.scheduler.pipeline import AdmissionPipeline
from actors.scheduler.policy_ref import PolicyRef
from actors.scheduler.priority import PriorityRules
from actors.scheduler.reconciler import (  # noqa: F401  (re-exported)
    ATTACH_PUSH_TIMEOUT_S, PUSH_RETRY_S, RECONCILE_FULL_S, RECONCILE_S, HandleFactory, RayHandles, Reconciler,
)
from actors.scheduler.reopt import Reoptimiser
from actors.scheduler.slo_watch import SloWatch
from actors.scheduler.snapshot_log import SNAPSHOT_LOG, SnapshotLog  # noqa: F401  (re-exported)
from actors.scheduler.views import Views
from rollmux.admission import InterGroupScheduler, SchedulerConfig, load_scheduler_config
from rollmux.admission_queue import AdmissionQueue
from rollmux.answers import (
    Admission, AdmitCall, Departure, GroupRecord, SchedulerHealth, SnapshotDelta, Unavailable,
)
from rollmux.codes import Code
from rollmux.config import ConfigError
from rollmux.messages import AttachTicket, MemberTarget, MembershipPush, ProgressReport, RuntimeEvent, TimelineEntry
from rollmux.models import ClusterSpec, JobSpec
from rollmux.records import JobRecord

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


def legacy_queue_key(store: Checkpoint) -> str:
    """The admission queue's KV key of the previous layout (read once, moved into a base and
    deleted): the line now travels in the write-ahead record of the commit that changes it."""
    return f"{store.prefix}.queue"


class GlobalSchedulerImpl:
    """The scheduler actor (a plain class, wrapped by :func:`get_or_create_scheduler`): builds its
    services (see the module docstring) and delegates every call to them.

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
        if reopt_worker not in ("thread", "process"):
            raise ValueError(f"reopt_worker must be 'thread' or 'process', not {reopt_worker!r}")
        self.cluster = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.model_validate(cluster)
        self.name = name
        self.kv = kv if kv is not None else make_kv(checkpoint_path, namespace=NAMESPACE)
        self.metrics = metrics if metrics is not None else RollmuxMetrics(flush_interval_s=metrics_flush_s,
                                                                          enabled=metrics_enabled)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        # timelines handed over by exiting controllers of dissolved groups (group_timeline)
        self._dissolved_timelines: collections.OrderedDict[str, list[TimelineEntry]] = collections.OrderedDict()
        # ---- the state: the policy's table, the records, the line (restored from the checkpoint, or new)
        self.policy = PolicyRef(self.cluster)
        self.job_store = JobStore(name, lambda: self.policy.igs)
        self.store = Checkpoint(self.kv, name)
        self.restored = False
        state = self.store.load()  # raises CheckpointError (naming the store) for a bad checkpoint
        if state is not None:
            load_state(self.policy, self.job_store, state)
            self.restored = True
            if self.igs.config.runtime_refusals():  # an older release's checkpoint: the runtime never did it
                log.warning("restored config: %s; running with per_job_allocations: off, what this runtime always did",
                            "; ".join(self.igs.config.runtime_refusals()))
                self.igs.config = self.igs.config.overridden(per_job_allocations="off")
            if self.store._legacy:  # a version-1 checkpoint: rewritten as a base once
                self.store.create(full_state(self.policy, self.job_store, None))
        else:
            base = load_scheduler_config() if config is None else SchedulerConfig.model_validate(
                config.model_dump() if isinstance(config, SchedulerConfig) else config)
            overrides = {k: v for k, v in {"policy": policy, "max_group_size": max_group_size, "seed": seed,
                                           "repack_on_departure": repack_on_departure}.items() if v is not None}
            cfg = SchedulerConfig.model_validate({**base.model_dump(), **overrides})
            refused = cfg.runtime_refusals()  # a setting the runtime cannot carry out is refused, never ignored
            if refused:
                raise ConfigError("the cluster's runtime cannot carry out these scheduler settings: " + "; ".join(refused))
            self.policy.igs = InterGroupScheduler(self.cluster, config=cfg)
            self.store.create(full_state(self.policy, self.job_store, None))
        self.queue = AdmissionQueue.from_config(self.policy.config)
        legacy_queue = self.kv.get(legacy_queue_key(self.store))  # the previous layout kept the line under its own key
        self.queue.restore(state["queue"] if state is not None and state.get("queue") is not None else legacy_queue)
        for jid in [q.job_id for q in self.queue.jobs()]:  # (previous layout) admitted before a crash between two writes
            if jid in self.job_store and self.job_store.get(jid).state.is_active():
                self.queue.remove(jid)
        if legacy_queue is not None:  # the line moves into a base (one put), then the old key goes
            self.store.compact(full_state(self.policy, self.job_store, self.queue))
            self.kv.delete(legacy_queue_key(self.store))
        # ---- the services, each from the collaborators it names
        # new GroupControllers carry the config's long-tail settings; explicit controller_kw wins
        self.controller_kw = {**self.policy.config.controller_settings(), **dict(controller_kw or {})}
        self.reconciler = Reconciler(name, handles if handles is not None else RayHandles(name, self.controller_kw),
                                     lambda gid: self.targets.target(gid),
                                     lambda gid: self.policy.igs.group_snapshot(gid) is not None)
        self.snapshots = SnapshotLog()  # the published snapshot (Serve replicas answer reads from it)
        self.views = Views(name, self.policy, self.job_store, self.queue, self.snapshots)
        self.commit = Commit(self.store, self.policy, self.job_store, self.queue, self.snapshots, self.views.publish,
                             self.reconciler.push, compaction)
        has_controller = self.reconciler.has_controller
        self.reopt = Reoptimiser(self.policy, self.job_store, self.commit, has_controller, self.metrics, self._lock,
                                 reopt_worker)
        self.drains = Drains(self.policy, self.job_store, self.commit, self._lock)
        self.targets = Membership(name, self.policy, self.job_store, self.drains, self.commit, self.reconciler,
                                     self._lock)
        self.queue_service = QueueService(self.queue, self.commit, self.job_store, self.metrics)
        self.rules = PriorityRules(self.policy, self.job_store, self.queue_service, self.commit, has_controller,
                                   self.reopt.forget, self.metrics)
        self.slo = SloWatch(self.policy, self.job_store, self.commit, self.reopt, self.metrics, self._lock)
        self.admissions = AdmissionPipeline(self.policy, self.job_store, self.queue_service, self.commit, self.rules,
                                            self.reopt, self.metrics)
        self.reopt.after_moves = self.admissions.settle  # a move may free room: the queue's first
        self.lifecycle = Lifecycle(self.policy, self.job_store, self.queue_service, self.commit, self.reopt, self.drains,
                                   self.slo, self.admissions, self.reconciler.release, self.metrics)
        # ---- threads
        self._reconciler_thread: Optional[threading.Thread] = None
        self._compactor_thread: Optional[threading.Thread] = None
        if compaction == "background":
            self._compactor_thread = threading.Thread(target=self.commit.compact_loop, args=(self._stop, self._lock),
                                                      name="rollmux-compactor", daemon=True)
            self._compactor_thread.start()
        self.targets.refind_controllers()
        if reconcile_s:
            self._reconcile_s = float(reconcile_s)
            self._reconciler_thread = threading.Thread(target=self._reconcile_loop, name="rollmux-reconcile",
                                                       daemon=True)
            self._reconciler_thread.start()

    # ---- views of the parts (read them; each is written by its service)
    @property
    def igs(self) -> InterGroupScheduler:
        """The policy's table now."""
        return self.policy.igs

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

    @property
    def compaction(self) -> str:
        return self.commit.compaction

    @property
    def compactions_inline(self) -> int:
        return self.commit.compactions_inline

    @property
    def compactions_off_reply(self) -> int:
        return self.commit.compactions_off_reply

    @property
    def reopt_planned(self) -> int:
        return self.reopt.planned

    @property
    def reopt_applied(self) -> int:
        return self.reopt.applied

    @property
    def reopt_stale(self) -> int:
        return self.reopt.stale

    # ---- admission
    @_locked
    def admit(self, spec: JobSpec, dry_run: bool = False, queue: bool = False, explain: str = "full") -> Admission:
        """Admit (or, with ``dry_run``, only evaluate) a job: its :class:`rollmux.answers.Admission`
        (``spec``: a :class:`rollmux.models.JobSpec`, or its dict form, validated: a bad one is
        refused with code ``invalid`` naming the field).

        On admission the job record and its group are checkpointed, then the group's controller
        (if it exists) gets the new membership pushed; the admission's neighbourhood is
        re-optimised afterwards, off the admission path (:meth:`reoptimise_pending`). ``queue``: a job that does not fit now
        (``retry_later``) is held by the admission queue (:mod:`rollmux.admission_queue`) instead
        of refused: code ``queued`` with ``queue_position``; a full queue refuses with code
        ``queue_full``. While jobs are queued, a new job larger than a queued one waits behind it
        (code ``retry_later`` without ``queue``). ``explain="chosen"``: an admission lists only the
        chosen candidate (:meth:`rollmux.admission.AdmissionDecision.answer`). The steps:
        :mod:`actors.scheduler.pipeline`. Source: RollMux §4.2, Alg. 1.
        """
        return self.admissions.admit(spec, dry_run, queue, explain)

    async def admit_batched(self, spec: JobSpec, dry_run: bool = False, queue: bool = False,
                            explain: str = "chosen") -> Admission:
        """:meth:`admit` with group commit (the HTTP path): the decision is taken at once, in
        arrival order; its checkpoint write is shared with the other decisions of the batch
        (collected for ``GROUP_COMMIT_WINDOW_S`` and while the previous write runs) and the call
        returns once that write is done, with ``snapshot_version`` (the published version that
        contains it). A failed write: code ``unavailable`` (nothing of the batch happened).
        ``explain``: ``"chosen"`` (default) or ``"full"`` candidate list of an admission."""
        out, version, failed = await self.commit.batched(self._lock, self.admissions.admit, spec, dry_run, queue,
                                                         explain)
        if failed is not None:
            jid = spec.get("job_id") if isinstance(spec, dict) else getattr(spec, "job_id", None)
            return Admission(jid, False, Code.UNAVAILABLE, failed)
        return out.replace(snapshot_version=version)

    async def admit_many(self, calls: list[AdmitCall]) -> list[Admission]:
        """Several :meth:`admit_batched` calls in ONE actor call (a Serve replica's batch of
        ``POST /v1/jobs``): decided one at a time in list order, sharing the group commit's write;
        the answers in the same order."""
        return list(await asyncio.gather(*(self.admit_batched(c.spec, c.dry_run, c.queue, c.explain) for c in calls)))

    # ---- departure / lifecycle
    @_locked
    def depart(self, job_id: str) -> Optional[Departure]:
        """The job leaves (:meth:`actors.scheduler.lifecycle.Lifecycle.depart`): its
        :class:`rollmux.answers.Departure` (``admitted_from_queue``: queued jobs let into the freed
        room); a queued job, or an admitted one no driver ever ran, is withdrawn (``cancelled``);
        None for an unknown id."""
        return self.lifecycle.depart(job_id)

    async def depart_batched(self, job_id: str) -> Optional[Departure | Unavailable]:
        """:meth:`depart` with group commit (see :meth:`admit_batched`), with ``snapshot_version``;
        :class:`rollmux.answers.Unavailable` when the batch's write failed (the departure did not happen)."""
        out, version, failed = await self.commit.batched(self._lock, self.lifecycle.depart, job_id)
        if failed is not None:
            return Unavailable(failed)
        return None if out is None else out.replace(snapshot_version=version)

    @_locked
    def expire_unattached(self, now: Optional[float] = None) -> list[str]:
        """Expire admitted jobs whose driver has not attached (reported ``running``) within the
        config's ``attach_timeout_s`` (:meth:`actors.scheduler.lifecycle.Lifecycle.expire_unattached`).
        Returns the expired job ids. Called by the reconcile loop; 0 disables."""
        return self.lifecycle.expire_unattached(now)

    @_locked
    def report(self, job_id: str, event: RuntimeEvent | ProgressReport) -> Optional[JobRecord]:
        """Runtime reports (:mod:`rollmux.messages`; anything else raises TypeError): a
        :class:`ProgressReport` (one measured iteration: iterations_done, t_iter_s, t_solo_s,
        slowdown); a :class:`RuntimeEvent` ``running``, ``finished`` (departure) or ``failed``
        (error; departure), the last two with the driver's final iteration count; of a preempted
        or moved job ``stopped`` (the controller of its old group, ``group_id``, removed it at its
        iteration boundary) and ``drained`` (its driver exported its state from that group's
        workers: its nodes there are free for others; :mod:`rollmux.drain`).
        Returns the job record."""
        return self.lifecycle.report(job_id, event)

    # ---- queries
    @_locked
    def list_jobs(self) -> list[JobRecord]:
        """Every job record (admission order), then the queued jobs (line order)."""
        return self.views.list_jobs()

    @_locked
    def get_job(self, job_id: str) -> Optional[JobRecord]:
        return self.views.get_job(job_id)

    @_locked
    def list_groups(self) -> list[GroupRecord]:
        """Groups: members, nodes, Cost(G) USD/h, T_cycle, T_load and slack (T_cycle - T_load)."""
        return self.views.list_groups()

    async def snapshot_since(self, epoch: Optional[str], version: int, wait_s: float = 5.0,
                             policy: bool = False) -> SnapshotDelta:
        """The published state changes after ``version`` of ``epoch`` (this actor instance's id):
        a :class:`rollmux.answers.SnapshotDelta` of the changed jobs and groups (None: gone) and
        the queue (None: unchanged), or everything (``full``) when the caller is new, of another
        instance, or too far behind. ``policy``: also the policy table's changes (its header and
        changed groups: what a replica answering dry-runs follows; only callers that ask pay for
        it). Waits up to ``wait_s`` for a new
        version when the caller is current (a long poll: the waiting costs the actor nothing).
        Versions count commits: a reply is at most one commit old."""
        await self.snapshots.wait_newer(epoch, version, wait_s)
        with self._lock:
            return self.snapshots.changes(epoch, version, policy,
                                          lambda: self.views.full_snapshot(self.cluster, policy))

    @_locked
    def health(self) -> SchedulerHealth:
        return SchedulerHealth(
            ok=True, jobs=self.job_store.active(), groups=len(self.igs.groups), queued=len(self.queue),
            snapshot_version=self.version, restored=self.restored, name=self.name,
            config_sha256=self.igs.config.sha256(), unacked_pushes=len(self.reconciler.dirty),
            checkpoint_seq=self.store.seq, checkpoint_base_seq=self.store.base_seq,
            compactions_inline=self.compactions_inline, compactions_off_reply=self.compactions_off_reply,
            reopt_planned=self.reopt_planned, reopt_applied=self.reopt_applied, reopt_stale=self.reopt_stale)

    async def group_timeline(self, group_id: str) -> list[TimelineEntry]:
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
    def keep_timeline(self, group_id: str, records: list[TimelineEntry]) -> bool:
        """Keep the timeline a dissolved group's controller hands over as it exits (the last
        ``DISSOLVED_TIMELINES_KEPT`` groups, in memory: an operator query, not checkpointed)."""
        self._dissolved_timelines[group_id] = list(records)
        self._dissolved_timelines.move_to_end(group_id)
        while len(self._dissolved_timelines) > DISSOLVED_TIMELINES_KEPT:
            self._dissolved_timelines.popitem(last=False)
        return True

    def cluster_spec(self) -> ClusterSpec:
        return self.cluster

    # ---- controllers: target state, pushes, the reconcile loop
    @_locked
    def membership(self, group_id: str) -> MembershipPush:
        """The group's target membership as a push with the next sequence number (what a
        restarted controller pulls)."""
        return self.reconciler.next_push(group_id)

    @_locked
    def group_members(self, group_id: str) -> list[MemberTarget]:
        """Active members of a group (planned round-robin order): job, nodes, SLO, fenced nodes."""
        return list(self.targets.target(group_id).members)

    @_locked
    def ensure_controller(self, group_id: str) -> str:
        """Create (if needed) the group's GroupController and push its members (not waited for);
        its name. Raises KeyError for a group without an active job. (Drivers use :meth:`attach`.)"""
        return self.targets.ensure_controller(group_id)

    async def attach(self, job_id: str) -> Optional[AttachTicket]:
        """A driver is about to run ``job_id``: its :class:`AttachTicket` (record, and its group's
        controller, created if needed and told first; :meth:`actors.scheduler.membership.Membership.attach`).
        None for an unknown job; an ended job's ticket has no controller."""
        return await self.targets.attach(job_id)

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

    def reoptimise_pending(self) -> list[dict]:
        """:meth:`actors.scheduler.reopt.Reoptimiser.reoptimise_pending` (the reconcile thread)."""
        return self.reopt.reoptimise_pending()

    def slo_watch_pending(self) -> list[dict]:
        """:meth:`actors.scheduler.slo_watch.SloWatch.pending_pass` (the reconcile thread)."""
        return self.slo.pending_pass()

    def drain_overdue_pending(self, now: Optional[float] = None, **kw) -> list[str]:
        """:meth:`actors.scheduler.drains.Drains.overdue_pending` (the reconcile thread)."""
        return self.drains.overdue_pending(now, **kw)

    def compact_pending(self) -> bool:
        """:meth:`actors.scheduler.commit.Commit.compact_pending` (the compactor thread, or a caller
        with ``compaction="manual"``)."""
        return self.commit.compact_pending(self._lock)

    def _reconcile_loop(self) -> None:
        """Converge every controller to the target state; a failing pass is logged, never fatal."""
        last_full = time.monotonic()
        while not self._stop.wait(self._reconcile_s):
            t0 = time.perf_counter()
            try:
                if time.monotonic() - last_full >= RECONCILE_FULL_S:
                    last_full = time.monotonic()
                    with self._lock:
                        self.targets.push_all()
                self.reoptimise_pending()
                self.slo_watch_pending()
                self.drain_overdue_pending()
                self.reconcile_once()
                self.expire_unattached()
                self.release_workers_once()
            except Exception:
                log.exception("reconcile pass failed; continuing")
            self.metrics.reconcile(time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the reconcile and compactor threads (tests; the actor otherwise lives until killed)."""
        self._stop.set()
        self.commit.compact_wake.set()
        self.reopt.close()


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
