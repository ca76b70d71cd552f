"""The shortcuts that make the neighbourhood re-optimisation cheap decide exactly as the full
search: the scalar training-pin check equals build_group's, the layout floor never exceeds
build_group's price, the partition floor never exceeds the optimum, and the dynamic programme
returns CP-SAT's partition whenever the optimum is unique. Jobs are drawn as the simulator draws
them (the repository's Philly extract, the ``mixed`` workload), so the sets mix 1- and 2-node jobs."""

from __future__ import annotations

import math
import random

import pytest

from rollmux import baselines
from rollmux.admission import build_group, layout_floor_usd_per_h, layout_row, load_scheduler_config, training_pins_feasible
from rollmux.admission.layouts import _train_plan
from rollmux.baselines import OptimalPartition
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.traces import EXTRACT_TRACE, TraceWindow, load_trace
from rollmux.workloads import draw_jobs


@pytest.fixture(scope="module")
def pool():
    cluster = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    window = TraceWindow(max_jobs=300, min_duration_s=3600.0, max_duration_s=259200.0)
    jobs = draw_jobs(load_trace(EXTRACT_TRACE, window), cluster, mix="mixed", seed=load_scheduler_config().seed)
    return cluster, [(j.spec, j.profile) for j in jobs]


def test_scalar_training_check_equals_build_groups_training_plan(pool):
    cluster, jobs = pool
    rng = random.Random(7)
    seen = {True: 0, False: 0}
    for _ in range(1500):
        ms = rng.sample(jobs, rng.randint(1, 5))
        want = _train_plan(ms, cluster, False) is not None
        assert training_pins_feasible([layout_row(s, p, cluster) for s, p in ms], cluster) == want
        seen[want] += 1
    assert seen[True] > 100 and seen[False] > 100  # both outcomes exercised


def test_layout_floor_is_a_lower_bound_of_build_group(pool):
    cluster, jobs = pool
    rng = random.Random(8)
    tight = inf_ok = 0
    for _ in range(400):
        ms = rng.sample(jobs, rng.randint(2, 5))
        g = build_group(ms, cluster)
        floor = layout_floor_usd_per_h(ms, cluster)
        if g is None:
            inf_ok += floor == math.inf
            continue
        assert floor <= g.cost_usd_per_h(cluster) + 1e-9
        tight += floor == g.cost_usd_per_h(cluster)
    assert tight > 20 and inf_ok > 20


def _cp_sat_only(monkeypatch):
    monkeypatch.setattr(baselines, "DP_MAX_JOBS", -1)


def test_dynamic_programme_returns_cp_sats_partition_when_the_optimum_is_unique(pool, monkeypatch):
    cluster, jobs = pool
    rng = random.Random(9)
    unique = 0
    for _ in range(25):
        ms = rng.sample(jobs, 8)
        dp = OptimalPartition(cluster, exact_max_jobs=8).solve(ms)
        feas = OptimalPartition(cluster, exact_max_jobs=8)._candidates(ms)
        cols = list(feas.items())
        top, parts = OptimalPartition._optimal_partitions(ms, cols, [round(g.cost_usd_per_h(cluster) * 1000) for _, g in cols], 64)
        with monkeypatch.context() as m:
            _cp_sat_only(m)
            cp = OptimalPartition(cluster, exact_max_jobs=8).solve(ms)
        assert round(dp.cost_usd_per_h * 1000) == round(cp.cost_usd_per_h * 1000) == top
        assert dp.exact and cp.exact
        if parts is not None and len(parts) == 1:
            unique += 1
            assert [g.job_ids for g in dp.groups] == [g.job_ids for g in cp.groups]
            assert dp.groups == cp.groups
    assert unique >= 5


def test_partition_floor_never_exceeds_the_optimum(pool):
    cluster, jobs = pool
    rng = random.Random(10)
    tight = 0
    for _ in range(20):
        ms = rng.sample(jobs, 7)
        solver = OptimalPartition(cluster, exact_max_jobs=8)
        floor = solver.partition_floor(ms, {})
        opt = OptimalPartition(cluster, exact_max_jobs=8).solve(ms)
        assert floor <= opt.cost_usd_per_h + 1e-6
        # the optimum's own groups, fixed at their price: still no partition below the optimum
        fixed = {frozenset(g.job_ids): g.cost_usd_per_h(cluster) for g in opt.groups}
        assert solver.partition_floor(ms, fixed) <= opt.cost_usd_per_h + 1e-6
        tight += floor >= opt.cost_usd_per_h - 1e-6
    assert tight >= 3  # the floor often proves the optimum (no exact search needed then)


