"""The global plan: at busy instants, a target partition of the active jobs and the moves toward it
that pay for themselves (a mixin of :class:`rollmux.admission.InterGroupScheduler`, like
:mod:`rollmux.admission.repack`).

Why. The neighbourhood re-optimisation (:meth:`RepackMixin.reoptimise`) re-partitions at most
``reopt_max_jobs`` jobs around one event; where many groups are active, a partition chosen afresh
over all of them packs tighter than any such neighbourhood (the cheapest partition known at busy
instants is within a few percent of the proven lower bound, :mod:`rollmux.partition_bound`, while
the neighbourhoods left RollMux about 10% above it).

Three steps, the same in the trace replay and in the cluster's GlobalScheduler (which runs the
second in its re-optimisation child process, off the reply path):

1. :meth:`GlobalPlanMixin.plan_request` (cheap, reads the table): whether a plan is due, and its
   window captured as values. Due when the gap between the $/h the groups run at and a cheap
   estimate of what the active jobs could run at has grown by ``plan_gap_trigger`` since the last
   plan. The estimate is the last plan's LP duals (what each job "should" cost, ``sum`` of them is
   the LP bound of that plan's window) carried forward, a job planned by no plan yet counting its
   work-rate floor (its node-seconds of phases per second of its SLO budget, at node prices) scaled
   by the last plan's ratio of duals to floors. The window is every group when at most
   ``plan_max_jobs`` jobs are active, else whole groups by their excess over the estimate
   (price - the estimates of their members), largest first.
2. :meth:`GlobalPlanMixin.plan_global` (the search; reads only the request, the cluster and the
   config, so it may run while the table changes): column generation of the LP relaxation of the
   window's set partitioning (:func:`rollmux.partition_bound.lp_lower_bound` within a budget of
   master solves and layouts, started from the columns every earlier plan found, today's groups
   among them at the $/h they run at), then the integer master over those columns by CP-SAT
   (:func:`rollmux.baselines.solve_set_partition`, within ``plan_deterministic_s`` of CP-SAT's
   deterministic time: the same target on any host), started from today's groups. With
   ``plan_master_columns`` N > 0 the master holds today's groups and the pool's columns of least
   reduced cost under the plan's LP duals, N in all (the restricted master heuristic: a pool of
   thousands of columns otherwise leaves CP-SAT without even its start partition within the budget,
   and the plan keeps today's groups). Moves are paid
   for in the master: a column that is not a group today costs :meth:`GlobalPlanMixin.copy_price`
   x the seconds of host-state copy of its members on top of its price, so the target moves a job
   only where the saving is worth the copy (a fresh job, not started yet, copies nothing). The
   target is then split into its independent exchanges (the connected components of today's groups
   and the target's: each replaces some groups by others over the same jobs); an exchange whose new
   group fails a move's checks (:meth:`RepackMixin.movable_order`: feasible, every moved job's SLO
   absorbs its copy, no member at its move cap) is forbidden and the master solved again (at most
   three rounds). Exchanges whose saving exceeds the price of their copies are the migrations, most
   saving per second of copy first.
3. :meth:`GlobalPlanMixin.apply_global` (commits): each migration through
   :meth:`RepackMixin.apply_reoptimise`, which commits it only when its groups are still as they
   were planned on (a stale one is dropped, nothing moves) and the cluster has room.

Hysteresis. Both directions of a move pay its copy price, so two partitions never alternate: from
A to B needs ``cost(A) - cost(B) > price x copy(B)``, back needs ``cost(B) - cost(A) > price x
copy(A)``, and both cannot hold. A job that has moved ``max_moves_per_job_per_h`` times in the last
hour is pinned (its group stays as it is) until the oldest of those moves is an hour old; the
neighbourhood re-optimisation and departure re-packing respect the same cap.

Source: extension of RollMux §4.2 Alg. 1 toward the optimum that re-partitions at every event
(RollMux §7.5 "Opt"); column generation and the integer master as in :mod:`rollmux.partition_bound`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from rollmux.admission.layouts import job_layout_needs
from rollmux.admission.repack import ReoptHood, ReoptPlan
from rollmux.union_find import find_root

__all__ = ["GlobalPlan", "GlobalPlanMixin", "Migration", "PlanRequest", "PlanState"]

#: the window of the move cap, s
CAP_WINDOW_S = 3600.0
#: rounds of the integer master (a round forbids the new groups that failed a move's checks)
MASTER_ROUNDS = 3


@dataclass(frozen=True)
class PlanRequest:
    """What :meth:`GlobalPlanMixin.plan_global` plans on, as values: the window (whole groups,
    :class:`ReoptHood`; its ``pinned`` jobs may not move), the jobs of it that have not started
    (``fresh``: no state to copy), the $/h every group of the table runs at and the estimate when
    it was captured (``cost_usd_per_h``, ``estimate_usd_per_h``), and the table's version then."""

    hood: ReoptHood
    fresh: frozenset
    cost_usd_per_h: float
    estimate_usd_per_h: float
    version: int


