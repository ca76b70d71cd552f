"""The roofline profiler: hand-derived values, worst case vs expectation, overrides, memory state,
seeded long-tailed sampling."""

from __future__ import annotations

import numpy as np
import pytest

from rollmux import profiler as P
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.models import JobSpec, PhaseProfile


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(CONFIG_DIR / "cluster_sim.yaml")


def _job(**kw) -> JobSpec:
    base = dict(job_id="q7", model_params_b=7, max_response_tokens=8192, num_prompts=256, responses_per_prompt=8,
                prompt_tokens=512, num_rollout_gpus=8, num_train_gpus=8)
    base.update(kw)
    return JobSpec(**base)


def test_worst_case_matches_hand_derived_roofline(cluster):
    # 7B bf16 = 14 GB fits one H20 (tp=1, 8 replicas); KV budget 0.9*96-14 = 72.4 GB; KV 57,344 B/token;
    # end context 8704 tokens -> 145 sequences per replica; 256 per replica -> 2 waves;
    # step = (14e9 + 145*4608*57344) / (4e12*0.7) + 3 ms = 21.684 ms; prefill 1.468e16/5.92e14 = 24.80 s.
    m = P.rollout_model(_job(), cluster.rollout_pool.node.gpu, 8, 8192)
    assert (m.tp, m.replicas, m.concurrency, m.sequences) == (1, 8, 145, 2048)
    assert m.step_s == pytest.approx(0.0216839, rel=1e-5)
    p = P.estimate(_job(), cluster)
    assert p.t_roll_s == pytest.approx(24.7974 + 2 * 8192 * 0.0216839, rel=1e-5)
    # training: 8 * 7e9 * 2048 * 8704 FLOPs / (8 * 989e12 * 0.35)
    assert p.t_train_s == pytest.approx(8 * 7e9 * 2048 * 8704 / (8 * 989e12 * 0.35), rel=1e-9)
    # sync: the plan's prediction: 14 GB over 20 Gbps (5.6 s), the 8-GPU broadcast of 1/8 shards
    # pipelined behind it over 32 MiB bucket rounds (56 rounds: + 0.245 s / 56), 0.1 ms per round
    assert p.t_sync_s == pytest.approx(5.6 + 14e9 / 8 * 7 * 8 / 400e9 / 56 + 56 * 1e-4, rel=1e-3)
    assert p.t_solo_s == pytest.approx(p.t_roll_s + p.t_train_s + p.t_sync_s)


def test_paper_job_types_land_in_paper_phase_range(cluster):
    # RollMux Fig. 2: Qwen 7B-32B, 4k-32k tokens, phases 50-900+ s.
    for pb, tok, gpus, prompts in [(7, 4096, 8, 256), (7, 8192, 8, 256), (14, 8192, 16, 256), (32, 16384, 32, 128)]:
        p = P.estimate(_job(model_params_b=pb, max_response_tokens=tok, num_rollout_gpus=gpus, num_train_gpus=gpus,
                            num_prompts=prompts), cluster)
        assert 50 <= p.t_roll_s <= 2500 and 50 <= p.t_train_s <= 2500, (pb, tok, p)


def test_worst_case_dominates_expected_and_scales(cluster):
    j = _job(mean_response_tokens=2048)
    w, e = P.estimate(j, cluster), P.expected_profile(j, cluster)
    assert e.t_roll_s < w.t_roll_s and e.t_train_s < w.t_train_s and e.t_sync_s == w.t_sync_s
    # longer caps cost more; more GPUs cost less
    assert P.estimate(_job(max_response_tokens=16384), cluster).t_roll_s > 2 * w.t_roll_s
    assert P.estimate(_job(num_train_gpus=16), cluster).t_train_s == pytest.approx(w.t_train_s / 2)
    assert P.estimate(_job(num_rollout_gpus=16), cluster).t_roll_s < w.t_roll_s


def test_multi_turn_multiplies_turns(cluster):
    one = P.estimate(_job(max_response_tokens=2048), cluster)
    three = P.estimate(_job(max_response_tokens=2048, multi_turn=True, turns=3), cluster)
    assert three.t_roll_s > 3 * one.t_roll_s  # three rounds with a growing context + env latency
    assert three.t_train_s == pytest.approx(3 * one.t_train_s)


def test_measured_wins_and_overrides_price_other_hardware(cluster):
    meas = PhaseProfile(t_roll_s=11, t_train_s=22, t_sync_s=3)
    assert P.estimate(_job(measured=meas), cluster) == meas
    h800 = cluster.train_pool.node.gpu
    col = P.estimate(_job(), cluster, rollout_gpu=h800, num_rollout_gpus=8, colocated=True)
    base = P.estimate(_job(), cluster)
    # H800 has less HBM bandwidth (3.35 vs 4.0 TB/s) and HBM than H20: decode is slower there
    assert col.t_roll_s > base.t_roll_s
    assert col.t_sync_s == pytest.approx(14e9 * 8 / 400e9, rel=0.05)  # resharding at fabric speed
    assert col.t_train_s == pytest.approx(base.t_train_s)


