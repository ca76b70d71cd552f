"""Asynchronous (off-policy) jobs in the policy core: the staleness contract (rollmux.staleness),
the schedule that co-executes them with synchronous jobs (round-robin queues, the event
simulation and the steady-state recurrence), admission, the replay, on hand-worked cases and
random groups (hypothesis). The hand-worked cases are the ones of rollmux/admission/README.md
("Asynchronous jobs")."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rollmux import profiler
from rollmux.admission import InterGroupScheduler
from rollmux.admission.rules import node_load_bound
from rollmux.intra_group import IterationTimes, coexec_times, realised_solo_s, simulate_group, steady_schedule
from rollmux.models import ClusterSpec, DeclaredProfile, GPUType, GroupMember, JobSpec, NodeSpec, PhaseProfile, Placement, PoolSpec
from rollmux.round_robin import RoundRobinQueues
from rollmux.staleness import (StalenessError, check_version, gating_sync, solo_iteration_s, version_for,
                               weight_copies)

from factories import QueueDriver


def mem(j, r, t, s=0.0, k=0, mode="exact", slo=2.0, rn=("r0",), tn=("t0",)):
    spec = JobSpec(job_id=j, model_params_b=7, num_rollout_gpus=8, num_train_gpus=8, slo=slo, max_staleness=k,
                   staleness_mode=mode)
    return GroupMember(spec=spec, profile=PhaseProfile(t_roll_s=r, t_train_s=t, t_sync_s=s),
                       placement=Placement(job_id=j, rollout_nodes=tuple(rn), train_nodes=tuple(tn)))


# --- the contract -----------------------------------------------------------------------------------

def test_solo_time_versions_and_weight_copies():
    assert solo_iteration_s(60, 30, 10, 0) == 100 and solo_iteration_s(60, 30, 10, 1) == 60
    assert solo_iteration_s(50, 80, 20, 3) == 100  # training-bound: T + S, whatever k
    with pytest.raises(ValueError):
        solo_iteration_s(1, 1, 0, -1)
    assert [gating_sync(i, 1) for i in range(4)] == [None, None, 0, 1]
    assert [gating_sync(i, 0) for i in range(3)] == [None, 0, 1]
    # exact: version i - k whatever is newer; bounded: the newest; never older than i - k
    assert version_for(5, 2, "exact", published=5) == 3 and version_for(5, 2, "bounded", published=4) == 4
    assert version_for(1, 2, "exact", published=0) == 0 and version_for(3, 0, "exact", published=3) == 3
    with pytest.raises(StalenessError, match="needs policy version >= 3"):
        version_for(5, 2, "bounded", published=2)
    with pytest.raises(ValueError, match="unknown staleness mode"):
        version_for(1, 1, "eventual", published=1)
    check_version(5, 4, 1, "bounded")
    check_version(5, 4, 1, "exact")
    with pytest.raises(StalenessError, match="outside"):
        check_version(5, 3, 1, "bounded")
    with pytest.raises(StalenessError, match="prescribes version 3"):
        check_version(5, 4, 2, "exact")
    assert (weight_copies(0, "exact"), weight_copies(1, "exact"), weight_copies(3, "exact"), weight_copies(3, "bounded")) == (1, 2, 4, 2)


def test_job_fields_profiles_and_members():
    j = JobSpec(job_id="a", model_params_b=7, max_staleness=2, staleness_mode="bounded",
                measured=PhaseProfile(t_roll_s=60, t_train_s=30, t_sync_s=10))
    for bad in ({"max_staleness": -1}, {"max_staleness": 17}, {"staleness_mode": "eventual"}, {"max_staleness": "1"}):
        with pytest.raises(ValidationError):
            JobSpec(job_id="a", model_params_b=7, **bad)
    with pytest.raises(ValidationError, match="declare the staleness bound on the job"):
        DeclaredProfile(t_roll_s=1, t_train_s=1, max_staleness=1)
    c = ClusterSpec(rollout_pool=PoolSpec(node=NodeSpec(gpu=GPUType(name="H20", price_usd_per_h=1, bf16_tflops=148, hbm_gb=96,
                                                                       hbm_tb_per_s=4), host_mem_gb=2048)),
                    train_pool=PoolSpec(node=NodeSpec(gpu=GPUType(name="H800", price_usd_per_h=2.85, bf16_tflops=989,
                                                                     hbm_gb=80, hbm_tb_per_s=3.35), host_mem_gb=2048)))
    p = profiler.estimate(j, c)
    assert p.max_staleness == 2 and p.t_solo_s == 60
    assert profiler.estimate(j, c, colocated=True).max_staleness == 0  # one set of GPUs: no overlap
    # an exact job holds k + 1 versions on each rollout node, a bounded one 2
    base = profiler.state_gb(j.model_copy(update={"max_staleness": 0}), "rollout", c)
    assert profiler.state_gb(j, "rollout", c) == pytest.approx(base + 2 * 7)
    ex = j.model_copy(update={"staleness_mode": "exact"})
    assert profiler.state_gb(ex, "rollout", c) == pytest.approx(base + 2 * 2 * 7)
    m = GroupMember(spec=j, profile=PhaseProfile(t_roll_s=60, t_train_s=30, t_sync_s=10),
                    placement=Placement(job_id="a", rollout_nodes=("r0",), train_nodes=("t0",)))
    assert m.profile.max_staleness == 2  # a profile given without a bound takes the job's
    with pytest.raises(ValidationError, match="differs from the job's"):
        GroupMember(spec=j, profile=PhaseProfile(t_roll_s=60, t_train_s=30, max_staleness=1), placement=m.placement)


# --- hand-worked cases (rollmux/admission/README.md) ------------------------------------------------

def test_solo_async_job_pipelines_its_phases():
    """R = 60, T = 30, S = 10, k = 1: rollout i + 1 runs beside training i; an iteration every
    60 s (not 100); bounded staleness 1 (the rollout starts before the sync it could use ends).
    Training-bound R = 50, T + S = 100: 100 s per iteration for every k; with k = 2 the rollouts
    run two ahead (staleness 2)."""
    a = mem("A", 60, 30, 10, k=1, mode="bounded")
    s = simulate_group([a], record_timeline=True)
    assert s.t_coexec_s == {"A": 60.0} and s.staleness == {"A": {1: 3}}
    starts = sorted((r.start_s, r.phase, r.iteration, r.end_s) for r in s.timeline if r.start_s <= 120)
    assert starts == [(0.0, "rollout", 0, 60.0), (60.0, "rollout", 1, 120.0), (60.0, "train", 0, 90.0),
                      (90.0, "sync", 0, 100.0), (120.0, "rollout", 2, 180.0), (120.0, "train", 1, 150.0)]
    assert s.bubble_fraction == pytest.approx({"rollout": 0.0, "train": 1 - 40 / 60})
    c = mem("C", 50, 80, 20, k=2, mode="bounded")
    assert steady_schedule([c]).t_coexec_s == {"C": 100.0} and steady_schedule([c]).staleness == {"C": {2: 6}}
    assert set(steady_schedule([mem("C", 50, 80, 20, k=1, mode="bounded")]).staleness["C"]) == {1}
    assert steady_schedule([mem("C", 50, 80, 20, k=2, mode="exact")]).staleness == {"C": {2: 6}}


def test_async_job_fills_both_bubbles_of_a_synchronous_one():
    """A (async, k = 1: R 60, T 30, S 10, solo 60 s) and B (sync: R 40, T 50, S 10, solo 100 s)
    on one rollout and one training node: both iterate every 100 s, both nodes 100% busy; A is
    slowed 100 / 60 = 1.667x, B not at all; A's bounded rollouts get fresh weights (staleness 0:
    B's phases delay them past A's sync), exact ones use version i - 1."""
    for mode, stale in (("bounded", 0), ("exact", 1)):
        a, b = mem("A", 60, 30, 10, k=1, mode=mode), mem("B", 40, 50, 10)
        ev = simulate_group([a, b], record_timeline=True)
        st_ = steady_schedule([a, b])
        for s in (ev, st_):
            assert s.t_coexec_s == {"A": 100.0, "B": 100.0}
            assert s.busy_fraction == {"rollout": 1.0, "train": 1.0}
            assert s.staleness == {"A": {stale: 4}}
        assert coexec_times([a, b]) == {"A": 100.0, "B": 100.0}
        first = sorted((r.start_s, r.job_id, r.phase, r.iteration) for r in ev.timeline if r.start_s <= 160)
        assert first == [(0.0, "A", "rollout", 0), (60.0, "A", "train", 0), (60.0, "B", "rollout", 0),
                         (90.0, "A", "sync", 0), (100.0, "A", "rollout", 1), (100.0, "B", "train", 0),
                         (150.0, "B", "sync", 0), (160.0, "A", "train", 1), (160.0, "B", "rollout", 1)]


def test_realised_solo_time_of_an_async_job_pipelines_its_samples():
    a = mem("A", 60, 30, 10, k=1)
    its = [IterationTimes(60, 30, 10), IterationTimes(20, 70, 10)]
    # alone: rollouts 60, 20 and trainings 40, 80 alternate; one step of slack absorbs it: the
    # trainings run back to back, (40 + 80) / 2 = 60 s (the mean of the per-iteration maxima is 70)
    assert realised_solo_s(a, its) == pytest.approx(60.0)
    assert realised_solo_s(mem("B", 60, 30, 10), its) == pytest.approx(100.0)  # sync: the mean of the sums
    # two long rollouts, then two long trainings: k = 1 cannot absorb it; rollouts 100, 100, 10, 10
    # and trainings 10, 10, 100, 100 take 310 s per 4 iterations (by hand: rollout 4 starts at 310 s,
    # rollout 8 at 620 s), above both means (55 s)
    its = [IterationTimes(100, 10), IterationTimes(100, 10), IterationTimes(10, 100), IterationTimes(10, 100)]
    assert realised_solo_s(a, its) == pytest.approx(77.5)
    assert realised_solo_s(a, [IterationTimes(60, 30, 10)]) == 60.0


# --- random groups (hypothesis) --------------------------------------------------------------------

_member_st = st.tuples(st.integers(1, 300), st.integers(1, 300), st.integers(0, 40), st.integers(0, 3),
                       st.sampled_from(["exact", "bounded"]), st.sets(st.integers(0, 2), min_size=1),
                       st.sets(st.integers(0, 1), min_size=1))


@settings(max_examples=80, deadline=None)
@given(st.lists(_member_st, min_size=1, max_size=5))
def test_random_groups_one_phase_per_node_and_staleness_within_bound(spec):
    """Random groups of synchronous and asynchronous members (k 0..3, both modes, shared and
    dedicated nodes): no node ever runs two phases at once; every rollout starts after the sync
    its bound needs and uses a version within it (exact: always i - k); training i follows
    rollout i; the recurrence equals the event simulation; no member iterates faster than alone
    or than its busiest node allows."""
    g = [mem(f"j{i}", r, t, s, k=k, mode=mode, rn=[f"r{x}" for x in sorted(rn)], tn=[f"t{x}" for x in sorted(tn)])
         for i, (r, t, s, k, mode, rn, tn) in enumerate(spec)]
    ev = simulate_group(g, record_timeline=True)
    by_node: dict[str, list] = {}
    for rec in ev.timeline:
        by_node.setdefault(rec.node, []).append(rec)
    for node, recs in by_node.items():
        recs.sort(key=lambda r: (r.start_s, r.end_s))
        for x, y in zip(recs, recs[1:]):
            assert y.start_s >= x.end_s, (node, x, y)  # one phase per node at a time
    for m in g:
        j, k = m.spec.job_id, m.profile.max_staleness
        mine = [r for r in ev.timeline if r.job_id == j and r.node == m.placement.rollout_nodes[0]
                or r.job_id == j and r.pool == "train" and r.node == m.placement.train_nodes[0]]
        rolls = {r.iteration: r for r in mine if r.phase == "rollout"}
        trains = {r.iteration: r for r in mine if r.phase == "train"}
        syncs = sorted(r.end_s for r in mine if r.phase == "sync")
        for i, r in rolls.items():
            published = bisect.bisect_right(syncs, r.start_s)
            assert published >= i - k, (j, i, published)  # the bound is never broken
            v = version_for(i, k, m.spec.staleness_mode, min(published, i))
            check_version(i, v, k, m.spec.staleness_mode)
            if i in trains:
                assert trains[i].start_s >= r.end_s
            if i - 1 in rolls:
                assert r.start_s >= rolls[i - 1].end_s
        assert all(s <= k for s in ev.staleness.get(j, {}))
        if k and m.spec.staleness_mode == "exact":
            assert set(ev.staleness[j]) == {k}
        loads = [sum(o.profile.t_roll_s for o in g if x in o.placement.rollout_nodes) for x in m.placement.rollout_nodes]
        loads += [sum(o.profile.t_train_node_s for o in g if x in o.placement.train_nodes) for x in m.placement.train_nodes]
        assert ev.t_coexec_s[j] >= node_load_bound(m.profile.t_solo_s, loads) * (1 - 1e-9)
    fast = steady_schedule(g)
    assert fast.t_coexec_s == ev.t_coexec_s and fast.staleness == ev.staleness
    assert coexec_times(g) == pytest.approx(ev.t_coexec_s, rel=1e-9)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "order", "release", "step", "step", "step"]),
                          st.sets(st.integers(0, 2), min_size=1), st.sets(st.integers(0, 1), min_size=1),
                          st.integers(0, 3), st.permutations(range(8)), st.integers(0, 8)), min_size=5, max_size=60))
def test_queues_with_async_members_never_deadlock_and_keep_the_bound(ops):
    """Synchronous and asynchronous jobs spanning several nodes join, leave, get re-planned and
    release long-tail rollouts while a driver completes running phases in any order: some phase
    always runs, no node runs two unreleased phases at once, no rollout is granted before the
    sync its bound needs, and every job left completes two more iterations."""
    d = QueueDriver(exclusive_nodes=True)
    q, running = d.q, d.running
    for op, rn, tn, k, perm, pick in ops:
        if op == "add":
            d.add([f"rollout-{x}" for x in sorted(rn)], [f"train-{x}" for x in sorted(tn)], max_staleness=k)
        elif op == "remove":
            d.remove(pick)
        elif op == "order":
            q.set_order([f"j{i}" for i in perm[:pick]])
        elif op == "release":
            d.release_one()
        elif running:
            q.on_phase_done(*running.pop(pick % len(running)))
        d.pump()
        assert running or not q.job_ids
    d.drain(rounds=60, pick=lambda i: i % len(running))


def test_async_stream_api():
    q = RoundRobinQueues()
    q.add_job("A", ["r0"], ["t0"], max_staleness=1)
    assert q.next_phases("A") == ("rollout", "train") and q.max_staleness("A") == 1
    q.grant("A", "rollout")
    q.on_phase_done("A", "rollout")
    assert {(r.phase, r.iteration) for r in q.ready()} == {("rollout", 1), ("train", 0)}
    q.grant("A", "rollout")
    q.grant("A", "train")
    assert q.is_running("A", "rollout") and q.is_running("A", "train") and q.next_phases("A") == ()
    q.on_phase_done("A", "rollout")
    assert [r.phase for r in q.ready()] == []  # rollout 2 waits for sync 0
    q.on_phase_done("A", "train")
    assert [(r.phase, r.iteration) for r in q.ready()] == [("sync", 0)]
    q.grant("A", "sync")
    q.on_phase_done("A", "sync")
    assert [(r.phase, r.iteration) for r in q.ready()] == [("rollout", 2), ("train", 1)]
    with pytest.raises(ValueError):
        q.add_job("B", ["r0"], ["t0"], max_staleness=-1)


# --- admission --------------------------------------------------------------------------------------

def _bounded_cluster() -> ClusterSpec:
    h20 = GPUType(name="H20", price_usd_per_h=1.0, bf16_tflops=148, hbm_gb=96, hbm_tb_per_s=4.0)
    h800 = GPUType(name="H800", price_usd_per_h=2.85, bf16_tflops=989, hbm_gb=80, hbm_tb_per_s=3.35)
    return ClusterSpec(rollout_pool=PoolSpec(node=NodeSpec(gpu=h20, host_mem_gb=2048), num_nodes=1),
                       train_pool=PoolSpec(node=NodeSpec(gpu=h800, host_mem_gb=2048), num_nodes=1))


def _job(j, r, t, s, slo, k=0):
    return JobSpec(job_id=j, model_params_b=7, num_rollout_gpus=8, num_train_gpus=8, slo=slo, max_staleness=k,
                   measured=PhaseProfile(t_roll_s=r, t_train_s=t, t_sync_s=s))


def test_admission_refuses_an_async_job_whose_slo_cannot_hold():
    """The hand-worked pair on a cluster of one node per pool: B (sync) runs; A (async, k = 1)
    would be slowed 1.667x: refused with SLO 1.5 (its slowdown named), admitted with 1.7 into
    B's group at no extra cost, its prediction 100 / 60."""
    s = InterGroupScheduler(_bounded_cluster())
    assert s.admit(_job("B", 40, 50, 10, 1.0)).admitted
    d = s.decide(_job("A", 60, 30, 10, 1.5, k=1))
    direct = next(c for c in d.to_dict()["candidates"] if c["strategy"] == "direct")
    assert not d.admitted and d.code == "retry_later" and direct["plugin"] == "slo"
    assert "A: slowdown >= 1.667 > SLO 1.500" in direct["reasons"][0]  # its node-load bound: 100 s / 60 s
    ok = s.admit(_job("A", 60, 30, 10, 1.7, k=1))
    assert ok.admitted and ok.strategy == "direct" and ok.delta_usd_per_h == 0.0
    assert ok.predicted_slowdowns == pytest.approx({"B": 1.0, "A": 100 / 60})
    # the same job synchronous (solo 100 s) is not slowed at all: the slowdown is its pipelining's loss
    s2 = InterGroupScheduler(_bounded_cluster())
    s2.admit(_job("B", 40, 50, 10, 1.0))
    assert s2.decide(_job("A", 60, 30, 10, 1.0)).predicted_slowdowns == pytest.approx({"B": 1.0, "A": 1.0})