@dataclass(frozen=True)
class Migration:
    """One independent exchange of the target: its groups today (``plan.hood``) replaced by the
    new groups of ``plan`` (a :class:`ReoptPlan`, committed by ``apply_reoptimise``); ``copy_s``:
    seconds of host-state copy of its moved jobs (fresh ones copy nothing); ``saving_usd_per_h``:
    ``plan.before_usd_per_h - plan.after_usd_per_h``."""

    plan: ReoptPlan
    copy_s: float
    saving_usd_per_h: float


@dataclass(frozen=True)
class GlobalPlan:
    """A target partition of a :class:`PlanRequest`'s window and the migrations toward it.

    Attributes:
        request: what it planned on.
        bound_usd_per_h: the LP bound of the window when its column generation converged within the
            plan's budget (a proven lower bound on the cheapest partition of the window's jobs),
            else 0, USD/h.
        current_usd_per_h / target_usd_per_h: the window's groups today and the target, at the
            $/h they run at.
        duals: per job of the window, its share of the bound (``BoundResult.duals``), USD/h.
        migrations: the exchanges chosen, most saving per second of copy first.
        left_out: exchanges of the target not chosen, by reason (``"move_price"``: the saving
            does not pay for the copies; ``"checks"``: a new group failed a move's checks in every
            round).
    """

    request: PlanRequest
    bound_usd_per_h: float
    current_usd_per_h: float
    target_usd_per_h: float
    duals: dict
    migrations: tuple
    left_out: dict = field(default_factory=dict)


@dataclass
class PlanState:
    """The global plan's memory in the scheduler: per job the times of its moves within the last
    hour (clock s), its dual at the last plan that covered it and its work-rate floor; the ratio of
    duals to floors at the last plan; the estimate's gap right after it (None: no plan yet); and
    counters (plans computed, migrations applied, migrations dropped as stale)."""

    moves_at: dict = field(default_factory=dict)
    duals: dict = field(default_factory=dict)
    floor: dict = field(default_factory=dict)
    scale: float = 1.0
    gap_ref: Optional[float] = None
    gap_terms: dict = field(default_factory=dict)  # group id -> (its summary, $/h, busy $/h), for plan_gap
    plans: int = 0
    applied: int = 0
    stale: int = 0


