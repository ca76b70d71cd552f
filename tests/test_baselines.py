"""Baselines on hand-made cases, and the optimum against RollMux on small instances."""

from __future__ import annotations

import pytest

from rollmux import profiler
from rollmux.admission import InterGroupScheduler
from rollmux.baselines import (
    OptimalPartition,
    colocated_profile,
    colocated_unit,
    gavel_choice,
    gavel_options,
    solo_unit,
)
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.policies import check_policy
from rollmux.intra_group import coexec_times
from rollmux.models import JobSpec, PhaseProfile
from rollmux.traces import TraceJob
from rollmux.workloads import draw_jobs

CLUSTER = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
H20_NODE = 8 * 1.85
H800_NODE = 8 * 5.2725


def job(jid, roll, train, sync=0.0, *, nr=8, nt=8, slo=2.0, b=7):
    return JobSpec(job_id=jid, model_params_b=b, num_rollout_gpus=nr, num_train_gpus=nt, slo=slo,
                   measured=PhaseProfile(t_roll_s=roll, t_train_s=train, t_sync_s=sync))


def test_solo_unit_hand_case():
    j = job("a", 100, 200, 10, nr=8, nt=16)
    u = solo_unit(j, j.measured, CLUSTER)
    assert u.cost_usd_per_h == pytest.approx(H20_NODE + 2 * H800_NODE)
    assert (u.rollout_gpus, u.train_gpus) == (8, 16)
    assert u.iter_time_s == {"a": 310.0}
    assert u.rollout_busy_gpus == pytest.approx(8 * 100 / 310)
    assert u.train_busy_gpus == pytest.approx(16 * 210 / 310)


def test_colocated_scales_measured_times_by_roofline_ratio():
    j = job("c", 100, 200, 10)
    bare = j.model_copy(update={"measured": None})
    ref = profiler.estimate(bare, CLUSTER)
    alt = profiler.estimate(bare, CLUSTER, rollout_gpu=CLUSTER.train_pool.node.gpu, num_rollout_gpus=8,
                            num_train_gpus=8, colocated=True)
    p = colocated_profile(j, CLUSTER)
    assert p.t_roll_s == pytest.approx(100 * alt.t_roll_s / ref.t_roll_s)
    assert p.t_train_s == pytest.approx(200.0)  # same GPUs for training
    assert p.t_sync_s < 10  # in-cluster resharding instead of the 20 Gbps link
    u = colocated_unit(j, CLUSTER)
    assert u.cost_usd_per_h == pytest.approx(H800_NODE) and u.rollout_gpus == 0 and u.train_gpus == 8
    assert u.iter_time_s["c"] == pytest.approx(p.t_solo_s)


def test_gavel_picks_cheapest_per_iteration_within_slo():
    for slo in (1.0, 1.3, 2.0):
        j = job(f"g{slo}", 300, 150, 5, slo=slo)
        opts = gavel_options(j, CLUSTER)
        assert {o.kind for o in opts} == {"disaggregated", "colocated"}
        g = gavel_choice(j, CLUSTER)
        assert g.meets_slo and g.profile.t_solo_s <= slo * j.measured.t_solo_s * (1 + 1e-9)
        assert g.usd_per_iteration == min(o.usd_per_iteration for o in opts if o.meets_slo)
        solo_usd = (H20_NODE + H800_NODE) * j.measured.t_solo_s / 3600
        assert g.usd_per_iteration <= solo_usd + 1e-9  # Solo-D's own allocation is an option


