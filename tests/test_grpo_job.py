"""The example GRPO job in plain (solo) mode: GRPO math units, task/reward, learning signal."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
import yaml

from examples.grpo import algo
from examples.grpo.config import GRPOJobConfig, ModelConfig, RunConfig, load_job_config
from examples.grpo.job import InjectedFailure, make_job, run_job
from examples.grpo.task import PromptSampler, reward
from examples.grpo.tokenizer import CharTokenizer
from rollmux.config import CONFIG_DIR, ConfigError, load_job
from rollmux.models import JobSpec

TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=32)


def script_main():
    """``main`` of scripts/grpo_job.py (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("grpo_job_script", CONFIG_DIR.parent / "scripts" / "grpo_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def tiny_cfg(job_id="t-grpo", **run) -> GRPOJobConfig:
    base = dict(task="next", answer_len=1, max_new_tokens=2, num_prompts=16, group_size=8, iterations=6, seed=0, lr=3e-3)
    r = RunConfig(**{**base, **run})
    job = JobSpec(job_id=job_id, model_params_b=0.0001, num_prompts=r.num_prompts,  # admission plans this job
                  responses_per_prompt=r.group_size, max_response_tokens=r.max_new_tokens)
    return GRPOJobConfig(job=job, run=r, model=TINY)


# ---- GRPO math ---------------------------------------------------------------------------

def test_group_advantages_are_group_normalised():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = algo.group_advantages(r, 4)
    # group 1: mean 0.25, sample std 0.5 -> (1-0.25)/0.5 = 1.5, (0-0.25)/0.5 = -0.5
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards -> no signal
    g = algo.group_advantages(torch.rand(24, generator=torch.Generator().manual_seed(1)), 6).view(4, 6)
    assert torch.allclose(g.mean(1), torch.zeros(4), atol=1e-5)
    assert torch.allclose(g.std(1), torch.ones(4), atol=1e-4)


@pytest.mark.parametrize("n,g", [(8, 1), (7, 2)])
def test_group_advantages_rejects_bad_groups(n, g):
    with pytest.raises(ValueError, match="group_size"):
        algo.group_advantages(torch.zeros(n), g)


def test_clipped_loss_clips_positive_and_negative_advantages():
    old = torch.zeros(2, 1)
    logp = torch.full((2, 1), math.log(1.5)).requires_grad_(True)  # ratio 1.5 > 1 + eps
    mask = torch.ones(2, 1)
    adv = torch.tensor([1.0, -1.0])
    loss, st = algo.clipped_pg_loss(logp, old, adv, mask, clip_eps=0.2)
    # A=+1: min(1.5, 1.2) = 1.2 (clipped); A=-1: min(-1.5, -1.2) = -1.5 (unclipped) -> mean -(1.2-1.5)/2
    assert loss.item() == pytest.approx(-(1.2 - 1.5) / 2, abs=1e-6)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0  # clipped branch carries no gradient
    assert logp.grad[1, 0].item() == pytest.approx(0.5 * 1.5, rel=1e-5)  # d/dlogp of ratio*|A|/2
    assert st["clip_frac"] == 1.0


def test_clipped_loss_unclipped_equals_policy_gradient_and_masks():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    loss, st = algo.clipped_pg_loss(logp, logp.clone(), torch.tensor([2.0]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx(-2.0)  # ratio 1 -> -A, averaged over the 2 unmasked tokens
    assert st["clip_frac"] == 0.0


def test_kl_k3_is_zero_iff_equal_and_added_with_coef():
    a = torch.tensor([[-1.0, -2.0]])
    assert torch.equal(algo.kl_k3(a, a), torch.zeros(1, 2))
    b = torch.tensor([[-1.5, -1.0]])
    kl = algo.kl_k3(a, b)
    assert (kl > 0).all()
    assert kl[0, 0].item() == pytest.approx(math.exp(-0.5) + 0.5 - 1, rel=1e-6)
    m = torch.ones(1, 2)
    l0, _ = algo.clipped_pg_loss(a, a, torch.zeros(1), m)
    l1, st = algo.clipped_pg_loss(a, a, torch.zeros(1), m, ref_logp=b, kl_coef=0.5)
    assert (l1 - l0).item() == pytest.approx(0.5 * kl.mean().item(), rel=1e-6)
    assert st["kl"] == pytest.approx(kl.mean().item(), rel=1e-6)


def test_response_mask_stops_after_first_eos_and_logprobs_gather():
    tok = CharTokenizer()
    seq = torch.tensor([[1, 5, 7, tok.eos_id, 0, 0], [1, 5, 7, 8, 9, 10]])
    m = algo.response_mask(seq, prompt_len=2, eos_id=tok.eos_id)
    assert m.tolist() == [[0, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    logits = torch.zeros(2, 6, tok.vocab_size)
    lp = algo.token_logprobs(logits, seq)
    assert lp.shape == (2, 5) and torch.allclose(lp, torch.full((2, 5), -math.log(tok.vocab_size)))


# ---- task, tokenizer ----------------------------------------------------------------------

def test_tokenizer_roundtrip_and_unknown_character():
    tok = CharTokenizer()
    ids = tok.encode("3+4=")
    assert ids[0] == tok.bos_id and tok.decode(ids) == "3+4="
    assert tok.decode(ids + [tok.eos_id, tok.digit_id(9)]) == "3+4="
    with pytest.raises(ValueError, match="'x'"):
        tok.encode("3x")


def test_tasks_and_partial_reward():
    tok = CharTokenizer()
    texts, ans = PromptSampler("next", seed=0, answer_len=3).sample(4)
    for t, a in zip(texts, ans.tolist()):
        d = int(t[0])
        assert a == [(d + 1) % 10, (d + 2) % 10, (d + 3) % 10]
    texts, ans = PromptSampler("copy", seed=0, answer_len=2).sample(3)
    assert [t[:2] for t in texts] == ["".join(map(str, a)) for a in ans.tolist()]
    texts, ans = PromptSampler("add", seed=5).sample(3)
    assert [(int(t[0]) + int(t[2])) % 10 for t in texts] == ans[:, 0].tolist()
    answers = torch.tensor([[1, 2], [3, 4]])
    resp = torch.tensor([[tok.digit_id(1), tok.digit_id(2), tok.eos_id], [tok.digit_id(3), tok.eos_id, 0]])
    assert reward(resp, answers, tok).tolist() == [1.0, 0.5]
    with pytest.raises(ValueError, match="task"):
        PromptSampler("sort", seed=0)
    a1 = PromptSampler("copy", seed=7, answer_len=2).sample(5)[1]
    assert torch.equal(a1, PromptSampler("copy", seed=7, answer_len=2).sample(5)[1])


# ---- configs --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["grpo_rollout_heavy", "grpo_train_heavy", "grpo_balanced", "grpo_failing"])
def test_job_configs_load_and_agree_with_their_jobspec(name):
    path = CONFIG_DIR / "jobs" / f"{name}.yaml"
    cfg = load_job_config(path)
    spec = load_job(path)  # the admission side reads the same file
    assert spec == cfg.job and spec.measured is not None
    assert spec.num_prompts == cfg.run.num_prompts and spec.responses_per_prompt == cfg.run.group_size
    assert spec.max_response_tokens == cfg.run.max_new_tokens


def test_three_jobs_have_different_phase_balances():
    ratios = {}
    for name in ("grpo_rollout_heavy", "grpo_train_heavy", "grpo_balanced"):
        m = load_job(CONFIG_DIR / "jobs" / f"{name}.yaml").measured
        ratios[name] = m.t_roll_s / m.t_train_s
    assert ratios["grpo_rollout_heavy"] > ratios["grpo_balanced"] > ratios["grpo_train_heavy"]
    assert ratios["grpo_rollout_heavy"] > 1.0 > ratios["grpo_train_heavy"]


def test_bad_job_config_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"job": {"job_id": "x", "model_params_b": 0.001}, "run": {"lr": -1}}))
    with pytest.raises(ConfigError, match="run.lr"):
        load_job_config(bad)
    bad.write_text(yaml.safe_dump({"job": {"job_id": "x", "model_params_b": 0.001},
                                   "run": {"max_new_tokens": 60}, "model": {"max_position_embeddings": 32}}))
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        load_job_config(bad)
    assert script_main()(["--config", str(bad), "--quiet"]) == 2


# ---- the job in plain mode -------------------------------------------------------------------

def test_plain_job_learns():
    res = run_job(tiny_cfg(iterations=30), attach=False)
    assert res["mode"] == "plain" and res["iterations"] == 30
    # random policy ~1/15 per answer; GRPO lifts the last 6 iterations' mean reward well above it
    assert res["initial_reward"] < 0.2
    assert res["final_reward"] > res["initial_reward"] + 0.25
    phases = [(r["phase"], r["iteration"]) for r in res["timeline"][:3]]
    assert phases == [("rollout", 0), ("train", 0), ("sync", 0)]


def test_plain_job_is_deterministic_and_independent_of_global_rng():
    a = run_job(tiny_cfg(iterations=3), attach=False)
    torch.manual_seed(12345)
    torch.rand(100)
    b = run_job(tiny_cfg(iterations=3), attach=False)
    c = run_job(tiny_cfg(iterations=3, seed=1), attach=False)
    assert a["weights_sha256"] == b["weights_sha256"]
    assert [m["reward_mean"] for m in a["history"]] == [m["reward_mean"] for m in b["history"]]
    assert a["weights_sha256"] != c["weights_sha256"]


def test_kl_and_ppo_epochs_path_runs():
    res = run_job(tiny_cfg(iterations=2, kl_coef=0.1, ppo_epochs=2, minibatch_size=32), attach=False)
    assert res["history"][-1]["kl"] > 0.0  # the policy moved away from the frozen reference
    assert res["history"][-1]["step"] == 2


def test_failing_job_raises_and_is_marked_failed():
    g = make_job(tiny_cfg(job_id="t-fail", fail_in_train_at=1), attach=False)
    with pytest.raises(InjectedFailure):
        with g.job:
            for it in range(3):
                g.train(g.rollout(it))
                g.publish()
    assert g.job.lifecycle == "failed" and "InjectedFailure" in g.job.error
    assert g.job.iteration == 1


def test_script_runs_solo_and_writes_json(tmp_path):
    cfg = tiny_cfg(job_id="t-script", iterations=2)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json(exclude_none=True))))
    main = script_main()
    out = tmp_path / "res.json"
    assert main(["--config", str(path), "--solo", "--quiet", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["ok"] and res["mode"] == "plain" and res["iterations"] == 2
    assert res["weights_sha256"] == run_job(cfg, attach=False)["weights_sha256"]


# ---- timeline figures (examples/grpo/report.py) -------------------------------------------------

def _rec(job, phase, it, a, b, **kw):
    return {"job_id": job, "phase": phase, "pool": "rollout" if phase == "rollout" else "train",
            "node": "x", "iteration": it, "start": a, "end": b, **kw}


def test_report_busy_fractions_iteration_time_and_switches():
    from examples.grpo import report

    # two jobs interleaved on 1 rollout + 1 train node over [0, 4]
    co = [_rec("a", "rollout", 0, 0, 1, switch="cold", switch_s=0.5), _rec("a", "train", 0, 1, 2),
          _rec("b", "rollout", 0, 1, 2), _rec("b", "train", 0, 2, 3),
          _rec("a", "rollout", 1, 2, 3, switch="warm", switch_s=0.01), _rec("a", "train", 1, 3, 4, switch="warm",
                                                                           switch_s=0.03)]
    u = report.coexec_utilisation(co, 1, 1)
    assert u["makespan_s"] == 4 and u["rollout_busy_fraction"] == 0.75 and u["train_busy_fraction"] == 0.75
    assert u["rollout_bubble_fraction"] == 0.25 and u["node_seconds"] == 8
    w = report.coexec_utilisation(co, 1, 1, window=(2, 4))  # clipped to the window
    assert w["makespan_s"] == 2 and w["rollout_busy_fraction"] == 0.5 and w["train_busy_fraction"] == 1.0
    assert report.steady_start({"a": co[:2] + co[4:], "b": co[2:4]}) == 3
    assert report.iteration_time_s(co[:2] + co[4:]) == 2.0  # from end of it 0 (2) to 4, one iteration
    assert report.switch_median_s(co, "warm") == pytest.approx(0.02)
    assert report.switch_median_s(co, "cold") == 0.5 and report.switch_median_s(co, "none") is None
    # solo: each job on its own nodes; job a alone 0..4 with 2 s rollout, 1 s train busy
    s = report.solo_utilisation({"a": [_rec("a", "rollout", 0, 0, 2), _rec("a", "train", 0, 2, 3)],
                                 "b": [_rec("b", "rollout", 0, 10, 11), _rec("b", "train", 0, 11, 12)]})
    assert s["makespan_s"] == 3 and s["node_seconds"] == 10
    assert s["rollout_busy_fraction"] == pytest.approx(3 / 5) and s["train_busy_fraction"] == pytest.approx(2 / 5)


def test_a_job_file_states_each_shared_fact_once_or_equal(tmp_path):
    """num_prompts, the GRPO group size and the max response tokens: admission (``job:``) and the
    RL loop (``run:``) read one value; two different values are refused, naming both fields."""
    from rollmux.config import ConfigError

    base = (CONFIG_DIR / "jobs" / "grpo_balanced.yaml").read_text()
    cfg, spec = load_job_config(CONFIG_DIR / "jobs" / "grpo_balanced.yaml"), load_job(CONFIG_DIR / "jobs" / "grpo_balanced.yaml")
    assert (cfg.run.num_prompts, cfg.run.group_size, cfg.run.max_new_tokens) == (4, 4, 224)
    assert (spec.num_prompts, spec.responses_per_prompt, spec.max_response_tokens) == (4, 4, 224)
    bad = tmp_path / "bad.yaml"
    bad.write_text(base.replace("run:\n", "run:\n  group_size: 8\n", 1))
    for load in (load_job_config, load_job):
        with pytest.raises(ConfigError, match=r"job.responses_per_prompt \(4\) and run.group_size \(8\)"):
            load(bad)
    same = tmp_path / "same.yaml"
    same.write_text(base.replace("run:\n", "run:\n  num_prompts: 4\n", 1))
    assert load_job_config(same).run.num_prompts == 4
    only_run = tmp_path / "only_run.yaml"  # stated on the run side only: admission plans with it too
    only_run.write_text(base.replace("  num_prompts: 4\n", "", 1).replace("run:\n", "run:\n  num_prompts: 6\n", 1))
    assert load_job(only_run).num_prompts == 6 and load_job_config(only_run).job.num_prompts == 6


def test_long_tailed_response_lengths_option():
    """``response_tail_sigma``: seeded log-normal per-row minimum lengths; the HF backend keeps
    ``<eos>`` away from each row until its own minimum."""
    import pydantic

    from actors.backends import make_rollout_backend
    from examples.grpo.config import ModelConfig, RunConfig
    from examples.grpo.job import response_minimums
    from examples.grpo.model import build_model

    m = response_minimums(2000, 40, 400, 1.0, seed=3)
    assert torch.equal(m, response_minimums(2000, 40, 400, 1.0, seed=3)) and m.min() >= 1 and m.max() <= 400
    assert float(m.double().mean()) == pytest.approx(40, rel=0.1)  # the mean is min_new_tokens
    assert float(m.double().quantile(0.99)) > 4 * float(m.double().median())  # a long tail
    tok = CharTokenizer()
    b = make_rollout_backend("hf", build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=4,
                                                           intermediate_size=64, max_position_embeddings=64), 0, tok))
    prompts = tok.encode_batch(["3>", "7>", "1>", "0>"])
    mins = torch.tensor([1, 5, 20, 40])
    out = b.generate(prompts, max_new_tokens=48, temperature=1.0, seed=1, eos_id=tok.eos_id, pad_id=tok.pad_id,
                     min_new_tokens=mins)
    P = prompts.shape[1]
    first_eos = [next((i for i, t in enumerate(row) if t == tok.eos_id), 48) for row in out[:, P:].tolist()]
    assert all(e >= int(k) for e, k in zip(first_eos, mins))
    with pytest.raises(pydantic.ValidationError, match="response_tail_sigma"):
        RunConfig(response_tail_sigma=1.0, rollout_backend="sched", min_new_tokens=4, max_new_tokens=8)
