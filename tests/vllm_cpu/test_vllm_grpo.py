"""The example GRPO job with vLLM rollout (vLLM's CPU build) and DeepSpeed ZeRO-2 training (CPU,
gloo), co-executed under the real GlobalScheduler / GroupController / pool workers with a second
job (transformers rollout, torch training): every iteration its trainer weights are bit-identical
to the same job run solo in this process with the same engine (on-policy preserved, RollMux §5),
and the vLLM engine really received each iteration's weights."""

from __future__ import annotations

import uuid

import pytest

from examples.grpo.config import ModelConfig, load_job_config
from examples.grpo.job import run_coexecuted
from rollmux.config import CONFIG_DIR

pytestmark = [pytest.mark.ray, pytest.mark.vllm_env, pytest.mark.timeout(900)]

N = 2  # iterations
# head size 32 (vLLM's CPU attention has no 16); the mate keeps the tiny shape of the CPU tests
VLLM_MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position_embeddings=40)
MATE_MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=176)


@pytest.fixture(scope="module")
def sched(module_scheduler):
    return module_scheduler


def test_vllm_deepspeed_job_coexecuted_is_bit_identical_to_solo(sched):
    uid = uuid.uuid4().hex[:6]
    ds = load_job_config(CONFIG_DIR / "jobs" / "grpo_deepspeed.yaml", iterations=N)
    ds = ds.model_copy(update={
        "job": ds.job.model_copy(update={"job_id": f"grpo-vllm-{uid}", "slo": 5.0}),
        "run": ds.run.model_copy(update={"rollout_backend": "vllm", "max_new_tokens": 16, "min_new_tokens": 8}),
        "model": VLLM_MODEL})
    mate = load_job_config(CONFIG_DIR / "jobs" / "grpo_train_heavy.yaml", iterations=N)
    mate = mate.model_copy(update={"job": mate.job.model_copy(update={"job_id": f"{mate.job.job_id}-{uid}"}),
                                   "model": MATE_MODEL,
                                   "run": mate.run.model_copy(update={"max_new_tokens": 24, "min_new_tokens": 8,
                                                                      "num_prompts": 4})})
    res = run_coexecuted([mate, ds], sched, admit_timeout_s=400, finish_timeout_s=600)
    assert not [v for v in res.values() if isinstance(v, BaseException)], res
    from factories import assert_coexecuted_equals_solo

    co = assert_coexecuted_equals_solo(res, ds, mate, N)
    # the engine generated with the weights training published (iteration i+1 samples with the
    # weights of iteration i): the digest the rollout state received equals the trainer's
    got = [m["received_sha256"] for m in co["history"]]
    sent = [m["weights_sha256"] for m in co["history"]]
    assert got == [[None]] + [[s] for s in sent[:-1]], (got, sent)
