"""The records of one admission decision: the arriving job as the filters see it
(:class:`Newcomer`), each placement considered (:class:`Candidate`, with its verdict) and the
outcome (:class:`AdmissionDecision`, JSON-able with ``to_dict``). Source: RollMux §4.2, Alg. 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from rollmux.answers import Admission, CandidateView, PrunedGroup
from rollmux.codes import Code
from rollmux.models import JobSpec, PhaseProfile, Placement
from rollmux.records import NodePlacement

#: The filters a candidate or group can be rejected by (``Candidate.plugin``, ``Verdict.plugin``).
PLUGINS = ("saturation", "memory", "slo", "capacity", "group_size", "finite", "train_gpu_memory")


@dataclass(frozen=True)
class Newcomer:
    """The arriving job as every filter sees it, computed once per decision.

    Attributes:
        job / profile: its spec and planning (worst-case) phase times, seconds.
        rollout_nodes / train_nodes: whole nodes it needs in each pool (``ceil(GPUs / gpus_per_node)``).
        rollout_state_gb / train_state_gb: host-memory state it pins on each of its nodes, GB.
        free_rollout: the free rollout nodes a scale-out would take (None: the pool is full).
        rollout_price / train_price: $/h of one node of each pool.
        rollout_host_mem_gb / train_host_mem_gb: host memory of one node of each pool, GB.
    """

    job: JobSpec
    profile: PhaseProfile
    rollout_nodes: int
    train_nodes: int
    rollout_state_gb: float
    train_state_gb: float
    free_rollout: Optional[tuple[str, ...]]
    rollout_price: float
    train_price: float
    rollout_host_mem_gb: float
    train_host_mem_gb: float


@dataclass
class Candidate:
    """One placement of the newcomer: ``verdict`` is ``"ok"`` (feasible), ``"rejected"`` (with the
    ``plugin``, one of :data:`PLUGINS`, and human-readable ``reasons``) or ``"skipped"`` (feasible
    by the lower bound but provably unable to beat the chosen one, so never simulated)."""

    group_id: Optional[str]
    strategy: str
    delta_usd_per_h: float
    verdict: str = "ok"
    plugin: Optional[str] = None
    reasons: list[str] = field(default_factory=list)
    predicted_slowdowns: dict[str, float] = field(default_factory=dict)
    nodes: Optional[tuple[tuple[str, ...], tuple[str, ...]]] = None  # (rollout, train) node ids
    job_id: str = ""
    new_nodes: tuple[str, ...] = ()
    score: float = 0.0  # max_k slowdown_k / slo_k (tie-break; lower = more slack)
    bound: float = 0.0  # optimistic (lower-bound) score, before simulating
    numbers: dict[str, float] = field(default_factory=dict)  # the rejecting filter's figures (Verdict.numbers)
    members: list = field(default_factory=list, repr=False)  # G' members (internal)
    base: tuple = field(default=(), repr=False)  # (existing members, new member's spec, profile) (internal)

    @property
    def placement(self) -> Optional[Placement]:
        if self.nodes is None:
            return None
        return Placement.model_construct(job_id=self.job_id, rollout_nodes=self.nodes[0], train_nodes=self.nodes[1])

    def reject(self, plugin: str, reason: str, numbers: Optional[Mapping[str, float]] = None) -> "Candidate":
        self.verdict, self.plugin = "rejected", plugin
        self.reasons.append(reason)
        if numbers:
            self.numbers.update(numbers)
        return self

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def view(self) -> CandidateView:
        """The candidate as an answer lists it (without its internal parts)."""
        return CandidateView(self.group_id, self.strategy, self.delta_usd_per_h, self.verdict, self.plugin,
                             tuple(self.reasons), dict(self.predicted_slowdowns), _nodes(self.nodes))

    def to_dict(self) -> dict:
        return self.view().to_dict()


def _nodes(nodes: Optional[tuple[tuple[str, ...], tuple[str, ...]]]) -> Optional[NodePlacement]:
    if nodes is None:
        return None
    return NodePlacement.model_construct(rollout_nodes=list(nodes[0]), train_nodes=list(nodes[1]))


def placement_dict(p: Optional[Placement]) -> Optional[dict]:
    """``{rollout_nodes, train_nodes}`` (lists of node ids) of ``p``, JSON-able; None for None."""
    return None if p is None else {"rollout_nodes": list(p.rollout_nodes), "train_nodes": list(p.train_nodes)}


@dataclass
class AdmissionDecision:
    """The outcome of :meth:`InterGroupScheduler.decide` (no state change until
    :meth:`InterGroupScheduler.commit`). ``code``: :class:`rollmux.codes.Code` ``OK`` | ``NEVER`` | ``RETRY_LATER``."""

    job_id: str
    admitted: bool
    code: Code
    reason: str
    policy: str
    group_id: Optional[str] = None
    strategy: Optional[str] = None
    placement: Optional[Placement] = None
    delta_usd_per_h: float = 0.0
    predicted_slowdowns: dict[str, float] = field(default_factory=dict)
    _candidates: list[Candidate] = field(default_factory=list)
    _pruned_src: list = field(default_factory=list)  # (group_id, (plugin, reason)) snapshot
    latency_ms: float = 0.0
    profile: Optional[PhaseProfile] = None
    spec: Optional[JobSpec] = None
    _chosen: Optional[Candidate] = None
    _version: int = -1
    _expand: Optional[Callable[[], list[Candidate]]] = field(default=None, repr=False)
    #: the job spec field an ``invalid`` refusal is about (e.g. ``priority_class``), for the HTTP
    #: 422's ``errors[{field}]``; None otherwise (and then absent from :meth:`to_dict`)
    field: Optional[str] = None

    @property
    def candidates(self) -> list[Candidate]:
        """Every (group, strategy) placement considered, in evaluation order (tier by tier, open
        groups in the order they were opened), then the isolated new group, each with its verdict.
        Candidates that the group index excluded without evaluating them (they fail the capacity
        or the newcomer's SLO bound filter) get their verdict on first access, from the state the
        decision was made on (groups are immutable records)."""
        if self._expand is not None:
            self._candidates, self._expand = self._expand(), None
        return self._candidates

    @property
    def pruned(self) -> list[dict]:
        """Groups discarded before evaluating placements: ``{group_id, plugin, reason}`` with plugin
        ``"group_size"`` or ``"saturation"`` (Alg. 1 line 4)."""
        return [{"group_id": g, "plugin": p, "reason": r} for g, (p, r) in self._pruned_src]

    def answer(self, explain: str = "full") -> Admission:
        """The decision as the scheduler answers it (:class:`rollmux.answers.Admission`: typed,
        picklable, without the lazy candidate list). ``explain="chosen"``: of an admission, only
        the chosen candidate is listed (``candidates_listed: "chosen"``; ``pruned`` empty and
        ``pruned_groups`` counting them), so the explanation of every other placement is never
        built (the hot path of many admissions); ``"full"`` (default) lists every candidate."""
        p = self.placement
        base = dict(job_id=self.job_id, admitted=self.admitted, code=Code(self.code), reason=self.reason,
                    policy=self.policy, group_id=self.group_id, strategy=self.strategy,
                    placement=None if p is None else _nodes((p.rollout_nodes, p.train_nodes)),
                    delta_usd_per_h=self.delta_usd_per_h, predicted_slowdowns=dict(self.predicted_slowdowns),
                    latency_ms=self.latency_ms, profile=self.profile, field=self.field)
        if explain == "chosen" and self._chosen is not None:
            return Admission(**base, candidates=(self._chosen.view(),), pruned_groups=len(self._pruned_src),
                             candidates_listed="chosen")
        return Admission(**base, candidates=tuple(c.view() for c in self.candidates),
                         pruned=tuple(PrunedGroup(g, pl, r) for g, (pl, r) in self._pruned_src))

    def to_dict(self, explain: str = "full") -> dict:
        """JSON-able form (rollmux/admission/README.md "Policy core"): :meth:`answer`'s."""
        return self.answer(explain).to_dict()