class GlobalPlanMixin:
    """The global plan of :class:`InterGroupScheduler` (module docstring). Uses the scheduler's
    ``_groups``, ``_job_group``, ``_version``, ``config``, ``cluster``, ``group_price``, ``clock``
    and the re-optimisation's ``movable_order`` / ``apply_reoptimise`` / ``_group_usd_per_h``."""

    #: the scheduler's clock, s (set by its owner: the replay's simulated time, the cluster's
    #: Unix time); None: no move cap (nothing to measure an hour with)
    clock = None

    @property
    def plan_state(self) -> PlanState:
        st = self.__dict__.get("_plan_state")
        if st is None:
            st = self.__dict__["_plan_state"] = PlanState()
        return st

    # --- moves and the cap ---------------------------------------------------------------------------
    def note_moves(self, moves: list[dict]) -> None:
        """Remember when the jobs of ``moves`` moved (a move with ``move_s`` 0, of a job that had not
        started, copies nothing and does not count). Needs :attr:`clock`; a no-op without it."""
        if self.clock is None or not moves:
            return
        now = float(self.clock())
        st = self.plan_state
        for mv in moves:
            if mv.get("move_s", 0.0) > 0:
                st.moves_at.setdefault(mv["job_id"], []).append(now)

    def copy_price(self) -> float:
        """What a second of host-state copy costs, USD/h: ``plan_move_price_node_pairs_per_copy_s``
        x the $/h of one rollout node and one training node of the cluster."""
        node_pair = self.cluster.rollout_pool.node.price_usd_per_h + self.cluster.train_pool.node.price_usd_per_h
        return self.config.plan_move_price_node_pairs_per_copy_s * node_pair

    def pays(self, saving_usd_per_h: float, copy_s: float) -> bool:
        """Whether a re-partition saving ``saving_usd_per_h`` with ``copy_s`` seconds of host-state
        copy in all is worth its moves: the saving exceeds :meth:`copy_price` x the copy (the
        hysteresis: a re-partition and its reverse cannot both pay)."""
        return saving_usd_per_h > self.copy_price() * copy_s + 1e-6

    def pinned_jobs(self) -> frozenset:
        """The jobs that may not move now: ``max_moves_per_job_per_h`` moves (or more) within the
        last hour of :attr:`clock`. Empty without a clock."""
        if self.clock is None or not self.plan_state.moves_at:
            return frozenset()
        since = float(self.clock()) - CAP_WINDOW_S
        cap = self.config.max_moves_per_job_per_h
        out = []
        for j, ts in list(self.plan_state.moves_at.items()):
            recent = [t for t in ts if t > since]
            if not recent or j not in self._job_group:
                del self.plan_state.moves_at[j]
                continue
            self.plan_state.moves_at[j] = recent
            if len(recent) >= cap:
                out.append(j)
        return frozenset(out)

    # --- the estimate and the trigger ----------------------------------------------------------------
    def _floor_of(self, spec, profile) -> float:
        """A job's work-rate floor, USD/h: its phase-seconds on its nodes per iteration, at node
        prices, over its SLO budget ``slo x T_solo`` (the node time any layout must give it)."""
        st = self.plan_state
        v = st.floor.get(spec.job_id)
        if v is None:
            nr, nt, _, _ = job_layout_needs(spec, self.cluster)
            pr, pt = self.cluster.rollout_pool.node.price_usd_per_h, self.cluster.train_pool.node.price_usd_per_h
            v = st.floor[spec.job_id] = ((nr * profile.t_roll_s * pr + nt * profile.t_train_node_s * pt)
                                         / (spec.slo * profile.t_solo_s))
        return v

    def _estimate(self, m) -> float:
        st = self.plan_state
        d = st.duals.get(m.spec.job_id)
        return st.scale * self._floor_of(m.spec, m.profile) if d is None else d

    def plan_gap(self) -> tuple[float, float]:
        """(the $/h every group runs at, the estimate of what the active jobs could run at: the $/h
        of the node time they keep busy, each group's price less its idle share, a group on a
        cheaper own allocation counted whole), USD/h."""
        cost = est = 0.0
        cache = self.plan_state.gap_terms
        for gid, g in self._groups.items():
            e = cache.get(gid)
            if e is None or e[0] is not g:  # a group's summary is replaced whenever it changes
                c = self._group_usd_per_h(g.group)
                e = cache[gid] = (g, c, c * (1.0 - self._idle_for_reopt(gid)))
            cost += e[1]
            est += e[2]
        if len(cache) > 2 * len(self._groups) + 64:
            for gid in [x for x in cache if x not in self._groups]:
                del cache[gid]
        return cost, est

    def plan_request(self, fresh=(), force: bool = False) -> Optional[PlanRequest]:
        """A :class:`PlanRequest` when a plan is due (module docstring, step 1), else None. Off
        (None) with ``plan_max_jobs: 0``, without re-packing, with fewer than two jobs, or while
        the neighbourhood re-optimisation sees every active job (``reopt_max_jobs``).
        ``fresh``: admitted jobs that have not started (no state to copy: the replay's newcomer,
        the cluster's jobs whose driver has not attached). ``force``: due whatever the gap, with
        every job but the fresh ones pinned (an admission raised the $/h the groups run at by more
        than its marginal cost, e.g. it joined a group whose lone member ran on a cheaper own
        allocation: the plan may place the newcomer anew, which copies nothing, and move nobody
        else). O(groups) when no plan is due."""
        cfg = self.config
        if (cfg.plan_max_jobs < 2 or not self.spec.repacks or not cfg.repack_on_departure or len(self._job_group) < 2
                or len(self._job_group) <= cfg.reopt_max_jobs):  # the neighbourhood re-optimisation sees them all
            return None
        st = self.plan_state
        if len(st.duals) > 2 * len(self._job_group) + 64:  # departed jobs' entries
            st.duals = {j: v for j, v in st.duals.items() if j in self._job_group}
            st.floor = {j: v for j, v in st.floor.items() if j in self._job_group}
        cost, est = self.plan_gap()
        gap = cost / est - 1.0 if est > 0 else math.inf
        if st.gap_ref is not None:
            st.gap_ref = min(st.gap_ref, gap)  # the reference follows the gap down: only growth triggers
            if gap < st.gap_ref + cfg.plan_gap_trigger and not force:
                return None
        return self._capture(cost, est, frozenset(fresh), only_fresh=force and (st.gap_ref is not None
                                                                          and gap < st.gap_ref + cfg.plan_gap_trigger))

    def _capture(self, cost: float, est: float, fresh: frozenset, only_fresh: bool = False) -> PlanRequest:
        cap = self.config.plan_max_jobs
        gids = list(self._groups)
        if len(self._job_group) > cap:
            def excess(gid: str) -> float:
                g = self._groups[gid].group
                return self._group_usd_per_h(g) - sum(self._estimate(m) for m in g.members)

            gids = self._whole_groups(sorted(gids, key=lambda gid: (-excess(gid), self._ordinal[gid])), cap)
        pinned = (frozenset(j for gid in gids for j in self._groups[gid].group.job_ids) - fresh if only_fresh
                  else self.pinned_jobs())
        hood = self._hood_of(gids, pinned)
        inside = {j for s in hood.job_sets.values() for j in s}
        return PlanRequest(hood=hood, fresh=frozenset(j for j in fresh if j in inside), cost_usd_per_h=cost,
                           estimate_usd_per_h=est, version=self._version)

    # --- the search ---------------------------------------------------------------------------------
    def plan_global(self, req: PlanRequest, *, solver) -> GlobalPlan:
        """The target partition of ``req``'s window and the migrations toward it (module docstring,
        step 2). ``solver``: the caller's :class:`rollmux.baselines.OptimalPartition` (its layout
        cache and LP column pool are reused across plans; ``per_job`` as the groups are priced:
        on where :attr:`group_price` runs a job alone on its own allocation). Reads only ``req``,
        the cluster and the config. Deterministic: budgets are counts and CP-SAT's deterministic
        time, never the wall clock."""
        from rollmux.baselines import solve_set_partition
        from rollmux.partition_bound import BoundBudget, lp_lower_bound

        cfg, hood = self.config, req.hood
        ids = sorted(j.job_id for j, _ in hood.members)
        idset = set(ids)
        by_id = {j.job_id: (j, p) for j, p in hood.members}
        current = {hood.job_sets[gid]: gid for gid in hood.groups}
        prices = {s: hood.prices[gid] for s, gid in current.items()}
        before = sum(prices.values())
        budget = BoundBudget(max_iterations=cfg.plan_lp_iterations, max_layouts=cfg.plan_lp_layouts,
                             time_limit_s=math.inf, cut_rounds=0)
        b = lp_lower_bound(solver, list(hood.members), seed_columns=list(current), extra_columns=prices, budget=budget,
                           keep_pool=True, farley=False)
        # the master's columns with a layout to build (today's groups need none)
        cols: dict[frozenset, float] = {}
        for k, c in solver._lp_pool.items():
            if k <= idset and (k in current or self._layout_of(solver, k) is not None):
                cols[k] = prices.get(k, c)
        for k, c in prices.items():
            cols[k] = c
        cap = cfg.plan_master_columns
        if 0 < cap < len(cols):  # the restricted master: today's groups and the least reduced costs
            cols = restricted_master(cols, current, b.duals, cap)
        copy = self._copy_weights(hood, req.fresh)
        where = {j: gid for gid, js in hood.job_sets.items() for j in js}
        price = self.copy_price()

        def penalty(k: frozenset) -> float:
            """The copy price of a new group: its members' copies but the largest block of one old
            group (the most a succession can keep in place)."""
            block: dict[str, float] = {}
            for j in sorted(k):  # sorted: the same float sums whatever order the frozenset yields
                block[where[j]] = block.get(where[j], 0.0) + copy[j]
            return price * (sum(block.values()) - max(block.values()))

        forbidden: set = set()
        orders: dict = {}
        for _ in range(MASTER_ROUNDS):
            keys, units = [], []
            for k, c in cols.items():
                if k not in current and (k in forbidden or any(j in hood.pinned for j in k)
                                         and not self._best_case(hood, self._layout_of(solver, k), req.fresh, copy, orders)):
                    continue
                keys.append(k)
                units.append(int(round(1000.0 * (c + (0.0 if k in current else penalty(k))))))
            picked, _, _ = solve_set_partition(keys, units, ids, cfg.plan_deterministic_s,
                                               hint=[k in current for k in keys])
            target = list(current) if picked is None else [keys[i] for i in picked]
            bad = set()
            for old_sets, new_sets in _exchanges(current, target):
                sub = self._sub_hood(hood, [current[k] for k in old_sets])
                if self.checked_groups(sub, [self._layout_of(solver, k) for k in new_sets], req.fresh, orders, copy) is None:
                    # the new groups that fail with their best succession alone, else (the successions
                    # compete for one old group) all of the exchange's
                    mine = {k for k in new_sets if not self._best_case(sub, self._layout_of(solver, k), req.fresh, copy, orders)}
                    bad |= mine or set(new_sets)
            if not bad:
                break
            forbidden |= bad
        migrations, left = [], {"move_price": 0, "checks": 0}
        after_all = sum(prices[k] for k in target if k in current)
        for old_sets, new_sets in _exchanges(current, target):
            gids = tuple(current[k] for k in old_sets)
            sub = self._sub_hood(hood, gids)
            old_price = sum(prices[k] for k in old_sets)
            checked = self.checked_groups(sub, [self._layout_of(solver, k) for k in new_sets], req.fresh, orders, copy)
            if checked is None:
                left["checks"] += 1
                after_all += old_price
                continue
            groups, succ = checked
            after = sum(self._group_usd_per_h(g) for g, _ in groups)
            stay = {j for _, kept, _ in succ for j in kept}
            movers = [j for k in new_sets for j in k if j not in stay]
            cp = math.fsum(copy[j] for j in movers)  # movers follow frozenset order: an exactly rounded sum
            saving = old_price - after
            if not self.pays(saving, cp):
                left["move_price"] += 1
                after_all += old_price
                continue
            fresh = frozenset(j for k in old_sets for j in k if j in req.fresh)
            plan = ReoptPlan(hood=sub, fresh=fresh, groups=groups, before_usd_per_h=old_price, after_usd_per_h=after,
                             successions=succ)
            migrations.append(Migration(plan=plan, copy_s=cp, saving_usd_per_h=saving))
            after_all += after
        # most saving per second of copy first
        migrations.sort(key=lambda m: (-(m.saving_usd_per_h / m.copy_s) if m.copy_s > 0 else -math.inf,
                                       min(m.plan.hood.groups)))
        return GlobalPlan(request=req, bound_usd_per_h=b.bound_usd_per_h, current_usd_per_h=before,
                          target_usd_per_h=after_all, duals=dict(b.duals), migrations=tuple(migrations),
                          left_out={k: v for k, v in left.items() if v})

    @staticmethod
    def _sub_hood(hood: ReoptHood, gids) -> ReoptHood:
        """The part of ``hood`` made of the groups ``gids``."""
        gids = tuple(gids)
        js = {j for gid in gids for j in hood.job_sets[gid]}
        return ReoptHood(groups=gids, members=tuple(m for m in hood.members if m[0].job_id in js),
                         costs={g: hood.costs[g] for g in gids}, job_sets={g: hood.job_sets[g] for g in gids},
                         prices={g: hood.prices[g] for g in gids}, pinned=hood.pinned,
                         placements={j: p for j, p in hood.placements.items() if j in js})

    @staticmethod
    def _layout_of(solver, key: frozenset):
        g = solver._layouts.get(key)
        return solver._cols.get(key) if g is None else g

    # --- the commit ---------------------------------------------------------------------------------
    def apply_global(self, plan: GlobalPlan, started=frozenset()) -> list[dict]:
        """Commit ``plan``'s migrations (module docstring, step 3), each only when its groups are
        still as planned on (:meth:`RepackMixin.apply_reoptimise`) and none of the jobs it planned
        as fresh has started since (``started``: their copies were not planned for); a stale one is
        dropped and counted in ``plan_state.stale``. Then the plan's duals enter the estimate.
        Returns the moves committed, in order (the form of :meth:`RepackMixin.reoptimise`'s)."""
        st = self.plan_state
        st.plans += 1
        moves: list[dict] = []
        for mig in plan.migrations:
            ok = not mig.plan.fresh_ids & frozenset(started)
            got = self.apply_reoptimise(mig.plan, source="plan") if ok else []
            if got:
                st.applied += 1
                moves += got
            else:
                st.stale += 1
        # the estimate: the plan's duals for its jobs, the others' floors scaled as the plan's
        fl = sum(self._floor_of(j, p) for j, p in plan.request.hood.members)
        st.duals.update(plan.duals)
        dual_sum = sum(plan.duals.values())
        if fl > 0 and dual_sum > 0:
            st.scale = dual_sum / fl
        cost, est = self.plan_gap()
        st.gap_ref = cost / est - 1.0 if est > 0 else math.inf
        return moves