# --- the replay -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,stale_group,stale_solo", [("exact", 1, 1), ("bounded", 0, 1)])
def test_replay_of_the_hand_worked_pair(mode, stale_group, stale_solo):
    """A (async, 10 iterations of 60 s alone) and B (sync, 10 of 100 s) arrive together. RollMux
    co-executes them on one node per pool: both iterate every 100 s, so both leave at 1,000 s
    (A slowed 1.667x, within its SLO 2); Solo-D runs A 600 s and B 1,000 s on two nodes each:
    1.6x RollMux's cost. A's rollouts: exact staleness 1 everywhere, bounded 0 in the group and 1
    alone."""
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.sim.simulator import simulate
    from rollmux.workloads import SimJob

    c = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    a = JobSpec(job_id="A", model_params_b=7, num_rollout_gpus=8, num_train_gpus=8, slo=2.0, max_staleness=1,
                staleness_mode=mode, measured=PhaseProfile(t_roll_s=60, t_train_s=30, t_sync_s=10))
    b = JobSpec(job_id="B", model_params_b=7, num_rollout_gpus=8, num_train_gpus=8, slo=1.0,
                measured=PhaseProfile(t_roll_s=40, t_train_s=50, t_sync_s=10))
    jobs = [SimJob(a, "hand", "balanced", 0.0, 600.0), SimJob(b, "hand", "balanced", 0.0, 1000.0)]
    res = simulate(jobs, c, ["rollmux", "solo-d"])
    node_usd_per_h = c.rollout_pool.node.price_usd_per_h + c.train_pool.node.price_usd_per_h
    rm, sd = res.runs["rollmux"], res.runs["solo-d"]
    assert rm.outcomes["A"].departure_s == pytest.approx(1000.0) and rm.outcomes["B"].departure_s == pytest.approx(1000.0)
    assert rm.outcomes["A"].slowdown == pytest.approx(1000 / 600) and rm.outcomes["B"].slowdown == pytest.approx(1.0)
    assert rm.cost_usd == pytest.approx(node_usd_per_h * 1000 / 3600)
    assert sd.cost_usd == pytest.approx(node_usd_per_h * (600 + 1000) / 3600)
    assert rm.outcomes["A"].staleness == pytest.approx({stale_group: 10.0})
    assert sd.outcomes["A"].staleness == pytest.approx({stale_solo: 10.0})
    kinds = res.summary["policies"]["rollmux"]["by_kind"]
    assert set(kinds) == {"sync", f"async_{mode}"}
    ka = kinds[f"async_{mode}"]
    assert ka["slo_attainment"] == 1.0 and ka["staleness_max"] == stale_group and ka["staleness_over_bound"] == 0
    assert ka["cost_usd"] == pytest.approx(rm.cost_usd / 2)  # half the GPUs asked
    assert kinds["sync"]["staleness_distribution"] == {"0": 1.0}


