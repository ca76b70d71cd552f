"""Engines driven by the rollout request scheduler: CPU (tiny transformers model) and simulated."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from actors.rollout.engine import CPUEngine, ListSource, serve
from actors.rollout.sim_engine import SimulatedEngine
from rollmux.rollout_sched import Request, RequestType, RolloutRequestScheduler, load_rollout_sched_config


@pytest.fixture(scope="module")
def cpu_engine_factory():
    cfg = load_rollout_sched_config(section="cpu_engine")

    def make(**kw):
        return CPUEngine(slice_tokens=cfg.slice_tokens, eos_token_id=None, seed=0, **kw)

    return cfg, make


def test_reward_query_is_answered_while_a_long_generation_runs(cpu_engine_factory):
    cfg, make = cpu_engine_factory
    eng = make()
    sched = RolloutRequestScheduler(cfg, "mixed")
    long_gen = Request(request_id="long", prompt_token_ids=tuple(range(1, 33)), max_tokens=200)
    reward = Request(request_id="reward", prompt_token_ids=tuple(range(40, 60)), type=RequestType.REWARD,
                     max_tokens=1, arrival_s=0.02)
    src = ListSource([long_gen, reward])
    seen_running = []
    stats = serve(sched, eng, src, max_windows=500, max_wall_s=60,
                  on_window=lambda now, b, comps: seen_running.extend(
                      (c.request_id, eng.running) for c in comps if c.request_id == "reward"))
    assert stats.stopped_by == "drained" and stats.completed == 2
    out = src.completions
    assert len(out["long"].output_token_ids) == 200
    assert out["reward"].finished_s < out["long"].finished_s
    assert seen_running == [("reward", 1)]  # the long generation was still in flight
    assert 0.0 < out["reward"].score < 1.0
    # the reward entered at a slice boundary, long before the generation's 25 slices ended
    rec = {d.request_id: d for d in sched.dispatch_log}
    assert rec["reward"].window < 25


def test_cpu_output_does_not_depend_on_batching(cpu_engine_factory):
    cfg, make = cpu_engine_factory
    target = Request(request_id="t", prompt_token_ids=(5, 6, 7, 8), max_tokens=12)
    others = [Request(request_id=f"o{i}", prompt_token_ids=(9, i + 1), max_tokens=12) for i in range(3)]

    def run(reqs):
        s = RolloutRequestScheduler(cfg, "fifo")
        src = ListSource(reqs)
        serve(s, make(), src, max_windows=200, max_wall_s=60)
        return src.completions

    alone = run([target])["t"].output_token_ids
    assert alone == run(others + [target])["t"].output_token_ids
    assert len(alone) == 12


def test_replay_and_state_query_on_cpu(cpu_engine_factory):
    cfg, make = cpu_engine_factory
    s = RolloutRequestScheduler(cfg, "mixed")
    src = ListSource([
        Request(request_id="rp", prompt_token_ids=tuple(range(1, 30)), type="replay", max_tokens=0),
        Request(request_id="sq", prompt_token_ids=(3, 4, 5), type="state_query", max_tokens=3),
    ])
    serve(s, make(), src, max_windows=100, max_wall_s=60)
    assert src.completions["rp"].score < 0 and src.completions["rp"].output_token_ids == ()
    assert len(src.completions["sq"].output_token_ids) == 3


def test_simulated_engine_prefix_hits_save_prefill_and_drain():
    cfg = load_rollout_sched_config()
    shared = tuple(range(1, 201))
    reqs = [Request(request_id=f"g{i}", prompt_token_ids=shared + (1000 + i,), max_tokens=64, arrival_s=0.01 * i)
            for i in range(40)]
    reqs += [Request(request_id=f"r{i}", prompt_token_ids=(7,) * 20, type="reward", max_tokens=1, arrival_s=0.2)
             for i in range(10)]
    eng = SimulatedEngine(cfg.slice_tokens, output_len=lambda r: 30 if r.request_id.startswith("g") else 1)
    s = RolloutRequestScheduler(cfg, "prefix")
    src = ListSource(reqs)
    stats = serve(s, eng, src, max_windows=10_000)
    assert stats.stopped_by == "drained" and len(src.completions) == 50
    assert all(len(src.completions[f"g{i}"].output_token_ids) == 30 for i in range(40))
    assert eng.prefill_saved_tokens >= 39 * 200  # every generation after the first reuses the shared prefix
    assert s.metrics()["prefix_hit_ratio"] > 0.8
    assert s.metrics()["running"] == 0 and s.metrics()["kv_in_use_tokens"] == 0


def test_serve_reports_requests_that_can_never_be_admitted():
    base = load_rollout_sched_config()
    cfg = base.model_copy(update={"budget": base.budget.model_copy(update={"replay_quota": 0.0})})  # no replay at all
    s = RolloutRequestScheduler(cfg, "mixed")
    src = ListSource([Request(request_id="bg", prompt_token_ids=(1,) * 10, type="replay", max_tokens=0)])
    with pytest.raises(RuntimeError, match="cannot be admitted"):
        serve(s, SimulatedEngine(cfg.slice_tokens), src, max_windows=5000)


def test_bench_quick_mixed_beats_baselines_on_the_simulated_stream():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_rollout_sched as bench

    spec = bench.StreamSpec(steps=4, horizon_s=90.0, burst_at_s=20.0, burst_size=200)
    res = {p: bench.run_policy(p, spec, "sim", seed=0, max_wall_s=120) for p in bench.POLICIES}
    for p in bench.POLICIES:
        assert res[p]["steps_done"] == 4 and res[p]["stopped_by"] == "drained"
        assert set(bench.METRIC_KEYS) <= set(res[p])
    assert res["mixed"]["short_p99_wait_s"] < res["fifo"]["short_p99_wait_s"]
    assert res["mixed"]["trainer_idle_ratio"] < res["fifo"]["trainer_idle_ratio"]
    assert res["mixed"]["diversity"] > res["prefix"]["diversity"]
    assert res["mixed"]["index_bytes"] < res["prefix"]["index_bytes"]


def test_cpu_prefix_cache_reuses_whole_blocks_with_bit_identical_logits(cpu_engine_factory):
    """Block-granular reuse: a prompt's logits are the same bits whether its prefix came from the
    cache (another prompt's, or its own) or was computed, so outputs never depend on the cache."""
    import torch

    _, make = cpu_engine_factory
    eng, cold = make(), make()
    cold.prefix_cache_entries = 0
    shared = tuple(range(1, 40))  # 39 shared tokens: two whole blocks of 16
    with eng._threads():
        eng._prefill(shared + (100, 101))
        reused_logits, _ = eng._prefill(shared + (200, 201, 202))
        assert eng.prefill_tokens_reused == 32 and eng.prefill_tokens_computed == 41 + 10
        same, _ = eng._prefill(shared + (200, 201, 202))  # its own prompt again: 32 of 42 tokens reused
        assert eng.prefill_tokens_reused == 64
        fresh_logits, _ = cold._prefill(shared + (200, 201, 202))
    assert torch.equal(reused_logits[-1], fresh_logits[-1]) and torch.equal(same[-1], fresh_logits[-1])
    eng.on_weights_updated(1)
    with eng._threads():
        eng._prefill(shared + (7,))
    assert eng.prefill_tokens_reused == 64  # nothing reused after a weight update


@pytest.mark.gpu
def test_vllm_engine_serves_a_mixed_stream(tmp_path):
    """GPU hosts with vLLM: a tiny random Llama saved locally (no download), prefix caching on."""
    pytest.importorskip("vllm")
    from transformers import LlamaConfig, LlamaForCausalLM

    from actors.rollout.vllm_engine import VLLMEngine

    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    eng = VLLMEngine(str(tmp_path), skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.2,
                     max_model_len=1024, ignore_eos=True)  # a random model may emit <eos> before 64 tokens
    sched = RolloutRequestScheduler(load_rollout_sched_config(section="cpu_engine"), "mixed")
    reqs = [Request(request_id="g", prompt_token_ids=tuple(range(1, 40)), max_tokens=64),
            Request(request_id="r", prompt_token_ids=tuple(range(1, 20)), type="reward", max_tokens=1, arrival_s=0.0),
            Request(request_id="p", prompt_token_ids=tuple(range(1, 50)), type="replay", max_tokens=0)]
    src = ListSource(reqs)
    stats = serve(sched, eng, src, max_windows=2000, max_wall_s=120)
    assert stats.stopped_by == "drained"
    assert len(src.completions["g"].output_token_ids) == 64
    assert src.completions["r"].score is not None and src.completions["p"].score is not None
