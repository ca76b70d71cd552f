"""A proven lower bound on the optimum's cost for any number of active jobs: the linear
relaxation of the set partitioning that :class:`rollmux.baselines.OptimalPartition` solves
exactly, by column generation.

Problem (``rollmux/README.md`` "Optimum"): partition the active jobs into co-execution groups
of at most ``max_group_size`` jobs, each laid out by :func:`rollmux.admission.build_group`
(price ``c_S``, USD/h), minimising ``sum_S c_S x_S``  s.t.  ``sum_{S ∋ j} x_S = 1``.

Relaxed column space. Every job set S of at most ``max_group_size`` jobs whose floor
:func:`floor_usd_per_h` is finite is a column, priced by its exact layout where one has been
built (:meth:`OptimalPartition.layout`, the same cache the exact solve reads; ``None`` = no
feasible layout: not a column) and otherwise by the floor ``L(S) <= c_S`` (with
``OptimalPartition(per_job=True)``, a one-job column is priced by ``single_usd_per_h``, the wider
problem of per-job allocations). The floor uses only rules ``build_group`` itself applies:

* the meta-iteration rule (:func:`rollmux.admission.rules.cadence_bound`): the members of a
  layout are linked through the spanning job's training nodes, so they run at one cadence, at
  least every member's solo time and every node's load, and at most the least budget
  ``B_min = min_k slo_k x T_solo_k``. So a set with a solo time above ``B_min`` has no layout,
  and every node carries at most ``B_min`` seconds per meta-iteration: a pool needs
  ``>= W / B_min`` nodes, ``W`` the phase-seconds per meta-iteration (nodes x phase time) of
  its jobs (each node-load test below runs with every budget at ``B_min``);
* jobs needing a pool's whole node set are on every node: each node carries their phases (and
  at most their least budget), each other job's nodes its own phase besides;
* the layout class gives the training pool exactly ``max_k NT_k`` nodes and the rollout pool the
  nodes of one of its layouts (dedicated nodes for some jobs, ``max NR`` shared by the rest),
  cheapest first.

The pruning floor :func:`prune_floor_usd_per_h` is monotone in S (adding a job never lowers it
nor makes an infeasible set feasible under the largest training node count of the instance) and
below ``L`` of every superset, so the pricing search (depth first over jobs by dual value,
pruned by ``floor - (the largest duals that can still join)``) misses no column it must see.
``tests/test_partition_bound.py`` checks ``L <= c_S`` and the monotony on random sets.

Bound. Column generation: the restricted master LP (covering form ``>= 1``, GLOP) gives duals
``pi``; pricing looks for columns with ``cost(S) - pi(S) < 0`` (stopping at ``keep`` of them); a
floor-priced one is laid out by ``build_group(..., below_usd_per_h=pi(S))`` (a layout found is
the cheapest; none found raises the set's floor to ``pi(S)``) and exact ones join the master.
When pricing finds none, every column outside the master prices ``>= -eps`` and the master's own
``>= -worst`` (the LP's tolerance), so ``sum pi - n x max(eps, worst)`` is a proven bound (the
Lagrangian bound: a partition has at most ``n`` groups), the LP value up to that (kind ``"lp"``).
Then rounds of subset-row cuts close part of the integrality gap: for a job set ``R`` of 3 or 5
jobs, ``sum_S floor(|S ∩ R| / 2) x_S <= floor(|R| / 2)`` holds for every partition (its groups are
disjoint) but not for fractional points such as three pairs, or five pairs around a cycle, at one
half each (:func:`_separate_subset_rows`). A cut's dual ``sigma <= 0`` is a penalty
``-sigma x floor(|S ∩ R| / 2)`` in pricing (it only grows with the set, so the pruning stays
valid), and a converged round bounds the optimum by ``sum pi + sum sigma x floor(|R| / 2) - n x
worst``; the best round is kept (kind ``"lp_cuts"`` when a cut raised it).
Stopped by its budget earlier, Farley's bound ``theta x sum pi`` with ``theta = min_S cost(S) /
pi(S) <= 1`` over every column (``theta pi`` is dual feasible) is returned (kind
``"lagrangian"``). Either is a proven lower bound on the exact optimum's cost. The next call
starts from this call's master columns (``OptimalPartition._lp_pool``). Source: RollMux §7.5
("Opt"); Lasdon (1970), Farley (1990), Vanderbeck & Wolsey (1996) column-generation bounds; Jepsen, Petersen,
Spoorendonk & Pisinger (2008) subset-row cuts.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

from rollmux.admission.layouts import build_group
# the column generation's pieces (moved to bound_columns; the names stay importable from here)
from rollmux.bound_columns import (_RC_EPS, _TOL, _FloorCache, _Master, _cut_rows, _price, _rows,  # noqa: F401
                                   _separate_subset_rows, floor_usd_per_h, prune_floor_usd_per_h)
from rollmux.models import JobSpec, PhaseProfile



@dataclass
class BoundResult:
    """The lower bound at one instant.

    Attributes:
        bound_usd_per_h: proven lower bound on the exact optimum's cost, USD/h.
        kind: ``"lp"`` (column generation converged: the LP relaxation's value over the relaxed
            columns), ``"lp_cuts"`` (the same with subset-row cuts, which raised it),
            ``"lagrangian"`` (budget hit: Farley's ``theta x sum pi``) or ``"stopped"`` (budget hit
            with ``farley=False``: no bound, 0).
        lp_usd_per_h: the last restricted master LP value (with the cuts of its round), USD/h.
        iterations: master solves.
        columns: columns in the last master.
        layouts_built: exact layouts priced by this call (``build_group`` runs, cached ones excluded).
        solve_ms: wall time, ms.
        duals: per job id its share of the bound, USD/h (the last master's duals ``pi`` of the
            LP without cuts, scaled by Farley's ``theta`` when the budget stopped the column
            generation, so that ``sum_{j in S} duals_j <= cost(S)`` for every column up to the LP's
            tolerance): what a job "should" cost, read by the global planner's estimate
            (:mod:`rollmux.admission.global_plan`).
    """

    bound_usd_per_h: float
    kind: str
    lp_usd_per_h: float
    iterations: int
    columns: int
    layouts_built: int
    solve_ms: float
    duals: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BoundBudget:
    """What one :func:`lp_lower_bound` call may spend. Any budget leaves the bound proven (a
    stopped column generation returns Farley's bound, stopped cut rounds the best converged
    round); a smaller one may only weaken it.

    Attributes:
        max_iterations: master LP solves (one per pricing round), >= 1.
        max_layouts: exact layouts built (``build_group`` runs), >= 1.
        time_limit_s: wall seconds; ``math.inf`` makes the bound independent of the host's speed
            and load (the other limits are counts), so a replay gives the same figures anywhere.
        keep: negative columns taken per pricing round, >= 1.
        cut_rounds: rounds of subset-row cuts after the LP converged (0: the plain LP relaxation).
        cuts_per_round: the most cuts one round adds, >= 1.
    Raises:
        ValueError: a count below its minimum or a time limit that is not positive.
    """

    max_iterations: int = 200
    max_layouts: int = 3000
    time_limit_s: float = 30.0
    keep: int = 40
    cut_rounds: int = 6
    cuts_per_round: int = 40

    def __post_init__(self) -> None:
        for name in ("max_iterations", "max_layouts", "keep", "cuts_per_round"):
            if getattr(self, name) < 1:
                raise ValueError(f"BoundBudget.{name}: must be >= 1, got {getattr(self, name)}")
        if self.cut_rounds < 0:
            raise ValueError(f"BoundBudget.cut_rounds: must be >= 0, got {self.cut_rounds}")
        if not self.time_limit_s > 0:
            raise ValueError(f"BoundBudget.time_limit_s: must be > 0, got {self.time_limit_s}")

    def to_json(self) -> dict:
        """The budget as JSON values (an unlimited ``time_limit_s`` is ``None``)."""
        d = asdict(self)
        d["time_limit_s"] = None if math.isinf(self.time_limit_s) else self.time_limit_s
        return d


def lp_lower_bound(opt, members: Sequence[tuple[JobSpec, PhaseProfile]], *,
                   seed_columns: Iterable[Iterable[str]] = (), extra_columns: Optional[dict] = None,
                   budget: BoundBudget = BoundBudget(), keep_pool: bool = False, farley: bool = True) -> BoundResult:
    """Proven lower bound on the cost of :meth:`OptimalPartition.solve` over ``members``
    (``(spec, worst-case profile)`` pairs), USD/h, for any number of jobs (module docstring).

    Args:
        opt: the :class:`rollmux.baselines.OptimalPartition` whose problem is bounded (its
            cluster, ``max_group_size`` and layout cache; new layouts are cached there).
        seed_columns: job sets to start the master with (e.g. a policy's current groups).
        extra_columns: ``{job set: USD/h}`` of groups known feasible outside the layout class (a
            policy's own groups), priced so: the bound is then over the layout class and these.
        budget: :class:`BoundBudget` (master solves, exact layouts built, wall seconds, columns
            per pricing round, cut rounds); when column generation hits it, Farley's bound is
            returned.
        keep_pool: the master's columns are added to ``OptimalPartition._lp_pool`` (the columns of
            other jobs stay) instead of replacing it: a caller that bounds one window of the
            active jobs after another (the global planner) keeps every window's columns.
        farley: when the budget stops the column generation, price every column once more for
            Farley's bound; False (a caller that wants the columns, not the bound) skips that pass
            and returns kind ``"stopped"`` with bound 0 (nothing proven).
    Returns:
        :class:`BoundResult`.
    Raises:
        ValueError: duplicate job ids.
    """
    t0 = time.perf_counter()
    max_iterations, max_layouts, time_limit_s = budget.max_iterations, budget.max_layouts, budget.time_limit_s
    keep, cut_rounds, cuts_per_round = budget.keep, budget.cut_rounds, budget.cuts_per_round
    cl = opt.cluster
    ids = [j.job_id for j, _ in members]
    if len(set(ids)) != len(ids):
        raise ValueError("lp_lower_bound: duplicate job ids")
    if not members:
        return BoundResult(0.0, "lp", 0.0, 0, 0, 0, 0.0)
    by_id = {j.job_id: (j, p) for j, p in members}
    rows = _rows(members, cl)
    price_r, price_t = cl.rollout_pool.node.price_usd_per_h, cl.train_pool.node.price_usd_per_h
    known: dict[frozenset, Optional[float]] = {}  # exact prices (None: no feasible layout)
    raised: dict[frozenset, float] = {}  # proven price floors above L(S): no layout is cheaper
    built = [0]

    def exact(key: frozenset) -> Optional[float]:
        if key not in known:
            cached = key in opt._layouts
            g = opt.layout([by_id[j] for j in sorted(key)])
            known[key] = None if g is None else g.cost_usd_per_h(cl)
            if not cached:
                built[0] += 1
        return known[key]

    def below(key: frozenset, limit: float) -> Optional[float]:
        """The exact price of ``key`` when a layout cheaper than ``limit`` exists (build_group's
        first feasible layout by price is the cheapest), else None and the floor ``limit``."""
        built[0] += 1
        g = build_group([by_id[j] for j in sorted(key)], cl, below_usd_per_h=limit)
        opt._remember(key)
        if g is not None:
            opt._layouts[key] = g
            known[key] = g.cost_usd_per_h(cl)
            return known[key]
        raised[key] = opt._floors[key] = max(opt._floors.get(key, 0.0), limit - 2e-9)
        return None

    # every layout of these jobs already priced (this instant or an earlier one) prices its column
    idset = set(ids)
    for key, g in list(opt._layouts.items()):
        if key <= idset and len(key) <= opt.max_group_size:
            known[key] = None if g is None else g.cost_usd_per_h(cl)
    for key, g in list(opt._cols.items()):  # bounded searches: a layout found is the cheapest one
        if g is not None and key not in known and key <= idset and len(key) <= opt.max_group_size:
            known[key] = g.cost_usd_per_h(cl)
    for key, f in list(opt._floors.items()):
        if key not in known and key <= idset and len(key) <= opt.max_group_size:
            raised[key] = f
    cols: dict[frozenset, float] = {}
    for j in ids:
        c = exact(frozenset([j]))
        if c is None:  # pragma: no cover - a job alone is always feasible
            raise ValueError(f"job {j} cannot be laid out alone")
        # with ``opt.per_job`` the one-job column is also the job's own allocation (the wider problem)
        cols[frozenset([j])] = known[frozenset([j])] = opt.single_usd_per_h(*by_id[j], c)
    # warm start: the last call's master columns still made of active jobs (the next instant
    # differs from the last by one arrival or departure)
    for key, c in opt._lp_pool.items():
        if key <= idset:
            cols[key] = c
    for key, c in (extra_columns or {}).items():
        key = frozenset(key)
        if key <= idset and (known.get(key) is None or c < known[key]):
            known[key] = cols[key] = c
    for s in seed_columns:
        key = frozenset(s)
        if key <= idset and 1 < len(key) <= opt.max_group_size:
            c = exact(key)
            if c is not None:
                cols[key] = c
    floors = _FloorCache(opt)  # L(S) depends on the jobs only: kept across instants, dropped with them
    it = 0
    master = _Master(ids)  # extended in place round after round (GLOP re-solves from its basis)

    def generate(cuts: list[frozenset]):
        """Column generation under ``cuts``: (converged, LP value, pi, cut duals, x)."""
        nonlocal it
        while True:
            it += 1
            master.sync(cols, cuts)
            val, pi, sig, x = master.solve()
            _, neg = _price(ids, rows, pi, known, raised, opt.max_group_size, price_r, price_t, keep, "first",
                            floors, cols, list(zip(cuts, sig)))
            if not neg:  # no column prices negative: the duals are feasible for every column
                return True, val, pi, sig, x
            if it >= max_iterations or built[0] >= max_layouts or time.perf_counter() - t0 > time_limit_s:
                return False, val, pi, sig, x
            before, added = built[0], 0
            for rc, key, is_exact, dual in neg:
                c = known[key] if is_exact else below(key, dual)
                if c is not None and key not in cols:
                    cols[key] = c
                    added += 1
                if built[0] >= max_layouts:
                    break
            if added == 0 and built[0] == before:
                # only master columns price negative (the LP's own tolerance): nothing left to add
                return False, val, pi, sig, x

    def dual_bound(pi, sig, cuts) -> float:
        # every column outside the master prices >= -_RC_EPS, the master's own columns >= -worst
        # (the LP's tolerance); a partition covers each job once and meets each cut at most once
        # at most its right-hand side floor(|R| / 2) (sig <= 0): sum(pi) + sum(sig x rhs) - n x worst
        # is the Lagrangian bound (at most n groups)
        master.sync(cols, cuts)
        items = list(cols.items())
        pen = [0.0] * len(items)
        for d, coefs in zip(sig, master.cut_coefs):
            for i, a in coefs.items():
                pen[i] += d * a
        worst = max([_RC_EPS] + [math.fsum(pi[j] for j in key) + pen[i] - c for i, (key, c) in enumerate(items)])
        return sum(pi.values()) + sum(d * (len(r) // 2) for r, d in zip(cuts, sig)) - len(ids) * worst

    cuts: list[frozenset] = []
    converged, lp_val, pi, sig, x = generate(cuts)
    pi0 = pi  # the duals of the LP without cuts (BoundResult.duals)
    if converged:
        kind, bound = "lp", min(dual_bound(pi, sig, cuts), lp_val)
        # subset-row cuts close part of the integrality gap (module docstring); every round
        # that converges gives a proven bound, the best is kept
        for _ in range(cut_rounds):
            if time.perf_counter() - t0 > time_limit_s:
                break
            new = _separate_subset_rows(list(cols.items()), x, set(cuts), cuts_per_round)
            if not new:
                break
            cuts = cuts + new
            ok, val, pi_c, sig_c, x = generate(cuts)
            if not ok:
                break
            lp_val = val
            b = min(dual_bound(pi_c, sig_c, cuts), val)
            if b > bound:
                kind, bound = "lp_cuts", b
        duals = dict(pi0)
    elif not farley:
        kind, bound, duals = "stopped", 0.0, dict(pi)
    else:
        kind = "lagrangian"
        # Farley: theta x pi is dual feasible for theta = min cost(S) / pi(S) over every column
        theta, _ = _price(ids, rows, pi, known, raised, opt.max_group_size, price_r, price_t, keep, "farley", floors)
        bound = theta * sum(pi.values())
        duals = {j: theta * v for j, v in pi.items()}
    if keep_pool:
        opt._lp_pool.update(cols)
    else:
        opt._lp_pool = dict(cols)
    return BoundResult(max(0.0, bound), kind, lp_val, it, len(cols), built[0], (time.perf_counter() - t0) * 1e3,
                       duals=duals)


def master_incumbent_usd_per_h(opt, job_ids: Iterable[str], hint: Iterable[Iterable[str]] = (),
                               deterministic_time: float = 2.0) -> Optional[float]:
    """The cheapest partition found of ``job_ids`` into the columns of the last :func:`lp_lower_bound`
    master (``OptimalPartition._lp_pool``), USD/h, or None when none is found.

    Every master column is a feasible group at its exact price (a floor-priced column joins the
    master only once a layout below its reduced-cost limit is built, and the policy's own groups
    join at the price they run at), so the result is the cost of a partition that exists: an upper
    bound on the optimum of the problem the bound relaxes. Beside the bound it splits a policy's
    distance to the bound into the policy's distance to a known partition and the bound's own
    slack (``bound <= optimum <= incumbent``). The integer set partitioning (costs in
    milli-USD/h) is :func:`rollmux.baselines.solve_set_partition`, the exact optimum's own solve,
    within ``deterministic_time`` (CP-SAT's deterministic time units, not wall seconds: the same
    answer on any host, whatever its load), started from ``hint`` (job sets, e.g. the policy's
    groups; the jobs of a hinted set that is not a master column, and the jobs no set names, start
    as singletons, so the start is always a whole partition).

    Raises:
        ValueError: ``deterministic_time`` not positive.
    """
    from rollmux.baselines import solve_set_partition

    if not deterministic_time > 0:
        raise ValueError(f"master_incumbent_usd_per_h: deterministic_time must be > 0, got {deterministic_time}")
    ids = set(job_ids)
    if not ids:
        return 0.0
    cols = [(k, c) for k, c in opt._lp_pool.items() if k <= ids]
    keys = {k for k, _ in cols}
    if not ids <= {j for k in keys for j in k}:
        return None  # a job no master column holds
    start = {k for k in map(frozenset, hint) if k in keys}
    covered = {j for k in start for j in k}
    start |= {frozenset([j]) for j in ids - covered}
    picked, _, _ = solve_set_partition([k for k, _ in cols], [int(round(c * 1000.0)) for _, c in cols], sorted(ids),
                                       deterministic_time, hint=[k in start for k, _ in cols])
    return None if picked is None else sum(cols[i][1] for i in picked)
