"""The typed answers of the control plane's actors: what the GlobalScheduler's admissions,
departures and queries return, and the answers of a GroupController's and a worker's calls that
carry no runtime state (acknowledgements, capabilities, what a worker hosts).

Each is a frozen dataclass (picklable, no lazy parts) that crosses the actor boundary as it is;
the HTTP face (``serve_api/``) turns it into JSON once, with its ``to_dict``. Re-exported by
:mod:`rollmux.messages` (the runtime's messages), where the table of who sends what lists them:

==============================  ==========================================  ==============================
answer                          from -> to                                  call
==============================  ==========================================  ==============================
:class:`AdmitCall`              HTTP face -> GlobalScheduler                ``admit_many`` (one per request)
:class:`Admission`              GlobalScheduler -> caller                   ``admit`` / ``admit_batched`` /
                                                                            ``admit_many``
:class:`Departure`              GlobalScheduler -> caller                   ``depart`` / ``depart_batched``
:class:`Unavailable`            GlobalScheduler -> caller                   ``depart_batched`` (a failed write)
:class:`GroupRecord`            GlobalScheduler -> caller                   ``list_groups``
:class:`SchedulerHealth`        GlobalScheduler -> caller                   ``health``
:class:`SnapshotDelta`          GlobalScheduler -> Serve replica            ``snapshot_since``
:class:`MembershipAck`          GroupController -> GlobalScheduler          ``sync_members``
:class:`HostedJob`              worker -> operator / test                   ``hosted``
:class:`EndpointCaps`           worker -> sync leader                       ``sync_caps``
:class:`EndpointOpened`         worker -> sync leader                       ``open_sync_endpoint``
==============================  ==========================================  ==============================

A job is answered as its :class:`rollmux.records.JobRecord` (``get_job``, ``list_jobs``,
``report``) without the checkpoint-only fields. Pure: no Ray import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional

from rollmux.codes import Code
from rollmux.models import ClusterSpec, CoExecutionGroup, JobSpec, PhaseProfile
from rollmux.records import JobRecord, JobState, MoveRecord, NodePlacement, QueueEntry

if TYPE_CHECKING:  # (the admission package imports this module: no import of it at run time)
    from rollmux.admission.config import SchedulerConfig

__all__ = ["AdmitCall", "CandidateView", "PrunedGroup", "Admission", "Departure", "Unavailable", "GroupRecord",
           "SchedulerHealth", "PolicyHeader", "PolicyDelta", "SnapshotDelta", "HostedJob", "MembershipAck",
           "EndpointCaps", "EndpointOpened"]


def _placement(p: Optional[NodePlacement]) -> Optional[dict]:
    return None if p is None else {"rollout_nodes": list(p.rollout_nodes), "train_nodes": list(p.train_nodes)}


def _node_placement(d: Optional[Mapping]) -> Optional[NodePlacement]:
    if d is None:
        return None
    return NodePlacement(rollout_nodes=list(d["rollout_nodes"]), train_nodes=list(d["train_nodes"]))


# ----------------------------------------------------------------------------- admission
@dataclass(frozen=True)
class AdmitCall:
    """One admission asked of the scheduler (a Serve replica batches them: ``admit_many``)."""

    spec: JobSpec  # the job (validated by the caller; the scheduler checks its priority class and id)
    dry_run: bool = False  # evaluate only: nothing changes
    queue: bool = False  # a job that does not fit now waits in the admission queue instead of a refusal
    explain: str = "full"  # "full": every candidate considered is listed; "chosen": only the chosen one


@dataclass(frozen=True)
class CandidateView:
    """One placement an admission considered (:class:`rollmux.admission.decisions.Candidate`
    without its internal parts): its verdict (``ok`` | ``rejected`` | ``skipped``), the rejecting
    filter (``plugin``) and why."""

    group_id: Optional[str]  # the group it joins (None: a new group)
    strategy: str  # direct | scale_out | isolated ...
    delta_usd_per_h: float  # Cost(G') - Cost(G), USD/h
    verdict: str = "ok"
    plugin: Optional[str] = None
    reasons: tuple[str, ...] = ()
    predicted_slowdowns: Mapping[str, float] = field(default_factory=dict)  # job id -> co-executed / solo time
    placement: Optional[NodePlacement] = None  # the newcomer's nodes there

    def to_dict(self) -> dict:
        return {"group_id": self.group_id, "strategy": self.strategy, "delta_usd_per_h": self.delta_usd_per_h,
                "verdict": self.verdict, "plugin": self.plugin, "reasons": list(self.reasons),
                "predicted_slowdowns": dict(self.predicted_slowdowns), "placement": _placement(self.placement)}

    @classmethod
    def of(cls, d: Mapping) -> "CandidateView":
        return cls(d.get("group_id"), d.get("strategy", ""), d.get("delta_usd_per_h", 0.0), d.get("verdict", "ok"),
                   d.get("plugin"), tuple(d.get("reasons") or ()), dict(d.get("predicted_slowdowns") or {}),
                   _node_placement(d.get("placement")))


@dataclass(frozen=True)
class PrunedGroup:
    """A group discarded before its placements were evaluated (Alg. 1 line 4)."""

    group_id: str
    plugin: str  # group_size | saturation
    reason: str

    def to_dict(self) -> dict:
        return {"group_id": self.group_id, "plugin": self.plugin, "reason": self.reason}


#: Admission fields listed in its JSON form only when set (the scheduler's additions to the decision).
_EXTRAS = ("replayed", "queued", "queue_position", "would_queue", "preempted", "admitted_from_queue", "kept",
           "snapshot_version")


@dataclass(frozen=True)
class Admission:
    """An admission decision as the scheduler answers it: the policy's
    :class:`rollmux.admission.AdmissionDecision` (:meth:`~rollmux.admission.AdmissionDecision.answer`,
    its candidates listed as asked) with what the scheduler added: a replayed decision, a place in
    the admission queue, the jobs preempted for it, the queued jobs admitted with it, the published
    snapshot version that holds it. ``code``: :class:`rollmux.codes.Code` (the policy's ``ok`` |
    ``never`` | ``retry_later`` and the scheduler's ``invalid`` | ``duplicate`` | ``queued`` |
    ``queue_full`` | ``unavailable``). Source: RollMux §4.2, Alg. 1."""

    job_id: Optional[str]  # None: a spec without a readable job id (an ``invalid`` refusal)
    admitted: bool
    code: Code
    reason: str = ""
    policy: Optional[str] = None  # the admission policy's name
    group_id: Optional[str] = None
    strategy: Optional[str] = None
    placement: Optional[NodePlacement] = None
    delta_usd_per_h: Optional[float] = None  # Cost(G') - Cost(G), USD/h (None: nothing was placed)
    predicted_slowdowns: Mapping[str, float] = field(default_factory=dict)  # job id -> worst-case co-executed / solo
    candidates: tuple[CandidateView, ...] = ()
    pruned: tuple[PrunedGroup, ...] = ()
    latency_ms: float = 0.0  # the decision's time, ms
    profile: Optional[PhaseProfile] = None  # the newcomer's planning profile, s
    field: Optional[str] = None  # the spec field an ``invalid`` refusal is about (the HTTP 422 names it)
    candidates_listed: Optional[str] = None  # "chosen": only the chosen candidate is listed
    pruned_groups: Optional[int] = None  # with ``candidates_listed``: how many groups were pruned
    # ---- the scheduler's additions
    replayed: bool = False  # a retry of an admitted spec: the original decision, where the job is now
    queued: bool = False  # held by the admission queue (code ``queued``)
    queue_position: Optional[int] = None  # its place there, 1 = next
    would_queue: bool = False  # a dry run: ``POST /v1/jobs`` with ``queue`` would hold it
    preempted: Optional[tuple[str, ...]] = None  # lower-class jobs preempted for it
    admitted_from_queue: tuple[str, ...] = ()  # queued jobs admitted in the same write
    kept: bool = False  # a queued job tried again keeps its place (nothing was tried)
    snapshot_version: Optional[int] = None  # the published snapshot version that holds it (a write)

    def replace(self, **kw) -> "Admission":
        return dataclasses.replace(self, **kw)

    @property
    def retry_later(self) -> bool:
        return not self.admitted and self.code == Code.RETRY_LATER

    def to_dict(self) -> dict:
        """The JSON form (rollmux/admission/README.md "Policy core"): the decision's fields always,
        ``field`` / ``candidates_listed`` and the scheduler's additions only when set."""
        out = {"job_id": self.job_id, "admitted": self.admitted, "code": Code(self.code).value, "reason": self.reason,
               "policy": self.policy, "group_id": self.group_id, "strategy": self.strategy,
               "placement": _placement(self.placement), "delta_usd_per_h": self.delta_usd_per_h,
               "predicted_slowdowns": dict(self.predicted_slowdowns),
               "candidates": [c.to_dict() for c in self.candidates], "pruned": [p.to_dict() for p in self.pruned],
               "latency_ms": self.latency_ms, "profile": None if self.profile is None else self.profile.model_dump()}
        if self.field is not None:
            out["field"] = self.field
        if self.candidates_listed is not None:
            out["pruned_groups"], out["candidates_listed"] = self.pruned_groups, self.candidates_listed
        for k in _EXTRAS:
            v = getattr(self, k)
            if v:
                out[k] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "Admission":
        """From its JSON form (:meth:`to_dict`; a decision a job record keeps for a retry)."""
        prof = d.get("profile")
        pre = d.get("preempted")
        return cls(
            job_id=d.get("job_id"), admitted=bool(d.get("admitted")), code=Code(d.get("code") or Code.NEVER),
            reason=d.get("reason", ""), policy=d.get("policy"), group_id=d.get("group_id"), strategy=d.get("strategy"),
            placement=_node_placement(d.get("placement")), delta_usd_per_h=d.get("delta_usd_per_h"),
            predicted_slowdowns=dict(d.get("predicted_slowdowns") or {}),
            candidates=tuple(CandidateView.of(c) for c in d.get("candidates") or ()),
            pruned=tuple(PrunedGroup(p["group_id"], p["plugin"], p["reason"]) for p in d.get("pruned") or ()),
            latency_ms=d.get("latency_ms", 0.0), profile=None if prof is None else PhaseProfile.model_validate(prof),
            field=d.get("field"), candidates_listed=d.get("candidates_listed"), pruned_groups=d.get("pruned_groups"),
            replayed=bool(d.get("replayed")), queued=bool(d.get("queued")), queue_position=d.get("queue_position"),
            would_queue=bool(d.get("would_queue")), preempted=None if pre is None else tuple(pre),
            admitted_from_queue=tuple(d.get("admitted_from_queue") or ()), kept=bool(d.get("kept")),
            snapshot_version=d.get("snapshot_version"))


