"""Workload mixes: seeded determinism, value ranges, mix weights."""

from __future__ import annotations

from collections import Counter

import pytest

from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.traces import TraceJob
from rollmux.workloads import JOB_TYPES, MIXES, draw_jobs

CLUSTER = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
TRACE = [TraceJob(i, 60.0 * i, 3600.0 + 100 * i, 1 + i % 8) for i in range(300)]


def test_same_seed_same_jobs_other_seed_differs():
    a = draw_jobs(TRACE[:50], CLUSTER, mix="mixed", seed=7)
    b = draw_jobs(TRACE[:50], CLUSTER, mix="mixed", seed=7)
    c = draw_jobs(TRACE[:50], CLUSTER, mix="mixed", seed=8)
    assert a == b
    assert [j.spec.measured for j in a] != [j.spec.measured for j in c]


def test_ranges_and_trace_fields():
    types = {t.name: t for t in JOB_TYPES}
    jobs = draw_jobs(TRACE, CLUSTER, mix="mixed", seed=0)
    assert len(jobs) == len(TRACE)
    for tj, j in zip(TRACE, jobs):
        t = types[j.job_type]
        p = j.spec.measured
        assert t.t_roll_s[0] <= p.t_roll_s <= t.t_roll_s[1]
        assert t.t_train_s[0] <= p.t_train_s <= t.t_train_s[1]
        assert p.t_sync_s > 0  # profiler's cross-cluster weight sync
        assert 1.0 <= j.spec.slo <= 2.0
        assert j.spec.num_rollout_gpus % 8 == 0 and j.spec.num_train_gpus % 8 == 0
        assert (j.arrival_s, j.duration_s) == (tj.arrival_s, tj.duration_s)
        assert j.iterations == pytest.approx(tj.duration_s / p.t_solo_s)
        assert 7 <= j.spec.model_params_b <= 32 and 4096 <= j.spec.max_response_tokens <= 32768
    # phases span the paper's 50-900+ s
    assert min(j.spec.measured.t_roll_s for j in jobs) < 100 and max(j.spec.measured.t_roll_s for j in jobs) > 900


def test_categories_follow_phase_ratio_and_mix_weights():
    for t in JOB_TYPES:
        ratio = sum(t.t_roll_s) / sum(t.t_train_s)
        want = "rollout" if ratio > 1.5 else "training" if ratio < 1 / 1.5 else "balanced"
        assert t.category == want, t.name
    for mix, weights in MIXES.items():
        cats = Counter(j.category for j in draw_jobs(TRACE, CLUSTER, mix=mix, seed=1))
        top = max(weights, key=weights.get)
        if weights[top] > 0.5:
            assert cats[top] > 0.45 * len(TRACE), (mix, cats)


def test_slo_range_and_bad_inputs():
    jobs = draw_jobs(TRACE[:40], CLUSTER, seed=3, slo_range=(1.1, 1.2))
    assert all(1.1 <= j.spec.slo <= 1.2 for j in jobs)
    with pytest.raises(ValueError, match="unknown mix 'nope'"):
        draw_jobs(TRACE[:2], CLUSTER, mix="nope")
    with pytest.raises(ValueError, match="slo_range"):
        draw_jobs(TRACE[:2], CLUSTER, slo_range=(0.5, 2.0))
