"""Re-partitioning existing groups, the part of :class:`rollmux.admission.InterGroupScheduler`
that moves admitted jobs: departure re-packing (:meth:`RepackMixin.repack`) and the bounded
exact re-optimisation of an event's neighbourhood (:meth:`RepackMixin.reoptimise`), both with an
exact rollback of the scheduler's state (``_save`` / ``_load``).

A mixin of the scheduler (one class, two files): it uses the scheduler's own state (``_groups``,
``_open``, ``_closed``, ``_job_group``, ``_pools``, ``_index``, ``_small``, ``_small_key``,
``_ordinal``, ``_next_group``, ``_version``, ``_rng``) and its ``decide`` / ``commit`` /
``depart`` / ``_set_group``. Source: extension of RollMux §4.2 Alg. 1 (the paper only admits;
its offline optimum re-partitions at every event, RollMux §7.5 "Opt").
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from rollmux import profiler
from rollmux.admission.decisions import placement_dict
from rollmux.admission.groups import summarise_group
from rollmux.admission.order import OrderChoice, best_round_robin_order
from rollmux.admission.rules import within
from rollmux.intra_group import coexec_times
from rollmux.models import CoExecutionGroup, GroupMember, Placement


@dataclass(frozen=True)
class ReoptHood:
    """A neighbourhood of :meth:`RepackMixin.reoptimise`, as values: its group ids (in order),
    every member's ``(spec, profile)``, each group's $/h (its nodes' price, and the price it
    runs at: ``InterGroupScheduler.group_price`` where set) and job-id set when it was captured."""

    groups: tuple[str, ...]
    members: tuple[tuple, ...]
    costs: dict[str, float]
    job_sets: dict[str, frozenset]
    prices: dict[str, float]


@dataclass(frozen=True)
class ReoptPlan:
    """A re-partition of a :class:`ReoptHood`: the new groups (each with its round-robin
    :class:`rollmux.admission.order.OrderChoice`) and the neighbourhood's $/h before and after."""

    hood: ReoptHood
    fresh: Optional[str]
    groups: tuple[tuple[CoExecutionGroup, OrderChoice], ...]
    before_usd_per_h: float
    after_usd_per_h: float