def test_sync_schemes(cluster):
    j = _job(num_rollout_gpus=32)  # 4 rollout nodes
    rm, flat = P.sync_time(j, cluster), P.sync_time(j, cluster, scheme="flat")
    assert rm == pytest.approx(5.6, rel=0.01)  # one copy across; the broadcast hides behind it
    assert flat == pytest.approx(32 * 5.6, rel=0.01)  # every rollout GPU pulls a copy across
    with pytest.raises(ValueError, match="unknown sync scheme"):
        P.sync_time(j, cluster, scheme="ring")


def test_model_too_big_for_gpus_raises(cluster):
    with pytest.raises(ValueError, match="do not fit"):
        P.estimate(_job(model_params_b=400, num_rollout_gpus=1), cluster)
    with pytest.raises(ValueError, match="positive"):
        P.estimate(_job(), cluster, num_train_gpus=0)


def test_state_gb_values_and_overrides(cluster):
    # rollout: 2 B/param + 0.1 * 96 GB * 8 GPUs; training: 20 B/param / nodes + 0.2 * 80 GB * 8 GPUs
    assert P.state_gb(_job(), "rollout", cluster) == pytest.approx(14 + 76.8)
    assert P.state_gb(_job(), "train", cluster) == pytest.approx(140 + 128)
    assert P.state_gb(_job(model_params_b=32, num_train_gpus=16), "train", cluster) == pytest.approx(320 + 128)
    assert P.state_gb(_job(mem_roll_gb=5, mem_train_gb=7), "rollout", cluster) == 5
    assert P.state_gb(_job(mem_roll_gb=5, mem_train_gb=7), "train", cluster) == 7
    with pytest.raises(ValueError, match="unknown pool"):
        P.state_gb(_job(), "disk")  # type: ignore[arg-type]


def test_response_lengths_seeded_long_tailed_and_clipped():
    j = _job(mean_response_tokens=1024, max_response_tokens=8192)
    a = P.sample_response_lengths(j, np.random.default_rng(3))
    b = P.sample_response_lengths(j, np.random.default_rng(3))
    assert np.array_equal(a, b) and a.shape == (2048,)
    assert a.max() == 8192 and a.min() >= 1
    assert np.median(a) < a.mean() < 1100  # right-skewed; clipping lowers the mean a little
    assert (a >= 8192).sum() >= 1  # some stragglers hit the cap


def test_sample_iteration_bounded_by_worst_case(cluster):
    j = _job(mean_response_tokens=1024, num_prompts=32)
    w = P.estimate(j, cluster)
    rng = np.random.default_rng(0)
    its = [P.sample_iteration(j, cluster, rng) for _ in range(5)]
    for it in its:
        assert 0 < it.t_trigger_s < it.t_roll_s <= w.t_roll_s * (1 + 1e-9)
        assert it.t_train_s < w.t_train_s and it.t_sync_s == w.t_sync_s
    # the sample is a fraction of the planning profile: a measured profile twice as long doubles it
    twice = PhaseProfile(t_roll_s=2 * w.t_roll_s, t_train_s=2 * w.t_train_s, t_sync_s=w.t_sync_s)
    a = P.sample_iteration(j, cluster, np.random.default_rng(7))
    b = P.sample_iteration(j, cluster, np.random.default_rng(7), profile=twice)
    assert b.t_roll_s == pytest.approx(2 * a.t_roll_s) and b.t_trigger_s == pytest.approx(2 * a.t_trigger_s)
    assert b.t_train_s == pytest.approx(2 * a.t_train_s)
    with pytest.raises(ValueError, match="trigger_fraction"):
        P.sample_iteration(j, cluster, rng, trigger_fraction=0)


def test_sync_time_is_the_plans_prediction_and_grows_with_model_size(cluster):
    """No fixed term: the profiler asks the runtime's plan (RollMux §5.2) and the time scales with
    the model's bytes; N = M is far faster than one trainer feeding the whole rollout pool."""
    from rollmux.sync_plan import LinkModel, TensorMeta, build_plan

    small, big = (P.sync_time(_job(model_params_b=b), cluster) for b in (0.5, 70))
    assert big / small == pytest.approx(140, rel=0.02)
    nb = 140 * 10**9
    metas = [TensorMeta(f"l{i}", (nb // 64,), "uint8", nb // 64) for i in range(64)]
    links = LinkModel(cluster.cross_cluster_gbps, cluster.intra_cluster_gbps, latency_s=P.SYNC_BUCKET_LATENCY_S)
    assert P.sync_time(_job(model_params_b=70), cluster) == pytest.approx(
        build_plan(metas, 8, 8).predict(links).total_s, rel=1e-9)
    one = build_plan(metas, 1, 8).predict(LinkModel(cluster.intra_cluster_gbps, cluster.intra_cluster_gbps)).total_s
    assert one > 2 * build_plan(metas, 8, 8).predict(LinkModel(cluster.intra_cluster_gbps, cluster.intra_cluster_gbps)).total_s