def restricted_master(cols: dict[frozenset, float], current, duals: dict[str, float], cap: int) -> dict[frozenset, float]:
    """The restricted master's columns: every column in ``current`` (today's groups) and the
    others of least reduced cost ``price - sum of the members' duals`` ($/h), ``cap`` columns in
    all (today's groups count; at least today's groups). Ties go to the sorted member names. The
    dual sum is exactly rounded (``math.fsum``), so the choice does not depend on the order a
    frozenset yields its members, which changes with the interpreter's string hash seed: the same
    plan on every host and process. ``cols`` maps a column (job ids) to its price, $/h; the result
    keeps its order."""
    rc = sorted((c - math.fsum(duals.get(j, 0.0) for j in k), sorted(k), k) for k, c in cols.items() if k not in current)
    keep = {k for _, _, k in rc[:max(0, cap - len(current))]}
    return {k: c for k, c in cols.items() if k in current or k in keep}


def _exchanges(current: dict, target: list) -> list[tuple[list, list]]:
    """The independent exchanges between today's groups (``current``: job set -> group id) and the
    target partition (job sets over the same jobs): the connected components of the two
    partitions' overlap, each as (today's job sets, the target's new job sets), skipping the
    target's sets that are groups today. Deterministic order (by the least job id)."""
    parent: dict = {}

    def find(x):
        return find_root(parent, x)

    for part in (list(current), target):
        for k in part:
            js = sorted(k)
            for j in js[1:]:
                ra, rb = find(js[0]), find(j)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    comps: dict = {}
    for k in current:
        comps.setdefault(find(min(k)), ([], []))[0].append(k)
    for k in target:
        if k not in current:
            comps.setdefault(find(min(k)), ([], []))[1].append(k)
    return [(sorted(o, key=min), sorted(n, key=min)) for r, (o, n) in sorted(comps.items()) if n]