def test_replay_without_async_jobs_reports_no_kinds():
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.sim.simulator import simulate
    from rollmux.workloads import SimJob, assign_async

    c = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    jobs = [SimJob(_job("B", 40, 50, 10, 1.0), "hand", "balanced", 0.0, 1000.0)]
    assert "by_kind" not in simulate(jobs, c, ["rollmux"]).summary["policies"]["rollmux"]
    drawn = assign_async(jobs * 1, 1.0, max_staleness=2, mode="bounded", seed=3)
    assert drawn[0].spec.max_staleness == 2 and drawn[0].profile.max_staleness == 2
    assert assign_async(jobs, 0.0) == jobs
    for bad in ({"share": 1.5}, {"share": 0.5, "max_staleness": 0}, {"share": 0.5, "mode": "eventual"}):
        with pytest.raises(ValueError):
            assign_async(jobs, bad.pop("share"), **bad)


def test_lower_bound_covers_async_jobs():
    """The optimum's floor and the LP lower bound price asynchronous members with the same model
    (their solo time and node loads): on sets of the replay's jobs, half of them asynchronous, the
    floor never exceeds build_group's price and the LP bound never exceeds the exact optimum."""
    import math
    import random

    from rollmux.admission import build_group
    from rollmux.baselines import OptimalPartition
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.partition_bound import _rows, floor_usd_per_h, lp_lower_bound
    from rollmux.traces import EXTRACT_TRACE, TraceWindow, load_trace
    from rollmux.workloads import assign_async, draw_jobs

    c = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    drawn = draw_jobs(load_trace(EXTRACT_TRACE, TraceWindow(max_jobs=120, min_duration_s=3600.0)), c, seed=0)
    jobs = [(j.spec, j.profile) for j in assign_async(drawn, 0.5, max_staleness=1, seed=0)]
    assert sum(p.max_staleness for _, p in jobs) > 30
    rng = random.Random(5)
    pr, pt = c.rollout_pool.node.price_usd_per_h, c.train_pool.node.price_usd_per_h
    feasible = 0
    for _ in range(60):
        ms = rng.sample(jobs, rng.randint(1, 4))
        g = build_group(ms, c)
        f = floor_usd_per_h(_rows(ms, c), pr, pt)
        if g is not None:
            feasible += 1
            assert f <= g.cost_usd_per_h(c) + 1e-9
        else:
            assert f == math.inf or f >= 0
    assert feasible > 10
    for n in (5, 8):
        ms = rng.sample(jobs, n)
        exact = OptimalPartition(c, exact_max_jobs=16, time_limit_s=5.0).solve(ms)
        assert exact.exact
        assert lp_lower_bound(OptimalPartition(c), ms).bound_usd_per_h <= exact.cost_usd_per_h + 1e-6


