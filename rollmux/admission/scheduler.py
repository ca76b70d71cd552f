"""The inter-group scheduler: :class:`InterGroupScheduler` keeps the co-execution groups of one
cluster and decides each arrival (Alg. 1 and the random / most-idle baselines; the module
docstring of :mod:`rollmux.admission` describes the steps). Re-packing and re-optimisation are
in :mod:`rollmux.admission.repack`. Source: RollMux §4.2, Alg. 1; §7.1 (baselines).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import time
from typing import Optional

from rollmux import profiler
from rollmux.codes import Code
from rollmux.admission.config import SchedulerConfig
from rollmux.admission.decisions import AdmissionDecision, Candidate, Newcomer
from rollmux.admission.filters import CANDIDATE_FILTERS, GROUP_FILTERS, JOB_FILTERS
from rollmux.admission.groups import GroupIndex, GroupSummary, NodePool, summarise_group
from rollmux.admission.order import slo_sim
from rollmux.admission.global_plan import GlobalPlanMixin
from rollmux.admission.repack import RepackMixin
from rollmux.admission.table_copy import TableCopyMixin
from rollmux.intra_group import coexec_times
from rollmux.models import ClusterSpec, CoExecutionGroup, GroupMember, JobSpec, PhaseProfile
from rollmux.nodes import node_index
from rollmux.policies import REGISTRY, PolicySpec, choose_min_cost as choose_min_cost_policy, group_number as _gnum, policy_spec

#: The group-forming admission policies: name -> description (a view of :data:`rollmux.policies.REGISTRY`).
POLICIES: dict[str, str] = {n: p.description for n, p in REGISTRY.items() if p.kind == "scheduler"}


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


class InterGroupScheduler(RepackMixin, GlobalPlanMixin, TableCopyMixin):
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
        self._groups: dict[str, GroupSummary] = {}
        self._groups_tuple: Optional[tuple[CoExecutionGroup, ...]] = None  # :attr:`groups`, until _set_group
        self._open: dict[str, GroupSummary] = {}  # groups a decision evaluates
        self._closed: dict[str, tuple[str, str]] = {}  # pruned groups: (plugin, reason)
        self._index = GroupIndex()  # the open groups by what the cheap filters read
        self._open_seq = 0  # opening order of the open groups (monotone)
        self._ordinal: dict[str, int] = {}  # creation order of each group id (= order of self._groups)
        self._small: list[tuple[int, float, int, str]] = []  # re-packing candidates, sorted: (members, Cost(G), ordinal, id)
        self._small_key: dict[str, tuple[int, float, int, str]] = {}
        self._job_group: dict[str, str] = {}
        self._pools = {"rollout": NodePool("rollout", cluster.rollout_pool.num_nodes),
                       "train": NodePool("train", cluster.train_pool.num_nodes)}
        self._next_group = 0
        self._version = 0
        #: optional check of a group on measured phase times (True: every member keeps its SLO),
        #: set by the SLO watch's owner (profile_source measured / blended); re-packing and
        #: re-optimisation then never form a group it refuses, so the watch and they never undo
        #: each other's moves (:mod:`rollmux.admission.slo_watch`)
        self.slo_guard = None
        #: optional $/h a group runs at where that differs from its nodes' price (the simulator's
        #: per-job allocations: a job alone may run on its own, cheaper allocation); read by the
        #: neighbourhood re-optimisation, which then prices its partitions so. None: the nodes' price
        self.group_price = None

    # --- queries -------------------------------------------------------------------------------
    @property
    def groups(self) -> tuple[CoExecutionGroup, ...]:
        out = self._groups_tuple
        if out is None:  # rebuilt after a change (every change goes through _set_group)
            out = self._groups_tuple = tuple(g.group for g in self._groups.values())
        return out

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
            # a given profile pipelines as the job's staleness bound says (rollmux.staleness)
            prof = profile.with_staleness(job.max_staleness) if profile is not None else profiler.estimate(job, self.cluster)
        except ValueError as e:
            return AdmissionDecision(job.job_id, False, Code.NEVER, str(e), self.policy)
        reason = self._never(job, prof)
        if reason:
            return AdmissionDecision(job.job_id, False, Code.NEVER, reason, self.policy, profile=prof)
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
            return AdmissionDecision(job.job_id, False, Code.RETRY_LATER, _no_placement_reason(cands, pruned),
                                     self.policy, _candidates=cands, _expand=expand, _pruned_src=pruned, profile=prof)
        return AdmissionDecision(
            job.job_id, True, Code.OK,
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

    def _candidate(self, g: GroupSummary, new: Newcomer, strategy: str) -> Candidate:
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
        add_t, add_r = p.t_train_node_s, p.t_roll_s
        ts_new, slo_new, nt, nr = p.t_solo_s, job.slo, new.train_nodes, new.rollout_nodes
        lbs = []
        for i, (g, st) in enumerate(pairs):
            x = max(ts_new, g.t_sorted[nt - 1] + add_t)
            if st == "direct":
                x = max(x, g.r_sorted[nr - 1] + add_r)
            lbs.append((max(g.pressure, x / ts_new / slo_new), i))
        lbs.sort()
        overhead = self.config.planned_rollout_overhead_s
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
                slo_sim(c, overhead)
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
                slo_sim(c, self.config.planned_rollout_overhead_s)
                if c.ok and (chosen is None or (c.score < chosen.score if most_slack else c.score > chosen.score)):
                    chosen = c
        return chosen

    # --- state changes -------------------------------------------------------------------------------
    def _set_group(self, gid: str, g: Optional[GroupSummary], seq: Optional[int] = None) -> None:
        """Store / drop a group and classify it as open or pruned (Alg. 1 line 4), so a decision
        only scans open groups. An open group goes last in the opening order, or at ``seq`` (its
        :meth:`open_seq` on the table this one copies; then call :meth:`_order_open`)."""
        self._groups_tuple = None
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
        if seq is None:
            self._open_seq += 1
            seq = self._open_seq
        else:
            self._open_seq = max(self._open_seq, int(seq))
        self._index.add(gid, int(seq), g)

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
        self._set_group(gid, summarise_group(grp, self.cluster))
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

    def update_profile(self, job_id: str, profile: PhaseProfile) -> bool:
        """Replace the planning profile of admitted job ``job_id`` (e.g. by its measured profile,
        :mod:`rollmux.measured`); its group's summary is rebuilt, nothing moves. Returns False when
        the profile is unchanged. Raises KeyError for an unknown job."""
        gid = self._job_group[job_id]
        old = self._groups[gid].group
        if next(m for m in old.members if m.spec.job_id == job_id).profile == profile:
            return False
        members = tuple(m.model_copy(update={"profile": profile}) if m.spec.job_id == job_id else m for m in old.members)
        self._set_group(gid, summarise_group(old.model_copy(update={"members": members}), self.cluster))
        self._version += 1
        return True

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
            self._set_group(gid, summarise_group(grp, self.cluster))
        else:
            self._set_group(gid, None)
        self._version += 1
        return sorted(rel_r + rel_t, key=lambda n: (n.split("-")[0], node_index(n)))
