"""DeepSpeed ZeRO on CPU over gloo (actors/backends/deepspeed_train.py): ZeRO-1/2 steps equal
torch AdamW, warm start offloads and reloads the optimizer states with DeepSpeed's own
``offload_states`` / ``reload_states``, a job YAML selects it, and the process-group guard.

The first DeepSpeed init on a machine builds its shared-memory comm op (ninja + C++, ~1 min,
then cached)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("deepspeed")

from actors.backends import BackendUnavailable, make_train_backend  # noqa: E402
from examples.grpo.config import ModelConfig, load_job_config  # noqa: E402
from examples.grpo.job import run_job  # noqa: E402
from examples.grpo.model import build_model  # noqa: E402
from examples.grpo.tokenizer import CharTokenizer  # noqa: E402
from rollmux.config import CONFIG_DIR  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]
TOK = CharTokenizer()
TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, max_position_embeddings=16)
SEQ = TOK.encode_batch(["3>45", "7>81", "1>22", "0>19"])


def _steps(t, n=3, offload=False):
    for _ in range(n):
        logits = t.forward(SEQ)
        t.backward_step(logits.logsumexp(-1).mean())
        if offload:
            t.offload()
            t.load()
    return t.weights()


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_stage_matches_torch_adamw_on_cpu(stage):
    ref = _steps(make_train_backend("torch", build_model(TINY, 0), lr=1e-2))
    ds = make_train_backend("deepspeed", build_model(TINY, 0), lr=1e-2, stage=stage, micro_batch=4)
    assert ds.device == "cpu" and ds.comm_backend == "gloo"
    got = _steps(ds, offload=True)
    assert max(float((got[k] - ref[k]).abs().max()) for k in ref) <= 1e-6
    # and the comparison can fail: another learning rate moves the weights elsewhere
    other = _steps(make_train_backend("deepspeed", build_model(TINY, 0), lr=5e-2, stage=stage, micro_batch=4))
    assert max(float((other[k] - ref[k]).abs().max()) for k in ref) > 1e-4


def test_warm_start_offloads_the_optimizer_states():
    t = make_train_backend("deepspeed", build_model(TINY, 0), lr=1e-2, stage=2, micro_batch=4)
    before = _steps(t, n=1)
    t.offload()
    assert {"hp_params", "lp_grads", "optim_states"} <= t.offloaded_states()  # flat fp32 + Adam moments
    t.load()
    assert t.offloaded_states() == set()
    assert all(torch.equal(before[k], v) for k, v in t.weights().items())
    after = _steps(t, n=1)  # and it keeps training after the round trip
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_process_group_guard_names_the_conflict():
    from actors.backends.deepspeed_train import ensure_process_group

    ensure_process_group(0, 1)  # this process's world of size 1 (shared by single-rank jobs)
    with pytest.raises(BackendUnavailable, match="rank 1 of 2"):
        ensure_process_group(1, 2, master_port=1)
    with pytest.raises(ValueError, match="zero_stage"):
        make_train_backend("deepspeed", build_model(TINY, 0), lr=1e-2, stage=4)


def test_job_yaml_selects_deepspeed_and_equals_the_torch_backend():
    cfg = load_job_config(CONFIG_DIR / "jobs" / "grpo_deepspeed.yaml", iterations=2)
    assert cfg.run.train_backend == "deepspeed" and cfg.run.zero_stage == 2 and cfg.run.torch_adam
    ds = run_job(cfg, attach=False)
    tt = run_job(cfg.model_copy(update={"run": cfg.run.model_copy(update={"train_backend": "torch"})}), attach=False)
    assert [h["weights_sha256"] for h in ds["history"]] == [h["weights_sha256"] for h in tt["history"]]