# --- the runtime's ledger (pure) --------------------------------------------------------------------

def test_ledger_grants_an_async_jobs_two_streams_at_once_with_versions():
    """An async member (k = 1) beside a synchronous one: its rollout 1 is granted while its
    training 0 holds the training node; every grant carries the version it works with; a move
    drains the pipeline (no rollout ahead) and takes effect at the iteration boundary."""
    from rollmux.group_ledger import GroupLedger, PermitError
    from rollmux.messages import PhaseRecord

    t = [0.0]
    led = GroupLedger("g", clock=lambda: t[0], lease_s=0)
    led.add("A", ["r0"], ["t0"], max_staleness=1)
    led.add("B", ["r1"], ["t1"])
    ok = PhaseRecord(ok=True)

    def grant(j, ph, it):
        g = led.try_grant(j, ph, it, t[0])
        assert g is not None, (j, ph, it)
        return g

    r0 = grant("A", "rollout", 0)
    assert r0.version == 0 and led.try_grant("A", "train", 0, 0.0) is None  # training 0 waits for rollout 0
    led.release(r0, ok)
    t0, r1 = grant("A", "train", 0), grant("A", "rollout", 1)  # both streams at once
    assert (t0.version, r1.version) == (0, 0)
    assert set(led.grants) == {("A", "train"), ("A", "rollout")}
    with pytest.raises(PermitError, match="asked for sync"):
        led.try_grant("A", "sync", 0, 0.0)  # its training runs: the sync is not next yet
    led.release(r1, ok)
    assert led.try_grant("A", "rollout", 2, 0.0) is None  # rollout 2 waits for sync 0 (version 1)
    led.release(t0, ok)
    s0 = grant("A", "sync", 0)
    assert s0.version == 1
    led.release(s0, ok)
    assert led.members["A"].iterations_done == 1
    assert grant("B", "rollout", 0).version == 0  # a synchronous member as before
    # a move: no rollout ahead is granted; the job leaves once its pipeline has drained
    assert led.remove("A", "moved to group-9") and "A" in led.moving
    assert led.try_grant("A", "rollout", 2, 0.0) is None
    t1 = grant("A", "train", 1)
    led.release(t1, ok)
    led.release(grant("A", "sync", 1), ok)
    assert led.gone["A"] == "moved to group-9" and not led.is_queued("A")