class RepackMixin:
    """Departure re-packing and neighbourhood re-optimisation of :class:`InterGroupScheduler`."""

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

    def after_departure(self, group_id: str, *, solver) -> list[dict]:
        """What the policy does after :meth:`depart` took a job out of ``group_id``, in order:
        :meth:`keep_slos` (the members left keep their SLOs), :meth:`repack` (small groups dissolve
        into others) and :meth:`reoptimise` (the neighbourhood re-partitioned; ``solver`` as
        there). The simulator and the cluster's GlobalScheduler both call this. Returns every
        move committed, in order (the shape of :meth:`repack`'s)."""
        moves = self.keep_slos(group_id)
        moves += self.repack(group_id)
        moves += self.reoptimise(group_id, solver=solver)
        return moves

    def keep_slos(self, group_id: str) -> list[dict]:
        """After a departure from ``group_id``: make every remaining member keep its SLO again.

        In the steady state a departure cannot lengthen the cadence of the members left: their
        round-robin waits are a subset of those the group had, and admission checked the group
        with the departed job in it. The re-check is kept as a defence for everything admission
        did not see: profiles refined by measurements since (:meth:`update_profile`), or a
        group whose admission check ran under older settings (a restored checkpoint). It runs on
        the same worst-case model as admission (:func:`best_round_robin_order`, every member
        ``T_coexec_k <= slo_k x T_solo_k``): when some round-robin order keeps every member, the
        group takes that order (no job moves); when none does, the at-risk member (or a
        neighbour) moves out by the SLO watch's options (:func:`rollmux.admission.slo_watch.watch`
        on the planning profiles: move, scale-out or a new group of its own, cheapest first). A
        bounded cluster without room changes nothing. Only policies that re-pack on departure
        (``"rollmux"`` with ``repack_on_departure``) do this; the paper's Alg. 1 does not.

        Returns:
            the moves committed (as :meth:`repack`; ``[]`` when the group still keeps every SLO,
            was re-ordered, is gone, or nothing fits). Raises nothing for an unknown group.
        Source: extension of RollMux §4.2 Alg. 1 (the paper checks SLOs at admission only).
        """
        if not self.spec.repacks or not self.config.repack_on_departure or group_id not in self._groups:
            return []
        g = self._groups[group_id].group
        if len(g.members) < 2:
            return []
        overhead = self.config.planned_rollout_overhead_s
        oc = best_round_robin_order(g.members, rollout_overhead_s=overhead)  # the current order first
        if oc.feasible:
            if [m.spec.job_id for m in oc.members] != list(g.job_ids):  # another order keeps every SLO
                self._set_group(group_id, summarise_group(g.model_copy(update={"members": tuple(oc.members)}), self.cluster))
                self._groups[group_id].coexec = dict(oc.t_coexec_s)
                self._version += 1
            return []
        from rollmux.admission.slo_watch import watch  # slo_watch drives this scheduler's methods

        def planned(grp: CoExecutionGroup) -> dict[str, float]:
            t = coexec_times(grp.members, rollout_overhead_s=overhead)
            return {m.spec.job_id: t[m.spec.job_id] / m.profile.t_solo_s for m in grp.members}

        act = watch(self, group_id, planned)
        return [] if act is None else list(act.moves)

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
            {rollout_nodes, train_nodes}, from_placement (its nodes in ``from_group``, same form),
            move_s, saved_usd_per_h}`` (``saved_usd_per_h``: the $/h the dissolution of
            ``from_group`` saved, repeated on each of its moves).
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
                        or not within(d.predicted_slowdowns.get(m.spec.job_id, math.inf) + mv / m.profile.t_solo_s, m.spec.slo)):
                    ok = False
                    break
                self.commit(d)
                if self.slo_guard is not None and not self.slo_guard(self._groups[d.group_id].group):
                    ok = False
                    break
                plan.append({"job_id": m.spec.job_id, "from_group": gid, "to_group": d.group_id,
                             "placement": placement_dict(d.placement), "from_placement": placement_dict(m.placement),
                             "move_s": mv})
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

        It is the three steps below in a row; a caller that must not hold its lock through the
        solve (the cluster's GlobalScheduler) calls them apart: :meth:`reopt_neighbourhood`
        (cheap, reads the table), :meth:`plan_reoptimise` (the solve; reads only the neighbourhood
        it is given, so the table may change meanwhile) and :meth:`apply_reoptimise` (commits the
        plan only if the neighbourhood's groups are still as they were planned on).

        Returns:
            the moves committed: ``{job_id, from_group, to_group, placement {rollout_nodes,
            train_nodes}, from_placement, move_s, saved_usd_per_h}`` (as :meth:`repack`); a move of ``fresh`` has
            ``move_s`` 0 (nothing to copy).
        Source: extension of RollMux §4.2 Alg. 1 towards the optimum that re-partitions at every
        event (RollMux §7.5 "Opt"), bounded to a neighbourhood.
        """
        hood = self.reopt_neighbourhood(trigger_group)
        plan = None if hood is None else self.plan_reoptimise(hood, fresh, solver=solver)
        return [] if plan is None else self.apply_reoptimise(plan)

    def reopt_neighbourhood(self, trigger_group: Optional[str] = None) -> Optional["ReoptHood"]:
        """The neighbourhood :meth:`reoptimise` re-partitions (``trigger_group`` first, then the
        most idle groups, whole groups, at most ``config.reopt_max_jobs`` jobs), captured as
        values; None when re-optimisation is off or fewer than two groups qualify. O(groups)."""
        cap = self.config.reopt_max_jobs
        if not self.spec.repacks or not self.config.repack_on_departure or cap < 2 or len(self._groups) < 2:
            return None
        hood: list[str] = []
        n = 0
        first = [trigger_group] if trigger_group in self._groups else []
        rest = heapq.nsmallest(3 * cap, (gid for gid in self._groups if gid != trigger_group),
                               key=lambda gid: (-self._idle_for_reopt(gid), len(self._groups[gid].group.members),
                                                self._ordinal[gid]))
        for gid in first + rest:
            k = len(self._groups[gid].group.members)
            if n + k <= cap:
                hood.append(gid)
                n += k
            if n >= cap:
                break
        if len(hood) < 2:
            return None
        return ReoptHood(groups=tuple(hood),
                         members=tuple((m.spec, m.profile) for gid in hood for m in self._groups[gid].group.members),
                         costs={gid: self._groups[gid].cost for gid in hood},
                         job_sets={gid: frozenset(self._groups[gid].group.job_ids) for gid in hood},
                         prices={gid: self._group_usd_per_h(self._groups[gid].group) for gid in hood})

    def _idle_for_reopt(self, gid: str) -> float:
        """A group's idle fraction of node time, 0 for one running on a cheaper own allocation
        (``group_price`` below its nodes' price: it has no idle nodes to fill)."""
        g = self._groups[gid]
        if self.group_price is not None and len(g.group.members) == 1 and self.group_price(g.group) < g.cost - 1e-9:
            return 0.0
        return g.idle_fraction

    def _group_usd_per_h(self, g: CoExecutionGroup) -> float:
        """The $/h ``g`` runs at: ``group_price(g)`` where the owner set one, else its nodes' price."""
        return g.cost_usd_per_h(self.cluster) if self.group_price is None else self.group_price(g)

    def plan_reoptimise(self, hood: "ReoptHood", fresh: Optional[str] = None, *, solver) -> Optional["ReoptPlan"]:
        """The re-partition of ``hood`` that :meth:`reoptimise` would take (every new group with
        its round-robin order), or None when none lowers the neighbourhood's $/h with every SLO
        held. Reads only ``hood``, the cluster and the config (never the group table), so it may
        run while the table changes; ``solver`` is the caller's (it caches layouts)."""
        members = list(hood.members)
        before = sum(hood.prices.values())
        current = {hood.job_sets[gid]: gid for gid in hood.groups}

        def gain(groups: Sequence[CoExecutionGroup]) -> tuple[list[CoExecutionGroup], float]:
            """The new groups of a partition of the neighbourhood and its $/h (kept groups at their cost)."""
            new = [g for g in groups if frozenset(g.job_ids) not in current]
            kept = [current[frozenset(g.job_ids)] for g in groups if frozenset(g.job_ids) in current]
            return new, sum(hood.prices[gid] for gid in kept) + sum(self._group_usd_per_h(g) for g in new)

        overhead = self.config.planned_rollout_overhead_s
        orders: dict[tuple[str, ...], Optional[OrderChoice]] = {}

        def movable(g: CoExecutionGroup) -> Optional[OrderChoice]:
            """A new group's round-robin order when it passes the checks below (feasible, every moved
            job's SLO absorbs its copy), else None; searched once per member list."""
            key = tuple(g.job_ids)
            if key not in orders:
                oc = best_round_robin_order(g.members, rollout_overhead_s=overhead)
                ok = oc.feasible and all(
                    within((oc.t_coexec_s[m.spec.job_id]
                            + (0.0 if m.spec.job_id == fresh else profiler.move_time_s(m.spec, self.cluster)))
                           / m.profile.t_solo_s, m.spec.slo)
                    for m in oc.members)
                if ok and self.slo_guard is not None:
                    ok = self.slo_guard(g.model_copy(update={"members": tuple(oc.members)}))
                orders[key] = oc if ok else None
            return orders[key]

        # Any partition the checks below would take is cheaper than the target and uses only new
        # groups that pass them: when the bound over those proves none is, nothing changes. The
        # margin covers float summation order; within it the exact solve decides.
        target = before - 1e-6 + 1e-9 * (1.0 + before)
        if solver.partition_floor(members, {s: hood.prices[gid] for s, gid in current.items()}, target,
                                  keeps=lambda g: movable(g) is not None) >= target:
            return None

        def unchanged(groups: Sequence[CoExecutionGroup]) -> bool:
            new, after = gain(groups)
            return not new or after >= before - 1e-6

        # the solver may skip choosing among tied optima when none of them would change anything
        res = solver.solve(members, indifferent=unchanged)
        if unchanged(res.groups):
            return None
        new, after = gain(res.groups)
        plans = []
        for g in new:
            oc = movable(g)
            if oc is None:
                return None
            plans.append((g, oc))
        return ReoptPlan(hood=hood, fresh=fresh, groups=tuple(plans), before_usd_per_h=before, after_usd_per_h=after)

    def apply_reoptimise(self, plan: "ReoptPlan") -> list[dict]:
        """Commit ``plan`` (:meth:`plan_reoptimise`): the moved jobs leave their groups and the
        plan's groups get new ids and nodes from the pools. Nothing changes (``[]``) when a group
        of the planned neighbourhood is gone or has other members or another cost now, or a
        bounded cluster has no room for the new layout. Returns the moves as :meth:`reoptimise`."""
        for gid in plan.hood.groups:
            g = self._groups.get(gid)
            if g is None or frozenset(g.group.job_ids) != plan.hood.job_sets[gid] or g.cost != plan.hood.costs[gid]:
                return []
        fresh, before, after = plan.fresh, plan.before_usd_per_h, plan.after_usd_per_h
        plans = list(plan.groups)
        saved = self._save()
        origin = {m.spec.job_id: self._job_group[m.spec.job_id] for g, _ in plans for m in g.members}
        was = {j: placement_dict(self.member(j).placement) for j in origin}  # its nodes before the move
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
            self._set_group(gid, summarise_group(grp, self.cluster))
            self._groups[gid].coexec = dict(oc.t_coexec_s)
            for m in mems:
                self._job_group[m.spec.job_id] = gid
                moves.append({"job_id": m.spec.job_id, "from_group": origin[m.spec.job_id], "to_group": gid,
                              "placement": placement_dict(m.placement), "from_placement": was[m.spec.job_id],
                              "move_s": 0.0 if m.spec.job_id == fresh else profiler.move_time_s(m.spec, self.cluster)})
        self._version += 1
        return [dict(mv, saved_usd_per_h=before - after) for mv in moves]

