"""The exact layout of a given job set as one co-execution group (the optimum's layout class,
``rollmux/README.md`` "Optimum"): :func:`build_group` and the cheaper checks the
neighbourhood re-optimisation bounds with (:func:`layout_floor_usd_per_h`,
:func:`training_pins_feasible`, :func:`layout_row`). Source: RollMux §4.2 problem formulation.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Optional, Sequence, Union

from rollmux import profiler
from rollmux.admission.decisions import Candidate
from rollmux.admission.filters import slo_bound
from rollmux.admission.groups import pick_nodes
from rollmux.admission.order import EXHAUSTIVE_ORDER_MAX, slo_sim
from rollmux.admission.rules import breaks_slo, cadence_bound
from rollmux.models import ClusterSpec, CoExecutionGroup, GroupMember, JobSpec, PhaseProfile, Placement
from rollmux.nodes import node_id


def _slo_check(cand: Candidate, members: list[GroupMember], loads: dict[str, float]) -> Candidate:
    """Bound, then simulate (both SLO plugins of Alg. 1 line 10)."""
    slo_bound(cand, members, loads)
    return slo_sim(cand) if cand.ok else cand


def _pin_train(order, items, nt, mt, t_nodes, t_cap_gb):
    """Training pins of a build_group layout, jobs taking their least-loaded memory-feasible
    training nodes in ``order``: ({job index: nodes}, node loads, node memory) or None."""
    if len(t_nodes) == 1:  # one shared training node: every job on it (the same sums, in order)
        x, load, m = t_nodes[0], 0.0, 0.0
        for i in order:
            if not m + mt[i] <= t_cap_gb + 1e-9:
                return None
            p = items[i][1]
            load = load + p.t_train_node_s
            m = m + mt[i]
        return {i: (x,) for i in order}, {x: load}, {x: m}
    loads: dict[str, float] = {}
    mem: dict[str, float] = {}
    pins = {}
    for i in order:
        p = items[i][1]
        tp = pick_nodes(t_nodes, nt[i], loads, mem, mt[i], t_cap_gb)
        if tp is None:
            return None
        for x in tp:
            loads[x] = loads.get(x, 0.0) + p.t_train_node_s
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
            rp = pick_nodes(shared_nodes, nr[i], loads, mem, mr[i], r_cap_gb)
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
    rollout state GB, training state GB, t_train_node_s, t_solo_s, slo)`` (seconds; the load on
    each training node is :attr:`rollmux.models.PhaseProfile.t_train_node_s`)."""
    return (*job_layout_needs(job, cluster), profile.t_train_node_s, profile.t_solo_s, job.slo)


def training_pins_feasible(rows: Sequence[tuple], cluster: ClusterSpec) -> bool:
    """Whether :func:`build_group` (one pinning order, the given one) gets past its checks that do
    not depend on the rollout layout: False exactly when ``_train_plan`` is None (a state larger
    than a node's host memory; a job finding no memory-feasible training nodes; the training pins
    breaking the meta-iteration rule, :func:`rollmux.admission.rules.cadence_bound`). The same pinning rule on plain lists (the same sums in
    the same order), ~10x cheaper; ``rows``: :func:`layout_row` per job."""
    rnode, tnode = cluster.rollout_pool.node, cluster.train_pool.node
    if max(r[2] for r in rows) > rnode.host_mem_gb or max(r[3] for r in rows) > tnode.host_mem_gb:
        return False
    cap = tnode.host_mem_gb + 1e-9
    n_t = max(r[1] for r in rows)
    load, mem, pins = [0.0] * n_t, [0.0] * n_t, []
    for _, nt, _, mt, tl, _, _ in rows:
        fit = [x for x in range(n_t) if mem[x] + mt <= cap]
        if len(fit) < nt:
            return False
        if len(fit) > nt:
            fit.sort(key=lambda x: (load[x], mem[x], x))
            fit = fit[:nt]
        for x in fit:
            load[x] = load[x] + tl
            mem[x] = mem[x] + mt
        pins.append(fit)
    # the meta-iteration rule (every member of the group, linked through the spanning job's
    # training nodes, runs at one cadence); it implies each member's node-load bound
    lb = cadence_bound([r[5] for r in rows], load)
    return not any(breaks_slo(lb, r[5], r[6]) for r in rows)


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
        # the meta-iteration rule on the training nodes alone (the same for every rollout layout):
        # the members are linked through the spanning job's training nodes, so each runs at the
        # group's one cadence, at least every member's solo time and every node's load
        lb = cadence_bound([p.t_solo_s for _, p in items], tr[1].values())
        if any(breaks_slo(lb, p.t_solo_s, j.slo) for j, p in items):
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
    t_solos = [p.t_solo_s for _, p in items]
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
                # the meta-iteration rule first, on plain numbers (most layouts of an infeasible
                # set stop here): one cadence for all, at least the busiest node's load
                lb = cadence_bound(t_solos, loads.values())
                if any(breaks_slo(lb, p.t_solo_s, j.slo) for j, p in items):
                    continue
                yield n_nodes, order, r_pins, t_pins, loads, nxt, t_nodes


def build_group(members: Sequence[Union[JobSpec, tuple[JobSpec, PhaseProfile]]], cluster: ClusterSpec, *,
                max_group_size: Optional[int] = None, group_id: str = "group-opt",
                below_usd_per_h: Optional[float] = None, pin_orders: bool = False) -> Optional[CoExecutionGroup]:
    """Minimum-cost feasible layout of exactly these jobs as one co-execution group, or None.

    Layout class (the optimum's; ``rollmux/README.md`` "Optimum"): the training nodes are one
    shared set of ``max_j ceil(NT_j / gpus_per_node)`` nodes; for every subset S of jobs (2^n,
    cheapest first) the jobs in S get dedicated rollout nodes (scale-out) and the others share one
    set of ``max ceil(NR_j / gpus_per_node)`` rollout nodes. Within a layout each job is pinned to
    its least-loaded memory-feasible nodes in turn (jobs spanning a whole shared set first, then
    the others in the given order; ``pin_orders=True``: every order of the latter, distinct
    pinnings once), and each pinning is checked by memory residency, the meta-iteration rule
    (:func:`rollmux.admission.rules.cadence_bound`: the members, linked through the spanning
    job's training nodes, share one cadence, so every node's load and every member's solo time
    must fit the least SLO budget), then
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