def test_pipeline_fill():
    from rollmux.staleness import pipeline_fill_s

    assert pipeline_fill_s(60, 30, 10, 1) == 40 and pipeline_fill_s(50, 80, 20, 2) == 50
    assert pipeline_fill_s(60, 30, 10, 0) == 0
    # alone: 4 iterations of case 1 end at 4 x 60 + 40 = 280 s (the 4th sync's end)
    s = simulate_group([mem("A", 60, 30, 10, k=1)], meta_iterations=4, record_timeline=True)
    assert max(r.end_s for r in s.timeline if r.phase == "sync" and r.iteration == 3) == 280.0


def test_stochastic_solo_d_of_an_async_job_is_its_realised_solo_time():
    """Stochastic replay: an asynchronous job alone on its own pools (Solo-D) runs at its realised
    solo time (its sampled iterations pipelined), so its slowdown there is 1; co-executed, both
    jobs' slowdowns are taken against the same realised solo times."""
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.sim.simulator import simulate
    from rollmux.workloads import SimJob

    c = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    a = JobSpec(job_id="A", model_params_b=7, num_rollout_gpus=8, num_train_gpus=8, slo=3.0, max_staleness=1,
                max_response_tokens=4096, measured=PhaseProfile(t_roll_s=60, t_train_s=30, t_sync_s=10))
    b = JobSpec(job_id="B", model_params_b=7, num_rollout_gpus=8, num_train_gpus=8, slo=3.0,
                max_response_tokens=4096, measured=PhaseProfile(t_roll_s=40, t_train_s=50, t_sync_s=10))
    jobs = [SimJob(a, "hand", "balanced", 0.0, 3000.0), SimJob(b, "hand", "balanced", 0.0, 3000.0)]
    res = simulate(jobs, c, ["solo-d", "rollmux"], stochastic=True, seed=1)
    sd = res.runs["solo-d"].outcomes
    assert sd["A"].slowdown == pytest.approx(1.0, rel=1e-9) and sd["B"].slowdown == pytest.approx(1.0, rel=1e-9)
    assert res.real.solo_time_s(a) < res.real.mean_profile(a).t_roll_s + res.real.mean_profile(a).t_train_s
    assert all(o.slo_met for o in res.runs["rollmux"].outcomes.values())


def test_slo_watch_predicts_async_slowdowns_against_the_pipelined_solo_time():
    """The SLO watch's prediction (measured samples through the same schedule) takes an async
    member's slowdown against its pipelined realised solo time: the hand-worked pair gives A
    100 / 60 and B 1.0, from their planning profiles and from one measured sample each."""
    from rollmux.admission.slo_watch import predict_slowdowns
    from rollmux.models import CoExecutionGroup

    a, b = mem("A", 60, 30, 10, k=1), mem("B", 40, 50, 10)
    g = CoExecutionGroup(group_id="g", rollout_nodes=("r0",), train_nodes=("t0",), members=(a, b))
    assert predict_slowdowns(g, {}) == pytest.approx({"A": 100 / 60, "B": 1.0})
    got = predict_slowdowns(g, {"A": [IterationTimes(60, 30, 10)], "B": [IterationTimes(40, 50, 10)]})
    assert got == pytest.approx({"A": 100 / 60, "B": 1.0})
