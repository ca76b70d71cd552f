"""Rollout backend ``sched``: generation through the rollout request scheduler (integration)."""

from __future__ import annotations

import pickle

import pytest
import torch

from actors.backends import make_rollout_backend
from actors.backends.hf_rollout import HFRolloutBackend
from actors.backends.sched_rollout import SchedRolloutBackend
from examples.grpo.config import GRPOJobConfig, ModelConfig, RunConfig, load_job_config
from examples.grpo.job import run_job
from examples.grpo.model import build_model
from examples.grpo.tokenizer import CharTokenizer
from rollmux.config import CONFIG_DIR, load_job
from rollmux.models import JobSpec
from rollmux.rollout_sched import Request, RequestType, load_rollout_sched_config

TOK = CharTokenizer()
TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=40)


def backend(seed: int = 0, **kw) -> SchedRolloutBackend:
    return make_rollout_backend("sched", build_model(TINY, seed, TOK), task_family="next", **kw)


def prompts(n_prompts: int = 2, group: int = 3) -> torch.Tensor:
    return TOK.encode_batch([f"{d}>" for d in range(n_prompts)]).repeat_interleave(group, dim=0)


def gen(be, p, seed=11, n=10, min_new=0, progress=None):
    return be.generate(p, max_new_tokens=n, temperature=1.0, seed=seed, eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                       progress=progress, min_new_tokens=min_new)