def test_optimum_pairs_complementary_jobs():
    a, b = job("a", 400, 100, slo=1.5), job("b", 100, 380, slo=1.5)
    res = OptimalPartition(CLUSTER).solve([(a, a.measured), (b, b.measured)])
    assert res.exact and len(res.groups) == 1
    assert res.cost_usd_per_h == pytest.approx(H20_NODE + H800_NODE)
    # two rollout-heavy jobs with tight SLOs share the training node only (rollout scale-out)
    c, d = job("c", 400, 100, slo=1.05), job("d", 400, 100, slo=1.05)
    res = OptimalPartition(CLUSTER).solve([(c, c.measured), (d, d.measured)])
    assert res.exact and len(res.groups) == 1 and len(res.groups[0].rollout_nodes) == 2
    assert res.cost_usd_per_h == pytest.approx(2 * H20_NODE + H800_NODE)
    # two training-heavy jobs with tight SLOs cannot share anything: two isolated groups
    e, f = job("e", 100, 400, slo=1.05), job("f", 100, 400, slo=1.05)
    res = OptimalPartition(CLUSTER).solve([(e, e.measured), (f, f.measured)])
    assert res.exact and len(res.groups) == 2
    assert res.cost_usd_per_h == pytest.approx(2 * (H20_NODE + H800_NODE))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_optimum_never_costlier_than_rollmux(seed):
    trace = [TraceJob(i, 0.0, 3600.0, 8) for i in range(7)]
    jobs = draw_jobs(trace, CLUSTER, mix="mixed", seed=seed)
    sched = InterGroupScheduler(CLUSTER, policy="rollmux")
    for j in jobs:
        assert sched.admit(j.spec, j.profile).admitted
    res = OptimalPartition(CLUSTER).solve([(j.spec, j.profile) for j in jobs])
    assert res.exact
    assert res.cost_usd_per_h <= sched.cost_usd_per_h() + 1e-6
    # a partition: every job exactly once, every group within every member's SLO
    ids = sorted(m.spec.job_id for g in res.groups for m in g.members)
    assert ids == sorted(j.spec.job_id for j in jobs)
    for g in res.groups:
        tco = coexec_times(g.members)
        assert len(g.members) <= 5
        for m in g.members:
            assert tco[m.spec.job_id] <= m.spec.slo * m.profile.t_solo_s * (1 + 1e-9)


def test_optimum_beyond_exact_limit_is_labelled():
    jobs = [job(f"x{i}", 100 + 30 * i, 200, slo=1.5) for i in range(5)]
    res = OptimalPartition(CLUSTER, exact_max_jobs=2).solve([(j, j.measured) for j in jobs])
    assert not res.exact
    assert sorted(m.spec.job_id for g in res.groups for m in g.members) == [j.job_id for j in jobs]
    exact = OptimalPartition(CLUSTER).solve([(j, j.measured) for j in jobs])
    assert exact.exact and exact.cost_usd_per_h <= res.cost_usd_per_h + 1e-9
    with pytest.raises(ValueError, match="duplicate"):
        OptimalPartition(CLUSTER).solve([(jobs[0], jobs[0].measured)] * 2)


def test_unknown_policy_is_named():
    assert check_policy("gavel+") == "gavel+"
    with pytest.raises(ValueError, match="unknown policy 'fifo'.*rollmux"):
        check_policy("fifo")


