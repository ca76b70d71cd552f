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
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from rollmux import profiler
from rollmux.admission.decisions import placement_dict
from rollmux.admission.groups import summarise_group
from rollmux.admission.inherit import successions
from rollmux.admission.order import OrderChoice, best_round_robin_order
from rollmux.admission.rules import within
from rollmux.intra_group import coexec_times
from rollmux.models import CoExecutionGroup, GroupMember, Placement
from rollmux.nodes import node_index


@dataclass(frozen=True)
class ReoptHood:
    """A neighbourhood of :meth:`RepackMixin.reoptimise`, as values: its group ids (in order),
    every member's ``(spec, profile)``, each group's $/h (its nodes' price, and the price it
    runs at: ``InterGroupScheduler.group_price`` where set) and job-id set when it was captured;
    ``pinned``: the jobs that may not move now (their move cap, ``max_moves_per_job_per_h``,
    is reached), so no new group may hold them."""

    groups: tuple[str, ...]
    members: tuple[tuple, ...]
    costs: dict[str, float]
    job_sets: dict[str, frozenset]
    prices: dict[str, float]
    pinned: frozenset = frozenset()
    placements: dict = field(default_factory=dict)  # job -> (rollout nodes, training nodes) now


@dataclass(frozen=True)
class ReoptPlan:
    """A re-partition of a :class:`ReoptHood`: the new groups (each with its round-robin
    :class:`rollmux.admission.order.OrderChoice`) and the neighbourhood's $/h before and after.
    ``fresh``: the jobs that have not started (no state to copy: a move costs them nothing), a
    job id or a set of them. ``successions``: per new group, the old group whose nodes and id it
    takes over, the members that stay on their nodes (they do not move) and the layout's node
    names for theirs (:func:`rollmux.admission.inherit.successions`); empty: every new group on
    fresh nodes, every member moved."""

    hood: ReoptHood
    fresh: Union[None, str, frozenset]
    groups: tuple[tuple[CoExecutionGroup, OrderChoice], ...]
    before_usd_per_h: float
    after_usd_per_h: float
    successions: tuple = ()

    @property
    def fresh_ids(self) -> frozenset:
        """``fresh`` as a set of job ids."""
        f = self.fresh
        return frozenset() if f is None else frozenset([f]) if isinstance(f, str) else frozenset(f)