def test_output_contract_matches_hf_backend():
    p = prompts()
    calls = []
    out = gen(backend(), p, progress=lambda d, t: calls.append((d, t)))
    ref = HFRolloutBackend(build_model(TINY, 0, TOK)).generate(
        p, max_new_tokens=10, temperature=1.0, seed=11, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
    assert out.shape == ref.shape == (6, 3 + 10) and out.dtype == ref.dtype == torch.long
    assert out.device.type == "cpu" and torch.equal(out[:, :3], p)
    assert int(out.min()) >= 0 and int(out.max()) < TOK.vocab_size
    for row in out[:, 3:].tolist():  # after the first <eos> only padding
        if TOK.eos_id in row:
            k = row.index(TOK.eos_id)
            assert all(t == TOK.pad_id for t in row[k + 1:])
    assert calls and calls[-1] == (6, 6)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and all(t == 6 for _, t in calls)


def test_same_seed_same_tokens_across_calls_pickle_and_global_rng():
    p = prompts(3, 2)
    be = backend()
    a = gen(be, p, seed=5)
    torch.manual_seed(999)  # the global RNG must not matter
    state = torch.random.get_rng_state()
    b = gen(pickle.loads(pickle.dumps(be)), p, seed=5)  # the runtime pickles rollout state between phases
    c = gen(backend(), p, seed=5)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not torch.equal(a, gen(be, p, seed=6))


def test_min_new_tokens_suppresses_eos_and_rows_sample_independently():
    out = gen(backend(), prompts(1, 8), n=8, min_new=8)
    assert not (out[:, 3:] == TOK.eos_id).any()
    assert len({tuple(r) for r in out.tolist()}) > 1  # identical prompts, different per-request streams


def test_min_new_tokens_holds_across_admission_waves():
    # 32 rows need several admission waves (cold profile batches 8): a finished request's
    # generator must not lend its sample count to a later one (it once did, via id(generator))
    for seed in range(8):  # the old id(generator) bookkeeping let <eos> through in 7 of these 256 rows
        out = gen(backend(), prompts(4, 8), seed=seed, n=24, min_new=24)
        assert not (out[:, 3:] == TOK.eos_id).any()


def test_weight_update_bumps_policy_version_and_metrics_report_the_scheduler():
    be = backend()
    gen(be, prompts(2, 4), n=4)
    m = be.metrics()
    assert m["policy"] == "mixed" and m["dispatched"] == m["completed"] == 8 and m["backend_calls"] == 1
    assert 0.0 < m["prefix_hit_ratio"] <= 1.0  # group members share their prompt
    assert m["index_bytes"] > 0 and m["coldstart_phase"] == "cold" and m["policy_version"] == 0
    be.load_weights(build_model(TINY, 1, TOK).state_dict())
    assert be.version == 1 and be.metrics()["policy_version"] == 1
    rows = be.model.state_dict()
    assert torch.equal(rows["lm_head.weight"], build_model(TINY, 1, TOK).state_dict()["lm_head.weight"])
    with pytest.raises(ValueError, match="device"):
        SchedRolloutBackend(build_model(TINY, 0, TOK), device="cuda")
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        gen(be, prompts(1, 1), n=be.config.budget.kv_capacity_tokens)
    assert be.scheduler.pending == 0 and be.scheduler.running == 0


def test_a_call_stopped_by_its_window_bound_leaves_the_scheduler_clean():
    be = backend(max_windows=2)
    with pytest.raises(RuntimeError, match="max_windows"):
        gen(be, prompts(1, 2), n=30, min_new=30)
    assert be.scheduler.pending == 0 and be.scheduler.running == 0
    be.max_windows = 1000
    assert gen(be, prompts(1, 2), n=30, min_new=30).shape == (2, 33)  # the scheduler is usable again


def test_reward_query_is_answered_while_long_generations_run():
    cfg = load_rollout_sched_config(section="cpu_engine")
    be = backend(config=cfg.model_copy(update={"slice_tokens": cfg.budget.short_max_tokens}))
    slice_tokens = be.config.slice_tokens
    n = 4 * slice_tokens  # each generation needs >= 4 windows
    be.submit_side(Request(request_id="rq-1", prompt_token_ids=(1, 4, 16, 5), type=RequestType.REWARD,
                           max_tokens=1, task_family="reward"), at_window=1)
    out = gen(be, prompts(1, 2), n=n, min_new=n)
    assert out.shape == (2, 3 + n) and not (out[:, 3:] == TOK.eos_id).any()
    win = be.last_completion_window
    gens = [w for rid, w in win.items() if rid != "rq-1"]
    assert len(gens) == 2 and min(gens) >= 4
    assert 1 <= win["rq-1"] < min(gens)  # released at window 1, scored before any generation ended
    assert 0.0 < be.side_completions["rq-1"].score < 1.0


def test_grpo_plain_run_with_sched_backend_completes_and_is_deterministic():
    run = RunConfig(task="next", answer_len=1, max_new_tokens=3, num_prompts=2, group_size=4, iterations=3,
                    seed=2, lr=3e-3, rollout_backend="sched")
    cfg = GRPOJobConfig(job=JobSpec(job_id="t-grpo-sched", model_params_b=0.0001), run=run, model=TINY)
    a = run_job(cfg, attach=False)
    assert a["mode"] == "plain" and a["iterations"] == 3
    assert all(0.0 <= h["reward_mean"] <= 1.0 for h in a["history"]) and [h["step"] for h in a["history"]] == [1, 2, 3]
    b = run_job(cfg, attach=False)
    assert a["weights_sha256"] == b["weights_sha256"]
    assert [h["reward_mean"] for h in a["history"]] == [h["reward_mean"] for h in b["history"]]


def test_grpo_sched_job_file_loads_and_agrees_with_its_jobspec():
    path = CONFIG_DIR / "jobs" / "grpo_sched.yaml"
    cfg = load_job_config(path)
    spec = load_job(path)
    assert cfg.run.rollout_backend == "sched" and spec == cfg.job
    assert spec.max_response_tokens == cfg.run.max_new_tokens and spec.responses_per_prompt == cfg.run.group_size


def test_phases_with_pickled_state_and_an_interleaved_job_match_the_plain_run():
    """The runtime's state convention (state pickled between phases, another job's phases in between,
    as in a co-execution group) leaves a ``sched``-backend job bit-identical to its plain run."""
    from examples.grpo.job import (apply_weights, build_rollout_state, build_train_state, publish_weights,
                                   rollout_phase, train_phase)

    def cfg_of(job_id, seed):
        run = RunConfig(task="next", answer_len=1, max_new_tokens=3, num_prompts=2, group_size=4, iterations=3,
                        seed=seed, lr=3e-3, rollout_backend="sched")
        return GRPOJobConfig(job=JobSpec(job_id=job_id, model_params_b=0.0001), run=run, model=TINY)

    a, b = cfg_of("t-sched-a", 4), cfg_of("t-sched-b", 9)
    solo = run_job(a, attach=False)
    ra, ta = build_rollout_state(a), build_train_state(a)
    rb = build_rollout_state(b)
    hop = lambda s: pickle.loads(pickle.dumps(s))  # noqa: E731 - object-store round trip
    for it in range(3):
        samples = rollout_phase(a, ra, it)
        rollout_phase(b, rb, it)  # the group-mate's rollout on the same process between a's phases
        ra, ta = hop(ra), hop(ta)
        m = train_phase(a, ta, hop(samples))
        apply_weights(a, ra, publish_weights(a, ta))
        assert m["reward_mean"] == solo["history"][it]["reward_mean"]
    assert m["weights_sha256"] == solo["weights_sha256"] and ra["engine"].version == 3
    em = ra["engine"].metrics()  # cold start ended by max_cold_steps (2) at the latest
    assert em["policy_version"] == 3 and em["coldstart_phase"] == "stable" and em["backend_calls"] == 3
