"""Inter-group admission: RollMux Alg. 1 and the random / most-idle baselines (RollMux §4.2).

:class:`InterGroupScheduler` keeps the co-execution groups of one cluster and decides, for each
arriving job, which group and exact nodes it is pinned to:

1. *Prune* groups that cannot take it (:data:`GROUP_FILTERS`, evaluated when a group changes):
   full groups (``max_group_size``) and saturated groups (``config.saturation``: by default
   ``T_load >= max_k slo_k T_solo_k``, the largest SLO budget; ``"paper"``: ``T_load >= T_cycle``,
   which with SLOs above 1 also prunes groups whose meta-iteration may still stretch).
2. For each remaining group evaluate *direct packing* (pin the job on the group's existing
   least-loaded rollout and training nodes, ``Δ = 0``) and *rollout scale-out* (share the
   group's least-loaded training nodes, add ``ceil(NR / gpus_per_node)`` new rollout nodes,
   ``Δ`` = their price).
3. Run each candidate through :data:`CANDIDATE_FILTERS` (small named functions over one
   precomputed :class:`Newcomer` record, each returning a :class:`Verdict` with its figures):
   capacity, the newcomer's O(1) SLO bound, memory, every member's node-load SLO bound
   (:func:`node_load_bound`, the one home of that rule). Reject a candidate that breaks *memory
   residency* (per node, the sum of the pinned jobs'
   :func:`rollmux.profiler.state_gb` must fit ``host_mem_gb``) or any member's *SLO*
   (``T_coexec_k <= slo_k * T_solo_k``, T_coexec from :func:`rollmux.intra_group.coexec_times`,
   i.e. the steady-state mean iteration time of the round-robin schedule simulated on worst-case
   profiles; a cheap lower bound ``max(T_solo_k, load of k's busiest node)`` rejects first
   without simulating).
4. Pick the minimum marginal cost; ties go to the most SLO slack (lowest
   ``max_k slowdown_k / slo_k``; ``SchedulerConfig.tie_break``), then to the earliest group.
   Compare with an isolated new group (its full price) and take the cheaper.

What differs between the policies (SLO check, saturation pruning, tiers, how the choice is made,
re-packing) is read from their :class:`rollmux.policies.PolicySpec`, never from their names.

Refusals are values: ``code="never"`` (the job can never fit: :data:`JOB_FILTERS` -- a non-finite
phase time, training state larger than a training GPU's HBM -- or state larger than every node of a
pool, more GPUs than the pool has, weights not fitting HBM, duplicate id) or
``code="retry_later"`` (no feasible placement now; the reason names the deciding filter of every
path: the groups' pruning or candidate filters and, for a new group, capacity = out of GPUs). The ``random`` and ``most-idle`` baselines
(RollMux §7.1) place into a random / the most idle memory-feasible, non-full group with
no SLO check, opening a new group only when none fits. Their placement inside the chosen group
(no simulation, only memory and node counts): *random* draws uniformly among all feasible
(group, strategy) pairs; *most-idle* takes the group with the largest idle node-time fraction and
packs directly when its chosen rollout nodes have idle time for the job's rollout
(``T_cycle - load >= T_roll``), else scales out.

Every decision carries its explanation (candidates with verdicts, pruned groups) and its
latency. Decisions are linear in the number of groups and cheap in practice: groups are classified
open / pruned when they change (not per decision); per-group ``T_load``/``T_cycle``, node loads and
memory are cached; the SLO check first applies a node-load lower bound, then simulates lazily by
branch and bound (cheapest tier first -- direct packing, Δ = 0; the scale-out tier is evaluated
only when no direct packing is feasible -- best optimistic bound first; candidates that cannot
win are reported as ``"skipped"``); the simulation is a recurrence memoised on the group's
structure. The chosen placement has the cost and SLO slack an exhaustive evaluation would pick
(property-tested).
Source: RollMux §4.2, Alg. 1; §7.1 (baselines).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from functools import lru_cache
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field

from rollmux import profiler
from rollmux.intra_group import LongTailPolicy, coexec_key, coexec_times, coexec_values
from rollmux.models import ClusterSpec, CoExecutionGroup, GroupMember, JobSpec, PhaseProfile, Placement, PoolName
from rollmux.nodes import node_id, node_index
from rollmux.policies import REGISTRY, PolicySpec, choose_min_cost as choose_min_cost_policy, group_number as _gnum, policy_spec

SLO_REL_TOL = 1e-9
_idx = lru_cache(maxsize=None)(node_index)

PLUGINS = ("saturation", "memory", "slo", "capacity", "group_size", "finite", "train_gpu_memory")


# --- the node-load rule (one home) ------------------------------------------------------------------

def node_load_bound(t_solo_s: float, node_loads_s: Iterable[float]) -> float:
    """The node-load rule: in every meta-iteration job k runs its rollout once on each of its
    rollout nodes and its training + sync once on each of its training nodes, and a node runs one
    phase at a time, so ``T_coexec_k >= max(T_solo_k, load of each of k's nodes)`` (seconds; the
    load of a node = the phase times pinned to it). Used by the SLO bound filters, the optimum's
    layouts and group pruning (``T_load``). Source: RollMux §4.2."""
    return max(t_solo_s, max(node_loads_s, default=0.0))


def breaks_slo(t_coexec_s: float, t_solo_s: float, slo: float) -> bool:
    """True when an iteration time ``t_coexec_s`` (or a lower bound of it) exceeds ``slo x t_solo_s``
    (relative tolerance :data:`SLO_REL_TOL`).
    A NaN or infinite value on either side breaks it (defence in depth: ``nan > x`` is False, so a
    plain comparison would let a non-finite time pass every SLO check)."""
    return not _within(t_coexec_s, slo * t_solo_s)


def is_saturated(t_load_s: float, t_cycle_s: float) -> bool:
    """Saturation (Alg. 1 line 4): ``T_load >= T_cycle``, i.e. the busiest node has no idle time
    left in a meta-iteration of the longest member's solo time. A non-finite load or cycle counts
    as saturated (defence in depth: ``nan >= x`` is False and would leave such a group open)."""
    return not (math.isfinite(t_load_s) and math.isfinite(t_cycle_s) and t_load_s < t_cycle_s)


class SchedulerConfig(BaseModel):
    """Scheduler settings (``configs/scheduler.yaml``).

    Attributes:
        policy: ``"rollmux"`` (Alg. 1), ``"random"`` or ``"most-idle"``.
        max_group_size: most jobs in one co-execution group (paper simulation: 5).
        tail_trigger_fraction: long-tail migration fires when this fraction of a rollout's
            responses is done (RollMux §4.3: 0.8).
        tail_gpus: GPUs that keep a migrated rollout's stragglers.
        migration_overhead_s: cost of one migration (stragglers' re-prefill), seconds.
        tail_migration: act on long-tail decisions (GroupControllers release the rollout's nodes
            to the waiting rollout; the simulator models it); false records decisions only.
        plan_migration_overhead: long-tail migration runs at run time, so the SLO check plans
            every rollout of a co-executed group ``migration_overhead_s`` longer (a migrated
            rollout ends that much later; :func:`rollmux.intra_group.coexec_times`). The
            simulator sets it for ``--stochastic`` replays, where rollouts migrate.
        seed: seed of the random baseline.
        tie_break: among candidates of equal marginal cost, ``"most_slack"`` (lowest
            ``max_k slowdown_k / slo_k``: leaves SLO headroom for stochastic phase times) or
            ``"best_fit"`` (the tightest feasible group). The paper does not say; measured on the
            default mix the two differ by ~1-2% in cost either way.
        repack_on_departure: after a departure, try to dissolve small groups into the others
            (:meth:`InterGroupScheduler.repack`); moved jobs pay one host-state copy.
        repack_max_groups: groups tried per departure (bounds the work of a departure).
        repack_max_members: only groups with at most this many members are dissolved.
        reopt_max_jobs: after every admission and departure (after re-packing), re-partition
            the event's neighbourhood exactly (:meth:`InterGroupScheduler.reoptimise`): the group
            the job joined or left and the groups with the most idle node time, at most this
            many jobs in all, by the optimum's set partitioning; 0 turns it off.
        saturation: which groups Alg. 1 line 4 prunes (:func:`saturation_filter`): ``"paper"``
            (``T_load >= T_cycle``), ``"slo"`` (``T_load >= max_k slo_k T_solo_k``) or ``"off"``.
        driver_lease_s: a GroupController evicts an attached job whose driver has not
            heart-beaten for this many seconds while none of its phases runs (0 disables).
        attach_timeout_s: an admitted job whose driver has not attached (reported ``running``)
            after this many seconds expires: its nodes are released and its record says
            ``expired`` (the GlobalScheduler's reconcile loop checks; 0 disables).
        queue_max_jobs: most jobs the admission queue of a bounded cluster holds
            (:class:`rollmux.admission_queue.AdmissionQueue`); more are refused (HTTP 429).
        queue_backfill: behind a job that does not fit, try smaller queued jobs (else strict FIFO).
        queue_scan_limit: most queued jobs one pass (after a departure) decides.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    policy: str = "rollmux"
    max_group_size: int = Field(default=5, ge=1, le=64)
    tail_trigger_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    tail_gpus: int = Field(default=1, ge=1, le=1024)
    migration_overhead_s: float = Field(default=2.0, ge=0.0, le=3600.0)
    tail_migration: bool = True
    plan_migration_overhead: bool = False
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    tie_break: Literal["best_fit", "most_slack"] = "most_slack"
    repack_on_departure: bool = True
    repack_max_groups: int = Field(default=4, ge=0, le=1024)
    repack_max_members: int = Field(default=2, ge=1, le=64)
    reopt_max_jobs: int = Field(default=8, ge=0, le=12)
    saturation: Literal["paper", "slo", "off"] = "slo"
    attach_timeout_s: float = Field(default=600.0, ge=0.0, le=1e7)
    driver_lease_s: float = Field(default=30.0, ge=0.0, le=1e6)
    queue_max_jobs: int = Field(default=1000, ge=1, le=1_000_000)
    queue_backfill: bool = True
    queue_scan_limit: int = Field(default=64, ge=1, le=100_000)

    def overridden(self, **values) -> "SchedulerConfig":
        """A validated copy with the given values; ``None`` values are ignored (an option not
        given keeps the config's value). How the cluster and ``rollmux simulate`` apply explicit
        arguments / flags over ``configs/scheduler.yaml``."""
        upd = {k: v for k, v in values.items() if v is not None}
        return SchedulerConfig.model_validate({**self.model_dump(), **upd}) if upd else self

    def long_tail_policy(self) -> LongTailPolicy:
        """The long-tail migration settings as a :class:`LongTailPolicy` (RollMux §4.3)."""
        return LongTailPolicy(self.tail_trigger_fraction, self.tail_gpus, self.migration_overhead_s)

    def controller_settings(self) -> dict:
        """Keyword arguments of a GroupController that carry these long-tail settings."""
        return {"migrate": self.tail_migration, "tail_trigger_fraction": self.tail_trigger_fraction,
                "tail_gpus": self.tail_gpus, "migration_overhead_s": self.migration_overhead_s,
                "lease_s": self.driver_lease_s}


def load_scheduler_config(path: Union[str, Path, None] = None) -> SchedulerConfig:
    """``configs/scheduler.yaml`` (or ``path``) as a :class:`SchedulerConfig`.
    Raises :class:`rollmux.config.ConfigError` naming the field."""
    from rollmux.config import CONFIG_DIR, load_model

    return load_model(path or CONFIG_DIR / "scheduler.yaml", SchedulerConfig)


# --- decisions -------------------------------------------------------------------------------------

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

    def to_dict(self) -> dict:
        return {
            "group_id": self.group_id,
            "strategy": self.strategy,
            "delta_usd_per_h": self.delta_usd_per_h,
            "verdict": self.verdict,
            "plugin": self.plugin,
            "reasons": list(self.reasons),
            "predicted_slowdowns": dict(self.predicted_slowdowns),
            "placement": _placement_dict(self.placement),
        }


def _placement_dict(p: Optional[Placement]) -> Optional[dict]:
    return None if p is None else {"rollout_nodes": list(p.rollout_nodes), "train_nodes": list(p.train_nodes)}


@dataclass
class AdmissionDecision:
    """The outcome of :meth:`InterGroupScheduler.decide` (no state change until
    :meth:`InterGroupScheduler.commit`). ``code``: ``"ok"`` | ``"never"`` | ``"retry_later"``."""

    job_id: str
    admitted: bool
    code: str
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

    def to_dict(self, explain: str = "full") -> dict:
        """JSON-able form (ARCHITECTURE.md "Policy core"). ``explain="chosen"``: of an admission,
        only the chosen candidate is listed (``candidates_listed: "chosen"``; ``pruned`` empty and
        ``pruned_groups`` counting them), so the explanation of every other placement is never
        built (the hot path of many admissions); ``"full"``
        (default) lists every candidate."""
        if explain == "chosen" and self._chosen is not None:
            return {**self._to_dict([self._chosen.to_dict()], []), "pruned_groups": len(self._pruned_src),
                    "candidates_listed": "chosen"}
        return self._to_dict([c.to_dict() for c in self.candidates])

    def _to_dict(self, candidates: list[dict], pruned: Optional[list[dict]] = None) -> dict:
        return {
            "job_id": self.job_id,
            "admitted": self.admitted,
            "code": self.code,
            "reason": self.reason,
            "policy": self.policy,
            "group_id": self.group_id,
            "strategy": self.strategy,
            "placement": _placement_dict(self.placement),
            "delta_usd_per_h": self.delta_usd_per_h,
            "predicted_slowdowns": dict(self.predicted_slowdowns),
            "candidates": candidates,
            "pruned": self.pruned if pruned is None else pruned,
            "latency_ms": self.latency_ms,
            "profile": None if self.profile is None else self.profile.model_dump(),
        }


# --- internal state ----------------------------------------------------------------------------------

class _NodePool:
    """Node ids of one pool: the lowest freed index is reused first; ``limit`` bounds the count."""

    def __init__(self, pool: PoolName, limit: Optional[int]) -> None:
        self.pool, self.limit = pool, limit
        self.free: list[int] = []
        self.next = 0
        self.used = 0

    def peek(self, k: int) -> Optional[list[str]]:
        if self.limit is not None and self.used + k > self.limit:
            return None
        idx = heapq.nsmallest(k, self.free)
        idx += list(range(self.next, self.next + k - len(idx)))
        return [node_id(self.pool, i) for i in idx]

    def take(self, nodes: Iterable[str]) -> None:
        for n in nodes:
            i = node_index(n)
            if i in self.free:
                self.free.remove(i)
                heapq.heapify(self.free)
            elif i >= self.next:
                for x in range(self.next, i):
                    heapq.heappush(self.free, x)
                self.next = i + 1
            else:
                raise ValueError(f"node {n} is already in use")
            self.used += 1

    def give(self, nodes: Iterable[str]) -> None:
        for n in nodes:
            heapq.heappush(self.free, node_index(n))
            self.used -= 1


@dataclass
class _Group:
    group: CoExecutionGroup
    loads: dict[str, float]
    mem: dict[str, float]
    t_cycle: float
    t_load: float
    coexec: Optional[dict[str, float]] = None
    info: list = field(default_factory=list)  # per member: (job_id, t_solo_s, slo, node set, max load of its nodes)
    r_sorted: list = field(default_factory=list)  # rollout-node loads, ascending
    t_sorted: list = field(default_factory=list)  # training-node loads, ascending
    cost: float = 0.0  # Cost(G), USD/h (CoExecutionGroup.cost_usd_per_h, cached)
    t_slack: tuple = ()  # per training node, descending: min over its members of slo_k T_solo_k, minus its load (+ margin)
    r_slack: tuple = ()  # the same for rollout nodes
    pressure: float = 0.0  # max_k max(T_solo_k, load of k's busiest node) / T_solo_k / slo_k (<= any candidate's bound)

    @functools.cached_property
    def idle_fraction(self) -> float:
        nodes = len(self.group.rollout_nodes) + len(self.group.train_nodes)
        if self.t_cycle <= 0 or nodes == 0:
            return 1.0
        return sum(max(0.0, self.t_cycle - self.loads.get(n, 0.0)) for n in self.group.rollout_nodes + self.group.train_nodes) / (nodes * self.t_cycle)


def _member_loads(m: GroupMember, cluster: ClusterSpec):
    p = m.profile
    mr, mt = profiler.state_gb(m.spec, "rollout", cluster), profiler.state_gb(m.spec, "train", cluster)
    for n in m.placement.rollout_nodes:
        yield n, p.t_roll_s, mr
    for n in m.placement.train_nodes:
        yield n, p.t_train_s + p.t_sync_s, mt


def _summarise(group: CoExecutionGroup, cluster: ClusterSpec) -> _Group:
    loads = {n: 0.0 for n in group.rollout_nodes + group.train_nodes}
    mem = dict.fromkeys(loads, 0.0)
    for m in group.members:
        for n, t, g in _member_loads(m, cluster):
            loads[n] += t
            mem[n] += g
    info = []
    for m in group.members:
        nodes = frozenset(m.placement.rollout_nodes + m.placement.train_nodes)
        info.append((m.spec.job_id, m.profile.t_solo_s, m.spec.slo, nodes, max(loads[n] for n in nodes)))  # busiest node
    budget: dict[str, float] = {}
    for _, ts, slo, nodes, _ in info:
        for n in nodes:
            b = ts * slo
            if b < budget.get(n, math.inf):
                budget[n] = b

    def slack(n: str) -> float:  # widened by a margin far above float rounding (index use only)
        b = budget.get(n, math.inf)
        return b * (1 + SLO_REL_TOL) - loads[n] + 1e-7 * (b + loads[n] + 1.0)

    return _Group(group, loads, mem, max((m.profile.t_solo_s for m in group.members), default=0.0),
                  max(loads.values(), default=0.0), info=info,
                  r_sorted=sorted(loads[n] for n in group.rollout_nodes), t_sorted=sorted(loads[n] for n in group.train_nodes),
                  cost=group.cost_usd_per_h(cluster),
                  t_slack=tuple(sorted((slack(n) for n in group.train_nodes), reverse=True)),
                  r_slack=tuple(sorted((slack(n) for n in group.rollout_nodes), reverse=True)),
                  pressure=max((max(ts, ml) / ts / slo for _, ts, slo, _, ml in info), default=0.0))


class _GroupIndex:
    """The open groups indexed by what the cheap candidate filters read, so that a decision
    evaluates only the groups that can pass them instead of every open group.

    For every ``k``, the groups with at least ``k`` training nodes sorted by (a) the load of
    their ``k``-th least-loaded training node and (b) the ``k``-th largest *slack* of a training
    node (the smallest SLO budget ``slo_j T_solo_j`` of the members pinned to it minus its load);
    likewise for rollout nodes. The capacity filter needs ``k`` nodes; the newcomer's SLO bound
    (:func:`newcomer_slo_bound_filter`) needs that load plus its phase within its own budget;
    the members' SLO bounds (:func:`slo_bound_filter`) need each node it is pinned to to have a
    slack of at least its phase, so ``k`` such nodes. Each is a prefix of a sorted list.
    :meth:`candidates` returns a superset of the (group, strategy) pairs passing these necessary
    conditions (thresholds carry a margin far above float rounding; the filters then decide), in
    the order the open groups were opened (the order an exhaustive scan visits them)."""

    def __init__(self) -> None:
        # (pool, "load" | "slack") -> k -> sorted [(key, seq, gid)]; slack keys are negated
        self.tables: dict[tuple[str, str], dict[int, list[tuple[float, int, str]]]] = {
            (p, w): {} for p in ("train", "rollout") for w in ("load", "slack")}
        self.entries: dict[str, tuple[int, dict[tuple[str, str], tuple[float, ...]]]] = {}

    def copy(self) -> "_GroupIndex":
        c = _GroupIndex()
        c.tables = {tk: {k: list(v) for k, v in t.items()} for tk, t in self.tables.items()}
        c.entries = dict(self.entries)
        return c

    def add(self, gid: str, seq: int, g: "_Group") -> None:
        keys = {("train", "load"): tuple(g.t_sorted), ("rollout", "load"): tuple(g.r_sorted),
                ("train", "slack"): tuple(-x for x in g.t_slack), ("rollout", "slack"): tuple(-x for x in g.r_slack)}
        self.entries[gid] = (seq, keys)
        for tk, vals in keys.items():
            table = self.tables[tk]
            for k, v in enumerate(vals, start=1):
                bisect.insort(table.setdefault(k, []), (v, seq, gid))

    def remove(self, gid: str) -> None:
        e = self.entries.pop(gid, None)
        if e is None:
            return
        seq, keys = e
        for tk, vals in keys.items():
            table = self.tables[tk]
            for k, v in enumerate(vals, start=1):
                lst = table[k]
                del lst[bisect.bisect_left(lst, (v, seq, gid))]

    @staticmethod
    def _threshold(budget_s: float, phase_s: float) -> float:
        """Largest k-th node load that can pass ``load + phase_s <= budget_s`` (with margin)."""
        return budget_s * (1 + SLO_REL_TOL) - phase_s + 1e-7 * (abs(budget_s) + abs(phase_s) + 1.0)

    def candidates(self, new: "Newcomer", strategies: Sequence[str], open_groups: Mapping[str, "_Group"]):
        """(group, strategy) pairs of ``open_groups`` that may pass the capacity, newcomer-SLO
        and member-SLO bound filters for ``strategies``, in opening order then strategy order."""
        p = new.profile
        budget = new.job.slo * p.t_solo_s
        if not math.isfinite(budget):
            return []
        add_t, add_r = p.t_train_s + p.t_sync_s, p.t_roll_s
        conds = {("train", "load"): (new.train_nodes, self._threshold(budget, add_t)),
                 ("train", "slack"): (new.train_nodes, -add_t + 1e-7 * (abs(add_t) + 1.0)),
                 ("rollout", "load"): (new.rollout_nodes, self._threshold(budget, add_r)),
                 ("rollout", "slack"): (new.rollout_nodes, -add_r + 1e-7 * (abs(add_r) + 1.0))}
        picked: dict[str, tuple[int, list[str]]] = {}
        for strategy in strategies:
            need = [tk for tk in conds if strategy == "direct" or tk[0] == "train"]
            prefixes = []
            for tk in need:
                k, thr = conds[tk]
                lst = self.tables[tk].get(k, [])
                prefixes.append((bisect.bisect_right(lst, (thr, math.inf, "")), tk, lst))
            n, tk0, lst0 = min(prefixes, key=lambda x: x[0])
            rest = [(conds[tk][0] - 1, conds[tk][1], tk) for tk in need if tk != tk0]
            for _, seq, gid in lst0[:n]:
                keys = self.entries[gid][1]
                if all(len(keys[tk]) > i and keys[tk][i] <= thr for i, thr, tk in rest):
                    picked.setdefault(gid, (seq, []))[1].append(strategy)
        return [(open_groups[gid], st) for gid, (_, sts) in sorted(picked.items(), key=lambda kv: kv[1][0]) for st in sts]


def _pick_nodes(nodes: Sequence[str], k: int, loads: dict, mem: dict, need_gb: float, cap_gb: float) -> Optional[list[str]]:
    """The ``k`` least-loaded nodes that still hold ``need_gb`` more state (None if too few)."""
    fit = [n for n in nodes if mem.get(n, 0.0) + need_gb <= cap_gb + 1e-9]
    if len(fit) < k:
        return None
    fit.sort(key=lambda n: (loads.get(n, 0.0), mem.get(n, 0.0), _idx(n)))
    return sorted(fit[:k], key=_idx)


def _within(value: float, limit: float) -> bool:
    """``value <= limit`` within :data:`SLO_REL_TOL`, and False when either is NaN or infinite: a
    non-finite slowdown or phase time is infeasible, never a pass (``nan > x`` is False)."""
    return math.isfinite(value) and math.isfinite(limit) and value <= limit * (1 + SLO_REL_TOL)


def _no_placement_reason(cands: list[Candidate], pruned: list) -> str:
    """Why no placement exists now, naming the deciding filter of every path: the plugin that pruned
    each group (saturation, group_size), the plugin that rejected each (group, strategy) candidate
    (capacity, memory, slo) and why a new group was refused (capacity = cluster out of GPUs)."""
    by: dict[str, list[str]] = {}
    for gid, (plugin, _) in pruned:
        by.setdefault(plugin, []).append(str(gid))
    iso = None
    for c in cands:
        if c.group_id is None:
            iso = c
        elif not c.ok:
            by.setdefault(c.plugin or "rejected", []).append(f"{c.group_id}/{c.strategy}")

    def some(xs: list[str]) -> str:
        return ", ".join(xs[:3]) + (f", ... ({len(xs)} in all)" if len(xs) > 3 else "")

    parts = [f"{plugin}: {some(xs)}" for plugin, xs in sorted(by.items())]
    groups = ("existing groups excluded by " + "; ".join(parts)) if parts else "no open group"
    new = (f"a new group refused by {iso.plugin} ({'; '.join(iso.reasons)})" if iso is not None and not iso.ok
           else "no new group considered")
    return f"no feasible placement now: {groups}; {new}"


def _slo_bound(cand: Candidate, members: list[GroupMember], loads: dict[str, float]) -> Candidate:
    """Cheap necessary SLO condition: job k iterates once per meta-iteration on each of its nodes,
    so ``T_coexec_k >= max(T_solo_k, load of k's busiest node)``. Rejects on violation; sets
    ``cand.bound`` = the optimistic ``max_k slowdown_k / slo_k`` (for branch and bound)."""
    rows = [(m.spec.job_id, m.profile.t_solo_s, m.spec.slo,
             node_load_bound(m.profile.t_solo_s, [loads[n] for n in m.placement.rollout_nodes + m.placement.train_nodes]))
            for m in members]
    cand.members = members
    return _bound_rows(cand, rows)


def _bound_verdict(rows: list[tuple[str, float, float, float]]) -> tuple[float, "Verdict"]:
    """The node-load lower bound over ``rows`` = (job_id, T_solo_s, slo, lower bound of T_coexec_s)
    per member of G': (optimistic ``max_k slowdown_k / slo_k``, the SLO verdict)."""
    bad = [(jid, lb / ts, slo) for jid, ts, slo, lb in rows if breaks_slo(lb, ts, slo)]
    bound = max((lb / ts / slo for _, ts, slo, lb in rows), default=0.0)
    if not bad:
        return bound, PASS
    return bound, _no("slo", "; ".join(f"{jid}: slowdown >= {sd:.3f} > SLO {slo:.3f} (node-load lower bound)" for jid, sd, slo in bad),
                      slowdown_lower_bound=max(sd for _, sd, _ in bad), slo=min(slo for _, _, slo in bad), optimistic_score=bound)


def _bound_rows(cand: Candidate, rows: list[tuple[str, float, float, float]]) -> Candidate:
    """Apply :func:`_bound_verdict` to ``cand``: sets ``cand.bound``; rejects on violation."""
    cand.bound, v = _bound_verdict(rows)
    return cand if v.ok else cand.reject(v.plugin, v.reason, v.numbers)


#: Groups of up to this many members get the exhaustive round-robin order search (n! orders);
#: larger groups (only with max_group_size above it) are checked in the given order only.
EXHAUSTIVE_ORDER_MAX = 6


@dataclass(frozen=True)
class OrderChoice:
    """The outcome of :func:`best_round_robin_order`.

    Attributes:
        members: the members in the chosen round-robin order.
        t_coexec_s: steady-state co-execution iteration time of each member in that order, seconds.
        feasible: every member within its SLO (``not breaks_slo``) in that order.
        exhaustive: every order was considered, or a feasible one was found (so ``feasible`` is
            False only if no order of the members is feasible).
        orders_tried: round-robin orders simulated.
    """

    members: tuple[GroupMember, ...]
    t_coexec_s: dict[str, float]
    feasible: bool
    exhaustive: bool
    orders_tried: int


def _order_feasible(members: Sequence[GroupMember], tco: Mapping[str, float]) -> bool:
    return not any(breaks_slo(tco[m.spec.job_id], m.profile.t_solo_s, m.spec.slo) for m in members)


def best_round_robin_order(members: Sequence[GroupMember], *, rollout_overhead_s: float = 0.0) -> OrderChoice:
    """Group feasibility over the round-robin order: the one function the optimum's layouts
    (:func:`build_group`), Alg. 1's candidates and departure re-packing use.

    A group is feasible iff *some* round-robin order of its members keeps every member within its
    SLO (``T_coexec_k <= slo_k * T_solo_k``, T_coexec from :func:`rollmux.intra_group.coexec_times`):
    the order decides which member waits behind which on a shared node, so a pair infeasible in
    arrival order may be feasible the other way round. The given order is tried first and kept
    when feasible (a running group is not reordered needlessly); otherwise every permutation is
    simulated (exhaustive up to :data:`EXHAUSTIVE_ORDER_MAX` members; n! <= 720 recurrences,
    memoised on the group's structure) and the first feasible one, in lexicographic order of the
    permutation, is returned. With no feasible order, the given order's times are returned.

    Args:
        members: the group G' with placements, in its current (admission) order.
        rollout_overhead_s: added to every rollout (planned long-tail migration overhead), seconds.
    Returns:
        :class:`OrderChoice`.
    Source: RollMux §4.2 (Alg. 1 line 10 SLO check), §4.3 (round-robin meta-iterations).
    """
    members = list(members)
    tco = coexec_times(members, rollout_overhead_s=rollout_overhead_s)
    if _order_feasible(members, tco):
        return OrderChoice(tuple(members), tco, True, True, 1)
    n = len(members)
    if n > EXHAUSTIVE_ORDER_MAX:
        return OrderChoice(tuple(members), tco, False, False, 1)
    tried = 1
    # every other order, as coexec_times would see it (the same memoised recurrence, its key built
    # from per-member rows instead of re-reading the models; the dict only for the answer)
    rows = [(mb.profile.t_roll_s + rollout_overhead_s, mb.profile.t_train_s, mb.profile.t_sync_s, mb.placement.rollout_nodes,
             mb.placement.train_nodes, mb.profile.t_solo_s, mb.spec.slo) for mb in members]
    ident = tuple(range(n))
    for perm in itertools.permutations(ident):
        if perm == ident:
            continue
        vals = coexec_values(coexec_key([rows[i][:5] for i in perm]))
        tried += 1
        if not any(breaks_slo(v, rows[i][5], rows[i][6]) for v, i in zip(vals, perm)):
            ms = [members[i] for i in perm]
            return OrderChoice(tuple(ms), {mb.spec.job_id: v for mb, v in zip(ms, vals)}, True, True, tried)
    return OrderChoice(tuple(members), tco, False, True, tried)


def _slo_sim(cand: Candidate, rollout_overhead_s: float = 0.0) -> Candidate:
    """Alg. 1 line 10: every member k of G' needs T_coexec_k <= slo_k * T_solo_k, T_coexec from
    the simulated round-robin schedule in the best order (:func:`best_round_robin_order`; every
    rollout planned ``rollout_overhead_s`` longer: the long-tail migration overhead);
    ``cand.members`` is left in that order (the order :meth:`InterGroupScheduler.commit` keeps)."""
    if not cand.members:
        old, spec, prof = cand.base
        cand.members = list(old) + [GroupMember.model_construct(spec=spec, profile=prof, placement=cand.placement)]
    oc = best_round_robin_order(cand.members, rollout_overhead_s=rollout_overhead_s)
    cand.members = list(oc.members)
    members = cand.members
    tco = oc.t_coexec_s
    sd = {m.spec.job_id: tco[m.spec.job_id] / m.profile.t_solo_s for m in members}
    cand.predicted_slowdowns = sd
    viol = [f"{m.spec.job_id}: predicted slowdown {sd[m.spec.job_id]:.3f} > SLO {m.spec.slo:.3f}"
            for m in members if breaks_slo(sd[m.spec.job_id], 1.0, m.spec.slo)]
    if viol:
        return cand.reject("slo", "; ".join(viol))
    cand.score = max(sd[m.spec.job_id] / m.spec.slo for m in members)
    return cand


def _slo_check(cand: Candidate, members: list[GroupMember], loads: dict[str, float]) -> Candidate:
    """Bound, then simulate (both SLO plugins of Alg. 1 line 10)."""
    _slo_bound(cand, members, loads)
    return _slo_sim(cand) if cand.ok else cand


# --- the scheduler ---------------------------------------------------------------------------------------

#: The group-forming admission policies: name -> description (a view of :data:`rollmux.policies.REGISTRY`).
POLICIES: dict[str, str] = {n: p.description for n, p in REGISTRY.items() if p.kind == "scheduler"}


# --- admission filters ----------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class Verdict:
    """A filter's answer: ``ok``, or the rejecting ``plugin`` (one of :data:`PLUGINS`) with a
    human-readable ``reason`` and the figures behind it (``numbers``, units in the keys)."""

    ok: bool
    plugin: str = ""
    reason: str = ""
    numbers: Mapping[str, float] = field(default_factory=dict)


PASS = Verdict(True)


def _no(plugin: str, reason: str, **numbers: float) -> Verdict:
    return Verdict(False, plugin, reason, numbers)


def capacity_filter(g: "_Group", new: Newcomer, c: Candidate) -> Verdict:
    """The group has enough training nodes (and rollout nodes for direct packing); a scale-out
    has enough free rollout nodes in the cluster."""
    grp = g.group
    if new.train_nodes > len(grp.train_nodes):
        return _no("capacity", f"job needs {new.train_nodes} training nodes, group has {len(grp.train_nodes)}",
                   train_nodes_needed=new.train_nodes, train_nodes_in_group=len(grp.train_nodes))
    if c.strategy == "direct" and new.rollout_nodes > len(grp.rollout_nodes):
        return _no("capacity", f"job needs {new.rollout_nodes} rollout nodes, group has {len(grp.rollout_nodes)}",
                   rollout_nodes_needed=new.rollout_nodes, rollout_nodes_in_group=len(grp.rollout_nodes))
    if c.strategy == "scale_out" and new.free_rollout is None:
        return _no("capacity", f"cluster out of GPUs: no {new.rollout_nodes} free rollout nodes",
                   rollout_nodes_needed=new.rollout_nodes)
    return PASS


def newcomer_slo_bound_filter(g: "_Group", new: Newcomer, c: Candidate) -> Verdict:
    """O(1) necessary condition before picking nodes (node-load rule on the newcomer alone): even
    on the group's least-loaded nodes, its own iteration would take at least their load plus its
    phases."""
    p = new.profile
    lb = g.t_sorted[new.train_nodes - 1] + p.t_train_s + p.t_sync_s
    if c.strategy == "direct" and new.rollout_nodes <= len(g.r_sorted):
        lb = max(lb, g.r_sorted[new.rollout_nodes - 1] + p.t_roll_s)
    if breaks_slo(lb, p.t_solo_s, new.job.slo):
        return _no("slo", f"{new.job.job_id}: slowdown >= {lb / p.t_solo_s:.3f} > SLO {new.job.slo:.3f} "
                          "(load of the least-loaded nodes, lower bound)",
                   slowdown_lower_bound=lb / p.t_solo_s, slo=new.job.slo)
    return PASS


def memory_filter(g: "_Group", new: Newcomer, c: Candidate) -> Verdict:
    """Memory residency: the newcomer's state fits the host memory of the least-loaded nodes it is
    pinned to (picks them: sets ``c.nodes``; scale-out takes the free rollout nodes)."""
    grp = g.group
    tn = _pick_nodes(grp.train_nodes, new.train_nodes, g.loads, g.mem, new.train_state_gb, new.train_host_mem_gb)
    if tn is None:
        return _no("memory", f"fewer than {new.train_nodes} training nodes with {new.train_state_gb:.1f} GB of host memory free",
                   train_nodes_needed=new.train_nodes, state_gb=new.train_state_gb, host_mem_gb=new.train_host_mem_gb)
    if c.strategy == "direct":
        rn = _pick_nodes(grp.rollout_nodes, new.rollout_nodes, g.loads, g.mem, new.rollout_state_gb, new.rollout_host_mem_gb)
        if rn is None:
            return _no("memory", f"fewer than {new.rollout_nodes} rollout nodes with {new.rollout_state_gb:.1f} GB of host memory free",
                       rollout_nodes_needed=new.rollout_nodes, state_gb=new.rollout_state_gb, host_mem_gb=new.rollout_host_mem_gb)
    else:  # scale_out: free_rollout is not None (capacity_filter)
        rn = list(new.free_rollout or ())
        c.new_nodes = tuple(rn)
    c.nodes, c.job_id = (tuple(rn), tuple(tn)), new.job.job_id
    c.base = (grp.members, new.job, new.profile)
    return PASS


def slo_bound_filter(g: "_Group", new: Newcomer, c: Candidate) -> Verdict:
    """Node-load rule on every member of G' (the newcomer on its picked nodes added to the loads):
    rejects when a member's lower bound breaks its SLO; sets ``c.bound``, the optimistic
    ``max_k slowdown_k / slo_k`` branch and bound orders by (no simulation)."""
    p = new.profile
    rn, tn = c.nodes  # type: ignore[misc]
    add_r, add_t = p.t_roll_s, p.t_train_s + p.t_sync_s
    new_loads = {n: g.loads.get(n, 0.0) + add_r for n in rn}
    for n in tn:
        new_loads[n] = g.loads[n] + add_t
    rows = [(new.job.job_id, p.t_solo_s, new.job.slo, node_load_bound(p.t_solo_s, new_loads.values()))]
    for jid, ts, slo, nodes, ml in g.info:
        rows.append((jid, ts, slo, node_load_bound(ts, [ml] + [v for n, v in new_loads.items() if n in nodes])))
    c.bound, v = _bound_verdict(rows)
    return v


@dataclass(frozen=True)
class Filter:
    """One admission filter: ``check(group, newcomer, candidate) -> Verdict``; ``slo_only``: run
    only for policies whose spec has ``slo_check`` (Alg. 1)."""

    name: str
    check: Callable[["_Group", Newcomer, Candidate], Verdict]
    slo_only: bool = False


#: Per-candidate filters, in order (cheap first; the memory filter picks the nodes the later ones use).
CANDIDATE_FILTERS: tuple[Filter, ...] = (
    Filter("capacity", capacity_filter),
    Filter("newcomer_slo_bound", newcomer_slo_bound_filter, slo_only=True),
    Filter("memory", memory_filter),
    Filter("slo_bound", slo_bound_filter, slo_only=True),
)


def finite_profile_filter(job: JobSpec, prof: PhaseProfile, cluster: ClusterSpec) -> Verdict:
    """Defence in depth behind the input bounds: a phase time that is NaN, infinite or not > 0
    (rollout, training) / < 0 (sync) would make every cycle, load and slack meaningless: refuse."""
    for name in ("t_roll_s", "t_train_s", "t_sync_s"):
        t = getattr(prof, name)
        if not (isinstance(t, (int, float)) and math.isfinite(t) and (t >= 0 if name == "t_sync_s" else t > 0)):
            return _no("finite", f"phase time {name} = {t!r} s is not a finite positive number")
    return PASS


def train_gpu_memory_filter(job: JobSpec, prof: PhaseProfile, cluster: ClusterSpec) -> Verdict:
    """Training-GPU memory residency: the job's weights, gradients and optimizer state per training
    GPU (:func:`rollmux.profiler.train_gpu_state_gb`, at its precision and ZeRO stage) must fit one
    GPU's HBM (a necessary condition beside host memory; activations are not counted)."""
    need = profiler.train_gpu_state_gb(job)
    gpu = cluster.train_pool.node.gpu
    if need <= gpu.hbm_gb:
        return PASS
    w, g, o = profiler.TRAIN_GPU_BYTES_PER_PARAM[job.train_precision]
    total, have = (w + g + o) * job.model_params_b, gpu.hbm_gb * job.num_train_gpus
    return _no("train_gpu_memory",
               f"training GPU memory: {job.model_params_b:g}B params x {w + g + o:g} B/param "
               f"({job.train_precision}, AdamW, ZeRO-{job.zero_stage} over num_train_gpus={job.num_train_gpus}) = "
               f"{need:.1f} GB per training GPU exceeds the {gpu.hbm_gb:.1f} GB HBM of one {gpu.name} "
               f"(total {total:.0f} GB vs {have:.0f} GB); "
               + ("ask for more num_train_gpus or a smaller model" if job.zero_stage == 3
                  else "ask for more num_train_gpus, a higher zero_stage or a smaller model"),
               state_gb_per_gpu=need, hbm_gb=gpu.hbm_gb, state_gb_total=total, hbm_gb_total=have)


@dataclass(frozen=True)
class JobFilter:
    """A job-level filter, independent of any group: ``check(job, profile, cluster) -> Verdict``;
    a rejection is a ``never`` refusal (no placement can ever change it)."""

    name: str
    check: Callable[[JobSpec, PhaseProfile, ClusterSpec], Verdict]


#: Job-level filters, run before any group is looked at (after the duplicate-id check), in order.
JOB_FILTERS: tuple[JobFilter, ...] = (
    JobFilter("finite", finite_profile_filter),
    JobFilter("train_gpu_memory", train_gpu_memory_filter),
)


def group_size_filter(g: "_Group", config: SchedulerConfig) -> Verdict:
    """A full group (``max_group_size`` members) takes no newcomer."""
    n, cap = len(g.group.members), config.max_group_size
    if n >= cap:
        return _no("group_size", f"group has {n} jobs (max_group_size={cap})", members=n, max_group_size=cap)
    return PASS


def saturation_filter(g: "_Group", config: SchedulerConfig) -> Verdict:
    """Saturated groups take no newcomer (Alg. 1 line 4). ``config.saturation``: ``"paper"``:
    :func:`is_saturated` (``T_load >= T_cycle``, the longest solo time); ``"slo"``: the busiest
    node already holds the largest SLO budget of the members, ``T_load >= max_k slo_k T_solo_k``
    (equal to the paper's rule when every SLO is 1; with looser SLOs a meta-iteration may stretch
    beyond T_cycle and the per-candidate SLO filters decide); ``"off"``: no pruning."""
    if config.saturation == "off":
        return PASS
    cap = g.t_cycle if config.saturation == "paper" else max((ts * slo for _, ts, slo, _, _ in g.info), default=0.0)
    if is_saturated(g.t_load, cap):
        what = "T_cycle" if config.saturation == "paper" else "max SLO budget"
        return _no("saturation", f"saturated: T_load {g.t_load:.1f} s >= {what} {cap:.1f} s", t_load_s=g.t_load, t_cycle_s=cap)
    return PASS


#: Group-level filters (pruning, evaluated when a group changes, not per decision), in order;
#: ``slo_only`` ones apply to policies with ``prune_saturated``.
GROUP_FILTERS: tuple[Filter, ...] = (
    Filter("group_size", group_size_filter),
    Filter("saturation", saturation_filter, slo_only=True),
)


class InterGroupScheduler:
    """Co-execution groups of one cluster and the admission policy that forms them.

    Args:
        cluster: the cluster (bounded pools refuse with ``retry_later`` when full).
        policy: a key of :data:`POLICIES`; ValueError names the known ones otherwise.
        max_group_size: most jobs per group (>= 1).
        seed: seed of the random baseline.
        config: a :class:`SchedulerConfig` (default: its defaults). ``policy`` /
            ``max_group_size`` / ``seed`` override the config's values when given (not None).
    Source: RollMux §4.2, Alg. 1.
    """

    def __init__(self, cluster: ClusterSpec, policy: Optional[str] = None, max_group_size: Optional[int] = None,
                 seed: Optional[int] = None, config: Optional[SchedulerConfig] = None) -> None:
        base = config if config is not None else SchedulerConfig()
        # an argument given explicitly (not None) overrides the config's value, also when it
        # equals the default (policy="rollmux" over a config saying "random")
        policy = base.policy if policy is None else policy
        max_group_size = base.max_group_size if max_group_size is None else max_group_size
        seed = base.seed if seed is None else seed
        if config is not None:
            config = config.model_copy(update={"policy": policy, "max_group_size": int(max_group_size), "seed": seed})
        self.spec: PolicySpec = policy_spec(policy, "scheduler")
        if int(max_group_size) < 1:
            raise ValueError(f"max_group_size must be >= 1, got {max_group_size}")
        self.cluster = cluster
        self.policy = policy
        self.max_group_size = int(max_group_size)
        self.seed = seed
        self.config = config or SchedulerConfig(policy=policy, max_group_size=max_group_size, seed=seed)
        self._rng = random.Random(seed)
        self._groups: dict[str, _Group] = {}
        self._open: dict[str, _Group] = {}  # groups a decision evaluates
        self._closed: dict[str, tuple[str, str]] = {}  # pruned groups: (plugin, reason)
        self._index = _GroupIndex()  # the open groups by what the cheap filters read
        self._open_seq = 0  # opening order of the open groups (monotone)
        self._ordinal: dict[str, int] = {}  # creation order of each group id (= order of self._groups)
        self._small: list[tuple[int, float, int, str]] = []  # re-packing candidates, sorted: (members, Cost(G), ordinal, id)
        self._small_key: dict[str, tuple[int, float, int, str]] = {}
        self._job_group: dict[str, str] = {}
        self._pools = {"rollout": _NodePool("rollout", cluster.rollout_pool.num_nodes),
                       "train": _NodePool("train", cluster.train_pool.num_nodes)}
        self._next_group = 0
        self._version = 0

    # --- queries -------------------------------------------------------------------------------
    @property
    def groups(self) -> tuple[CoExecutionGroup, ...]:
        return tuple(g.group for g in self._groups.values())

    def group(self, group_id: str) -> CoExecutionGroup:
        """The group ``group_id`` (KeyError if unknown)."""
        return self._groups[group_id].group

    def group_of(self, job_id: str) -> Optional[CoExecutionGroup]:
        gid = self._job_group.get(job_id)
        return None if gid is None else self._groups[gid].group

    def member(self, job_id: str) -> Optional[GroupMember]:
        g = self.group_of(job_id)
        return None if g is None else next(m for m in g.members if m.spec.job_id == job_id)

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(self._job_group)

    def cost_usd_per_h(self) -> float:
        """Hourly price of every provisioned GPU (sum of Cost(G)), USD/h."""
        return sum(g.cost for g in self._groups.values())

    def nodes_in_use(self) -> dict[str, int]:
        """Provisioned nodes per pool."""
        return {p: self._pools[p].used for p in ("rollout", "train")}

    def group_stats(self, group_id: str) -> dict:
        """``group_id, members, rollout_nodes, train_nodes, cost_usd_per_h, t_cycle_s, t_load_s,
        slack_s, saturated, predicted_slowdowns`` (KeyError if unknown)."""
        g = self._groups[group_id]
        if g.coexec is None and g.group.members:
            g.coexec = coexec_times(list(g.group.members))
        return {
            "group_id": group_id,
            "members": list(g.group.job_ids),
            "rollout_nodes": list(g.group.rollout_nodes),
            "train_nodes": list(g.group.train_nodes),
            "cost_usd_per_h": g.group.cost_usd_per_h(self.cluster),
            "t_cycle_s": g.t_cycle,
            "t_load_s": g.t_load,
            "slack_s": g.t_cycle - g.t_load,
            "saturated": g.t_load >= g.t_cycle,
            "predicted_slowdowns": {m.spec.job_id: (g.coexec or {}).get(m.spec.job_id, 0.0) / m.profile.t_solo_s for m in g.group.members},
        }

    def describe_groups(self) -> list[dict]:
        return [self.group_stats(gid) for gid in self._groups]

    # --- decisions ----------------------------------------------------------------------------------
    def _never(self, job: JobSpec, prof: Optional[PhaseProfile]) -> Optional[str]:
        if job.job_id in self._job_group:
            return f"job id {job.job_id!r} is already admitted"
        for f in JOB_FILTERS if prof is not None else ():
            v = f.check(job, prof, self.cluster)
            if not v.ok:
                return v.reason
        for pool in ("rollout", "train"):
            ps = self.cluster.pool(pool)  # type: ignore[arg-type]
            gpus = job.num_rollout_gpus if pool == "rollout" else job.num_train_gpus
            need = job.nodes_needed(pool, ps.node)  # type: ignore[arg-type]
            if ps.num_nodes is not None and need > ps.num_nodes:
                return (f"num_{'rollout' if pool == 'rollout' else 'train'}_gpus={gpus} needs {need} nodes but the "
                        f"{pool} pool has {ps.num_nodes} nodes of {ps.node.gpus_per_node} GPUs")
            st = profiler.state_gb(job, pool, self.cluster)  # type: ignore[arg-type]
            if st > ps.node.host_mem_gb:
                field_ = "mem_roll_gb" if pool == "rollout" else "mem_train_gb"
                return (f"{pool} state {st:.1f} GB per node ({field_}) exceeds the host memory of every {pool} node "
                        f"({ps.node.host_mem_gb:.1f} GB)")
        return None

    def decide(self, job: JobSpec, profile: Optional[PhaseProfile] = None) -> AdmissionDecision:
        """Evaluate admitting ``job`` (no state change; the random baseline advances its RNG).

        ``profile`` defaults to the worst-case :func:`rollmux.profiler.estimate` (``job.measured``
        wins there). Returns an :class:`AdmissionDecision`; refusals are values, never raised.
        Source: RollMux §4.2, Alg. 1.
        """
        t0 = time.perf_counter()
        d = self._decide(job, profile)
        d.latency_ms = (time.perf_counter() - t0) * 1e3
        d._version = self._version
        d.spec = job
        return d

    def _decide(self, job: JobSpec, profile: Optional[PhaseProfile]) -> AdmissionDecision:
        try:
            prof = profile or profiler.estimate(job, self.cluster)
        except ValueError as e:
            return AdmissionDecision(job.job_id, False, "never", str(e), self.policy)
        reason = self._never(job, prof)
        if reason:
            return AdmissionDecision(job.job_id, False, "never", reason, self.policy, profile=prof)
        new = self._newcomer(job, prof)
        nr, nt = new.rollout_nodes, new.train_nodes
        spec = self.spec
        cands: list[Candidate] = []
        pruned = list(self._closed.items())  # kept up to date on every state change (linear scan avoided)
        # Tier by tier (RollMux: direct packing, Δ = 0, then scale-out only when no direct packing
        # survives; the baselines draw among every feasible pair, so they see both in one tier).
        # With the SLO check, only the open groups the index returns are evaluated (a superset of
        # those passing the capacity and newcomer-SLO-bound filters); the others are rejected by
        # one of those two filters, and their candidates are built on demand (decision.candidates).
        indexed = spec.slo_check
        opens = list(self._open.values()) if indexed else None
        tiers_done: list[tuple[str, ...]] = []
        evaluated: dict[tuple[str, str], Candidate] = {}
        skip_score: Optional[float] = None  # a streamed branch and bound stopped below this score
        chosen: Optional[Candidate] = None
        for strategies in spec.tiers:
            tier: list[Candidate] = []
            tiers_done.append(strategies)
            if indexed:
                pairs = self._index.candidates(new, strategies, self._open)
                if spec.choose is choose_min_cost_policy and len(strategies) == 1 and self.config.tie_break == "most_slack":
                    chosen = self._branch_and_bound(pairs, new, evaluated)
                    if chosen is not None:
                        skip_score = chosen.score
                        break
                    continue
                for g, strategy in pairs:
                    c = self._candidate(g, new, strategy)
                    evaluated[(g.group.group_id, strategy)] = c
                    if c.ok:
                        tier.append(c)
            else:
                for g in self._open.values():
                    for strategy in strategies:
                        c = self._candidate(g, new, strategy)
                        cands.append(c)
                        if c.ok:
                            tier.append(c)
            chosen = spec.choose(self, tier, prof)  # type: ignore[misc]
            if chosen is not None:
                break
        if chosen is not None and not spec.slo_check:  # predicted slowdowns of the chosen placement only
            g = self._groups[chosen.group_id]  # type: ignore[index]
            mems = list(g.group.members) + [GroupMember(spec=job, profile=prof, placement=chosen.placement)]
            tco = coexec_times(mems)
            chosen.predicted_slowdowns = {m.spec.job_id: tco[m.spec.job_id] / m.profile.t_solo_s for m in mems}
        iso = Candidate(None, "isolated", nr * new.rollout_price + nt * new.train_price)
        new_r = new.free_rollout
        new_t = self._pools["train"].peek(nt)
        if new_r is None or new_t is None:
            iso.reject("capacity", "cluster out of GPUs: not enough free nodes for a new group "
                       f"({nr} rollout + {nt} training nodes)", {"rollout_nodes_needed": nr, "train_nodes_needed": nt})
        else:
            iso.nodes, iso.job_id = (tuple(new_r), tuple(new_t)), job.job_id
            iso.new_nodes = tuple(new_r) + tuple(new_t)
            iso.predicted_slowdowns = {job.job_id: 1.0}
        cands.append(iso)
        expand = None
        if indexed:
            cands = []

            def expand() -> list[Candidate]:
                out = []
                for sts in tiers_done:
                    for g in opens:  # type: ignore[union-attr]
                        for st in sts:
                            c = evaluated.get((g.group.group_id, st))
                            if c is None:
                                c = self._candidate(g, new, st)
                                if c.ok and skip_score is not None:  # never reached by the branch and bound
                                    c.verdict, c.reasons = "skipped", [f"bound {c.bound:.3f} >= chosen score {skip_score:.3f} (branch and bound)"]
                            out.append(c)
                return out + [iso]

        if iso.ok and (chosen is None or iso.delta_usd_per_h < chosen.delta_usd_per_h):
            chosen = iso
        if chosen is None:
            if expand is not None:
                cands, expand = expand(), None
            return AdmissionDecision(job.job_id, False, "retry_later", _no_placement_reason(cands, pruned),
                                     self.policy, _candidates=cands, _expand=expand, _pruned_src=pruned, profile=prof)
        return AdmissionDecision(
            job.job_id, True, "ok",
            f"{chosen.strategy} into {chosen.group_id or 'a new group'} (delta {chosen.delta_usd_per_h:.2f} USD/h)",
            self.policy, group_id=chosen.group_id, strategy=chosen.strategy, placement=chosen.placement,
            delta_usd_per_h=chosen.delta_usd_per_h, predicted_slowdowns=dict(chosen.predicted_slowdowns),
            _candidates=cands, _expand=expand, _pruned_src=pruned, profile=prof, _chosen=chosen,
        )

    def _newcomer(self, job: JobSpec, prof: PhaseProfile) -> Newcomer:
        cl = self.cluster
        nr = job.nodes_needed("rollout", cl.rollout_pool.node)
        free = self._pools["rollout"].peek(nr)
        return Newcomer(job, prof, nr, job.nodes_needed("train", cl.train_pool.node),
                        profiler.state_gb(job, "rollout", cl), profiler.state_gb(job, "train", cl),
                        None if free is None else tuple(free), cl.rollout_pool.node.price_usd_per_h,
                        cl.train_pool.node.price_usd_per_h, cl.rollout_pool.node.host_mem_gb, cl.train_pool.node.host_mem_gb)

    def _candidate(self, g: _Group, new: Newcomer, strategy: str) -> Candidate:
        """One placement of the newcomer into ``g`` (``"direct"`` | ``"scale_out"``), through
        :data:`CANDIDATE_FILTERS` in order; the first rejecting filter's verdict is kept."""
        c = Candidate(g.group.group_id, strategy, 0.0 if strategy == "direct" else new.rollout_nodes * new.rollout_price)
        slo_check = self.spec.slo_check
        for f in CANDIDATE_FILTERS:
            if f.slo_only and not slo_check:
                continue
            v = f.check(g, new, c)
            if not v.ok:
                return c.reject(v.plugin, v.reason, v.numbers)
        return c

    def _branch_and_bound(self, pairs: list, new: Newcomer, evaluated: dict) -> Optional[Candidate]:
        """:meth:`choose_min_cost` (most-slack tie-break, one strategy) with the candidates built
        on demand: groups are taken in order of a lower bound of their candidate's optimistic
        score (``max(pressure, newcomer's load on the k-th least-loaded nodes / budget)``, never
        above ``Candidate.bound``), and a candidate is visited only once every group that could
        precede it in ``(bound, group number, opening order)`` has been built, so the visiting
        order, the skips and the choice are those of the exhaustive evaluation; the search stops
        when no remaining candidate's bound is below the chosen score. Built candidates are
        recorded in ``evaluated``."""
        p, job = new.profile, new.job
        add_t, add_r = p.t_train_s + p.t_sync_s, p.t_roll_s
        ts_new, slo_new, nt, nr = p.t_solo_s, job.slo, new.train_nodes, new.rollout_nodes
        lbs = []
        for i, (g, st) in enumerate(pairs):
            x = max(ts_new, g.t_sorted[nt - 1] + add_t)
            if st == "direct":
                x = max(x, g.r_sorted[nr - 1] + add_r)
            lbs.append((max(g.pressure, x / ts_new / slo_new), i))
        lbs.sort()
        overhead = self.config.migration_overhead_s if self.config.plan_migration_overhead else 0.0
        heap: list = []
        chosen: Optional[Candidate] = None
        k = 0

        def skip(c: Candidate) -> None:
            c.verdict, c.reasons = "skipped", [f"bound {c.bound:.3f} >= chosen score {chosen.score:.3f} (branch and bound)"]

        while True:
            next_lb = lbs[k][0] if k < len(lbs) else math.inf
            if heap and (heap[0][0] < next_lb or k >= len(lbs)):  # nothing unbuilt can precede it
                _, _, _, c = heapq.heappop(heap)
                if chosen is not None and c.bound >= chosen.score:
                    skip(c)
                    continue
                _slo_sim(c, overhead)
                if c.ok and (chosen is None or c.score < chosen.score):
                    chosen = c
                continue
            if k >= len(lbs):
                return chosen
            if chosen is not None and next_lb >= chosen.score and (not heap or heap[0][0] >= chosen.score):
                for _, _, _, c in heap:
                    skip(c)
                return chosen
            i = lbs[k][1]
            k += 1
            g, st = pairs[i]
            c = self._candidate(g, new, st)
            evaluated[(g.group.group_id, st)] = c
            if c.ok:
                heapq.heappush(heap, (c.bound, _gnum(c.group_id), i, c))

    def choose_min_cost(self, feasible: list[Candidate]) -> Optional[Candidate]:
        """Min marginal cost, tie-break on SLO slack, over bound-feasible candidates; simulates
        lazily: cheaper tiers first (direct Δ=0, then scale-out), best optimistic bound first, and
        stops when no remaining candidate can beat the best simulated one (branch and bound).
        Candidates never simulated get verdict ``"skipped"`` with the reason."""
        most_slack = self.config.tie_break == "most_slack"
        chosen: Optional[Candidate] = None
        for delta in sorted({c.delta_usd_per_h for c in feasible}):
            tier = sorted((c for c in feasible if c.delta_usd_per_h == delta), key=lambda c: (c.bound, _gnum(c.group_id)))
            if chosen is not None:
                for c in tier:
                    c.verdict, c.reasons = "skipped", [f"dominated: a placement with delta {chosen.delta_usd_per_h:.2f} USD/h exists"]
                continue
            for c in tier:
                if chosen is not None and most_slack and c.bound >= chosen.score:
                    c.verdict, c.reasons = "skipped", [f"bound {c.bound:.3f} >= chosen score {chosen.score:.3f} (branch and bound)"]
                    continue
                _slo_sim(c, self.config.migration_overhead_s if self.config.plan_migration_overhead else 0.0)
                if c.ok and (chosen is None or (c.score < chosen.score if most_slack else c.score > chosen.score)):
                    chosen = c
        return chosen

    # --- state changes -------------------------------------------------------------------------------
    def _set_group(self, gid: str, g: Optional[_Group]) -> None:
        """Store / drop a group and classify it as open or pruned (Alg. 1 line 4), so a decision
        only scans open groups."""
        self._open.pop(gid, None)
        self._closed.pop(gid, None)
        self._index.remove(gid)
        sk = self._small_key.pop(gid, None)
        if sk is not None:
            del self._small[bisect.bisect_left(self._small, sk)]
        if g is None:
            del self._groups[gid]
            return
        if gid not in self._groups:
            self._ordinal[gid] = len(self._ordinal)
        self._groups[gid] = g
        if len(g.group.members) <= self.config.repack_max_members:
            sk = (len(g.group.members), g.cost, self._ordinal[gid], gid)
            self._small_key[gid] = sk
            bisect.insort(self._small, sk)
        for f in GROUP_FILTERS:
            if f.slo_only and not self.spec.prune_saturated:
                continue
            v = f.check(g, self.config)
            if not v.ok:
                self._closed[gid] = (v.plugin, v.reason)
                return
        self._open[gid] = g
        self._open_seq += 1
        self._index.add(gid, self._open_seq, g)

    def commit(self, decision: AdmissionDecision) -> Optional[CoExecutionGroup]:
        """Apply an admitting decision from :meth:`decide` (no-op for a refusal: returns None).

        Raises ValueError if the scheduler changed since the decision was made (decide again).
        """
        if not decision.admitted:
            return None
        if decision._version != self._version:
            raise ValueError("stale admission decision: the groups changed since decide(); call decide() again")
        c, job, prof = decision._chosen, decision.spec, decision.profile
        assert c is not None and job is not None and prof is not None and c.placement is not None
        member = GroupMember(spec=job, profile=prof, placement=c.placement)
        if c.strategy == "isolated":
            gid = f"group-{self._next_group}"
            self._next_group += 1
            self._pools["rollout"].take(c.placement.rollout_nodes)
            self._pools["train"].take(c.placement.train_nodes)
            grp = CoExecutionGroup(group_id=gid, rollout_nodes=c.placement.rollout_nodes,
                                   train_nodes=c.placement.train_nodes, members=(member,))
        else:
            gid = c.group_id
            old = self._groups[gid].group
            rn = old.rollout_nodes
            if c.strategy == "scale_out":
                self._pools["rollout"].take(c.new_nodes)
                rn = rn + tuple(c.new_nodes)
            members = old.members + (member,)
            if c.members:  # the round-robin order the SLO check chose (best_round_robin_order)
                rank = {m.spec.job_id: i for i, m in enumerate(c.members)}
                members = tuple(sorted(members, key=lambda m: rank.get(m.spec.job_id, len(rank))))
            grp = old.model_copy(update={"rollout_nodes": rn, "members": members})
        self._set_group(gid, _summarise(grp, self.cluster))
        if c.predicted_slowdowns and c.strategy != "isolated":
            self._groups[gid].coexec = {j: s * next(m.profile.t_solo_s for m in grp.members if m.spec.job_id == j)
                                        for j, s in c.predicted_slowdowns.items()}
        self._job_group[job.job_id] = gid
        self._version += 1
        return grp

    def admit(self, job: JobSpec, profile: Optional[PhaseProfile] = None) -> AdmissionDecision:
        """:meth:`decide` then :meth:`commit` when admitted. Returns the decision."""
        d = self.decide(job, profile)
        self.commit(d)
        return d

    def depart(self, job_id: str) -> list[str]:
        """Remove a finished job from its group; release nodes no member uses any more (e.g. its
        scale-out rollout nodes) and the whole group when it becomes empty.

        Returns the released node ids (sorted). Raises KeyError for an unknown job.
        """
        gid = self._job_group.pop(job_id)
        old = self._groups[gid].group
        members = tuple(m for m in old.members if m.spec.job_id != job_id)
        used = {n for m in members for n in m.placement.rollout_nodes + m.placement.train_nodes}
        rel_r = [n for n in old.rollout_nodes if n not in used]
        rel_t = [n for n in old.train_nodes if n not in used]
        self._pools["rollout"].give(rel_r)
        self._pools["train"].give(rel_t)
        if members:
            grp = old.model_copy(update={
                "members": members,
                "rollout_nodes": tuple(n for n in old.rollout_nodes if n in used),
                "train_nodes": tuple(n for n in old.train_nodes if n in used),
            })
            self._set_group(gid, _summarise(grp, self.cluster))
        else:
            self._set_group(gid, None)
        self._version += 1
        return sorted(rel_r + rel_t, key=lambda n: (n.split("-")[0], node_index(n)))

    # --- departure re-packing -------------------------------------------------------------------------
    def _save(self) -> tuple:
        return (dict(self._groups), dict(self._open), dict(self._closed), dict(self._job_group),
                {k: (list(p.free), p.next, p.used) for k, p in self._pools.items()},
                self._next_group, self._version, self._rng.getstate(), self._index.copy(),
                list(self._small), dict(self._small_key))

    def _load(self, saved: tuple) -> None:
        g, o, c, jg, pools, ng, v, rng, index, small, small_key = saved
        self._groups, self._open, self._closed, self._job_group, self._index = g, o, c, jg, index
        self._small, self._small_key = small, small_key
        for k, (free, nxt, used) in pools.items():
            p = self._pools[k]
            p.free, p.next, p.used = free, nxt, used
        self._next_group = ng
        self._rng.setstate(rng)
        self._version = v + 1

    def repack(self, trigger_group: Optional[str] = None) -> list[dict]:
        """Departure re-packing: dissolve small groups into the others when that lowers the $/h.

        Called after :meth:`depart` (``trigger_group``: the group the job left, tried first).
        Candidates are the groups with at most ``config.repack_max_members`` members (at most
        ``config.repack_max_groups`` of them, fewest members and cheapest first). For each, its
        members are re-admitted one by one (longest solo time first) through the same Alg. 1
        decision as an arrival (saturation pruning, memory residency, every member's SLO on the
        simulated round-robin schedule, minimum marginal cost), restricted to existing groups;
        the mover's own SLO must also absorb copying its host state once
        (:func:`rollmux.profiler.move_time_s`): ``slowdown + move_s / T_solo <= slo``. The
        dissolution is kept only if every member found a place and the cluster's total $/h
        dropped; otherwise the state is rolled back exactly. Only the ``"rollmux"`` policy
        re-packs (the baselines are the paper's greedy placements); ``repack_on_departure:
        false`` turns it off (plain Alg. 1).

        Returns:
            the moves committed, in order: ``{job_id, from_group, to_group, placement
            {rollout_nodes, train_nodes}, move_s, saved_usd_per_h}`` (``saved_usd_per_h``: the
            $/h the dissolution of ``from_group`` saved, repeated on each of its moves).
        Source: extension of RollMux §4.2 Alg. 1 (the paper only admits; its offline optimum
        re-partitions at every event, RollMux §7.5 "Opt").
        """
        if not self.spec.repacks or not self.config.repack_on_departure or self.config.repack_max_groups == 0:
            return []
        # the groups of <= repack_max_members members, the trigger group first, then fewest
        # members, cheapest, oldest (self._small is kept sorted so)
        top = self.config.repack_max_groups
        cands = [gid for gid in (trigger_group,) if gid in self._small_key]
        cands += [gid for *_, gid in itertools.islice((x for x in self._small if x[3] != trigger_group), top - len(cands))]
        moves: list[dict] = []
        for gid in cands:
            if gid not in self._groups:
                continue
            saved = self._save()
            before_groups = saved[0]
            members = list(self._groups[gid].group.members)
            for m in members:
                self.depart(m.spec.job_id)
            plan, ok = [], True
            for m in sorted(members, key=lambda m: -m.profile.t_solo_s):
                d = self.decide(m.spec, m.profile)
                mv = profiler.move_time_s(m.spec, self.cluster)
                if (not d.admitted or d.strategy == "isolated"
                        or not _within(d.predicted_slowdowns.get(m.spec.job_id, math.inf) + mv / m.profile.t_solo_s, m.spec.slo)):
                    ok = False
                    break
                self.commit(d)
                plan.append({"job_id": m.spec.job_id, "from_group": gid, "to_group": d.group_id,
                             "placement": _placement_dict(d.placement), "move_s": mv})
            # the $/h change is that of the dissolved group and the groups that took its members
            touched = [gid] + sorted({mv["to_group"] for mv in plan})
            before = sum(before_groups[x].cost for x in touched)
            after = sum(self._groups[x].cost for x in touched if x in self._groups)
            if ok and after < before - 1e-9:
                moves += [dict(mv, saved_usd_per_h=before - after) for mv in plan]
            else:
                self._load(saved)
        return moves

    def reoptimise(self, trigger_group: Optional[str] = None, fresh: Optional[str] = None, *, solver) -> list[dict]:
        """Bounded exact re-optimisation of an event's neighbourhood, after every admission (with
        the newcomer's group and ``fresh`` = the newcomer) and after every departure (after
        :meth:`repack`, with the group the job left). The cluster's GlobalScheduler and the
        simulator both call it.

        The neighbourhood is the group ``trigger_group`` (if it exists) and then the groups with
        the largest idle fraction of node time (fewest members first on ties), whole groups
        only, at most ``config.reopt_max_jobs`` jobs in all. ``solver.solve(members)`` (the
        optimum's set partitioning, :class:`rollmux.baselines.OptimalPartition` with
        ``exact_max_jobs >= reopt_max_jobs``: every subset of at most ``max_group_size`` jobs
        laid out by :func:`build_group`, every member's SLO in the best round-robin order,
        CP-SAT) re-partitions its jobs; groups the partition keeps as they are stay untouched.
        The new partition is taken only if it lowers the neighbourhood's $/h and every job of a
        new group stays within its SLO with one host-state copy (``slowdown + move_s / T_solo <=
        slo``, :func:`rollmux.profiler.move_time_s`; the job ``fresh`` has not started, so it
        has no state to copy); its groups get new ids and nodes from the pools (a bounded
        cluster without room keeps the old groups). Bounded work: one set partitioning of at
        most ``reopt_max_jobs`` jobs (the solver caches layouts across calls). Only the
        ``"rollmux"`` policy does this; ``reopt_max_jobs: 0`` turns it off, and so does
        ``repack_on_departure: false`` (the paper's admission-only Alg. 1).

        Returns:
            the moves committed: ``{job_id, from_group, to_group, placement {rollout_nodes,
            train_nodes}, move_s, saved_usd_per_h}`` (as :meth:`repack`); a move of ``fresh`` has
            ``move_s`` 0 (nothing to copy).
        Source: extension of RollMux §4.2 Alg. 1 towards the optimum that re-partitions at every
        event (RollMux §7.5 "Opt"), bounded to a neighbourhood.
        """
        cap = self.config.reopt_max_jobs
        if not self.spec.repacks or not self.config.repack_on_departure or cap < 2 or len(self._groups) < 2:
            return []
        hood: list[str] = []
        n = 0
        first = [trigger_group] if trigger_group in self._groups else []
        rest = heapq.nsmallest(3 * cap, (gid for gid in self._groups if gid != trigger_group),
                               key=lambda gid: (-self._groups[gid].idle_fraction, len(self._groups[gid].group.members),
                                                self._ordinal[gid]))
        for gid in first + rest:
            k = len(self._groups[gid].group.members)
            if n + k <= cap:
                hood.append(gid)
                n += k
            if n >= cap:
                break
        if len(hood) < 2:
            return []
        members = [(m.spec, m.profile) for gid in hood for m in self._groups[gid].group.members]
        before = sum(self._groups[gid].cost for gid in hood)
        current = {frozenset(self._groups[gid].group.job_ids): gid for gid in hood}

        def gain(groups: Sequence[CoExecutionGroup]) -> tuple[list[CoExecutionGroup], float]:
            """The new groups of a partition of the neighbourhood and its $/h (kept groups at their cost)."""
            new = [g for g in groups if frozenset(g.job_ids) not in current]
            kept = [current[frozenset(g.job_ids)] for g in groups if frozenset(g.job_ids) in current]
            return new, sum(self._groups[gid].cost for gid in kept) + sum(g.cost_usd_per_h(self.cluster) for g in new)

        overhead = self.config.migration_overhead_s if self.config.plan_migration_overhead else 0.0
        orders: dict[tuple[str, ...], Optional[OrderChoice]] = {}

        def movable(g: CoExecutionGroup) -> Optional[OrderChoice]:
            """A new group's round-robin order when it passes the checks below (feasible, every moved
            job's SLO absorbs its copy), else None; searched once per member list."""
            key = tuple(g.job_ids)
            if key not in orders:
                oc = best_round_robin_order(g.members, rollout_overhead_s=overhead)
                ok = oc.feasible and all(
                    _within((oc.t_coexec_s[m.spec.job_id]
                             + (0.0 if m.spec.job_id == fresh else profiler.move_time_s(m.spec, self.cluster)))
                            / m.profile.t_solo_s, m.spec.slo)
                    for m in oc.members)
                orders[key] = oc if ok else None
            return orders[key]

        # Any partition the checks below would take is cheaper than the target and uses only new
        # groups that pass them: when the bound over those proves none is, nothing changes. The
        # margin covers float summation order; within it the exact solve decides.
        target = before - 1e-6 + 1e-9 * (1.0 + before)
        if solver.partition_floor(members, {s: self._groups[gid].cost for s, gid in current.items()}, target,
                                  keeps=lambda g: movable(g) is not None) >= target:
            return []

        def unchanged(groups: Sequence[CoExecutionGroup]) -> bool:
            new, after = gain(groups)
            return not new or after >= before - 1e-6

        # the solver may skip choosing among tied optima when none of them would change anything
        res = solver.solve(members, indifferent=unchanged)
        if unchanged(res.groups):
            return []
        new, after = gain(res.groups)
        plans = []
        for g in new:
            oc = movable(g)
            if oc is None:
                return []
            plans.append((g, oc))
        saved = self._save()
        origin = {m.spec.job_id: self._job_group[m.spec.job_id] for g, _ in plans for m in g.members}
        for j in origin:
            self.depart(j)
        moves: list[dict] = []
        for g, oc in plans:
            rn = self._pools["rollout"].peek(len(g.rollout_nodes))
            tn = self._pools["train"].peek(len(g.train_nodes))
            if rn is None or tn is None:  # a bounded cluster without room for the new layout
                self._load(saved)
                return []
            self._pools["rollout"].take(rn)
            self._pools["train"].take(tn)
            name = {**dict(zip(g.rollout_nodes, rn)), **dict(zip(g.train_nodes, tn))}
            gid = f"group-{self._next_group}"
            self._next_group += 1
            mems = tuple(GroupMember(spec=m.spec, profile=m.profile, placement=Placement(
                job_id=m.spec.job_id, rollout_nodes=tuple(name[x] for x in m.placement.rollout_nodes),
                train_nodes=tuple(name[x] for x in m.placement.train_nodes))) for m in oc.members)
            grp = CoExecutionGroup(group_id=gid, rollout_nodes=tuple(rn), train_nodes=tuple(tn), members=mems)
            self._set_group(gid, _summarise(grp, self.cluster))
            self._groups[gid].coexec = dict(oc.t_coexec_s)
            for m in mems:
                self._job_group[m.spec.job_id] = gid
                moves.append({"job_id": m.spec.job_id, "from_group": origin[m.spec.job_id], "to_group": gid,
                              "placement": _placement_dict(m.placement),
                              "move_s": 0.0 if m.spec.job_id == fresh else profiler.move_time_s(m.spec, self.cluster)})
        self._version += 1
        return [dict(mv, saved_usd_per_h=before - after) for mv in moves]

    # --- checkpointing ------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """JSON-able state: policy, settings, groups with members (spec, profile, placement).
        The policy owns this format: ``{**snapshot_header(), "groups": [group_snapshot(g), ...]}``."""
        return {**self.snapshot_header(), "groups": [self.group_snapshot(gid) for gid in self._groups]}

    def snapshot_header(self) -> dict:
        """The snapshot without its groups: version, policy, settings and the next group number
        (group ids are never reused). A checkpoint may store it apart from the groups."""
        return {
            "version": 1,
            "policy": self.policy,
            "max_group_size": self.max_group_size,
            "seed": self.seed,
            "config": self.config.model_dump(),
            "next_group": self._next_group,
        }

    def group_snapshot(self, group_id: str) -> Optional[dict]:
        """One group of :meth:`snapshot` (``group_id, rollout_nodes, train_nodes, members``), None
        once the group is gone."""
        g = self._groups.get(group_id)
        if g is None:
            return None
        return {
            "group_id": g.group.group_id,
            "rollout_nodes": list(g.group.rollout_nodes),
            "train_nodes": list(g.group.train_nodes),
            "members": [m.model_dump(mode="json") for m in g.group.members],
        }

    def load_groups(self, header: Mapping, groups: Mapping[str, Optional[dict]]) -> None:
        """Bring a copy of the table up to date with published changes: each group of ``groups``
        is replaced by its :meth:`group_snapshot` (None: gone; an unknown id: a new group, last in
        order), and ``next_group`` taken from ``header`` (:meth:`snapshot_header`). Nodes are
        released before any is taken, so a change that moves nodes between groups applies in any
        order. Used by a follower (a Serve replica answering dry-runs) that holds the scheduler's
        table without deciding for it; the table equals what :meth:`restore` of the scheduler's
        snapshot gives, except the order among open groups (ties of equal cost). Raises
        ValueError on a malformed group."""
        try:
            for gid in groups:
                old = self._groups.get(gid)
                if old is None:
                    continue
                for m in old.group.members:
                    if self._job_group.get(m.spec.job_id) == gid:
                        del self._job_group[m.spec.job_id]
                self._pools["rollout"].give(old.group.rollout_nodes)
                self._pools["train"].give(old.group.train_nodes)
            for gid, gd in groups.items():
                if gd is None:
                    if gid in self._groups:
                        self._set_group(gid, None)
                    continue
                grp = CoExecutionGroup(group_id=gd["group_id"], rollout_nodes=tuple(gd["rollout_nodes"]),
                                       train_nodes=tuple(gd["train_nodes"]),
                                       members=tuple(GroupMember.model_validate(m) for m in gd["members"]))
                self._pools["rollout"].take(grp.rollout_nodes)
                self._pools["train"].take(grp.train_nodes)
                self._set_group(gid, _summarise(grp, self.cluster))
                for m in grp.members:
                    self._job_group[m.spec.job_id] = gid
            self._next_group = max(self._next_group, int(header.get("next_group", self._next_group)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed group snapshot: missing or bad {e}") from e
        self._version += 1

    @classmethod
    def restore(cls, cluster: ClusterSpec, snapshot: dict) -> "InterGroupScheduler":
        """Rebuild a scheduler from :meth:`snapshot` output. Raises ValueError on a malformed
        snapshot (pydantic messages name the field)."""
        try:
            cfg = SchedulerConfig.model_validate({**snapshot.get("config", {}), "policy": snapshot["policy"],
                                                  "max_group_size": snapshot["max_group_size"], "seed": snapshot["seed"]})
            s = cls(cluster, policy=cfg.policy, max_group_size=cfg.max_group_size, seed=cfg.seed, config=cfg)
            s._next_group = int(snapshot["next_group"])
            for gd in snapshot["groups"]:
                grp = CoExecutionGroup(group_id=gd["group_id"], rollout_nodes=tuple(gd["rollout_nodes"]),
                                       train_nodes=tuple(gd["train_nodes"]),
                                       members=tuple(GroupMember.model_validate(m) for m in gd["members"]))
                s._pools["rollout"].take(grp.rollout_nodes)
                s._pools["train"].take(grp.train_nodes)
                s._set_group(grp.group_id, _summarise(grp, cluster))
                for m in grp.members:
                    s._job_group[m.spec.job_id] = grp.group_id
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed scheduler snapshot: missing or bad {e}") from e
        return s


# --- exact layout of a given job set (for the optimum) ------------------------------------------------

def _pin_train(order, items, nt, mt, t_nodes, t_cap_gb):
    """Training pins of a build_group layout, jobs taking their least-loaded memory-feasible
    training nodes in ``order``: ({job index: nodes}, node loads, node memory) or None."""
    if len(t_nodes) == 1:  # one shared training node: every job on it (the same sums, in order)
        x, load, m = t_nodes[0], 0.0, 0.0
        for i in order:
            if not m + mt[i] <= t_cap_gb + 1e-9:
                return None
            p = items[i][1]
            load = load + p.t_train_s + p.t_sync_s
            m = m + mt[i]
        return {i: (x,) for i in order}, {x: load}, {x: m}
    loads: dict[str, float] = {}
    mem: dict[str, float] = {}
    pins = {}
    for i in order:
        p = items[i][1]
        tp = _pick_nodes(t_nodes, nt[i], loads, mem, mt[i], t_cap_gb)
        if tp is None:
            return None
        for x in tp:
            loads[x] = loads.get(x, 0.0) + p.t_train_s + p.t_sync_s
            mem[x] = mem.get(x, 0.0) + mt[i]
        pins[i] = tuple(tp)
    return pins, loads, mem


def _pin_rollout(order, items, mask, nr, mr, shared_nodes, n_shared, r_cap_gb):
    """Rollout pins: jobs in ``mask`` on dedicated nodes, the others on their least-loaded
    memory-feasible shared nodes in ``order``: ({job index: nodes}, loads, rollout nodes used) or None."""
    loads: dict[str, float] = {}
    mem: dict[str, float] = {}
    nxt = n_shared
    pins = {}
    for i in order:
        if mask >> i & 1:
            rp = [node_id("rollout", x) for x in range(nxt, nxt + nr[i])]
            nxt += nr[i]
        elif nr[i] == n_shared:
            rp = shared_nodes
            if any(mem.get(x, 0.0) + mr[i] > r_cap_gb + 1e-9 for x in rp):
                return None
        else:
            rp = _pick_nodes(shared_nodes, nr[i], loads, mem, mr[i], r_cap_gb)
            if rp is None:
                return None
        for x in rp:
            loads[x] = loads.get(x, 0.0) + items[i][1].t_roll_s
            mem[x] = mem.get(x, 0.0) + mr[i]
        pins[i] = tuple(rp)
    return pins, loads, nxt


def job_layout_needs(job: JobSpec, cluster: ClusterSpec) -> tuple[int, int, float, float]:
    """What :func:`build_group` reads of one job besides its profile: ``(rollout nodes, training
    nodes, rollout state GB per node, training state GB per node)``."""
    rnode, tnode = cluster.rollout_pool.node, cluster.train_pool.node
    return (job.nodes_needed("rollout", rnode), job.nodes_needed("train", tnode),
            profiler.state_gb(job, "rollout", cluster), profiler.state_gb(job, "train", cluster))


def layout_row(job: JobSpec, profile: PhaseProfile, cluster: ClusterSpec) -> tuple:
    """One job as :func:`training_pins_feasible` reads it: ``(rollout nodes, training nodes,
    rollout state GB, training state GB, t_train_s, t_sync_s, t_solo_s, slo)``."""
    return (*job_layout_needs(job, cluster), profile.t_train_s, profile.t_sync_s, profile.t_solo_s, job.slo)


def training_pins_feasible(rows: Sequence[tuple], cluster: ClusterSpec) -> bool:
    """Whether :func:`build_group` (one pinning order, the given one) gets past its checks that do
    not depend on the rollout layout: False exactly when ``_train_plan`` is None (a state larger
    than a node's host memory; a job finding no memory-feasible training nodes; the training pins
    breaking a member's node-load bound). The same pinning rule on plain lists (the same sums in
    the same order), ~10x cheaper; ``rows``: :func:`layout_row` per job."""
    rnode, tnode = cluster.rollout_pool.node, cluster.train_pool.node
    if max(r[2] for r in rows) > rnode.host_mem_gb or max(r[3] for r in rows) > tnode.host_mem_gb:
        return False
    cap = tnode.host_mem_gb + 1e-9
    n_t = max(r[1] for r in rows)
    load, mem, pins = [0.0] * n_t, [0.0] * n_t, []
    for _, nt, _, mt, tt, ts, _, _ in rows:
        fit = [x for x in range(n_t) if mem[x] + mt <= cap]
        if len(fit) < nt:
            return False
        if len(fit) > nt:
            fit.sort(key=lambda x: (load[x], mem[x], x))
            fit = fit[:nt]
        for x in fit:
            load[x] = load[x] + tt + ts
            mem[x] = mem[x] + mt
        pins.append(fit)
    return not any(breaks_slo(node_load_bound(r[6], [load[x] for x in tp]), r[6], r[7]) for r, tp in zip(rows, pins))


def _train_plan(items: Sequence[tuple[JobSpec, PhaseProfile]], cluster: ClusterSpec, pin_orders: bool,
                needs: Optional[Sequence[tuple[int, int, float, float]]] = None):
    """The part of :func:`build_group` that does not depend on the rollout layout: host memory of
    every state, then the training pins (one per pinning order tried) that keep every member's
    node-load bound on the training nodes. ``(nr, mr, training node ids, [(order, (pins, loads,
    memory))])``, or None when no layout of these jobs can exist for those reasons. ``needs``:
    :func:`job_layout_needs` of each item, when the caller has them."""
    n = len(items)
    rnode, tnode = cluster.rollout_pool.node, cluster.train_pool.node
    if needs is None:
        needs = [job_layout_needs(j, cluster) for j, _ in items]
    nr = [x[0] for x in needs]
    nt = [x[1] for x in needs]
    mr = [x[2] for x in needs]
    mt = [x[3] for x in needs]
    if max(mr) > rnode.host_mem_gb or max(mt) > tnode.host_mem_gb:
        return None
    t_nodes = [node_id("train", i) for i in range(max(nt))]
    # Pinning order: each job takes its least-loaded memory-feasible nodes in turn, so the pins
    # depend on the order; every order is tried (distinct pinnings once each) up to
    # EXHAUSTIVE_ORDER_MAX jobs, and each pinning's round-robin order is chosen by
    # best_round_robin_order (through _slo_check).
    ident = tuple(range(n))
    train_orders = list(itertools.permutations(range(n))) if pin_orders and n <= EXHAUSTIVE_ORDER_MAX else [ident]
    trains = []
    for order in train_orders:
        tr = _pin_train(order, items, nt, mt, t_nodes, tnode.host_mem_gb)
        if tr is None or any(tr[0] == t[0] for _, t in trains):
            continue
        # node-load rule on the training nodes alone (the same for every rollout layout)
        if any(breaks_slo(node_load_bound(p.t_solo_s, [tr[1][x] for x in tr[0][i]]), p.t_solo_s, j.slo)
               for i, (j, p) in enumerate(items)):
            continue
        trains.append((order, tr))
    return (nr, mr, t_nodes, trains) if trains else None


def layout_floor_usd_per_h(members: Sequence[tuple[JobSpec, PhaseProfile]], cluster: ClusterSpec,
                           needs: Optional[Sequence[tuple[int, int, float, float]]] = None) -> float:
    """A lower bound on the price of :func:`build_group`'s layout of ``members`` (default
    ``pin_orders``), USD/h, without searching rollout layouts or simulating: ``inf`` when
    build_group returns None before simulating anything (a state larger than a node's host memory,
    or no pinning of any layout keeps every member's node-load bound), else the price of the
    cheapest layout whose pinning passes those checks (build_group's answer, if any, passes
    them too and also the round-robin simulation). Used to skip re-optimisations that cannot
    lower the cost (:meth:`InterGroupScheduler.reoptimise`).
    ``needs``: :func:`job_layout_needs` of each member, when the caller has them."""
    plan = _train_plan(members, cluster, False, needs)
    if plan is None:
        return math.inf
    for n_nodes, *_ in _node_load_layouts(members, cluster, plan, None, False):
        return n_nodes * cluster.rollout_pool.node.price_usd_per_h + len(plan[2]) * cluster.train_pool.node.price_usd_per_h
    return math.inf


@lru_cache(maxsize=4096)
def _rollout_layouts(nr: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """The rollout layouts of :func:`build_group` for jobs needing ``nr`` rollout nodes each:
    ``(rollout nodes, dedicated jobs, mask)`` for every subset ``mask`` of jobs on dedicated
    nodes (the others share ``max nr`` nodes), cheapest first (ties: fewer dedicated jobs, then
    the mask). A function of ``nr`` only, so computed once per distinct tuple."""
    n = len(nr)
    layouts = []
    for mask in range(1 << n):
        ded = [i for i in range(n) if mask >> i & 1]
        shared = [i for i in range(n) if not mask >> i & 1]
        n_nodes = sum(nr[i] for i in ded) + (max(nr[i] for i in shared) if shared else 0)
        layouts.append((n_nodes, len(ded), mask))
    layouts.sort()
    return tuple(layouts)


def _node_load_layouts(items, cluster: ClusterSpec, plan, below_usd_per_h: Optional[float], pin_orders: bool):
    """:func:`build_group`'s pinnings in its search order (layouts cheapest first, then training
    pins, then rollout pinning orders; distinct pinnings once) that pass memory residency and the
    node-load rule: ``(rollout nodes, order, rollout pins, training pins, node loads, rollout
    nodes used, training node ids)`` each; only layouts strictly cheaper than ``below_usd_per_h``."""
    n = len(items)
    nr, mr, t_nodes, trains = plan
    rnode, tnode = cluster.rollout_pool.node, cluster.train_pool.node
    price = lambda rn: rn * rnode.price_usd_per_h + len(t_nodes) * tnode.price_usd_per_h  # noqa: E731
    for n_nodes, _, mask in _rollout_layouts(tuple(nr)):
        if below_usd_per_h is not None and price(n_nodes) >= below_usd_per_h - 1e-9:
            return  # layouts are sorted by cost: none of the rest is cheaper than the bound
        shared = [i for i in range(n) if not mask >> i & 1]
        n_shared = max((nr[i] for i in shared), default=0)
        shared_nodes = [node_id("rollout", i) for i in range(n_shared)]
        seen: set = set()
        for order, (t_pins, t_loads, _) in trains:
            r_orders = [order]
            if pin_orders:
                flex = [i for i in order if not mask >> i & 1 and nr[i] < n_shared]
                if len(flex) <= EXHAUSTIVE_ORDER_MAX:
                    rigid = tuple(i for i in order if i not in flex)
                    r_orders = [rigid + q for q in itertools.permutations(flex)]
            for r_order in r_orders:
                ro = _pin_rollout(r_order, items, mask, nr, mr, shared_nodes, n_shared, rnode.host_mem_gb)
                if ro is None:
                    continue
                r_pins, r_loads, nxt = ro
                sig = (tuple(sorted(t_pins.items())), tuple(sorted(r_pins.items())))
                if sig in seen:
                    continue
                seen.add(sig)
                loads = {**r_loads, **t_loads}
                # node-load rule first, on plain numbers (most layouts of an infeasible set stop here)
                if any(breaks_slo(node_load_bound(p.t_solo_s, [loads[x] for x in r_pins[i] + t_pins[i]]), p.t_solo_s, j.slo)
                       for i, (j, p) in enumerate(items)):
                    continue
                yield n_nodes, order, r_pins, t_pins, loads, nxt, t_nodes


def build_group(members: Sequence[Union[JobSpec, tuple[JobSpec, PhaseProfile]]], cluster: ClusterSpec, *,
                max_group_size: Optional[int] = None, group_id: str = "group-opt",
                below_usd_per_h: Optional[float] = None, pin_orders: bool = False) -> Optional[CoExecutionGroup]:
    """Minimum-cost feasible layout of exactly these jobs as one co-execution group, or None.

    Layout class (the optimum's; ``docs/ARCHITECTURE.md`` "Optimum"): the training nodes are one
    shared set of ``max_j ceil(NT_j / gpus_per_node)`` nodes; for every subset S of jobs (2^n,
    cheapest first) the jobs in S get dedicated rollout nodes (scale-out) and the others share one
    set of ``max ceil(NR_j / gpus_per_node)`` rollout nodes. Within a layout each job is pinned to
    its least-loaded memory-feasible nodes in turn (jobs spanning a whole shared set first, then
    the others in the given order; ``pin_orders=True``: every order of the latter, distinct
    pinnings once), and each pinning is checked by memory residency, the node-load bound, then
    :func:`best_round_robin_order` (every member's SLO in the best round-robin order). The first
    feasible layout by cost is returned, its members in the feasible round-robin order.

    Args:
        members: the jobs (``JobSpec`` or ``(spec, profile)``; profiles default to the worst case).
        below_usd_per_h: only layouts strictly cheaper than this are searched (None if none).
        pin_orders: also try every pinning order of the jobs that take part of a shared node set.
    Raises:
        ValueError: an empty set, duplicate ids, more than ``max_group_size`` jobs or more than 12.
    Source: RollMux §4.2 problem formulation.
    """
    items = [(m, profiler.estimate(m, cluster)) if isinstance(m, JobSpec) else (m[0], m[1]) for m in members]
    n = len(items)
    if n == 0:
        raise ValueError("build_group needs at least one job")
    if len({j.job_id for j, _ in items}) != n:
        raise ValueError("build_group: duplicate job ids")
    if n > 12 or (max_group_size is not None and n > max_group_size):
        raise ValueError(f"build_group: {n} jobs exceed the group size limit ({max_group_size or 12})")
    plan = _train_plan(items, cluster, pin_orders)
    if plan is None:
        return None
    r_price, t_price = cluster.rollout_pool.node.price_usd_per_h, cluster.train_pool.node.price_usd_per_h
    price = lambda rn: rn * r_price + len(plan[2]) * t_price  # noqa: E731
    for n_nodes, order, r_pins, t_pins, loads, nxt, t_nodes in _node_load_layouts(items, cluster, plan, below_usd_per_h, pin_orders):
        mems = [GroupMember.model_construct(spec=items[i][0], profile=items[i][1], placement=Placement.model_construct(
                    job_id=items[i][0].job_id, rollout_nodes=r_pins[i], train_nodes=t_pins[i]))
                for i in order]
        cand = _slo_check(Candidate(group_id, "optimal", price(n_nodes)), mems, loads)
        if cand.ok:
            rn = tuple(node_id("rollout", i) for i in range(nxt))
            members = tuple(GroupMember(spec=m.spec, profile=m.profile, placement=Placement(
                job_id=m.spec.job_id, rollout_nodes=m.placement.rollout_nodes, train_nodes=m.placement.train_nodes))
                for m in cand.members)
            return CoExecutionGroup(group_id=group_id, rollout_nodes=rn, train_nodes=tuple(t_nodes), members=members)
    return None