# ----------------------------------------------------------------------------- departure
@dataclass(frozen=True)
class Departure:
    """What a departure (``depart``, ``DELETE /v1/jobs/{id}``) did: the job's state now, the nodes
    the cluster no longer uses (the job's and those of groups dissolved by moves), the groups that
    ceased to exist, the departure re-packing moves, the queued jobs let into the freed room."""

    job_id: str
    state: JobState  # finished | cancelled (a queued job, or one no driver ever ran) | the ended state
    released_nodes: tuple[str, ...] = ()
    group_dissolved: bool = False  # the job's own group ceased to exist
    dissolved_groups: tuple[str, ...] = ()
    moves: tuple[MoveRecord, ...] = ()
    admitted_from_queue: tuple[str, ...] = ()
    already_ended: bool = False  # the job had ended before: nothing changed
    snapshot_version: Optional[int] = None  # the published snapshot version that holds it (a write)

    def replace(self, **kw) -> "Departure":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        """The JSON form (``DELETE /v1/jobs/{id}``); ``admitted_from_queue`` only when some were."""
        out = {"job_id": self.job_id, "state": str(self.state), "released_nodes": list(self.released_nodes),
               "group_dissolved": self.group_dissolved, "dissolved_groups": list(self.dissolved_groups),
               "moves": [m.model_dump(mode="json") for m in self.moves]}
        if self.admitted_from_queue:
            out["admitted_from_queue"] = list(self.admitted_from_queue)
        return out


