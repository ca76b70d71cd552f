"""Baselines the simulator compares RollMux with, and the offline optimum.

Every policy is seen by the simulator as a set of *units* (:class:`Unit`): a provisioned
allocation (GPUs of each pool, $/h) and the realised iteration time of each job it runs.

* **Solo-D**, **colocated (veRL-style)** and **Gavel+**: the per-job baselines and :class:`Unit`
  live in :mod:`rollmux.per_job_baselines` (RollMux §7.1) and are re-exported here
  (:func:`solo_unit`, :func:`colocated_unit`, :func:`gavel_choice`, :data:`PER_JOB_UNITS`, ...).
* **Random / Most-Idle**: :class:`rollmux.admission.InterGroupScheduler` with those policies
  (no SLO check), wrapped by the simulator.
* **Optimum** (:class:`OptimalPartition`, this module): the cheapest partition of the active jobs
  into feasible co-execution groups (groups laid out by :func:`rollmux.admission.build_group`), by
  CP-SAT set partitioning over every feasible candidate group. RollMux §7.5 "Opt".
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from rollmux.admission.layouts import build_group, layout_floor_usd_per_h, layout_row, training_pins_feasible
from rollmux.admission.order import EXHAUSTIVE_ORDER_MAX
from rollmux.models import ClusterSpec, CoExecutionGroup, JobSpec, PhaseProfile
from rollmux.per_job_baselines import (  # noqa: F401  (re-exported: the per-job baselines' names)
    GAVEL_SCALES, PER_JOB_UNITS, GavelChoice, Unit, cheaper_alone, choice_unit, colocated_profile, colocated_unit,
    gavel_choice, gavel_options, gavel_unit, planning_profile, profile_on, realised, solo_unit,
)


# --- Optimum ------------------------------------------------------------------------------------------


#: Job sets of at most this many jobs get the dynamic programme of :meth:`OptimalPartition.solve`
#: (at most 2^n subsets; the neighbourhood re-optimisation solves 8); larger ones go to CP-SAT.
DP_MAX_JOBS = 10
#: More tied optimal partitions than this: CP-SAT decides.
DP_MAX_TIES = 64
#: CP-SAT's wall-clock safety net, as a multiple of its deterministic budget ``time_limit_s``.
WALL_CAP_FACTOR = 20.0


def solve_set_partition(keys: Sequence[frozenset], units: Sequence[int], job_ids: Sequence[str],
                        deterministic_time: float, hint: Optional[Sequence[bool]] = None
                        ) -> tuple[Optional[list[int]], bool, float]:
    """``min sum_S units_S x_S  s.t.  sum_{S ∋ j} x_S = 1`` for every job of ``job_ids``, ``x``
    binary, by CP-SAT: ``(indices of the chosen keys or None when no partition was found, proven
    optimal, best objective bound in units)``. The budget is CP-SAT's deterministic time (work
    units, about a second of one core each), never the wall clock: the partition returned is the
    same on an idle or a loaded host, so replays are reproducible. One worker (and the default seed)
    keep the search deterministic; the wall-clock cap (``WALL_CAP_FACTOR`` x the budget, at least
    that many seconds) is only a safety net far above it. ``hint``: a start value per key."""
    from ortools.sat.python import cp_model

    memo_key = (tuple(keys), tuple(units), tuple(job_ids), deterministic_time, tuple(bool(h) for h in hint or ()))
    out = _SOLVED.get(memo_key)
    if out is not None:  # the same model: the same answer (one worker, deterministic time)
        return list(out[0]) if out[0] is not None else None, out[1], out[2]
    model = cp_model.CpModel()
    _set_partition_proto(model.Proto(), keys, units, job_ids, hint)
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = deterministic_time
    solver.parameters.max_time_in_seconds = WALL_CAP_FACTOR * max(1.0, deterministic_time)
    solver.parameters.num_workers = 1
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        out = (None, False, 0.0)
    else:
        sol = solver.response_proto.solution  # the variables' values, by index
        out = ([i for i in range(len(keys)) if sol[i]], status == cp_model.OPTIMAL, solver.BestObjectiveBound())
    if len(_SOLVED) >= _SOLVED_MAX:
        _SOLVED.pop(next(iter(_SOLVED)))
    _SOLVED[memo_key] = (tuple(out[0]) if out[0] is not None else None, out[1], out[2])
    return out


#: answers of :func:`solve_set_partition` by model (a replay may pose the same master twice), oldest first
_SOLVED: dict = {}
_SOLVED_MAX = 256


def _set_partition_proto(p, keys: Sequence[frozenset], units: Sequence[int], job_ids: Sequence[str],
                         hint: Optional[Sequence[bool]]) -> None:
    """Fill the empty CpModelProto ``p`` with the set partitioning of :func:`solve_set_partition`:
    a Boolean ``x{i}`` per key, one exactly-one constraint per job (the keys holding it, ascending),
    the objective ``sum units_i x_i`` and the hint, written into the proto directly (the model the
    ``CpModel`` builder methods make, field for field, at a third of their Python cost)."""
    n = len(keys)
    for i in range(n):
        v = p.variables.add()
        v.name = f"x{i}"
        v.domain.extend((0, 1))
    holding: dict[str, list[int]] = {j: [] for j in job_ids}
    for i, s in enumerate(keys):
        for j in s:
            h = holding.get(j)
            if h is not None:
                h.append(i)
    for j in job_ids:
        p.constraints.add().exactly_one.literals.extend(holding[j])
    if n:
        o = p.objective
        o.vars.extend(range(n))
        o.coeffs.extend(int(u) for u in units)
        o.scaling_factor = 1
    hs = list(hint or ())[:n]
    if hs:
        p.solution_hint.vars.extend(range(len(hs)))
        p.solution_hint.values.extend(int(bool(h)) for h in hs)


@dataclass
class PartitionResult:
    """The optimum's answer for one set of active jobs.

    Attributes:
        groups: the chosen co-execution groups (laid out by ``build_group``).
        cost_usd_per_h: their total price, $/h.
        exact: True when CP-SAT proved optimality over *all* feasible candidate groups; False when
            the instance exceeded ``exact_max_jobs`` (then the jobs are split into blocks of at
            most that size, in arrival order, each solved exactly: the cost is the best found,
            an upper bound on the optimum, not a lower bound) or the solver hit its time limit.
        candidates: feasible candidate groups considered.
        solve_ms: wall time of the decision, ms.
    """

    groups: list[CoExecutionGroup]
    cost_usd_per_h: float
    exact: bool
    candidates: int
    solve_ms: float = 0.0
    bound_usd_per_h: Optional[float] = None


@dataclass
class OptimalPartition:
    """Offline optimum: the cheapest partition of a job set into feasible co-execution groups.

    Candidate groups are all subsets of at most ``max_group_size`` jobs that
    :func:`rollmux.admission.build_group` can lay out (memory residency and every member's SLO on
    the worst-case round-robin schedule); their cost is that layout's price. Enumeration is
    level-wise: a subset is tried only if all its subsets one job smaller are feasible. This
    assumes feasibility is closed under taking subsets: removing a job never raises any node's
    load or lengthens the others' round-robin iteration, so it holds in practice, but
    ``build_group`` searches layouts per job set and does not guarantee it (a documented
    assumption of "exact"). CP-SAT then solves the set partitioning
    ``min sum_S c_S x_S  s.t.  sum_{S ∋ j} x_S = 1`` exactly. Layouts are cached across calls.

    Exact (optimal over those candidates, proven by CP-SAT) up to ``exact_max_jobs`` active
    jobs and within ``time_limit_s`` of CP-SAT's deterministic time (work units of about a core
    second, so the answer does not depend on the host's load); beyond, a labelled best-found upper bound, see
    :class:`PartitionResult`. Measured (``scripts/bench_decision_latency.py``, median of 5 solves
    from an empty cache on a shared 2-core host): ~20-50 ms at 12-16 jobs, ~0.4 s at 32; the
    simulator's incremental use (cached layouts) defaults to 16. Source: RollMux §7.5 ("Opt", Table 5).
    """

    cluster: ClusterSpec
    max_group_size: int = 5
    exact_max_jobs: int = 12
    time_limit_s: float = 10.0
    _layouts: dict = field(default_factory=dict, repr=False)
    _cols: dict = field(default_factory=dict, repr=False)
    _keys_of: dict = field(default_factory=dict, repr=False)  # job id -> cached job sets holding it (forget)
    _floors: dict = field(default_factory=dict, repr=False)  # job set -> layout_floor_usd_per_h (partition_floor)
    _rows: dict = field(default_factory=dict, repr=False)  # job id -> layout_row
    _lp_pool: dict = field(default_factory=dict, repr=False)  # job set -> price: the LP bound's last master columns (warm start)
    _lb_floors: dict = field(default_factory=dict, repr=False)  # job set -> the LP bound's floor L(S) (rollmux.partition_bound)
    #: the wider problem of ``per_job_allocations``: a job alone may also run on its own allocation
    #: (its Gavel+ choice among the scaled and colocated allocations meeting its SLO), so a one-job
    #: column costs the least of its layout's and that allocation's $/h
    per_job: bool = False
    _single: dict = field(default_factory=dict, repr=False)  # job id -> {layout $/h: one-job column price} (per_job)
    _gone: set = field(default_factory=set, repr=False)  # departed jobs the LP pool may still hold (forget)

    def single_usd_per_h(self, job: JobSpec, profile: PhaseProfile, layout_usd_per_h: float) -> float:
        """Price of the one-job column of ``job`` whose layout costs ``layout_usd_per_h``: that
        price, or with ``per_job`` the $/h of the job's own allocation where
        :func:`cheaper_alone` (the one rule ``per_job_allocations``
        runs a job alone by) takes it, USD/h."""
        if not self.per_job:
            return layout_usd_per_h
        mine = self._single.get(job.job_id)
        if mine is None:
            mine = self._single[job.job_id] = {}
        v = mine.get(layout_usd_per_h)
        if v is None:
            alt = cheaper_alone(job, profile, layout_usd_per_h, self.cluster)
            v = mine[layout_usd_per_h] = layout_usd_per_h if alt is None else min(layout_usd_per_h, alt.cost_usd_per_h)
        return v

    def _price_of(self, key: frozenset, g: CoExecutionGroup, by_id: Mapping) -> float:
        c = g.cost_usd_per_h(self.cluster)
        if self.per_job and len(key) == 1:
            (jid,) = key
            return self.single_usd_per_h(by_id[jid][0], by_id[jid][1], c)
        return c

    def _remember(self, key: frozenset) -> None:
        for j in key:
            self._keys_of.setdefault(j, []).append(key)

    def layout(self, members: Sequence[tuple[JobSpec, PhaseProfile]]) -> Optional[CoExecutionGroup]:
        """Cached min-cost feasible layout of ``members`` (``None`` if infeasible)."""
        key = frozenset(j.job_id for j, _ in members)
        if key not in self._layouts:
            self._layouts[key] = build_group(list(members), self.cluster)
            self._remember(key)
        return self._layouts[key]

    def _column(self, key: frozenset, members: Sequence[tuple[JobSpec, PhaseProfile]], below: float) -> Optional[CoExecutionGroup]:
        """Cached min-cost feasible layout of ``members`` strictly cheaper than ``below`` $/h (a
        function of the job set only: ``below`` is derived from its subsets)."""
        if key not in self._cols:
            full = self._layouts.get(key, False)
            if full is not False:  # the unbounded search already ran
                self._cols[key] = full if full is not None and full.cost_usd_per_h(self.cluster) < below - 1e-9 else None
            elif self._floors.get(key, -math.inf) >= below - 1e-9:
                # build_group's first layout passing memory and the node-load rule costs the floor:
                # nothing cheaper than ``below`` exists, so its search would return None
                self._cols[key] = None
            else:
                self._cols[key] = build_group(list(members), self.cluster, below_usd_per_h=below)
            self._remember(key)
        return self._cols[key]

    def dominates(self, partition: Sequence[tuple[Sequence[tuple[JobSpec, PhaseProfile]], float]]) -> bool:
        """Certificate that the optimum is a lower bound on a policy's cost at one instant.

        ``partition``: the policy's allocations now, each as (its jobs with worst-case profiles,
        its $/h). True when every allocation's job set has a layout in the optimum's layout class
        (:func:`rollmux.admission.build_group`) costing no more than the allocation; then the
        optimum, the cheapest partition over those layouts, costs no more than the policy:
        ``opt <= sum_g layout(g) <= sum_g cost(g)``. False when some allocation lies outside
        the class (e.g. an SLO-violating group, a layout build_group does not search, another
        GPU type): the instant is then not counted as exactly compared.
        """
        for members, cost in partition:
            if len(members) > self.max_group_size:
                return False
            g = self.layout(list(members))
            if g is None:
                return False
            c = g.cost_usd_per_h(self.cluster)
            if len(members) == 1:
                c = self.single_usd_per_h(members[0][0], members[0][1], c)
            if c > cost + 1e-6:
                return False
        return True

    def forget(self, job_id: str) -> None:
        """Drop cached layouts that contain a departed job (bounds the cache)."""
        for k in self._keys_of.pop(job_id, ()):  # the job sets cached with it (no scan of the caches)
            self._layouts.pop(k, None)
            self._cols.pop(k, None)
            self._floors.pop(k, None)
            self._lb_floors.pop(k, None)
            self._lp_pool.pop(k, None)
        self._rows.pop(job_id, None)
        self._single.pop(job_id, None)
        # the LP pool's columns that were never laid out here (a policy's own groups): dropped in
        # one pass once as many jobs have gone as the pool holds columns
        self._gone.add(job_id)
        if len(self._gone) >= max(64, len(self._lp_pool)):
            gone, self._gone = self._gone, set()
            self._lp_pool = {k: c for k, c in self._lp_pool.items() if gone.isdisjoint(k)}

    def view(self, per_job: bool) -> "OptimalPartition":
        """An optimum of the same cluster and group size whose layouts and floors are this one's
        (one cache, filled by either; each forgets what it remembered), with its own ``per_job``,
        LP column pool and one-job prices: the global plan prices a job alone at what it runs on
        while the neighbourhood re-optimisation searches co-execution partitions, over one cache."""
        v = OptimalPartition(self.cluster, max_group_size=self.max_group_size, exact_max_jobs=self.exact_max_jobs,
                             time_limit_s=self.time_limit_s, per_job=per_job)
        v._layouts, v._cols, v._floors, v._rows = self._layouts, self._cols, self._floors, self._rows
        return v

    def partition_floor(self, members: Sequence[tuple[JobSpec, PhaseProfile]], fixed: Mapping[frozenset, float],
                        target: Optional[float] = None,
                        keeps: Optional[Callable[[CoExecutionGroup], bool]] = None) -> float:
        """A lower bound, USD/h, on ``sum_{S in P} value(S)`` over every partition P of ``members``
        into the columns the exact solve uses (:meth:`_candidates`), where ``value(S)`` is
        ``fixed[S]`` for the job sets in ``fixed`` (the current groups at their price) and the
        column's price otherwise. Columns already computed are priced exactly, the others by
        :func:`rollmux.admission.layout_floor_usd_per_h` (no rollout layout searched, nothing
        simulated); job sets it proves infeasible are remembered as such for the exact solve.
        The minimum over partitions is a dynamic programme over job subsets. With ``target``,
        while the bound is below it and its cheapest partition uses floor-priced sets, those sets
        are laid out exactly (:meth:`layout`, the unbounded search the exact solve then reuses) and
        the bound recomputed; so a bound below ``target`` means an exactly priced partition below
        it exists (the exact solve must decide), and one at or above it proves none does.
        ``keeps``: the caller's test of a new group (a job set not in ``fixed``, as laid out): a
        set whose layout fails it is priced ``inf`` (the caller would reject any partition using
        it), checked on the sets of the cheapest partition only, as they are needed.
        :meth:`rollmux.admission.InterGroupScheduler.reoptimise` skips the exact solve when this
        bound shows that no partition is cheaper than the current groups."""
        by_id = {j.job_id: (j, p) for j, p in members}
        ids = sorted(by_id)
        n = len(ids)
        rows = []
        for i in ids:
            r = self._rows.get(i)
            if r is None:
                r = self._rows[i] = layout_row(*by_id[i], self.cluster)
            rows.append(r)
        by_low: dict[int, list[int]] = {}  # lowest bit -> masks of the sets with a finite value
        val: dict[int, float] = {}
        rough: dict[int, tuple] = {}  # mask -> (job set, combo) of the sets priced by their floor only
        unchecked: dict[int, tuple] = {}  # mask -> (job set, combo) of new groups ``keeps`` has not seen
        retried: set = set()  # job sets whose bounded search found nothing once (next time: unbounded)
        for size in range(1, min(self.max_group_size, n) + 1):
            for combo in itertools.combinations(range(n), size):
                s = frozenset(ids[b] for b in combo)
                exact = True
                if s in fixed:
                    v = fixed[s]
                elif size == 1:  # with ``per_job`` the job's own allocation where cheaper
                    g = self.layout([by_id[ids[combo[0]]]])
                    v = math.inf if g is None else self.single_usd_per_h(*by_id[ids[combo[0]]], g.cost_usd_per_h(self.cluster))
                elif s in self._cols:
                    g = self._cols[s]
                    v = math.inf if g is None else g.cost_usd_per_h(self.cluster)
                elif s in self._layouts:
                    g = self._layouts[s]
                    v = math.inf if g is None else g.cost_usd_per_h(self.cluster)
                elif s in self._floors:
                    v, exact = self._floors[s], False
                else:
                    v = (layout_floor_usd_per_h([by_id[ids[b]] for b in combo], self.cluster, [rows[b][:4] for b in combo])
                         if training_pins_feasible([rows[b] for b in combo], self.cluster) else math.inf)
                    if v == math.inf:  # build_group finds no layout below any price: not a column
                        self._cols[s] = None
                    else:
                        self._floors[s] = v
                        exact = False
                    self._remember(s)
                if v < math.inf:
                    mask = 0
                    for b in combo:
                        mask |= 1 << b
                    by_low.setdefault(1 << combo[0], []).append(mask)
                    val[mask] = v
                    if not exact:
                        rough[mask] = (s, combo)
                    if keeps is not None and s not in fixed:
                        unchecked[mask] = (s, combo)
        while True:
            best = [0.0] + [math.inf] * ((1 << n) - 1)
            pick = [0] * (1 << n)
            for mask in range(1, 1 << n):
                low, top, arg = mask & -mask, math.inf, 0
                for m in by_low.get(low, ()):
                    if m & mask == m:
                        x = val[m] + best[mask ^ m]
                        if x < top:
                            top, arg = x, m
                best[mask], pick[mask] = top, arg
            if target is None or best[-1] >= target:
                return best[-1]
            # the cheapest partition uses sets priced by their floor: lay those out exactly (the
            # unbounded layout, cached as the exact solve would read it) and bound again
            used, mask = [], (1 << n) - 1
            while mask:
                used.append(pick[mask])
                mask ^= pick[mask]
            todo = [m for m in used if m in rough or m in unchecked]
            if not todo:
                return best[-1]  # an exactly priced partition below the target: only the solve decides
            full = (1 << n) - 1
            for m in todo:
                s, combo = unchecked.get(m) or rough[m]
                if m in rough:
                    # a partition using S costs >= exact(S) + best(rest): only layouts below
                    # ``bound`` can take it under the target, so build_group searches those only
                    bound = target - best[full ^ m]
                    g = build_group([by_id[ids[b]] for b in combo], self.cluster,
                                    below_usd_per_h=None if rough[m][0] in retried else bound)
                    if g is None and s not in retried:
                        # no feasible layout below ``bound``: a valid floor (kept just under it, so
                        # that _column's floor test stays exact) and S may come back once, exactly
                        retried.add(s)
                        val[m] = self._floors[s] = max(val[m], bound - 2e-9)
                        continue
                    del rough[m]
                    if s in retried or g is not None:
                        self._layouts[s] = g  # the unbounded search's answer (the first feasible layout)
                    if g is None:
                        val[m] = math.inf
                        unchecked.pop(m, None)
                        continue
                else:
                    g = self._cols.get(s)
                    if g is None:
                        g = self.layout([by_id[ids[b]] for b in combo])
                unchecked.pop(m, None)
                val[m] = math.inf if g is None or (keeps is not None and s not in fixed and not keeps(g)) \
                    else g.cost_usd_per_h(self.cluster)

    def _candidates(self, members: Sequence[tuple[JobSpec, PhaseProfile]], complete: bool = True) -> dict[frozenset, CoExecutionGroup]:
        """Every column the set partitioning needs: for each subset S of at most
        ``max_group_size`` jobs, its cheapest layout if that is strictly cheaper than
        ``split(S) = min_x best(S - {x}) + best({x})`` (``best``: the cheapest partition of a set
        into columns, built bottom-up). A layout costing ``split(S)`` or more is matched by a
        partition into smaller columns, so dropping it never changes the optimum; feasibility need
        not be closed under subsets (round-robin schedules are not monotone: removing a member can
        delay another), so every subset is examined. ``complete=False`` (blocks beyond
        ``exact_max_jobs``, labelled not exact): level-wise, a subset only when all its subsets one
        job smaller are feasible (cheaper, may miss columns)."""
        by_id = {j.job_id: (j, p) for j, p in members}
        ids = sorted(by_id)
        feas: dict[frozenset, CoExecutionGroup] = {}
        # best / feasibility by bit mask over ``ids`` (the same values as by job set, cheaper keys)
        best: dict[int, float] = {}
        single: list[float] = []
        for b, i in enumerate(ids):
            g = self.layout([by_id[i]])
            if g is None:  # pragma: no cover - a job alone is always feasible
                raise ValueError(f"job {i} cannot be laid out alone")
            feas[frozenset([i])] = g
            single.append(self.single_usd_per_h(*by_id[i], g.cost_usd_per_h(self.cluster)))
            best[1 << b] = single[-1]
        feasible = set(best)
        for size in range(2, min(self.max_group_size, len(ids)) + 1):
            for combo in itertools.combinations(range(len(ids)), size):
                mask = 0
                for b in combo:
                    mask |= 1 << b
                if not complete and any((mask ^ (1 << b)) not in feasible for b in combo):
                    continue
                split = min(best[mask ^ (1 << b)] + single[b] for b in combo) if complete else math.inf
                s = frozenset(ids[b] for b in combo)
                g = self._column(s, [by_id[ids[b]] for b in combo], split)
                if g is not None:
                    feas[s] = g
                    feasible.add(mask)
                    best[mask] = g.cost_usd_per_h(self.cluster)
                elif complete:
                    best[mask] = split
        return feas

    @staticmethod
    def _optimal_partitions(members, cols, units: list[int], limit: int) -> tuple[int, Optional[list[tuple[int, ...]]]]:
        """Every partition of ``members`` into the columns ``cols`` of minimum total ``units``
        (the set partitioning's integer objective), each as its column indices in ascending order,
        by dynamic programming over job subsets (the job with the lowest bit first, so each
        partition is found once): ``(minimum, partitions)``, partitions None when more than
        ``limit`` tie."""
        bit = {j.job_id: 1 << k for k, (j, _) in enumerate(members)}
        by_low: dict[int, list[tuple[int, int]]] = {}
        for c, (s, _) in enumerate(cols):
            m = 0
            for jid in s:
                m |= bit[jid]
            by_low.setdefault(m & -m, []).append((m, c))
        memo: dict[int, tuple[float, list]] = {0: (0, [()])}

        def best(mask: int) -> tuple[float, list]:
            r = memo.get(mask)
            if r is not None:
                return r
            low, top, parts = mask & -mask, math.inf, []
            for m, c in by_low.get(low, ()):
                if m & mask != m:
                    continue
                sub, subparts = best(mask ^ m)
                v = units[c] + sub
                if v < top:
                    top, parts = v, []
                if v == top and len(parts) <= limit:
                    parts.extend((c,) + p for p in subparts[: limit + 1 - len(parts)])
            memo[mask] = (top, parts)
            return memo[mask]

        top, parts = best(sum(bit.values()))
        return top, (None if len(parts) > limit else [tuple(sorted(p)) for p in parts])

    def _solve_exact(self, members, complete: bool = True,
                     indifferent: Optional[Callable[[list[CoExecutionGroup]], bool]] = None) -> PartitionResult:
        feas = self._candidates(members, complete)
        cols = list(feas.items())
        by_id = {j.job_id: (j, p) for j, p in members}
        price = [self._price_of(s, g, by_id) for s, g in cols]
        units = [round(p * 1000) for p in price]  # the integer objective CP-SAT minimises
        if len(members) <= DP_MAX_JOBS:
            # The optimum without CP-SAT when that cannot change the answer: a unique optimal
            # partition is the one CP-SAT returns (it proves optimality on these sizes), and when
            # every tied optimum leaves the caller's decision unchanged (``indifferent``), any of
            # them serves.
            top, parts = self._optimal_partitions(members, cols, units, DP_MAX_TIES)
            if parts and (len(parts) == 1 or (indifferent is not None
                                              and all(indifferent([cols[c][1] for c in p]) for p in parts))):
                chosen = [cols[c][1] for c in parts[0]]
                return PartitionResult(chosen, sum(price[c] for c in parts[0]),
                                       complete and self.max_group_size <= EXHAUSTIVE_ORDER_MAX, len(cols),
                                       bound_usd_per_h=top / 1000.0)
        # deterministic time, never the wall clock (solve_set_partition): reproducible replays
        picked, optimal, bound = solve_set_partition([s for s, _ in cols], units, [j.job_id for j, _ in members],
                                                     max(0.05, self.time_limit_s))
        if picked is None:  # pragma: no cover - singletons are feasible
            groups = [feas[frozenset([j.job_id])] for j, _ in members]
            return PartitionResult(groups, sum(g.cost_usd_per_h(self.cluster) for g in groups), False, len(cols))
        chosen = [cols[i][1] for i in picked]
        cost = sum(price[i] for i in picked)
        exact = optimal and complete and self.max_group_size <= EXHAUSTIVE_ORDER_MAX
        return PartitionResult(chosen, cost, exact, len(cols), bound_usd_per_h=bound / 1000.0)

    def solve(self, members: Sequence[tuple[JobSpec, PhaseProfile]], *,
              indifferent: Optional[Callable[[list[CoExecutionGroup]], bool]] = None) -> PartitionResult:
        """Cheapest partition of ``members`` (``(spec, worst-case profile)`` pairs, arrival order).

        Up to :data:`DP_MAX_JOBS` jobs the optimal partitions are first enumerated by dynamic
        programming; CP-SAT runs only when several tie (it picks among them) and
        ``indifferent`` (the caller's test that a partition leaves its decision unchanged) does
        not hold for every one of them. So the answer is CP-SAT's whenever CP-SAT proves
        optimality (its time limit is not hit), and CP-SAT's cost (model building, ~1-3 ms) is
        mostly saved.

        Returns:
            :class:`PartitionResult` (``exact`` says whether it is proven optimal).
        Raises:
            ValueError: duplicate job ids.
        """
        t0 = time.perf_counter()
        ids = [j.job_id for j, _ in members]
        if len(set(ids)) != len(ids):
            raise ValueError("OptimalPartition.solve: duplicate job ids")
        if not members:
            return PartitionResult([], 0.0, True, 0, 0.0, 0.0)
        if len(members) <= self.exact_max_jobs:
            res = self._solve_exact(members, indifferent=indifferent)
        else:
            blocks = [members[i : i + self.exact_max_jobs] for i in range(0, len(members), self.exact_max_jobs)]
            parts = [self._solve_exact(b, complete=False) for b in blocks]
            res = PartitionResult(
                [g for p in parts for g in p.groups],
                sum(p.cost_usd_per_h for p in parts),
                False,
                sum(p.candidates for p in parts),
            )
        res.solve_ms = (time.perf_counter() - t0) * 1000.0
        return res
