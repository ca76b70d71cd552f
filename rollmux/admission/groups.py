"""The scheduler's group table pieces: node ids of each pool (:class:`NodePool`), one summary
per group with what the filters read (:class:`GroupSummary`, :func:`summarise_group`: node
loads, host memory, ``T_cycle``, ``T_load``, slack) and the index of the open groups by those
figures (:class:`GroupIndex`), so a decision evaluates only the groups that can pass the cheap
filters. Source: RollMux §4.2 (node loads, ``T_load`` / ``T_cycle``).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Mapping, Optional, Sequence

from rollmux import profiler
from rollmux.admission.decisions import Newcomer
from rollmux.admission.rules import SLO_REL_TOL
from rollmux.models import ClusterSpec, CoExecutionGroup, GroupMember, PoolName
from rollmux.nodes import node_id, node_index

_idx = lru_cache(maxsize=None)(node_index)


class NodePool:
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
class GroupSummary:
    """One group as the filters, the index and pruning read it (built by :func:`summarise_group`,
    replaced whenever the group changes).

    Attributes:
        group: the group record.
        loads: per node of the group, the phase times pinned to it per meta-iteration, seconds
            (rollout nodes: rollouts; training nodes: training + sync,
            :attr:`rollmux.models.PhaseProfile.t_train_node_s`).
        mem: per node, the host-memory state of the jobs pinned to it, GB.
        t_cycle: ``T_cycle(G) = max_k T_solo_k``, seconds (0 for no member).
        t_load: ``T_load(G)``, the busiest node's load, seconds (0 for no member).
        coexec: predicted co-execution iteration time per member, seconds (None until known).
    """

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
        """Idle share of the group's node-time in a meta-iteration of ``T_cycle`` (1 for an empty cycle)."""
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
        yield n, p.t_train_node_s, mt


def summarise_group(group: CoExecutionGroup, cluster: ClusterSpec) -> GroupSummary:
    """The :class:`GroupSummary` of ``group`` on ``cluster`` (state sizes from
    :func:`rollmux.profiler.state_gb`, Cost(G) at the cluster's prices): the one computation of a
    group's node loads, ``T_cycle`` and ``T_load`` in the policy. Source: RollMux §4.2 (3)."""
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

    return GroupSummary(group, loads, mem, max((m.profile.t_solo_s for m in group.members), default=0.0),
                  max(loads.values(), default=0.0), info=info,
                  r_sorted=sorted(loads[n] for n in group.rollout_nodes), t_sorted=sorted(loads[n] for n in group.train_nodes),
                  cost=group.cost_usd_per_h(cluster),
                  t_slack=tuple(sorted((slack(n) for n in group.train_nodes), reverse=True)),
                  r_slack=tuple(sorted((slack(n) for n in group.rollout_nodes), reverse=True)),
                  pressure=max((max(ts, ml) / ts / slo for _, ts, slo, _, ml in info), default=0.0))


class GroupIndex:
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

    def copy(self) -> "GroupIndex":
        c = GroupIndex()
        c.tables = {tk: {k: list(v) for k, v in t.items()} for tk, t in self.tables.items()}
        c.entries = dict(self.entries)
        return c

    def add(self, gid: str, seq: int, g: "GroupSummary") -> None:
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

    def candidates(self, new: "Newcomer", strategies: Sequence[str], open_groups: Mapping[str, "GroupSummary"]):
        """(group, strategy) pairs of ``open_groups`` that may pass the capacity, newcomer-SLO
        and member-SLO bound filters for ``strategies``, in opening order then strategy order."""
        p = new.profile
        budget = new.job.slo * p.t_solo_s
        if not math.isfinite(budget):
            return []
        add_t, add_r = p.t_train_node_s, p.t_roll_s
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


def pick_nodes(nodes: Sequence[str], k: int, loads: dict, mem: dict, need_gb: float, cap_gb: float) -> Optional[list[str]]:
    """The ``k`` least-loaded nodes that still hold ``need_gb`` more state (None if too few)."""
    fit = [n for n in nodes if mem.get(n, 0.0) + need_gb <= cap_gb + 1e-9]
    if len(fit) < k:
        return None
    fit.sort(key=lambda n: (loads.get(n, 0.0), mem.get(n, 0.0), _idx(n)))
    return sorted(fit[:k], key=_idx)