def test_ties_go_to_cp_sat_unless_the_caller_is_indifferent(pool, monkeypatch):
    cluster, jobs = pool
    calls = []
    orig = baselines.OptimalPartition._optimal_partitions

    def spy(members, cols, units, limit):
        top, parts = orig(members, cols, units, limit)
        calls.append(None if parts is None else len(parts))
        return top, parts

    monkeypatch.setattr(baselines.OptimalPartition, "_optimal_partitions", staticmethod(spy))
    rng = random.Random(11)
    for _ in range(15):
        ms = rng.sample(jobs, 8)
        res = OptimalPartition(cluster, exact_max_jobs=8).solve(ms, indifferent=lambda groups: True)
        with monkeypatch.context() as m:
            _cp_sat_only(m)
            cp = OptimalPartition(cluster, exact_max_jobs=8).solve(ms)
        assert round(res.cost_usd_per_h * 1000) == round(cp.cost_usd_per_h * 1000)
    assert calls and all(c is not None for c in calls)


def test_cp_sat_answer_does_not_depend_on_the_wall_clock(pool, monkeypatch):
    """CP-SAT's budget is deterministic time with one worker and a fixed seed: a host so loaded
    that every clock read is 100 s later gets the same partition, still proven optimal (a
    wall-clock budget returned unproven partitions under load and made replays irreproducible)."""
    import time as _time

    from ortools.sat.python import cp_model

    cluster, jobs = pool
    _cp_sat_only(monkeypatch)
    members = jobs[:9]
    calm = OptimalPartition(cluster, exact_max_jobs=12, time_limit_s=2.0).solve(members)
    seen = []
    real_solver = cp_model.CpSolver

    def spy():
        s = real_solver()
        seen.append(s)
        return s

    monkeypatch.setattr(cp_model, "CpSolver", spy)
    clock = {"t": _time.perf_counter()}

    def loaded():
        clock["t"] += 100.0
        return clock["t"]

    monkeypatch.setattr(baselines.time, "perf_counter", loaded)
    monkeypatch.setattr(baselines, "_SOLVED", {})  # CP-SAT itself answers again (not the memo of identical models)
    busy = OptimalPartition(cluster, exact_max_jobs=12, time_limit_s=2.0).solve(members)
    assert seen and all(s.parameters.max_deterministic_time == 2.0 and s.parameters.num_workers == 1
                        and s.parameters.max_time_in_seconds >= 20.0 for s in seen)
    assert busy.exact and calm.exact
    assert sorted(sorted(g.job_ids) for g in busy.groups) == sorted(sorted(g.job_ids) for g in calm.groups)
    assert busy.cost_usd_per_h == calm.cost_usd_per_h


def test_set_partition_proto_is_the_builders_model():
    """solve_set_partition writes its CP-SAT model into the proto directly: field for field the
    model CpModel's builder methods make (so CP-SAT searches the same model), hint included."""

    from ortools.sat.python import cp_model

    rng = random.Random(5)
    for _ in range(20):
        ids = [f"j{k}" for k in range(rng.randint(1, 9))]
        keys = [frozenset([j]) for j in ids] + [frozenset(rng.sample(ids, rng.randint(1, len(ids)))) for _ in range(15)]
        units = [rng.randint(1, 10_000) for _ in keys]
        hint = [rng.random() < 0.3 for _ in keys] if rng.random() < 0.7 else None
        model = cp_model.CpModel()
        x = [model.NewBoolVar(f"x{i}") for i in range(len(keys))]
        for j in ids:
            model.AddExactlyOne(x[i] for i, s in enumerate(keys) if j in s)
        model.Minimize(sum(u * xi for u, xi in zip(units, x)))
        for xi, h in zip(x, hint or ()):
            model.AddHint(xi, h)
        direct = cp_model.CpModel()
        baselines._set_partition_proto(direct.Proto(), keys, units, ids, hint)
        assert str(direct.Proto()) == str(model.Proto())
        picked, optimal, _ = baselines.solve_set_partition(keys, units, ids, 1.0, hint)
        assert optimal and sorted(j for i in picked for j in keys[i]) == sorted(ids)
        assert baselines.solve_set_partition(keys, units, ids, 1.0, hint) == (picked, optimal, _)  # the memo's answer
