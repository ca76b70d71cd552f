"""Trace-driven, event-driven simulator: replays job arrivals through a scheduling policy.

Model (RollMux §7.4–§7.5):

* A job's work is its trace duration at solo speed: ``iterations = duration_s / T_solo``, with
  ``T_solo`` its solo iteration time under the *realised* phase times.
* Between two events (an arrival or a departure) group membership is fixed: every job advances at
  ``1 / t_iter`` iterations per second, ``t_iter`` its realised co-execution iteration time in
  its current unit (:class:`rollmux.per_job_baselines.Unit`), obtained by simulating the group's
  round-robin meta-iterations (:func:`rollmux.intra_group.simulate_group`). When membership
  changes, the affected rates change. A job departs when its iterations are done; its unit
  releases GPUs (an empty group is dissolved by the scheduler).
* Realisation. Deterministic (default, as in the paper's simulation §7.5): realised phase times
  equal the worst-case planning times (``spec.measured`` of the drawn jobs). ``stochastic=True``:
  each job gets ``stochastic_samples`` seeded iterations from
  :func:`rollmux.profiler.sample_iteration` (long-tailed response lengths, clipped at the max
  tokens); groups are simulated on them with :class:`rollmux.intra_group.LongTailPolicy`
  migration, solo times are the mean of the same samples. The same job gets the same samples
  under every policy.
* Slowdown of a job = lifetime / trace duration (= lifetime-average co-execution iteration time
  over its realised solo time); its SLO is met iff slowdown <= ``spec.slo``.
* Cost: the sum of the units' $/h, integrated over time. ``avg_cost_usd_per_h`` divides the
  integral by the *common* horizon (the last departure over all policies of a run), so averages
  compare total spend. Bubble ratio per pool = idle GPU-seconds / provisioned GPU-seconds over the
  whole replay: busy GPU-seconds come from each unit's realised timeline
  (:func:`rollmux.occupancy.occupancy`: GPU-weighted, the union of busy intervals per node), from
  the unit's formation (an empty pipeline: warm-up counts) to its end, the steady-state rate
  continuing past the simulated window (:meth:`Realisation.busy_gpu_s`).
* Decision latency: wall time of each arrival's placement decision (the scheduler's own
  ``latency_ms``; the optimum's re-partition time; the per-job baselines' allocation time).
* The optimum re-partitions the active jobs at every event (offline, migrations free); it is
  exact up to ``exact_max_jobs`` active jobs, a labelled best-found upper bound beyond. Since its
  job set over time differs from an online policy's (departures depend on slowdowns), the
  clean comparison is ``cost_vs_optimal_exact``: during the online policy's own replay, the exact
  optimum of the *same* active jobs at the same instants, integrated where exact.

Differences from the paper's figures (reported, not tuned): job profiles are synthetic
(Table-6-style uniform phase times, since the paper's production trace is not public), SLOs are
U(1, 2) so many jobs tolerate little sharing, groups are formed in whole 8-GPU nodes, and
colocated / Gavel+ phase times come from this project's roofline, under which an H800 decodes
about as fast as an H20 (3.35 vs 4.0 TB/s HBM), so colocation is not penalised as heavily as
in the paper's testbed. In this work-conserving fluid model, SLO-blind over-packing (random,
most-idle) is cheap per unit of work: it trades slowdown for cost.

Modules: the realised phase times and group units are :mod:`rollmux.sim.realisation`, the
policies as the replay sees them :mod:`rollmux.sim.policies`, the replay's outcomes and the summary
:mod:`rollmux.sim.outcomes`; this module holds the replay and :func:`simulate` (``Realisation``,
``make_policy``, ``JobOutcome``, ``PolicyRun``, ``per_class`` and ``summarise`` are re-exported here).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from rollmux.admission import SchedulerConfig
from rollmux.baselines import OptimalPartition, Unit
from rollmux.partition_bound import BoundBudget, lp_lower_bound, master_incumbent_usd_per_h
from rollmux.intra_group import PhaseRecord, simulate_group
from rollmux.models import ClusterSpec
from rollmux.policies import POLICY_NAMES, check_policy, policy_spec
from rollmux.sim.async_jobs import StalenessTally
from rollmux.sim.outcomes import PAPER_RATIOS, JobOutcome, PolicyRun, per_class, summarise  # noqa: F401  (re-exported)
from rollmux.sim.policies import QUEUED_SOLO, OptimalPolicy, SimPolicy, make_policy
from rollmux.sim.realisation import Realisation
from rollmux.workloads import SimJob

#: relative tolerance on a job's remaining iterations at which it counts as done
_EPS = 1e-9

__all__ = ["PAPER_RATIOS", "JobOutcome", "PolicyRun", "Realisation", "SimPolicy", "SimulationResult", "gantt_records",
           "make_policy", "replay", "simulate", "summarise"]


def replay(
    jobs: Sequence[SimJob],
    policy: SimPolicy,
    real: Realisation,
    *,
    on_event: Optional[Callable[[int], None]] = None,
    max_events: Optional[int] = None,
    shadow: Optional[OptimalPartition] = None,
    lower_bound: bool = False,
    bound_gap_every: int = 10,
    bound_budget: BoundBudget = BoundBudget(),
    bound_incumbent: bool = False,
) -> PolicyRun:
    """Replay ``jobs`` (arrival order) through ``policy``: event-driven fluid progress.

    Args:
        jobs: the workload (see :func:`rollmux.workloads.draw_jobs`).
        policy: from :func:`make_policy`.
        real: realisation shared by every policy of a run.
        on_event: called with 1 after each arrival or departure (progress bars).
        max_events: bound on events (default ``2 * len(jobs) + 10``).
        shadow: when given, at every event with at most ``shadow.exact_max_jobs`` active jobs the
            exact optimum of *this policy's* active set is computed, and the policy's and the
            optimum's costs are integrated over those intervals (``cost_vs_optimal_exact``: a
            same-jobs, same-instant comparison, RollMux §7.5 "x of optimal").
        lower_bound: with ``shadow``, also a proven lower bound at *every* instant: the exact
            optimum where it is exact, else the LP relaxation of the same set partitioning by
            column generation (:func:`rollmux.partition_bound.lp_lower_bound`), integrated as
            ``cost_vs_lower_bound``; every ``bound_gap_every``-th exact instant also gets the LP
            bound, for its gap to the exact optimum (``lower_bound_gap_to_exact_*``).
        bound_budget: what each LP bound may spend (:class:`rollmux.partition_bound.BoundBudget`;
            with ``time_limit_s=math.inf`` the figures do not depend on the host's load).
        bound_incumbent: with ``lower_bound``, also the cheapest known partition at every bounded
            instant (the exact optimum, else :func:`rollmux.partition_bound.master_incumbent_usd_per_h`),
            so ``cost_vs_lower_bound`` splits into ``cost_vs_best_known_partition`` (the policy's
            distance to a partition that exists) x ``best_known_partition_vs_lower_bound`` (at most
            the bound's slack).
    Returns:
        :class:`PolicyRun` with series, integrals and per-job outcomes.
    Raises:
        ValueError: duplicate job ids or arrivals out of order; RuntimeError when the bound on
        events is hit or a job stops progressing.
    """
    t_wall = time.perf_counter()
    ids = [j.spec.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("replay: duplicate job ids")
    if any(b.arrival_s < a.arrival_s for a, b in zip(jobs, jobs[1:])):
        raise ValueError("replay: jobs must be sorted by arrival_s")
    run = PolicyRun(policy=policy.name)
    bound = max_events if max_events is not None else 2 * len(jobs) + 10
    remaining: dict[str, float] = {}
    by_id = {j.spec.job_id: j for j in jobs}
    rate: dict[str, float] = {}
    cost = rg = tg = 0.0
    units: list[Unit] = []
    born: dict[tuple, float] = {}  # unit identity -> when it was formed (its pipeline starts empty)
    t, i, events = 0.0, 0, 0
    start_s: dict[str, float] = {}
    total_it: dict[str, float] = {}  # iterations of each started job in all
    done_at: dict[str, float] = {}  # iterations left at which a job counts as done
    params: dict[int, tuple] = {}  # id(unit) -> (unit, busy params, its jobs' rates, born key) of the current units
    # busy GPU-seconds are integrated per unit over each stretch of constant busy params (a
    # segment), when the stretch ends: born key -> (busy params, when the segment began)
    segment: dict[tuple, tuple] = {}

    paused: dict[str, float] = {}  # preempted job -> iterations left (it resumes from its commits)
    job_cost: dict[str, float] = {}  # with priorities: each job's share of its units' cost, $
    shares: list[tuple[str, float]] = []  # (job, $/h share) of the current units
    # priority classes only where the policy keeps them (a scheduler policy replayed with priorities)
    classes = getattr(policy, "job_class", None) if getattr(policy, "book", None) is not None else None
    n_pre: dict[str, int] = {}
    tally = StalenessTally() if any(j.spec.max_staleness for j in jobs) else None  # async jobs: staleness used
    shared = classes is not None or tally is not None  # each job's share of its units' cost is reported

    def start(jid: str) -> None:
        sj = by_id[jid]
        if jid in paused:  # resumed after a preemption: the same work left, its state re-loaded
            remaining[jid] = paused.pop(jid)
            stalls[jid] = stalls.get(jid, 0.0) + real_restore_s(sj.spec)
            return
        remaining[jid] = total_it[jid] = sj.duration_s / real.solo_time_s(sj.spec)
        start_s[jid] = t
        done_at[jid] = _EPS * max(1.0, sj.iterations)

    def real_restore_s(spec) -> float:
        from rollmux.profiler import move_time_s

        return move_time_s(spec, real.cluster)
    best_group_size = 0
    seen_groups: dict[int, object] = {}  # id(group) -> group, of the last event (kept alive: ids stay unique)
    shadow_cost: Optional[float] = None
    bound_cost: list = [None]  # the lower bound's $/h now (None: not compared)
    known_cost: list = [None]  # with bound_incumbent: the cheapest known partition's $/h now
    n_exact = [0]
    shadow_jpg = [0.0, 0.0]  # jobs per group now: the policy's, the optimum's
    last_event = "arrival"
    stalls: dict[str, float] = {}
    queued = False  # the policy holds jobs in an admission queue (take_started is not None)

    def close_segment(bk: tuple, now: float) -> None:
        """Add the busy GPU-seconds of unit ``bk``'s open segment, up to ``now``, and close it."""
        prm, t0 = segment.pop(bk)
        b0 = born[bk]
        b_r, b_t = real.busy_from_params(prm, t0 - b0, now - b0)
        run.rollout_busy_gpu_s += b_r
        run.train_busy_gpu_s += b_t

    def refresh() -> None:
        nonlocal cost, rg, tg, units, best_group_size, shadow_cost, params
        units = policy.units()
        cur = {}
        fresh = []  # entries of units that were not current at the last event
        for u in units:
            e = params.get(id(u))
            if e is None or e[0] is not u:
                rates = {}
                for jid, it in u.iter_time_s.items():
                    if not (it > 0 and math.isfinite(it)):
                        raise RuntimeError(f"{policy.name}: job {jid} has iteration time {it}")
                    rates[jid] = 1.0 / it
                e = (u, real.busy_params(u), rates, (u.key, u.job_ids))
                fresh.append(e)
            cur[id(u)] = e
        if tally is not None:
            tally.set_units(units)
        if shared:
            shares.clear()
            for u in units:
                g = {j: by_id[j].spec.num_rollout_gpus + by_id[j].spec.num_train_gpus for j in u.job_ids}
                tot = sum(g.values()) or 1
                shares.extend((j, u.cost_usd_per_h * n / tot) for j, n in g.items())
        cost = sum(u.cost_usd_per_h for u in units)
        rg = sum(u.rollout_gpus for u in units)
        tg = sum(u.train_gpus for u in units)
        gone = [e for k, e in params.items() if cur.get(k) is not e]
        if gone or fresh:
            keys = {e[3] for e in cur.values()} if gone else ()
            for e in gone:  # the rates of units that ended (a unit's jobs are in no other unit)
                for jid in e[2]:
                    if rate.get(jid) is e[2][jid]:
                        del rate[jid]
                if e[3] not in keys:  # the unit ended: its last segment is integrated, its pipeline forgotten
                    close_segment(e[3], t)
                    del born[e[3]]
            for e in fresh:
                bk = e[3]
                if bk not in born:
                    born[bk] = t
                    segment[bk] = (e[1], t)
                elif segment[bk][0][0] is not e[1][0] or segment[bk][0][1:] != e[1][1:]:  # other busy params: a new segment
                    close_segment(bk, t)
                    segment[bk] = (e[1], t)
                rate.update(e[2])
        params = cur
        for jid in remaining:
            if jid not in rate:
                missing = sorted(set(remaining) - set(rate))
                raise RuntimeError(f"{policy.name}: active jobs without an allocation: {missing[:5]}")
        now_groups = {}
        for g in policy.groups():  # the largest group seen: a group seen at the last event was looked at then
            now_groups[id(g)] = g
            if seen_groups.get(id(g)) is not g and len(g.members) > best_group_size:
                best_group_size = len(g.members)
                run.gantt_group = g
        seen_groups.clear()
        seen_groups.update(now_groups)
        shadow_cost = None
        bound_cost[0] = known_cost[0] = None
        res = None
        if shadow is not None and lower_bound and not remaining:
            bound_cost[0] = known_cost[0] = 0.0  # nothing active: nothing provisioned, the bound is 0
        elif shadow is not None and lower_bound:
            members = [(by_id[j].spec, by_id[j].profile) for j in remaining]
            unit_sets = [([(by_id[j].spec, by_id[j].profile) for j in u.job_ids], u.cost_usd_per_h) for u in units]
            small = len(remaining) <= shadow.exact_max_jobs
            res = shadow.solve(members) if small else None
            if shadow.dominates(unit_sets):
                if res is not None and res.exact:
                    bound_cost[0] = known_cost[0] = res.cost_usd_per_h
                    run.bound_kinds["exact"] = run.bound_kinds.get("exact", 0) + 1
                    n_exact[0] += 1
                    if bound_gap_every > 0 and n_exact[0] % bound_gap_every == 0:
                        b = lp_lower_bound(shadow, members, seed_columns=[u.job_ids for u in units],
                                           budget=bound_budget)
                        run.bound_vs_exact.append((b.bound_usd_per_h, res.cost_usd_per_h))
                else:
                    b = lp_lower_bound(shadow, members, seed_columns=[u.job_ids for u in units], budget=bound_budget)
                    bound_cost[0] = b.bound_usd_per_h
                    run.bound_kinds[b.kind] = run.bound_kinds.get(b.kind, 0) + 1
            else:
                # a group of the policy outside the layout class: the LP bound over the class and
                # the policy's own groups (priced as they run) still bounds the policy's cost
                b = lp_lower_bound(shadow, members, extra_columns={u.job_ids: u.cost_usd_per_h for u in units},
                                   budget=bound_budget)
                bound_cost[0] = b.bound_usd_per_h
                k = f"{b.kind}_with_policy_groups"
                run.bound_kinds[k] = run.bound_kinds.get(k, 0) + 1
            if bound_incumbent and known_cost[0] is None:  # an LP instant: the best partition of its master
                known_cost[0] = master_incumbent_usd_per_h(shadow, remaining, hint=[u.job_ids for u in units])
        if shadow is not None and 0 < len(remaining) <= shadow.exact_max_jobs:
            if res is None:
                res = shadow.solve([(by_id[j].spec, by_id[j].profile) for j in remaining])
            if res.exact and shadow.dominates([([(by_id[j].spec, by_id[j].profile) for j in u.job_ids], u.cost_usd_per_h)
                                               for u in units]):
                shadow_cost = res.cost_usd_per_h
                run.shadow_instants.append((t, cost, shadow_cost))
                shadow_jpg[:] = [len(remaining) / max(1, len(units)), len(remaining) / max(1, len(res.groups))]
            elif res.exact:
                run.shadow_outside += 1
        run.times_s.append(t)
        run.cost_usd_per_h.append(cost)
        run.rollout_gpus.append(int(rg))
        run.train_gpus.append(int(tg))

    while i < len(jobs) or remaining or getattr(policy, "waiting", 0):
        events += 1
        if events > bound:
            raise RuntimeError(f"{policy.name}: more than {bound} events")
        if i >= len(jobs) and not remaining:  # only queued jobs left and nothing will depart
            raise RuntimeError(f"{policy.name}: {getattr(policy, 'waiting', 0)} queued jobs can never be admitted")
        t_arr = jobs[i].arrival_s if i < len(jobs) else math.inf
        t_dep, j_dep = math.inf, None
        if remaining:  # the first job of the earliest departure (the order of ``remaining``)
            tds = [t + left / rate[jid] for jid, left in remaining.items()]
            k = min(range(len(tds)), key=tds.__getitem__)
            if tds[k] < t_dep:
                t_dep, j_dep = tds[k], list(remaining)[k]
        # a policy that learns from measured iterations (profile_source measured / blended) asks
        # to be called when a job has run a given number of iterations (an iteration boundary)
        t_learn, learners = math.inf, ()
        if (want := policy.learn_points()):
            for jid, n_it in want.items():
                if jid in remaining:
                    tl = t + max(0.0, n_it - (total_it[jid] - remaining[jid])) / rate[jid]
                    if tl < t_learn - 1e-9 * max(1.0, abs(tl)):
                        t_learn, learners = tl, [jid]
                    elif abs(tl - t_learn) <= 1e-9 * max(1.0, abs(tl)):
                        learners.append(jid)
        # preemption victims stop at their next iteration boundary
        t_stop, stoppers = math.inf, []
        for jid in (policy.stop_points() if hasattr(policy, "stop_points") else ()):
            if jid in remaining:
                done = total_it[jid] - remaining[jid]
                nxt = math.ceil(done - 1e-9 * max(1.0, done))
                ts = t + max(0.0, nxt - done) / rate[jid]
                if ts < t_stop - 1e-9 * max(1.0, abs(ts)):
                    t_stop, stoppers = ts, [jid]
                elif abs(ts - t_stop) <= 1e-9 * max(1.0, abs(ts)):
                    stoppers.append(jid)
        t_next = min(t_arr, t_dep, t_learn, t_stop)
        dt = t_next - t
        if dt > 0:
            run.cost_usd += cost * dt / 3600.0
            for jid, usd in shares:
                job_cost[jid] = job_cost.get(jid, 0.0) + usd * dt / 3600.0
            run.rollout_gpu_s += rg * dt
            run.train_gpu_s += tg * dt
            if shadow_cost is not None:
                run.shadow_gap_usd_by_event[last_event] = (run.shadow_gap_usd_by_event.get(last_event, 0.0)
                                                           + (cost - shadow_cost) * dt / 3600.0)
                run.shadow_jobs_per_group_s[0] += shadow_jpg[0] * dt
                run.shadow_jobs_per_group_s[1] += shadow_jpg[1] * dt
                run.shadow_s += dt
                run.shadow_policy_usd += cost * dt / 3600.0
                run.shadow_optimal_usd += shadow_cost * dt / 3600.0
            if bound_cost[0] is not None:
                run.bound_s += dt
                run.bound_policy_usd += cost * dt / 3600.0
                run.bound_usd += bound_cost[0] * dt / 3600.0
                if bound_incumbent and known_cost[0] is not None:
                    run.best_known_s += dt
                    run.best_known_usd += known_cost[0] * dt / 3600.0
                    run.best_known_policy_usd += cost * dt / 3600.0
                    run.best_known_bound_usd += bound_cost[0] * dt / 3600.0
            if tally is not None:
                tally.advance({jid: rate[jid] * dt for jid in remaining})
            remaining.update({jid: left - rate[jid] * dt for jid, left in remaining.items()})
        t = t_next
        if t_stop < min(t_arr, t_dep) and t_stop <= t_learn:  # victims at their boundary: stop, re-queue
            events -= 1  # bounded by the preemptions, at most one plan per arrival
            policy.clock = t
            for jid in stoppers:
                policy.stop(jid)
            for jid in policy.take_preempted():
                paused[jid] = remaining.pop(jid)
                n_pre[jid] = n_pre.get(jid, 0) + 1
            for jid in policy.take_started() or ():
                start(jid)
        elif t_learn < min(t_arr, t_dep):  # iteration boundaries of learning jobs: measure, re-check, act
            events -= 1  # not an arrival or departure: bounded by the policy's learn points instead
            policy.clock = t
            for jid in learners:
                for mj, ms in (policy.learn(jid, round(want[jid])) or {}).items():
                    stalls[mj] = stalls.get(mj, 0.0) + ms
        elif t_dep <= t_arr:  # departures first on ties: they free capacity
            last_event = "departure"
            done = [jid for jid, left in remaining.items() if left <= done_at[jid] or jid == j_dep]
            for jid in done:
                del remaining[jid]
                del done_at[jid]
                policy.clock = t
                for mj, ms in (policy.depart(jid) or {}).items():
                    stalls[mj] = stalls.get(mj, 0.0) + ms
                real.forget(jid)
                if shadow is not None:
                    shadow.forget(jid)
                sj, st = by_id[jid], start_s.pop(jid, None)
                run.outcomes[jid] = o = JobOutcome(jid, sj.arrival_s, t, sj.duration_s, sj.spec.slo,
                                                   real.solo_time_s(sj.spec) / sj.profile.t_solo_s,
                                                   start_s=st if queued else None)
                ct = classes(jid) if classes is not None else None
                if ct is not None:
                    o.priority_class, o.tenant = ct
                    o.preemptions = n_pre.get(jid, 0)
                    o.lost_gpu_h = sum(r.lost_gpu_h for r in policy.book.preemptions.get(jid, ()))  # type: ignore[attr-defined]
                if ct is not None or tally is not None:
                    o.cost_usd = job_cost.pop(jid, 0.0)
                if tally is not None:
                    o.max_staleness, o.staleness_mode = sj.spec.max_staleness, sj.spec.staleness_mode
                    o.staleness = tally.pop(jid)
                if on_event:
                    on_event(1)
            for jid in policy.take_started() or ():  # queued jobs admitted into the freed room
                start(jid)
        else:
            last_event = "arrival"
            job = jobs[i]
            i += 1
            policy.clock = t
            run.decision_ms.append(policy.arrive(job))
            for mj, ms in policy.pop_stalls().items():  # jobs moved by the admission's re-optimisation
                stalls[mj] = stalls.get(mj, 0.0) + ms
            started = policy.take_started()
            queued = queued or started is not None
            for jid in ([job.spec.job_id] if started is None else started):
                start(jid)
            if on_event:
                on_event(1)
        refresh()
        for jid, st in stalls.items():  # a moved job's state copy: lost progress at its new speed
            if jid in remaining:
                remaining[jid] += st * rate[jid]
        stalls.clear()
    for bk in list(segment):  # units still running at the end (a replay stopped early)
        close_segment(bk, t)
    run.end_s = t
    run.wall_s = time.perf_counter() - t_wall
    run.extra.update(policy.extra())
    if isinstance(policy, OptimalPolicy):
        run.extra["optimal_exact_fraction"] = policy.exact_events / max(1, policy.events)
    return run


@dataclass
class SimulationResult:
    """A whole run: per-policy runs and the summary (``summary.json`` content)."""

    runs: dict[str, PolicyRun]
    summary: dict
    real: Realisation


def simulate(
    jobs: Sequence[SimJob],
    cluster: ClusterSpec,
    policies: Iterable[str] = POLICY_NAMES,
    *,
    stochastic: bool = False,
    seed: int = 0,
    max_group_size: Optional[int] = None,
    exact_max_jobs: int = 16,
    on_event: Optional[Callable[[str, int], None]] = None,
    meta: Optional[dict] = None,
    shadow_policies: Iterable[str] = ("rollmux",),
    repack: Optional[bool] = None,
    config=None,
    queue: bool = False,
    priorities: bool = False,
    lower_bound: bool = False,
    bound_budget: BoundBudget = BoundBudget(),
    bound_incumbent: bool = False,
) -> SimulationResult:
    """Replay the same jobs through every policy with one shared realisation.

    ``config``: the scheduler settings (:class:`rollmux.admission.SchedulerConfig`, the model the
    cluster's GlobalScheduler uses; default: its defaults); ``max_group_size`` / ``repack`` override
    a copy of it when given, ``seed`` (realisation) is also the random baseline's seed.
    ``shadow_policies`` also get the same-instant exact-optimum comparison (see :func:`replay`), and
    with ``lower_bound`` the proven lower bound at every instant (``cost_vs_lower_bound``, each LP
    bound within ``bound_budget``; with ``bound_incumbent`` also the cheapest known partition, see
    :func:`replay`);
    ``repack=False`` runs RollMux as the paper's admission-only Alg. 1 (no departure re-packing).
    ``queue=True``: a bounded ``cluster`` holds the jobs that do not fit in the admission queue
    (:class:`rollmux.sim.policies.SchedulerPolicy`); each policy's summary then reports its jobs' queue waits.
    Solo-D replays queued too (a group of one). ``priorities=True`` (with ``queue``): the jobs'
    priority classes and tenants (``JobSpec.priority_class`` / ``tenant``) order the queue, quotas
    and preemption apply (:mod:`rollmux.preemption`), and each summary has ``by_class``.

    Raises:
        ValueError: an unknown policy name (before anything runs) or an empty job list.
    """
    names = [check_policy(p) for p in policies]
    if not jobs:
        raise ValueError("simulate: no jobs to replay")
    if priorities and not queue:
        raise ValueError("priorities need a bounded cluster replayed with the admission queue (queue=True)")
    if queue and (other := [n for n in names if policy_spec(n).kind != "scheduler" and n != QUEUED_SOLO]):
        raise ValueError(f"policies {', '.join(other)} do not admit through the scheduler and cannot replay with the "
                         "admission queue; queued replays take the policies of kind 'scheduler' (rollmux, random, most-idle)")
    cfg = (config or SchedulerConfig()).overridden(max_group_size=max_group_size, seed=seed, repack_on_departure=repack)
    max_group_size, repack = cfg.max_group_size, cfg.repack_on_departure
    real = Realisation(cluster, stochastic=stochastic, seed=seed)
    shadow_policies = tuple(shadow_policies)
    runs: dict[str, PolicyRun] = {}
    for name in names:
        pol = make_policy(name, cluster, real, exact_max_jobs=exact_max_jobs, config=cfg, queue=queue,
                          priorities=priorities)
        cb = (lambda k, _n=name: on_event(_n, k)) if on_event else None
        shadow = (OptimalPartition(cluster, max_group_size=max_group_size, exact_max_jobs=exact_max_jobs, time_limit_s=5.0,
                                   per_job=cfg.per_job_allocations == "simulator")
                  if name in shadow_policies else None)
        runs[name] = replay(jobs, pol, real, on_event=cb, shadow=shadow, lower_bound=lower_bound,
                            bound_budget=bound_budget, bound_incumbent=bound_incumbent)
    m = dict(meta or {}, jobs=len(jobs), stochastic=stochastic, seed=seed, max_group_size=max_group_size,
             exact_max_jobs=exact_max_jobs, repack_on_departure=repack,
             **({"bound_budget": bound_budget.to_json()} if lower_bound else {}), **({"admission_queue": True} if queue else {}),
             **({"priorities": True} if priorities else {}))
    return SimulationResult(runs, summarise(runs, m), real)


def gantt_records(run: PolicyRun, real: Realisation, meta_iterations: int = 3) -> list[PhaseRecord]:
    """Timeline of the largest group the policy formed (first ``meta_iterations`` cycles)."""
    g = run.gantt_group
    if g is None:
        return []
    if real.stochastic:
        s = real.schedule(g, record_timeline=True)
    else:
        s = simulate_group(g, meta_iterations=max(2, meta_iterations), record_timeline=True)
    return list(s.timeline)