class RepackMixin:
    """Departure re-packing and neighbourhood re-optimisation of :class:`InterGroupScheduler`."""

    def _save(self) -> tuple:
        return (dict(self._groups), dict(self._open), dict(self._closed), dict(self._job_group),
                {k: (list(p.free), p.next, p.used) for k, p in self._pools.items()},
                self._next_group, self._version, self._rng.getstate() if self.spec.draws_random else None, self._index.copy(),
                list(self._small), dict(self._small_key))

    def _load(self, saved: tuple) -> None:
        g, o, c, jg, pools, ng, v, rng, index, small, small_key = saved
        self._groups, self._open, self._closed, self._job_group, self._index = g, o, c, jg, index
        self._groups_tuple = None  # :attr:`groups` of the restored table (a what-if may have read its own)
        self._small, self._small_key = small, small_key
        for k, (free, nxt, used) in pools.items():
            p = self._pools[k]
            p.free, p.next, p.used = free, nxt, used
        self._next_group = ng
        if rng is not None:
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
        self.note_moves(moves)  # (the re-optimisation's own moves are noted where they are applied)
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
        return [] if act is None else [dict(mv, source="slo") for mv in act.moves]

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
        pinned = self.pinned_jobs()
        price = self.copy_price()
        for gid in cands:
            if gid not in self._groups or any(j in pinned for j in self._groups[gid].group.job_ids):
                continue
            grp = self._groups[gid].group
            # a dissolution saves at most the group's $/h and moves every member: skip what cannot pay
            copy_s = sum(profiler.move_time_s(m.spec, self.cluster) for m in grp.members)
            if self._groups[gid].cost <= price * copy_s + 1e-6:
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
            if ok and after < before - 1e-9 and self.pays(before - after, sum(mv["move_s"] for mv in plan)):
                moves += [dict(mv, saved_usd_per_h=before - after, source="repack") for mv in plan]
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
        first = [trigger_group] if trigger_group in self._groups else []
        rest = heapq.nsmallest(3 * cap, (gid for gid in self._groups if gid != trigger_group),
                               key=lambda gid: (-self._idle_for_reopt(gid), len(self._groups[gid].group.members),
                                                self._ordinal[gid]))
        hood = self._whole_groups(first + rest, cap)
        if len(hood) < 2:
            return None
        return self._hood_of(hood, self.pinned_jobs())

    def _whole_groups(self, ordered, cap: int) -> list[str]:
        """The groups of ``ordered`` taken in order, whole, while their jobs fit ``cap``."""
        out: list[str] = []
        n = 0
        for gid in ordered:
            k = len(self._groups[gid].group.members)
            if n + k <= cap:
                out.append(gid)
                n += k
            if n >= cap:
                break
        return out

    def _hood_of(self, gids, pinned: frozenset) -> "ReoptHood":
        """The groups ``gids`` of the table captured as a :class:`ReoptHood` (values only)."""
        gids = tuple(gids)
        return ReoptHood(groups=gids,
                         members=tuple((m.spec, m.profile) for gid in gids for m in self._groups[gid].group.members),
                         costs={gid: self._groups[gid].cost for gid in gids},
                         job_sets={gid: frozenset(self._groups[gid].group.job_ids) for gid in gids},
                         prices={gid: self._group_usd_per_h(self._groups[gid].group) for gid in gids},
                         pinned=pinned, placements=self._placements(gids))

    def _placements(self, gids) -> dict:
        """job -> (rollout nodes, training nodes) of every member of the groups ``gids``."""
        return {m.spec.job_id: (m.placement.rollout_nodes, m.placement.train_nodes)
                for gid in gids for m in self._groups[gid].group.members}

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

    def movable_order(self, g: CoExecutionGroup, nocopy: frozenset = frozenset(), pinned: frozenset = frozenset(),
                      cache: Optional[dict] = None) -> Optional[OrderChoice]:
        """The round-robin order of a new group ``g`` when it passes the checks every move passes,
        else None: some order is feasible, every member that moves absorbs its host-state copy in
        its SLO (``slowdown + move_s / T_solo <= slo``, :func:`rollmux.profiler.move_time_s`; the
        jobs of ``nocopy`` copy nothing: they have not started, or they stay on their nodes), no
        member that moves is ``pinned`` (at its move cap) and ``slo_guard`` (measured profiles)
        accepts the group. ``cache``: by member list and ``nocopy``, so each is searched once. The
        neighbourhood re-optimisation and the global plan both check so."""
        key = (tuple(g.job_ids), frozenset(nocopy.intersection(g.job_ids)))
        if cache is not None and key in cache:
            return cache[key]
        oc: Optional[OrderChoice] = None
        if not any(j in pinned and j not in nocopy for j in key[0]):
            oc = best_round_robin_order(g.members, rollout_overhead_s=self.config.planned_rollout_overhead_s)
            ok = oc.feasible and all(
                within((oc.t_coexec_s[m.spec.job_id]
                        + (0.0 if m.spec.job_id in nocopy else profiler.move_time_s(m.spec, self.cluster)))
                       / m.profile.t_solo_s, m.spec.slo)
                for m in oc.members)
            if ok and self.slo_guard is not None:
                ok = self.slo_guard(g.model_copy(update={"members": tuple(oc.members)}))
            oc = oc if ok else None
        if cache is not None:
            cache[key] = oc
        return oc

    def _copy_weights(self, hood: "ReoptHood", fresh: frozenset) -> dict[str, float]:
        """Per job of ``hood``: the seconds of host-state copy a move costs it (0 when fresh)."""
        return {j.job_id: 0.0 if j.job_id in fresh else profiler.move_time_s(j, self.cluster) for j, _ in hood.members}

    def checked_groups(self, hood: "ReoptHood", new: Sequence[CoExecutionGroup], fresh: frozenset,
                       cache: Optional[dict] = None, weight: Optional[dict] = None) -> Optional[tuple[tuple, tuple]]:
        """The new groups of a re-partition of ``hood`` with their successions
        (:func:`rollmux.admission.inherit.successions`: which old group's nodes each takes over,
        which members stay) and their round-robin orders, when every one passes
        :meth:`movable_order` (a member that stays copies nothing); else None. Returns
        ``(((group, order), ...), (succession, ...))``."""
        weight = self._copy_weights(hood, fresh) if weight is None else weight
        succ = ([successions([g], hood.job_sets, hood.placements, self._keep_first(g, weight))[0] for g in new]
                if hood.placements else [(None, frozenset(), {})] * len(new))
        if len(new) > 1 and len({s[0] for s in succ if s[0] is not None}) < sum(s[0] is not None for s in succ):
            # two new groups would take over one old group: one succession for all of them
            merged = {j: w for g in new for j, w in self._keep_first(g, weight).items()}
            succ = successions(new, hood.job_sets, hood.placements, merged)
        out = []
        for g, (_, kept, _) in zip(new, succ):
            oc = self.movable_order(g, fresh | kept, hood.pinned, cache)
            if oc is None:
                return None
            out.append((g, oc))
        return tuple(out), tuple(succ)

    def _keep_first(self, g: CoExecutionGroup, weight: dict) -> dict:
        """``weight`` (copy seconds) for the members of ``g``, raised far above every copy for the
        members whose SLO cannot absorb their copy in ``g`` (so a succession keeps them first)."""
        tco = coexec_times(g.members, rollout_overhead_s=self.config.planned_rollout_overhead_s)
        out = {}
        for m in g.members:
            j = m.spec.job_id
            w = weight.get(j, 0.0)
            out[j] = w + (1e6 if w > 0 and not within((tco[j] + w) / m.profile.t_solo_s, m.spec.slo) else 0.0)
        return out

    def _best_case(self, hood: "ReoptHood", g: CoExecutionGroup, fresh: frozenset, weight: dict, cache: dict) -> bool:
        """Whether ``g`` could pass :meth:`movable_order` as a new group of a re-partition of
        ``hood``: with its best succession alone (the old group it keeps most of)."""
        ((_, kept, _),) = (successions([g], hood.job_sets, hood.placements, self._keep_first(g, weight))
                           if hood.placements else [(None, frozenset(), {})])
        return self.movable_order(g, fresh | kept, hood.pinned, cache) is not None

    def plan_reoptimise(self, hood: "ReoptHood", fresh: Optional[str] = None, *, solver) -> Optional["ReoptPlan"]:
        """The re-partition of ``hood`` that :meth:`reoptimise` would take (every new group with
        its round-robin order and succession), or None when none lowers the neighbourhood's $/h
        with every SLO held. Reads only ``hood``, the cluster and the config (never the group
        table), so it may run while the table changes; ``solver`` is the caller's (it caches layouts)."""
        members = list(hood.members)
        before = sum(hood.prices.values())
        current = {hood.job_sets[gid]: gid for gid in hood.groups}

        def gain(groups: Sequence[CoExecutionGroup]) -> tuple[list[CoExecutionGroup], float]:
            """The new groups of a partition of the neighbourhood and its $/h (kept groups at their cost)."""
            new = [g for g in groups if frozenset(g.job_ids) not in current]
            kept = [current[frozenset(g.job_ids)] for g in groups if frozenset(g.job_ids) in current]
            return new, sum(hood.prices[gid] for gid in kept) + sum(self._group_usd_per_h(g) for g in new)

        orders: dict = {}
        fresh_ids = frozenset() if fresh is None else frozenset([fresh])
        weight = self._copy_weights(hood, fresh_ids)

        # Any partition the checks below would take is cheaper than the target and uses only new
        # groups that could pass them: when the bound over those proves none is, nothing changes.
        # The margin covers float summation order; within it the exact solve decides.
        target = before - 1e-6 + 1e-9 * (1.0 + before)
        if solver.partition_floor(members, {s: hood.prices[gid] for s, gid in current.items()}, target,
                                  keeps=lambda g: self._best_case(hood, g, fresh_ids, weight, orders)) >= target:
            return None

        def unchanged(groups: Sequence[CoExecutionGroup]) -> bool:
            new, after = gain(groups)
            return not new or after >= before - 1e-6

        # the solver may skip choosing among tied optima when none of them would change anything
        res = solver.solve(members, indifferent=unchanged)
        if unchanged(res.groups):
            return None
        new, after = gain(res.groups)
        checked = self.checked_groups(hood, new, fresh_ids, orders, weight)
        if checked is None:
            return None
        stay = {j for _, kept, _ in checked[1] for j in kept}
        movers = [j for g in new for j in g.job_ids if j not in stay and weight[j] > 0]
        if not self.pays(before - after, sum(weight[j] for j in movers)):
            return None
        return ReoptPlan(hood=hood, fresh=fresh, groups=checked[0], before_usd_per_h=before, after_usd_per_h=after,
                         successions=checked[1])

    def apply_reoptimise(self, plan: "ReoptPlan", source: str = "reopt") -> list[dict]:
        """Commit ``plan`` (:meth:`plan_reoptimise`): the moved jobs leave their groups; a new group
        with a succession takes over its old group's id and nodes (the members that stay keep
        theirs, its other nodes are the old group's left free, then fresh ones), the others get new
        ids and nodes from the pools. Nothing changes (``[]``) when a group of the planned
        neighbourhood is gone or has other members, another cost or other placements now, or a
        bounded cluster has no room for the new layout. Returns the moves as :meth:`reoptimise`
        (the members that stay on their nodes do not move), each with ``source`` (what decided it:
        ``"reopt"``, or the caller's, e.g. ``"plan"``)."""
        for gid in plan.hood.groups:
            g = self._groups.get(gid)
            if g is None or frozenset(g.group.job_ids) != plan.hood.job_sets[gid] or g.cost != plan.hood.costs[gid]:
                return []
        fresh, before, after = plan.fresh_ids, plan.before_usd_per_h, plan.after_usd_per_h
        plans = list(plan.groups)
        succ = list(plan.successions) or [(None, frozenset(), {})] * len(plans)
        stay = {j for _, kept, _ in succ for j in kept}
        for j in stay:
            m = self.member(j)
            if plan.hood.placements.get(j) != (m.placement.rollout_nodes, m.placement.train_nodes):
                return []
        saved = self._save()
        origin = {m.spec.job_id: self._job_group[m.spec.job_id] for g, _ in plans for m in g.members
                  if m.spec.job_id not in stay}
        was = {j: placement_dict(self.member(j).placement) for j in origin}  # its nodes before the move
        freed: dict[str, list[str]] = {}
        for j in origin:
            freed.setdefault(origin[j], []).extend(self.depart(j))
        moves: list[dict] = []
        # successors first: the nodes their old groups left free are theirs
        for (g, oc), (old, kept, nmap) in sorted(zip(plans, succ), key=lambda x: x[1][0] is None):
            name = dict(nmap)
            for pool, nodes in (("rollout", g.rollout_nodes), ("train", g.train_nodes)):
                need = [x for x in nodes if x not in name]
                np_ = self._pools[pool]
                free = set(np_.free)
                own = [n for n in freed.get(old, ()) if n.startswith(pool + "-") and node_index(n) in free][:len(need)]
                np_.take(own)
                more = np_.peek(len(need) - len(own))
                if more is None:  # a bounded cluster without room for the new layout
                    self._load(saved)
                    return []
                np_.take(more)
                name.update(zip(need, own + more))
            if old is not None and old in self._groups:
                gid = old
            else:
                gid = f"group-{self._next_group}"
                self._next_group += 1
            mems = tuple(GroupMember(spec=m.spec, profile=m.profile, placement=Placement(
                job_id=m.spec.job_id, rollout_nodes=tuple(name[x] for x in m.placement.rollout_nodes),
                train_nodes=tuple(name[x] for x in m.placement.train_nodes))) for m in oc.members)
            if gid == old:  # the old group's nodes still held (its staying members') are the layout's now
                held = set(self._groups[gid].group.rollout_nodes) | set(self._groups[gid].group.train_nodes)
                for pool in ("rollout", "train"):
                    self._pools[pool].give([n for n in held if n.startswith(pool + "-") and n not in name.values()])
            grp = CoExecutionGroup(group_id=gid, rollout_nodes=tuple(name[x] for x in g.rollout_nodes),
                                   train_nodes=tuple(name[x] for x in g.train_nodes), members=mems)
            self._set_group(gid, summarise_group(grp, self.cluster))
            self._groups[gid].coexec = dict(oc.t_coexec_s)
            for m in mems:
                j = m.spec.job_id
                self._job_group[j] = gid
                if j in stay:
                    continue
                moves.append({"job_id": j, "from_group": origin[j], "to_group": gid,
                              "placement": placement_dict(m.placement), "from_placement": was[j],
                              "move_s": 0.0 if j in fresh else profiler.move_time_s(m.spec, self.cluster)})
        self._version += 1
        out = [dict(mv, saved_usd_per_h=before - after, source=source) for mv in moves]
        self.note_moves(out)
        return out