def test_a_linked_pair_runs_at_the_slower_members_cadence_in_either_order():
    """Two Qwen-7B single-turn jobs (Philly replay, tight SLOs) sharing one training node: in the
    steady state linked members run in lockstep, so both iterate at the slower one's own 466.1 s in
    either round-robin order, over job-00025's SLO budget (1.0821 x 419.1 s = 453.5 s). Neither
    the layout search, Alg. 1 nor the optimum pairs them."""
    from rollmux.admission import best_round_robin_order, build_group, cadence_bound
    from rollmux.models import GroupMember, Placement

    cl = load_cluster(CONFIG_DIR / "cluster_sim.yaml")

    def spec(jid, roll, train, slo):
        return JobSpec(job_id=jid, model_params_b=7.0, num_prompts=256, responses_per_prompt=8, prompt_tokens=512,
                       max_response_tokens=16384, num_rollout_gpus=8, num_train_gpus=8, slo=slo,
                       measured=PhaseProfile(t_roll_s=roll, t_train_s=train, t_sync_s=6.6))

    a, b = spec("job-00023", 341.303, 118.236, 1.1165), spec("job-00025", 315.552, 96.93, 1.0821)
    assert build_group([(a, a.measured), (b, b.measured)], cl) is None
    assert build_group([(b, b.measured), (a, a.measured)], cl) is None
    pair = [GroupMember(spec=x, profile=x.measured, placement=Placement(job_id=x.job_id, rollout_nodes=(r,), train_nodes=("train-0",)))
            for x, r in ((a, "rollout-0"), (b, "rollout-1"))]
    for order in (pair, pair[::-1]):
        tco = coexec_times(order)
        assert tco == pytest.approx({"job-00023": 466.139, "job-00025": 466.139}, rel=1e-9)
        oc = best_round_robin_order(order)
        assert not oc.feasible and oc.exhaustive and oc.orders_tried == 1  # the cadence bound proves it: no search
    cadence = cadence_bound([a.measured.t_solo_s, b.measured.t_solo_s], [118.236 + 96.93 + 2 * 6.6])
    assert cadence == pytest.approx(466.139) and cadence > b.slo * b.measured.t_solo_s == pytest.approx(453.4886)
    sched = InterGroupScheduler(cl)
    sched.admit(a, a.measured)
    d = sched.admit(b, b.measured)
    assert d.admitted and [g.job_ids for g in sched.groups] == [("job-00023",), ("job-00025",)]
    res = OptimalPartition(cl).solve([(a, a.measured), (b, b.measured)])
    assert res.exact and res.cost_usd_per_h == pytest.approx(sched.cost_usd_per_h()) == pytest.approx(113.96)


def test_group_feasibility_takes_the_best_round_robin_order():
    """Four jobs on two shared training nodes (``factories.ring_quartet``): in arrival order a
    chain of trainings through all four waits within one meta-iteration and three members break
    their SLOs; in the order (00059, 00095, 00075, 00097) all four fit. Alg. 1, the layout search
    and the optimum all take that order (143.56 $/h)."""
    from factories import ring_quartet
    from rollmux.admission import best_round_robin_order, build_group

    cl, jobs = ring_quartet()
    best = ("job-00059", "job-00095", "job-00075", "job-00097")
    sched = InterGroupScheduler(cl)
    for j in jobs:
        assert sched.admit(j, j.measured).admitted
    (g,) = sched.groups
    assert g.job_ids == best and sched.cost_usd_per_h() == pytest.approx(143.56)
    by = {m.spec.job_id: m for m in g.members}
    arrival = [by[j.job_id] for j in jobs]
    tco = coexec_times(arrival)
    train_chain = sum(m.profile.t_train_s + m.profile.t_sync_s for m in arrival)
    assert tco == pytest.approx({j.job_id: train_chain for j in jobs}, rel=1e-9) and train_chain == pytest.approx(1260.501)
    assert {j for j, t in tco.items() if t > by[j].spec.slo * by[j].profile.t_solo_s} == {"job-00095", "job-00097", "job-00075"}
    oc = best_round_robin_order(arrival)
    assert oc.feasible and tuple(m.spec.job_id for m in oc.members) == best and oc.orders_tried == 2
    assert oc.t_coexec_s == pytest.approx({j: 1041.8165 for j in best}, rel=1e-6)
    built = build_group([(j, j.measured) for j in jobs], cl)
    assert built.job_ids == best and built.cost_usd_per_h(cl) == pytest.approx(143.56)
    res = OptimalPartition(cl).solve([(j, j.measured) for j in jobs])
    assert res.exact and res.cost_usd_per_h == pytest.approx(143.56)