@dataclass(frozen=True)
class Unavailable:
    """A write that did not happen: the checkpoint write of its batch failed (nothing of the batch
    changed; retry). ``depart_batched``'s answer then (an admission answers code ``unavailable``)."""

    reason: str


# ----------------------------------------------------------------------------- queries
@dataclass(frozen=True)
class GroupRecord:
    """A co-execution group as ``list_groups`` (``GET /v1/groups``) shows it: members, nodes,
    Cost(G) (USD/h), natural cycle T_cycle, busiest-node load T_load and slack T_cycle - T_load (s)."""

    group_id: str
    members: tuple[str, ...]  # job ids, round-robin order
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    cost_usd_per_h: float
    t_cycle_s: Optional[float]
    t_load_s: Optional[float]
    slack_s: Optional[float]
    controller: str  # its GroupController's actor name

    def to_dict(self) -> dict:
        return {"group_id": self.group_id, "members": list(self.members), "rollout_nodes": list(self.rollout_nodes),
                "train_nodes": list(self.train_nodes), "cost_usd_per_h": self.cost_usd_per_h,
                "t_cycle_s": self.t_cycle_s, "t_load_s": self.t_load_s, "slack_s": self.slack_s,
                "controller": self.controller}


@dataclass(frozen=True)
class SchedulerHealth:
    """The scheduler's liveness and bookkeeping (``health``, ``GET /healthz``)."""

    ok: bool
    jobs: int  # active jobs (admitted or running)
    groups: int
    queued: int  # jobs in the admission queue
    snapshot_version: int
    restored: bool  # restored from a checkpoint at start
    name: str  # its actor name
    config_sha256: str  # the scheduler settings' digest
    unacked_pushes: int  # groups whose controller has not acknowledged its membership yet
    checkpoint_seq: int
    checkpoint_base_seq: int
    compactions_inline: int  # checkpoint bases written on a reply path
    compactions_off_reply: int  # ... and off it
    reopt_planned: int  # re-optimisation plans computed / applied / stale
    reopt_applied: int
    reopt_stale: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- the published snapshot
