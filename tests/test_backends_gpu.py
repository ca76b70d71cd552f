"""Rollout / training backends: the registry on CPU, and the GPU paths (vLLM sleep/wake, DeepSpeed
ZeRO, CUDA torch/HF) on a CUDA host. GPU tests carry ``@pytest.mark.gpu`` and are skipped
visibly elsewhere (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from actors.backends import BackendUnavailable, make_rollout_backend, make_train_backend
from examples.grpo.config import GRPOJobConfig, ModelConfig, RunConfig
from examples.grpo.job import run_job
from examples.grpo.model import build_model
from examples.grpo.tokenizer import CharTokenizer
from rollmux.models import JobSpec

TOK = CharTokenizer()
TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=32)
TINY32 = TINY.model_copy(update={"num_heads": 2})  # head size 32 (vLLM's CPU kernels have no 16)
PROMPTS = TOK.encode_batch(["3>", "7>", "1>", "0>"])


def gen(backend, seed: int) -> torch.Tensor:
    return backend.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=seed, eos_id=TOK.eos_id, pad_id=TOK.pad_id)


# ---- CPU: registry and guards ------------------------------------------------------------

def test_unknown_backend_names_the_field():
    m = build_model(TINY, 0)
    with pytest.raises(ValueError, match="rollout_backend"):
        make_rollout_backend("sglang", m)
    with pytest.raises(ValueError, match="train_backend"):
        make_train_backend("megatron", m, lr=1e-3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the guard on machines without CUDA")
def test_gpu_backends_raise_backend_unavailable_on_cpu():
    m = build_model(TINY, 0)
    with pytest.raises(BackendUnavailable, match="vllm"):  # this Python has no vLLM (tests/vllm_cpu/ runs it)
        make_rollout_backend("vllm", m)
    # DeepSpeed runs on CPU (gloo): tests/test_deepspeed_cpu.py


def test_hf_backend_progress_and_seeded_sampling_on_cpu():
    b = make_rollout_backend("hf", build_model(TINY, 0))
    seen = []
    out = b.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=5, eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                     progress=lambda d, t: seen.append((d, t)))
    assert out.shape == (4, PROMPTS.shape[1] + 6) and torch.equal(out[:, :3], PROMPTS)
    assert seen[-1] == (4, 4) and all(t == 4 and 0 <= d <= 4 for d, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert torch.equal(out, gen(b, 5)) and not torch.equal(out, gen(b, 6))


def test_zero_config_keeps_zero12_buckets_small():
    from actors.backends.deepspeed_train import ZERO_BUCKET_ELEMENTS, zero_config

    for stage in (1, 2):
        z = zero_config(lr=1e-3, max_grad_norm=1.0, stage=stage, micro_batch=4, bf16=False)["zero_optimization"]
        assert z == {"stage": stage, "reduce_bucket_size": ZERO_BUCKET_ELEMENTS,
                     "allgather_bucket_size": ZERO_BUCKET_ELEMENTS}
        assert ZERO_BUCKET_ELEMENTS < 5e8  # DeepSpeed's default: 2 GB fp32 buckets
    for stage in (0, 3):
        assert zero_config(lr=1e-3, max_grad_norm=1.0, stage=stage, micro_batch=4, bf16=False)[
            "zero_optimization"] == {"stage": stage}


# ---- GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_hf_rollout_and_torch_train_on_cuda_offload_roundtrip():
    r = make_rollout_backend("hf", build_model(TINY, 0), device="cuda")
    a = gen(r, 1)
    r.offload()
    assert next(r.model.parameters()).device.type == "cpu"
    r.load()
    assert torch.equal(a, gen(r, 1))
    t = make_train_backend("torch", build_model(TINY, 0), lr=1e-2, device="cuda")
    seq = a.cuda()
    before = t.weights()
    t.backward_step(t.forward(seq).logsumexp(-1).mean())
    after = t.weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    t.offload()
    assert next(t.model.parameters()).device.type == "cpu"
    assert all(v.device.type == "cpu" for st in t.optimizer.state.values() for k, v in st.items() if k != "step")
    t.load()
    assert next(t.model.parameters()).device.type == "cuda"
    assert all(torch.equal(after[k], v) for k, v in t.weights().items())


@pytest.mark.gpu
def test_grpo_job_plain_on_cuda():
    cfg = GRPOJobConfig(job=JobSpec(job_id="gpu-grpo", model_params_b=0.0001),
                        run=RunConfig(iterations=3, device="cuda", kl_coef=0.05), model=TINY)
    res = run_job(cfg, attach=False)
    assert res["iterations"] == 3 and res["history"][-1]["kl"] >= 0.0


@pytest.mark.gpu
def test_vllm_sleep_wake_and_weight_update():
    pytest.importorskip("vllm")
    model = build_model(TINY32, 0)
    b = make_rollout_backend("vllm", model, gpu_memory_utilization=0.1)
    assert b.rollmux_resident
    a = gen(b, 3)
    assert a.shape == (4, PROMPTS.shape[1] + 6) and torch.equal(a[:, :3], PROMPTS)
    b.offload()
    free_asleep = torch.cuda.mem_get_info()[0]
    b.load()
    assert torch.cuda.mem_get_info()[0] < free_asleep  # waking re-allocated device memory
    assert torch.equal(a, gen(b, 3))  # per-request seeds: reproducible across sleep/wake
    other = build_model(TINY32, 1)
    b.load_weights({k: v for k, v in other.state_dict().items()})
    assert not torch.equal(a, gen(b, 3))


@pytest.mark.gpu
def test_vllm_production_attention_exact_lengths_update_and_close():
    """bf16 with head size 64 (the production attention path; the float32 head-16 TINY model runs
    on vLLM's FlexAttention fallback), a fixed KV cache size (no memory profiling of a shared GPU),
    every row generated to its cap (``ignore_eos``), a weight update, and ``close()``."""
    pytest.importorskip("vllm")
    import torch

    prod = ModelConfig(hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, max_position_embeddings=64)
    model = build_model(prod, 0).to(torch.bfloat16)
    b = make_rollout_backend("vllm", model, dtype="bfloat16", gpu_memory_utilization=0.1,
                             kv_cache_memory_bytes=64 << 20, ignore_eos=True)
    out = b.generate(PROMPTS, max_new_tokens=16, temperature=1.0, seed=1, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
    # every row ran to its cap: vLLM says so (the pad id is a token it may sample, so "no pad" is no check)
    assert out.shape == (4, PROMPTS.shape[1] + 16) and b.last_finish_reasons == ["length"] * 4
    b.load_weights(build_model(prod, 1).to(torch.bfloat16).state_dict())
    assert not torch.equal(out, b.generate(PROMPTS, max_new_tokens=16, temperature=1.0, seed=1, eos_id=TOK.eos_id,
                                           pad_id=TOK.pad_id))
    b.close()
    assert b.closed and b.llm is None
    b.close()  # idempotent


@pytest.mark.gpu
def test_deepspeed_zero_step_and_offload():
    pytest.importorskip("deepspeed")
    t = make_train_backend("deepspeed", build_model(TINY, 0), lr=1e-2, stage=2, micro_batch=4)
    seq = PROMPTS.cuda()
    before = t.weights()
    t.backward_step(t.forward(seq).logsumexp(-1).mean())
    after = t.weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    t.offload()
    assert "optim_states" in t.offloaded_states() and t.device.startswith("cuda")
    t.load()
    assert all(torch.equal(after[k], v) for k, v in t.weights().items())


def test_concurrent_hf_rollouts_in_one_process_stay_reproducible():
    """After a long-tail migration two jobs' rollouts can run at once in one worker process: the
    global-RNG lock keeps each one equal to the same rollout run alone."""
    import threading

    a, b = make_rollout_backend("hf", build_model(TINY, 0)), make_rollout_backend("hf", build_model(TINY, 1))
    alone = {1: gen(a, 1), 2: gen(b, 2)}
    for _ in range(3):
        got: dict = {}
        ts = [threading.Thread(target=lambda k=k, m=m: got.__setitem__(k, gen(m, k))) for k, m in ((1, a), (2, b))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert torch.equal(got[1], alone[1]) and torch.equal(got[2], alone[2])
