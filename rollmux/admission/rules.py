"""The shared comparisons of admission: the node-load rule, the SLO comparison and saturation.

Every SLO check of the policy (the filters, the round-robin order search, re-packing, the
optimum's layouts) compares through :func:`breaks_slo` / :func:`within`, and every node-load
lower bound is :func:`node_load_bound`, so NaN / infinite values are infeasible everywhere and
the tolerance is one constant. Source: RollMux §4.2.
"""

from __future__ import annotations

import math
from typing import Iterable

#: Relative tolerance of every SLO comparison (``value <= limit x (1 + SLO_REL_TOL)``).
SLO_REL_TOL = 1e-9


def node_load_bound(t_solo_s: float, node_loads_s: Iterable[float]) -> float:
    """The node-load rule: in every meta-iteration job k runs its rollout once on each of its
    rollout nodes and its training + sync once on each of its training nodes, and a node runs one
    phase at a time, so ``T_coexec_k >= max(T_solo_k, load of each of k's nodes)`` (seconds; the
    load of a node = the phase times pinned to it). Used by the SLO bound filters, the optimum's
    layouts and group pruning (``T_load``). Source: RollMux §4.2."""
    return max(t_solo_s, max(node_loads_s, default=0.0))


def cadence_bound(t_solo_s: Iterable[float], node_loads_s: Iterable[float]) -> float:
    """The meta-iteration rule: on every shared node each FIFO serves the members' phases in
    round-robin order, so members linked by shared nodes run in lockstep, one iteration each per
    meta-iteration, and in the steady state every member's ``T_coexec`` is the same period, at
    least the longest member's own iteration and the busiest node's load (seconds; the steady
    state of :func:`rollmux.intra_group.coexec_times`). For the members of one linked group:
    ``T_coexec_k >= max(max_j T_solo_j, max over nodes of the load)`` for every k, which is at
    least :func:`node_load_bound` of each. Source: RollMux §4.3 (round-robin meta-iterations)."""
    return max(max(t_solo_s, default=0.0), max(node_loads_s, default=0.0))


def breaks_slo(t_coexec_s: float, t_solo_s: float, slo: float) -> bool:
    """True when an iteration time ``t_coexec_s`` (or a lower bound of it) exceeds ``slo x t_solo_s``
    (relative tolerance :data:`SLO_REL_TOL`).
    A NaN or infinite value on either side breaks it (defence in depth: ``nan > x`` is False, so a
    plain comparison would let a non-finite time pass every SLO check)."""
    return not within(t_coexec_s, slo * t_solo_s)


def is_saturated(t_load_s: float, t_cycle_s: float) -> bool:
    """Saturation (Alg. 1 line 4): ``T_load >= T_cycle``, i.e. the busiest node has no idle time
    left in a meta-iteration of the longest member's solo time. A non-finite load or cycle counts
    as saturated (defence in depth: ``nan >= x`` is False and would leave such a group open)."""
    return not (math.isfinite(t_load_s) and math.isfinite(t_cycle_s) and t_load_s < t_cycle_s)


def within(value: float, limit: float) -> bool:
    """``value <= limit`` within :data:`SLO_REL_TOL`, and False when either is NaN or infinite: a
    non-finite slowdown or phase time is infeasible, never a pass (``nan > x`` is False)."""
    return math.isfinite(value) and math.isfinite(limit) and value <= limit * (1 + SLO_REL_TOL)