@dataclass(frozen=True)
class PolicyHeader:
    """The policy table's snapshot without its groups
    (:meth:`rollmux.admission.InterGroupScheduler.snapshot_header`)."""

    version: int
    policy: str
    max_group_size: int
    seed: Optional[int]
    config: SchedulerConfig
    next_group: int  # group ids are never reused

    @classmethod
    def of(cls, header: Mapping, config: SchedulerConfig) -> "PolicyHeader":
        """From the policy's header form, with its config as the object it was dumped from."""
        return cls(int(header["version"]), header["policy"], int(header["max_group_size"]), header.get("seed"),
                   config, int(header["next_group"]))

    def to_dict(self) -> dict:
        return {"version": self.version, "policy": self.policy, "max_group_size": self.max_group_size,
                "seed": self.seed, "config": self.config.model_dump(), "next_group": self.next_group}


@dataclass(frozen=True)
class PolicyDelta:
    """The policy table's changes (what a Serve replica answering dry-runs follows): its header,
    each changed group (None: gone) and, for each changed group that is open, its place in the
    order decisions visit open groups (:meth:`rollmux.admission.InterGroupScheduler.open_seq`:
    the order a decision lists its candidates in)."""

    header: Optional[PolicyHeader] = None
    groups: Mapping[str, Optional[CoExecutionGroup]] = field(default_factory=dict)
    open_seqs: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SnapshotDelta:
    """The published state after a version (``snapshot_since``): the views of the changed jobs and
    groups (None: gone), the admission queue (None: unchanged) and, when asked, the policy table's
    changes; or everything (``full``) for a caller that is new, of another scheduler instance or
    too far behind (then ``cluster`` is set). ``epoch``: the scheduler instance; ``version``: the
    commits published so far."""

    epoch: str
    version: int
    full: bool = False
    jobs: Mapping[str, Optional[JobRecord]] = field(default_factory=dict)
    groups: Mapping[str, Optional[GroupRecord]] = field(default_factory=dict)
    queue: Optional[tuple[QueueEntry, ...]] = None
    cluster: Optional[ClusterSpec] = None
    policy: Optional[PolicyDelta] = None


# ----------------------------------------------------------------------------- a controller's and a worker's answers
@dataclass(frozen=True)
class HostedJob:
    """A job a worker hosts (its ``hosted`` answer, one per hosting key)."""

    key: str  # the hosting key: ``job_id`` or ``job_id@scheduler`` (actors.naming.hosted_key)
    job_id: str  # the scheduler's job id
    stored: bool  # its state is stored (in the object store) between phases
    resident: tuple[str, ...]  # names of its resident values (engines) kept on the worker
    switches: tuple[str, ...]  # how each of its phases here started (warm | cold | moved | recovered | replayed)
    pending_weights: bool  # synced weights wait for its next rollout


@dataclass(frozen=True)
class MembershipAck:
    """The controller's answer to a :class:`MembershipPush` (``sync_members``): the jobs it added
    and removed; ``stale``: the push was older than one already applied (ignored)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    stale: bool = False


@dataclass(frozen=True)
class EndpointCaps:
    """What a worker can use for a sync endpoint (its ``sync_caps`` answer,
    :func:`collectives.select.endpoint_caps`), named by its node, with the IP its endpoint binds to."""

    name: str  # the node id
    ip: str
    cuda: bool  # a CUDA device is visible
    nccl: bool  # NCCL can run here
    why: str  # why NCCL cannot run here ("ok" when it can)
    device: Optional[str] = None  # UUID of the current CUDA device (endpoints compare it)

    def to_dict(self) -> dict:
        """The form :func:`collectives.choose_backend` compares."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class EndpointOpened:
    """A worker joined a job's collectives group (its ``open_sync_endpoint`` answer)."""

    node: str
    index: int  # its index among the pool's endpoints
    backend: str  # nccl | gloo
