"""Group feasibility over the round-robin order: :func:`best_round_robin_order` (the one function
Alg. 1's SLO check, departure re-packing and the optimum's layouts call) and :func:`slo_sim`,
Alg. 1 line 10 on one candidate. Source: RollMux §4.2 (Alg. 1 line 10), §4.3 (round-robin
meta-iterations).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

from rollmux.admission.decisions import Candidate
from rollmux.admission.rules import breaks_slo, cadence_bound
from rollmux.intra_group import coexec_key, coexec_times, coexec_values
from rollmux.models import GroupMember
from rollmux.union_find import find_root


#: Groups of up to this many members get the exhaustive round-robin order search (n! orders);
#: larger groups (only with max_group_size above it) are checked in the given order only.
EXHAUSTIVE_ORDER_MAX = 6

#: Relative margin by which :func:`steady_lower_bounds` must break an SLO before the order search
#: is skipped (far above the float rounding of the recurrence's sums, far below any SLO step).
ORDER_BOUND_MARGIN = 1e-6


def steady_lower_bounds(rows: Sequence[tuple]) -> list[float]:
    """A lower bound of every member's steady-state ``t_coexec_s`` that holds in *every*
    round-robin order: :func:`rollmux.admission.rules.cadence_bound` of each set of members linked
    by shared nodes (one common period, at least every node's load per meta-iteration and every
    synchronous member's own iteration; an asynchronous member's rollouts wait for an older sync,
    so its own iteration is left out). Seconds, one per row.

    Args:
        rows: per member, in any order, ``(t_roll_s + rollout overhead, t_train_s, t_sync_s,
            rollout node ids, training node ids, max_staleness, t_solo_s, ...)`` (the rows of
            :func:`best_round_robin_order`; further fields are ignored).
    Source: RollMux §4.3 (round-robin meta-iterations).
    """
    parent: dict = {}

    def root(a):
        return find_root(parent, a)

    load: dict = {}
    for tr, tt, ts, rn, tn, *_ in rows:
        for x in rn:
            load[x] = load.get(x, 0.0) + tr
        for x in tn:
            load[x] = load.get(x, 0.0) + tt + ts
        xs = tuple(rn) + tuple(tn)
        for x in xs[1:]:
            parent[root(x)] = root(xs[0])
    comp = [root((tuple(r[3]) + tuple(r[4]))[0]) for r in rows]
    loads: dict = {}
    for x, v in load.items():
        loads.setdefault(root(x), []).append(v)
    solos: dict = {}
    for c, r in zip(comp, rows):
        if not r[5]:
            solos.setdefault(c, []).append(r[6])
    lam = {c: cadence_bound(solos.get(c, ()), loads[c]) for c in loads}
    return [lam[c] for c in comp]


@dataclass(frozen=True)
class OrderChoice:
    """The outcome of :func:`best_round_robin_order`.

    Attributes:
        members: the members in the chosen round-robin order.
        t_coexec_s: steady-state co-execution iteration time of each member in that order, seconds.
        feasible: every member within its SLO (``not breaks_slo``) in that order.
        exhaustive: every order was considered, a feasible one was found, or the cadence bound
            (:func:`steady_lower_bounds`) proved that none is (so ``feasible`` is False only if no
            order of the members is feasible).
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

    First of all, a group whose :func:`steady_lower_bounds` breaks a member's SLO by more than
    :data:`ORDER_BOUND_MARGIN` is infeasible without any simulation: members linked by shared
    nodes share one period, at least that bound, in every order. Where the recurrence reaches its
    periodic regime, its times are at least the bound, so this only saves the n! search; where it
    does not within ``STEADY_MAX_CYCLES`` meta-iterations (:func:`rollmux.steady_state._rr_steady`),
    its averages still hold part of the transient and may sit below the period (linked members
    then even show different times), and the bound decides.

    Args:
        members: the group G' with placements, in its current (admission) order.
        rollout_overhead_s: added to every rollout (planned long-tail migration overhead), seconds.
    Returns:
        :class:`OrderChoice`.
    Source: RollMux §4.2 (Alg. 1 line 10 SLO check), §4.3 (round-robin meta-iterations).
    """
    members = list(members)
    n = len(members)
    tco = coexec_times(members, rollout_overhead_s=rollout_overhead_s)
    # every order, as coexec_times sees it (a lone job plans without the overhead; the same memoised
    # recurrence, its key built from per-member rows instead of re-reading the models)
    ov = rollout_overhead_s if n >= 2 else 0.0
    rows = [(mb.profile.t_roll_s + ov, mb.profile.t_train_s, mb.profile.t_sync_s, mb.placement.rollout_nodes,
             mb.placement.train_nodes, mb.profile.max_staleness, mb.profile.t_solo_s, mb.spec.slo) for mb in members]
    if any(breaks_slo(lb * (1.0 - ORDER_BOUND_MARGIN), r[6], r[7]) for lb, r in zip(steady_lower_bounds(rows), rows)):
        return OrderChoice(tuple(members), tco, False, True, 1)
    if _order_feasible(members, tco):
        return OrderChoice(tuple(members), tco, True, True, 1)
    if n > EXHAUSTIVE_ORDER_MAX:
        return OrderChoice(tuple(members), tco, False, False, 1)
    tried = 1
    ident = tuple(range(n))
    for perm in itertools.permutations(ident):
        if perm == ident:
            continue
        vals = coexec_values(coexec_key([rows[i][:6] for i in perm]))
        tried += 1
        if not any(breaks_slo(v, rows[i][6], rows[i][7]) for v, i in zip(vals, perm)):
            ms = [members[i] for i in perm]
            return OrderChoice(tuple(ms), {mb.spec.job_id: v for mb, v in zip(ms, vals)}, True, True, tried)
    return OrderChoice(tuple(members), tco, False, True, tried)


def slo_sim(cand: Candidate, rollout_overhead_s: float = 0.0) -> Candidate:
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
