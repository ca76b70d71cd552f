"""The typed messages of the runtime control plane: what crosses an actor boundary (RollMux §5).

Every value one RollMux actor (or driver) sends another is one of these frozen dataclasses
(the answers to queries and the scheduler's answers: :mod:`rollmux.answers`, re-exported here);
:mod:`actors.handles` is the only code that sends them. Who sends what (docs/ARCHITECTURE.md
"Runtime sequences" draws each flow):

============================  ==========================================  ==========================
message                       from -> to                                  call
============================  ==========================================  ==========================
:class:`MembershipPush`       GlobalScheduler -> GroupController          ``sync_members``
:class:`MembershipAck`        GroupController -> GlobalScheduler          ``sync_members`` (its answer)
:class:`AttachTicket`         GlobalScheduler -> driver                   ``attach``
:class:`AttachReply`          GroupController -> driver                   ``attach``
:class:`Grant`                GroupController -> driver -> leader worker  ``acquire`` / ``run``
:class:`PhaseCall`            driver -> leader worker -> follower ranks   ``run``
:class:`PhaseRecord`          worker -> GroupController (the releaser)    ``release``
:class:`TimelineEntry`        GroupController -> worker / GlobalScheduler ``release`` / ``keep_timeline``
:class:`PhaseOutcome`         worker -> driver                            ``run`` (its answer)
:class:`RolloutProgress`      worker -> GroupController                   ``progress``
:class:`TailDecision`         GroupController -> worker                   ``progress`` (its answer)
:class:`ProgressReport`       GroupController -> GlobalScheduler          ``report``
:class:`RuntimeEvent`         driver / GroupController -> GlobalScheduler ``report``
:class:`JobHosting`           driver -> workers                           ``register_job``
:class:`MovedState`           old worker -> driver -> new worker          ``export_job`` / ``register_job``
:class:`SyncSignal`           sync leader -> the job's other workers      ``sync_signal``
:class:`SyncAck`              rollout worker -> sync leader               ``receive_*`` (answer)
:class:`EndpointCaps`         worker -> sync leader                       ``sync_caps`` (answer)
:class:`EndpointOpened`       worker -> sync leader                       ``open_sync_endpoint`` (answer)
:class:`WorkerPlace`          worker -> driver                            ``where``
============================  ==========================================  ==========================

Facts and their one owner (docs/ARCHITECTURE.md "Who owns what"): a grant carries the job's
iteration index once (the driver's count, :attr:`Grant.iteration`); the controller and the
scheduler derive what they show from the records they receive. No message grows keys on its
way: a value that is added on the way is a field of a new message (e.g. :attr:`PhaseCall.sync_gen`).

Pure: no Ray import. Units are in the field comments.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from rollmux.answers import (  # noqa: F401  (the actors' answers to queries, re-exported: see rollmux/answers.py)
    Admission, AdmitCall, CandidateView, Departure, EndpointCaps, EndpointOpened, GroupRecord, HostedJob,
    MembershipAck, PolicyDelta, PolicyHeader, PrunedGroup, SchedulerHealth, SnapshotDelta,
)
from rollmux.records import JobRecord, QueueEntry

__all__ = [
    "MemberTarget", "MembershipPush", "MembershipAck", "AttachTicket", "AttachReply", "Releaser", "Grant", "PhaseCall",
    "PhaseRecord", "PhaseOutcome", "RolloutProgress", "TailDecision", "EventKind", "RuntimeEvent",
    "ProgressReport", "AbortOutcome", "ParallelPlace", "JobHosting", "PendingWeights", "MovedState",
    "SyncSignalKind", "SyncSignal", "SyncAck", "EndpointCaps", "EndpointOpened", "WorkerPlace", "TimelineEntry",
    # the answers to queries (rollmux/answers.py)
    "AdmitCall", "Admission", "CandidateView", "PrunedGroup", "Departure", "GroupRecord", "SchedulerHealth",
    "PolicyHeader", "PolicyDelta", "SnapshotDelta", "JobRecord", "QueueEntry", "HostedJob", "MemberStatus",
    "ControllerStatus",
]


# ----------------------------------------------------------------------------- membership
@dataclass(frozen=True)
class MemberTarget:
    """One member of a co-execution group as its controller must know it."""

    job_id: str  # the job id (the scheduler's, not the workers' hosting key)
    rollout_nodes: tuple[str, ...]  # rollout node ids, rank order (e.g. "rollout-0")
    train_nodes: tuple[str, ...]  # training node ids, rank order (e.g. "train-0")
    slo: Optional[float] = None  # slowdown SLO, x the job's solo iteration time
    # nodes of this member on which it may not start a phase yet: a job of another group preempted
    # or moved off them has not drained there (rollmux.drain.fenced_nodes); empty: none
    fenced: tuple[str, ...] = ()
    max_staleness: int = 0  # the job's staleness bound k (rollmux.staleness; 0: synchronous)

    def to_dict(self) -> dict:
        """JSON-able ``{job_id, rollout_nodes, train_nodes, slo, fenced, max_staleness}`` (``group_members`` answers)."""
        return {"job_id": self.job_id, "rollout_nodes": list(self.rollout_nodes),
                "train_nodes": list(self.train_nodes), "slo": self.slo, "fenced": list(self.fenced),
                "max_staleness": self.max_staleness}

    @classmethod
    def of(cls, d: "MemberTarget | Mapping[str, Any]") -> "MemberTarget":
        if isinstance(d, MemberTarget):
            return d
        return cls(str(d["job_id"]), tuple(d["rollout_nodes"]), tuple(d["train_nodes"]), d.get("slo"),
                   tuple(d.get("fenced") or ()), int(d.get("max_staleness") or 0))


@dataclass(frozen=True)
class MembershipPush:
    """A group's whole target membership (GlobalScheduler -> GroupController, never awaited).

    The newest push alone decides (each is the whole target state); an older one arriving
    later (Ray does not keep an async actor's calls in submission order) is ignored by its
    :attr:`seq`. The scheduler sends one after every committed change of the group and again
    until the controller acknowledged it; a restarted controller pulls one
    (``GlobalScheduler.membership``)."""

    group_id: str  # the co-execution group
    members: tuple[MemberTarget, ...]  # active members in the planned round-robin order (first to last)
    gone: Mapping[str, str] = field(default_factory=dict)  # job id -> why it left ("departed", "failed", "moved to <g>")
    seq: int = 0  # push sequence number: increasing across scheduler restarts (ns since the epoch at start)
    dissolved: bool = False  # the group no longer exists (every member departed or moved)

    @classmethod
    def of(cls, group_id: str, members=(), gone: Optional[Mapping[str, str]] = None, seq: int = 0,
           dissolved: bool = False) -> "MembershipPush":
        """Build one from member dicts / :class:`MemberTarget` values (tests, the scheduler)."""
        return cls(group_id, tuple(MemberTarget.of(m) for m in members), dict(gone or {}), int(seq), bool(dissolved))

    @property
    def order(self) -> tuple[str, ...]:
        """The planned round-robin order (member job ids, first to last)."""
        return tuple(m.job_id for m in self.members)


@dataclass(frozen=True)
class AttachTicket:
    """What a driver needs to run its job (GlobalScheduler -> driver, ``attach``): its record and
    the name of its group's controller, which already holds the job's membership when this is
    answered (the scheduler pushed it and waited for the acknowledgement, bounded)."""

    record: JobRecord  # the job's record as the scheduler shows it (group and placement read from the policy)
    controller: Optional[str]  # the group's GroupController actor name (None: the job is not active)
    pushed: bool = False  # the controller acknowledged the membership that lists the job

    @property
    def group_id(self) -> Optional[str]:
        return self.record.group_id


@dataclass(frozen=True)
class AttachReply:
    """The controller's answer to a driver's ``attach``."""

    group_id: str  # the co-execution group
    queues: Mapping[str, tuple[str, ...]]  # node id -> job ids in its FIFO, head first
    lease_s: float  # driver lease, s (a driver silent this long while no phase of it runs is evicted)


# ----------------------------------------------------------------------------- one phase
class Releaser(str, enum.Enum):
    """Who releases a granted permit (:attr:`Grant.releaser`).

    ``leader_worker``: the worker that runs the phase on ``nodes[0]`` releases it once every
    rank ended, in the same call that ran the phase, before it answers the driver. The driver is
    granted the permit (it asked), the worker gives it back: the nodes are held until the phase
    really ended on them, also when the driver dies during the phase (a driver-side release
    would free the nodes while the dead driver's phase still computes there)."""

    LEADER_WORKER = "leader_worker"
    #: a framework job's driver, which runs the phase in its own code under ``Job.permit``
    #: (``actors.driver.permits``): nothing of the phase runs on RollMux's workers, so the driver
    #: that acquired releases; a driver that dies holding the permit is evicted after its lease
    #: (no worker marked the phase started), which frees the nodes.
    DRIVER = "driver"


@dataclass(frozen=True)
class Grant:
    """A phase permit (GroupController -> driver; carried on to the leader worker in its
    :class:`PhaseCall` and back to the controller with the :class:`PhaseRecord`)."""

    job_id: str  # the job (the scheduler's id)
    group_id: str  # the granting co-execution group
    phase: str  # rollout | train | sync
    pool: str  # rollout | train: the pool whose nodes the phase holds
    nodes: tuple[str, ...]  # node ids the phase holds, rank order (nodes[0]: the leader)
    iteration: int  # the job's iteration index, 0-based: the driver's count (the owner), carried once
    granted_at: float  # when the permit was granted, Unix time, s
    waited_s: float  # how long the acquire waited for it, s
    controller: Optional[str] = None  # the granting GroupController's actor name: where the releaser releases
    releaser: Releaser = Releaser.LEADER_WORKER  # who releases the permit (see :class:`Releaser`)
    # the policy version the phase works with (rollmux.staleness): a rollout's oldest allowed one
    # (``exact``: the one it uses), the version a training step starts from, the version a sync publishes
    version: Optional[int] = None


@dataclass(frozen=True)
class PhaseCall:
    """One run of a granted phase (driver -> the pool's leader worker; the leader hands each
    follower rank a copy with :attr:`sync_gen` set for a sync)."""

    grant: Grant  # the permit this run uses (a replay: the grant of the run that was released)
    pool_seq: int  # the driver's number of this phase among the job's phases of its pool, 1-based: its commit's number
    replay: bool = False  # the phase was released before a worker was lost: return its committed result, run nothing
    sync_gen: Optional[int] = None  # sync endpoint generation for the follower ranks (set by the leader)
    # the phase function's arguments after its state, as the user's driver called the phase (the
    # user's own values, passed through unchanged: ``fn(state, *args, **kwargs)``)
    args: tuple = ()
    kwargs: Mapping[str, object] = field(default_factory=dict)

    @property
    def phase(self) -> str:
        return self.grant.phase

    @property
    def iteration(self) -> int:
        return self.grant.iteration


#: PhaseRecord fields always present in its dict form; the others only when set.
_CORE = ("node", "nodes", "start", "switch", "switch_s", "ok", "error", "end")


@dataclass(frozen=True)
class PhaseRecord:
    """What one phase did on the leader worker (worker -> GroupController ``release``; also the
    driver's timeline). Times are Unix seconds, durations seconds, sizes bytes."""

    node: Optional[str] = None  # the leader's node id (None: no worker ran it, e.g. an aborted permit)
    nodes: tuple[str, ...] = ()  # every rank's node id, rank order
    start: Optional[float] = None  # the phase began on the leader, Unix time, s
    end: Optional[float] = None  # it ended (every rank), Unix time, s
    switch: Optional[str] = None  # warm | cold | moved | recovered | replayed: how the state was started
    switch_s: Optional[float] = None  # start-up (warm/cold/moved/recovered) time, s
    run_s: Optional[float] = None  # the user's phase function, s
    offload_s: Optional[float] = None  # offload of the state after the phase, s
    commit_s: Optional[float] = None  # the durable commit write, s (durable jobs)
    commit: Optional[int] = None  # the commit holding the phase's result (its pool_seq): the result's durable reference
    ok: bool = False  # the phase completed on every rank
    error: Optional[str] = None  # "<Type>: <message>" when it failed
    traceback: Optional[str] = None  # the failing frames (last 8)
    lost: Optional[bool] = None  # a worker (or a peer) was lost: redo from the last commit, not a failure
    replayed: Optional[bool] = None  # a replay of a released phase (nothing ran)
    ranks: Optional[tuple[Mapping[str, Any], ...]] = None  # per rank: node, switch, switch_s, run_s, offload_s
    gpus: Optional[int] = None  # GPUs the phase used on each node (None: the whole node)
    sync_backend: Optional[str] = None  # sync: the transport used (nccl | gloo | object_store)
    sync_backend_requested: Optional[str] = None  # sync: the transport asked for (auto | nccl | gloo | object_store)
    sync_note: Optional[str] = None  # sync: why that transport
    sync_s: Optional[float] = None  # sync: the weight transfer, s
    sync_receivers: Optional[tuple[Mapping[str, Any], ...]] = None  # sync: each rollout worker's :class:`SyncAck`
    sync_cross_bytes: Optional[int] = None  # sync: bytes sent across the pool boundary (all ranks), B
    sync_cross_bytes_by_rank: Optional[tuple[Optional[int], ...]] = None  # sync: per training rank, B
    release_error: Optional[str] = None  # the release to the controller failed ("<Type>: <message>")
    driver_side: Optional[bool] = None  # the phase ran in the driver under a permit (framework integrations)
    policy_version: Optional[int] = None  # rollout: the policy version its weights are (rollmux.staleness)
    empty: Optional[bool] = None  # driver-side: the framework skipped the phase; the permit kept the job's turn

    def to_dict(self) -> dict:
        """The JSON-able timeline form: the core fields always, the others only when set."""
        out: dict = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.name not in _CORE:
                continue
            if isinstance(v, tuple):
                v = [dict(x) if isinstance(x, Mapping) else x for x in v]
            out[f.name] = v
        return out

    def replace(self, **kw: Any) -> "PhaseRecord":
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PhaseRecord":
        """From its timeline form (:meth:`to_dict`; keys that are no field are ignored)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in _RECORD_FIELDS})


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(PhaseRecord))


@dataclass(frozen=True)
class TimelineEntry:
    """One phase in a group's timeline (GroupController ``get_timeline`` / ``release``; the
    scheduler keeps a dissolved group's, ``keep_timeline`` / ``group_timeline``): the job, its
    phase and iteration (the grant's), where it ran and what it did (:class:`PhaseRecord`).
    ``start_s`` / ``end_s``: s since the controller started."""

    job_id: str
    phase: str  # rollout | train | sync
    group_id: str
    pool: str  # rollout | train
    iteration: int  # the grant's iteration index, 0-based
    record: PhaseRecord
    start_s: float
    end_s: float

    def to_dict(self) -> dict:
        """The JSON form (a driver's ``Job.timeline()`` rows): the record's fields inline."""
        return {"job_id": self.job_id, "phase": self.phase, "group_id": self.group_id, "pool": self.pool,
                "iteration": self.iteration, **self.record.to_dict(), "ok": bool(self.record.ok),
                "start_s": self.start_s, "end_s": self.end_s}

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> "TimelineEntry":
        """From its JSON form (:meth:`to_dict`, the ledger's timeline rows)."""
        return cls(d["job_id"], d["phase"], d["group_id"], d["pool"], int(d["iteration"]), PhaseRecord.from_dict(d),
                   float(d["start_s"]), float(d["end_s"]))


@dataclass(frozen=True)
class PhaseOutcome:
    """The leader worker's answer to a :class:`PhaseCall`: the phase's result (the ranks'
    results in rank order for a job on several nodes of the pool) and its record."""

    result: Any  # the phase function's return value (a sync: ``{backend, cross_bytes, ...}``)
    record: PhaseRecord  # what the phase did


@dataclass(frozen=True)
class RolloutProgress:
    """Generation progress of a running rollout (worker -> controller, at most once per 1/20 of
    the responses): feeds long-tail migration (RollMux §4.3)."""

    job_id: str  # the job (the scheduler's id)
    done: int  # responses finished so far
    total: int  # responses of this rollout


@dataclass(frozen=True)
class TailDecision:
    """A long-tail migration decision (GroupController -> the rollout's worker; kept in the
    controller's status). ``acted``: the rollout's queue slots were released for the next one."""

    job_id: str  # the tail-bound job
    iteration: int  # its iteration index (from its grant)
    done: int  # responses finished at the trigger
    total: int  # responses of the rollout
    t: float  # when it was decided, Unix time, s
    next_rollout: Optional[str]  # the member waiting for these rollout nodes (None: nobody waits)
    tail_workers: tuple[str, ...]  # nodes that keep the unfinished responses
    freed_workers: tuple[str, ...]  # nodes handed to the next rollout
    acted: bool = False  # the queue slots were released (``migrate=True`` and someone waits)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tail_workers"], d["freed_workers"] = list(self.tail_workers), list(self.freed_workers)
        return d


class AbortOutcome(str, enum.Enum):
    """The controller's answer to ``abort_phase`` (the driver lost the worker running a phase)."""

    ABORTED = "aborted"  # the permit was withdrawn: the phase is granted again when ready (redo it)
    DONE = "done"  # the phase was released before the loss: do not run it again (replay its commit)
    NONE = "none"  # no grant here (a restarted controller, or the loss was already reported): ask again


# ----------------------------------------------------------------------------- reports to the scheduler
class EventKind(str, enum.Enum):
    """What a :class:`RuntimeEvent` says about a job."""

    RUNNING = "running"  # its driver registered it on its workers (admitted -> running)
    FINISHED = "finished"  # its driver ended it (departure: its nodes are released)
    FAILED = "failed"  # a phase failed, its driver was lost, or its driver gave up (departure)
    # a preempted or moved job (rollmux.drain): its old group's controller removed it at its
    # iteration boundary (no phase of it runs there any more, its permits are withdrawn;
    # GroupController -> scheduler, with the group)
    STOPPED = "stopped"
    # a preempted or moved job: its driver exported its state from its old workers, which no
    # longer host it (driver -> scheduler, with the group it left; none: every old home, a
    # preempted job's); its nodes there are free for other groups' jobs
    DRAINED = "drained"


@dataclass(frozen=True)
class RuntimeEvent:
    """A lifecycle event of a job (driver or GroupController -> GlobalScheduler ``report``)."""

    kind: EventKind  # running | finished | failed | stopped | drained
    error: Optional[str] = None  # failed: the raw error (the record keeps it as ``error_detail``)
    phase: Optional[str] = None  # failed: the phase that failed, if one did
    iterations_done: Optional[int] = None  # finished / failed by the driver: the owner's final iteration count
    group_id: Optional[str] = None  # stopped / drained: the group the job left (None: every group it left)

    def to_dict(self) -> dict:
        return {"event": self.kind.value, "error": self.error, "phase": self.phase,
                "iterations_done": self.iterations_done, "group_id": self.group_id}


@dataclass(frozen=True)
class ProgressReport:
    """One measured iteration of a job (GroupController -> GlobalScheduler ``report``), derived
    from the grants: ``iterations_done`` is the iteration's index (its grant's) + 1."""

    iterations_done: int  # iterations done after the measured one
    t_iter_s: Optional[float] = None  # co-executed iteration time: its rollout grant -> its last phase's end, s
    t_solo_s: Optional[float] = None  # the job's own phase time in that iteration (its solo iteration), s
    slowdown: Optional[float] = None  # measured co-executed / solo iteration time over its finished iterations
    # the job's own phase times in that iteration, s (None: not reported); they feed its measured
    # profile (rollmux.measured) and the SLO watch
    t_roll_s: Optional[float] = None
    t_train_s: Optional[float] = None
    t_sync_s: Optional[float] = None
    # the rollout at the long-tail trigger (None: no trigger reached): when, s from its start; the
    # responses unfinished then; whether long-tail migration acted on it
    t_trigger_s: Optional[float] = None
    tail_responses: Optional[int] = None
    tail_migrated: Optional[bool] = None
    # the job's first iteration in its group (after its admission or a move): it carries the cold
    # start (engine start-up, first load onto the nodes), which the steady-state model has no term
    # for, so it is not folded into the measured profile
    cold_start: bool = False

    def to_dict(self) -> dict:
        return {"event": "iteration", "iterations_done": self.iterations_done, "t_iter_s": self.t_iter_s,
                "t_solo_s": self.t_solo_s, "slowdown": self.slowdown, "t_roll_s": self.t_roll_s,
                "t_train_s": self.t_train_s, "t_sync_s": self.t_sync_s, "t_trigger_s": self.t_trigger_s,
                "tail_responses": self.tail_responses, "tail_migrated": self.tail_migrated,
                "cold_start": self.cold_start}


# ----------------------------------------------------------------------------- hosting a job on its workers
@dataclass(frozen=True)
class ParallelPlace:
    """A worker's SPMD place among the job's workers of one pool (multi-node phases)."""

    rank: int = 0  # this worker's rank in the pool (0: the leader)
    world_size: int = 1  # the job's workers of this pool
    peers: tuple[str, ...] = ()  # their worker actor names, rank order
    nodes: tuple[str, ...] = ()  # their node ids, rank order
    addr: Optional[str] = None  # "host:port" of the job's rendezvous store (hosted by rank 0; None: one worker)
    host: Optional[str] = None  # the address the job's gloo groups bind to on this worker

    @classmethod
    def of(cls, d: "ParallelPlace | Mapping[str, Any] | None") -> "ParallelPlace":
        if isinstance(d, ParallelPlace):
            return d
        d = d or {}
        return cls(int(d.get("rank", 0)), int(d.get("world_size", 1)), tuple(d.get("peers") or ()),
                   tuple(d.get("nodes") or ()), d.get("addr"), d.get("host"))


@dataclass(frozen=True)
class JobHosting:
    """What a worker needs to host a job (driver -> worker ``register_job``, cloudpickled by the
    driver and unpickled under the worker's lock): the job's program for this pool and where
    its state goes."""

    builder: Callable[[], dict]  # zero-arg builder of the pool's state dict
    job_id: Optional[str] = None  # the scheduler's job id (None: the hosting key is the id)
    phases: Mapping[str, Callable] = field(default_factory=dict)  # phase name -> function, this pool's phases
    apply: Optional[Callable] = None  # apply_weights(rollout_state, weights) (rollout side)
    hooks: tuple[Callable, ...] = ()  # runtime hooks: fn(event dict)
    switch: str = "warm"  # warm | cold: phase state between phases in the object store, or rebuilt from disk
    checkpoint_dir: Optional[str] = None  # cold-start files and durable commits (a path every node sees)
    admission: Optional[str] = None  # the scheduler's token of this admission (a re-used id gets a new one)
    sync_backend: str = "auto"  # weight transport asked for: auto | nccl | gloo | object_store
    durable: bool = True  # commit every phase's state and result before it counts as done
    rebuild_resident: bool = False  # cold starts rebuild resident values (engines) with the builder; False: keep them
    rollout_workers: tuple[str, ...] = ()  # training side: the job's rollout worker names (sync targets), rank order
    parallel: ParallelPlace = field(default_factory=ParallelPlace)  # this worker's SPMD place
    max_staleness: int = 0  # the job's staleness bound k (rollmux.staleness; 0: synchronous)
    staleness_mode: str = "exact"  # exact | bounded: which held version a rollout applies

    @classmethod
    def of(cls, cfg: "JobHosting | Mapping[str, Any]") -> "JobHosting":
        """From the message or its dict form (keys = field names; unit tests). Raises KeyError
        without a builder, TypeError for an unknown key."""
        if isinstance(cfg, JobHosting):
            return cfg
        d = dict(cfg)
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - known
        if extra:
            raise TypeError(f"unknown job hosting field(s): {', '.join(sorted(extra))}")
        d["phases"] = dict(d.get("phases") or {})
        d["hooks"] = tuple(d.get("hooks") or ())
        d["rollout_workers"] = tuple(d.get("rollout_workers") or ())
        d["parallel"] = ParallelPlace.of(d.get("parallel"))
        d["sync_backend"] = d.get("sync_backend") or "auto"
        d["durable"] = bool(d.get("durable", True))
        return cls(**d)


@dataclass(frozen=True)
class PendingWeights:
    """Synced weights a rollout worker holds until the job's next rollout applies them: object
    refs to pull (object-store sync) or the tensors received (collectives sync)."""

    refs: Optional[tuple[Any, ...]] = None  # ObjectRefs of the weights dict (object store)
    tensors: Optional[Mapping[str, Any]] = None  # name -> tensor (received over collectives / from disk)
    version: Optional[int] = None  # the policy version they are (the publishing sync's grant; None: not known)


@dataclass(frozen=True)
class MovedState:
    """A job's stored state handed over for a move (old worker -> driver -> new worker): the
    ObjectRef of the storable state (warm switch) or the cold-start file's bytes (cold switch),
    plus synced weights not applied yet. Resident values stay behind (rebuilt by the builder)."""

    job_id: str  # the hosting key on the old worker
    node: str  # the old worker's node id
    pool: str  # rollout | train
    ref: Any = None  # ObjectRef of the storable state, or None
    ckpt: Optional[bytes] = None  # the cold-start checkpoint's bytes, or None
    pending_weights: Optional[PendingWeights] = None  # rollout side: weights not applied yet
    held_weights: tuple[PendingWeights, ...] = ()  # rollout side, async ``exact`` job: versions published ahead
    policy_version: Optional[int] = None  # rollout side, async job: the version its rollout state holds
    bytes: Optional[int] = None  # size of ``ckpt``, B (None for a ref)


# ----------------------------------------------------------------------------- weight sync
class SyncSignalKind(str, enum.Enum):
    ABORT = "abort"  # a peer failed: an endpoint of that generation aborts now; a rank waiting for one gives up
    OBJECT_STORE = "object_store"  # the collectives could not be built: the sync goes through the object store


@dataclass(frozen=True)
class SyncSignal:
    """The sync leader's word about one sync generation (leader -> the job's other workers)."""

    gen: int  # the sync endpoint generation it is about
    kind: SyncSignalKind  # abort | object_store
    why: str  # the reason, for people


@dataclass(frozen=True)
class SyncAck:
    """A rollout worker's receipt of one sync (its ``receive_*`` answer to the leader)."""

    node: str  # the rollout node id
    fetch_s: float  # receiving (and, object store, pulling) the weights, s
    backend: str  # nccl | gloo | object_store | counted (emulated: bytes counted, not moved)
    cross_recv_bytes: Optional[int] = None  # received across the pool boundary, B (collectives)
    intra_recv_bytes: Optional[int] = None  # received from rollout peers (broadcast inside the pool), B

    def to_dict(self) -> dict:
        d = {"node": self.node, "fetch_s": self.fetch_s, "backend": self.backend}
        if self.backend != "object_store":
            d.update(cross_recv_bytes=self.cross_recv_bytes, intra_recv_bytes=self.intra_recv_bytes)
        return d


@dataclass(frozen=True)
class WorkerPlace:
    """Where a worker runs (its ``where`` answer: the placement check and the job's bind address)."""

    ray_node_id: str  # the Ray node the actor runs on
    node: str  # the RollMux node id
    pool: str  # rollout | train
    ip: str  # the node's IP address
    pid: int  # the worker process
    torch_threads: int  # torch compute threads (1)
    cpus: Optional[tuple[int, ...]] = None  # the CPUs it is pinned to (None: unpinned)
    gpu_ids: tuple[str, ...] = ()  # the GPUs Ray assigned it (where a driver-side job granted this node computes)


# ----------------------------------------------------------------------------- a controller's status
@dataclass(frozen=True)
class MemberStatus:
    """One member of a group as its controller sees it (:class:`ControllerStatus`)."""

    job_id: str
    next_phase: Optional[str]  # the phase the job asks for next (None: it has none queued)
    running: bool  # a phase of it is granted now
    iterations_done: int  # derived from the grants (the driver's count)
    turns: int  # the queues' own counter of this controller instance (restarts with it)
    fenced: tuple[str, ...]  # its nodes on which it may not start a phase yet (rollmux.drain)
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    slowdown: Optional[float]  # measured co-executed / solo iteration time


@dataclass(frozen=True)
class ControllerStatus:
    """A group's controller as it is now (GroupController ``status``): members, per-node queues,
    the jobs that left or are moving, long-tail migrations, metric totals."""

    group_id: str
    jobs: Mapping[str, MemberStatus]  # job id -> its status, queued members
    pending: tuple[str, ...]  # members whose driver has not attached yet
    gone: Mapping[str, str]  # job id -> why it left ("departed", "failed: ...", "moved to <g>")
    moving: Mapping[str, str]  # job id -> the move it waits to finish at its iteration boundary
    queues: Mapping[str, tuple[str, ...]]  # node id -> job ids in its FIFO, head first
    order: tuple[str, ...]  # the planned round-robin order
    migrations: tuple[TailDecision, ...]  # long-tail migration decisions
    timeline_len: int  # phases recorded in its timeline
    metrics: Mapping[str, Mapping[str, float]]  # metric name -> tag -> its total

    @classmethod
    def of(cls, st: Mapping[str, Any], migrations: tuple[TailDecision, ...],
           metrics: Mapping[str, Mapping[str, float]]) -> "ControllerStatus":
        """From the ledger's status (``rollmux.group_ledger.GroupLedger.status``)."""
        jobs = {j: MemberStatus(j, v["next_phase"], bool(v["running"]), int(v["iterations_done"]), int(v["turns"]),
                                tuple(v["fenced"]), tuple(v["rollout_nodes"]), tuple(v["train_nodes"]), v["slowdown"])
                for j, v in st["jobs"].items()}
        return cls(st["group_id"], jobs, tuple(st["pending"]), dict(st["gone"]), dict(st["moving"]),
                   {n: tuple(q) for n, q in st["queues"].items()}, tuple(st["order"]), tuple(migrations),
                   int(st["timeline_len"]), {k: dict(v) for k, v in metrics.items()})