@pytest.mark.parametrize("seed,slo", [(1, (1.0, 2.0)), (2, (1.5, 2.5)), (4, (1.0, 1.2))])
def test_no_policy_cheaper_than_the_exact_optimum_at_any_instant(seed, slo):
    """At every instant the replay calls exact, the optimum of the same active jobs costs no more
    than RollMux's or Solo-D's allocation (the optimum is a lower bound where it is compared).
    Instants where a RollMux group has no layout in the optimum's search are not compared
    (``shadow_outside``; the LP bound with the policy's own groups covers them): a group with a
    round-robin order Alg. 1 found and ``build_group``'s search does not (on whole-node groups, the
    default, seed 1 has such a four-job group, which per-job allocations used to hide), or one the
    global plan or a re-partition's succession formed, keeping members on their nodes. They stay a
    minority of RollMux's exact instants."""
    from rollmux.sim.simulator import simulate
    from rollmux.traces import EXTRACT_TRACE, TraceWindow, load_trace

    cl = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    tjobs = load_trace(EXTRACT_TRACE, TraceWindow(max_jobs=60, min_duration_s=3600.0, max_duration_s=3 * 86400.0))
    jobs = draw_jobs(tjobs, cl, mix="mixed", seed=seed, slo_range=slo)
    res = simulate(jobs, cl, ["rollmux", "solo-d"], seed=seed, exact_max_jobs=12, shadow_policies=("rollmux", "solo-d"))
    for name in ("rollmux", "solo-d"):
        run = res.runs[name]
        assert len(run.shadow_instants) >= 10
        assert all(pol >= opt - 1e-6 for _, pol, opt in run.shadow_instants), name
        assert run.shadow_outside <= (max(1, len(run.shadow_instants) // 4) if name == "rollmux" else 0)
        m = res.summary["policies"][name]
        assert 0 < m["optimal_exact_spend_fraction"] <= 1 and m["cost_vs_optimal_exact"] >= 1.0
    assert res.summary["policies"]["rollmux"]["slo_attainment"] == 1.0


def test_order_search_is_skipped_only_where_no_order_is_feasible():
    """``steady_lower_bounds`` holds in every round-robin order (each member's steady-state
    ``t_coexec`` in each of the n! orders is at least it, where the recurrence reaches its period),
    and ``best_round_robin_order`` with the bound answers exactly as the plain exhaustive search on random groups of 2-5 members sharing
    nodes, synchronous and asynchronous, with and without a rollout overhead (searches the bound
    skips), and on the ring quartet, where another order fits (a search it must not skip)."""
    import itertools
    import random

    import rollmux.admission.order as order
    from rollmux.intra_group import coexec_key, coexec_values
    from rollmux.models import GroupMember, Placement

    from factories import ring_quartet

    def compare(members, ov):
        with_bound = order.best_round_robin_order(members, rollout_overhead_s=ov)
        saved = order.ORDER_BOUND_MARGIN
        order.ORDER_BOUND_MARGIN = 1.0  # lb x 0: never skips
        try:
            plain = order.best_round_robin_order(members, rollout_overhead_s=ov)
        finally:
            order.ORDER_BOUND_MARGIN = saved
        assert (with_bound.feasible, with_bound.members, with_bound.t_coexec_s) == (plain.feasible, plain.members, plain.t_coexec_s)
        return with_bound, plain

    cl, jobs = ring_quartet()  # arrival order breaks three SLOs, another order fits: the search runs
    sched = InterGroupScheduler(cl)
    for j in jobs:
        sched.admit(j, j.measured)
    by = {m.spec.job_id: m for m in sched.groups[0].members}
    with_bound, plain = compare([by[j.job_id] for j in jobs], 0.0)
    assert with_bound.feasible and with_bound.orders_tried == plain.orders_tried == 2
    rng = random.Random(3)
    pruned = 0
    for case in range(300):
        n = rng.randint(2, 5)
        members = []
        for k in range(n):
            stale = rng.choice([0, 0, 0, 1])
            spec = JobSpec(job_id=f"j{k}", model_params_b=7.0, num_rollout_gpus=8, num_train_gpus=8,
                           slo=round(rng.uniform(1.0, 3.0), 3), max_staleness=stale,
                           measured=PhaseProfile(t_roll_s=rng.uniform(20, 400), t_train_s=rng.uniform(20, 300),
                                                 t_sync_s=rng.uniform(0, 10)))
            prof = spec.measured.with_staleness(stale)
            rn = tuple(sorted({f"rollout-{rng.randrange(3)}" for _ in range(rng.randint(1, 2))}))
            tn = tuple(sorted({f"train-{rng.randrange(2)}" for _ in range(rng.randint(1, 2))}))
            members.append(GroupMember(spec=spec, profile=prof, placement=Placement(job_id=f"j{k}", rollout_nodes=rn, train_nodes=tn)))
        ov = rng.choice([0.0, 2.0])
        rows = [(m.profile.t_roll_s + ov, m.profile.t_train_s, m.profile.t_sync_s, m.placement.rollout_nodes,
                 m.placement.train_nodes, m.profile.max_staleness, m.profile.t_solo_s, m.spec.slo) for m in members]
        lbs = order.steady_lower_bounds(rows)
        for perm in itertools.permutations(range(n)):
            vals = coexec_values(coexec_key([rows[i][:6] for i in perm]))
            assert all(v >= lbs[i] * (1 - 1e-9) for v, i in zip(vals, perm)), (case, perm)
        with_bound, plain = compare(members, ov)
        pruned += plain.orders_tried > with_bound.orders_tried
    assert pruned >= 10, pruned


def test_the_cadence_bound_decides_where_the_recurrence_has_not_reached_its_period():
    """Four members linked through shared nodes (one asynchronous) whose round-robin schedule finds
    no period within the recurrence's horizon: in the order (j0, j2, j3, j1) its second-half
    averages still hold part of the transient, below the linked members' common period (they even
    differ from member to member), and j0 (SLO 1.0) would pass at 105.4924 s against its 105.5048 s
    own iteration. The cadence bound (105.5048 s for all four) decides: no order is feasible."""
    import rollmux.admission.order as order
    from rollmux.intra_group import coexec_key, coexec_values
    from rollmux.models import GroupMember, Placement

    def member(j, tr, tt, ts, rn, tn, stale, slo):
        spec = JobSpec(job_id=j, model_params_b=7.0, num_rollout_gpus=8, num_train_gpus=8, slo=slo, max_staleness=stale,
                       measured=PhaseProfile(t_roll_s=tr, t_train_s=tt, t_sync_s=ts))
        return GroupMember(spec=spec, profile=spec.measured.with_staleness(stale),
                           placement=Placement(job_id=j, rollout_nodes=rn, train_nodes=tn))

    ms = [member("j0", 46.1338, 56.0106, 3.3480, ("rollout-0",), ("train-0", "train-1"), 0, 1.0),
          member("j1", 54.2019, 49.0138, 2.2891, ("rollout-1",), ("train-3",), 0, 3.0),
          member("j2", 28.5889, 38.9620, 0.0, ("rollout-3",), ("train-1", "train-2"), 0, 3.0),
          member("j3", 38.0292, 17.6696, 0.0, ("rollout-1", "rollout-2"), ("train-0", "train-3"), 2, 3.0)]
    rows = [(m.profile.t_roll_s, m.profile.t_train_s, m.profile.t_sync_s, m.placement.rollout_nodes,
             m.placement.train_nodes, m.profile.max_staleness, m.profile.t_solo_s, m.spec.slo) for m in ms]
    assert order.steady_lower_bounds(rows) == pytest.approx([105.5048] * 4, rel=1e-12)
    by = {m.spec.job_id: i for i, m in enumerate(ms)}
    vals = coexec_values(coexec_key([rows[by[j]][:6] for j in ("j0", "j2", "j3", "j1")]))
    assert vals[0] == pytest.approx(105.4924, rel=1e-9) and vals[0] < 105.5048 * (1 - 1e-5) and max(vals) > vals[0]
    oc = order.best_round_robin_order(ms)
    assert not oc.feasible and oc.exhaustive and oc.orders_tried == 1
