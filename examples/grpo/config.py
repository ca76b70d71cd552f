"""Run configuration of the example GRPO job, loaded from ``configs/jobs/<name>.yaml``.

A job file has three sections: ``job`` (the :class:`rollmux.models.JobSpec` used for admission,
so ``rollmux.config.load_job`` reads the same file), ``run`` (iterations, seed, batch, lr, ...)
and ``model`` (the tiny causal LM built from a transformers config, no download).

Raises :class:`rollmux.config.ConfigError` naming the field on bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollmux.config import ConfigError, read_yaml, unify_job_file
from rollmux.models import JobSpec


class _Strict(BaseModel):
    # every number finite (no NaN / Infinity) and bounded on both sides
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelConfig(_Strict):
    """Tiny Llama-style causal LM (``transformers.LlamaConfig``); sizes in units of features."""

    hidden_size: int = Field(default=128, gt=0, le=65_536)
    num_layers: int = Field(default=2, gt=0, le=48)
    num_heads: int = Field(default=4, gt=0, le=1024)
    intermediate_size: int = Field(default=256, gt=0, le=262_144)
    max_position_embeddings: int = Field(default=64, gt=0, le=1 << 20)

    @model_validator(mode="after")
    def _heads(self) -> "ModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        return self


class RunConfig(_Strict):
    """Hyper-parameters of one GRPO run.

    Attributes:
        task: digit task (``next`` | ``copy`` | ``add``, see :mod:`examples.grpo.task`).
        iterations: RL iterations (rollout -> training -> sync).
        seed: seeds the model init, the prompt sampler and the sampling generator.
        num_prompts / group_size: prompts per iteration and samples per prompt (GRPO group).
        answer_len: digits in each answer (task difficulty and response length).
        max_new_tokens: generation cap, tokens (>= answer_len; sets the rollout phase's length).
        min_new_tokens: ``<eos>`` suppressed before this many tokens (a long rollout, e.g. reasoning).
        temperature: sampling temperature (> 0).
        lr: AdamW learning rate; ppo_epochs / minibatch_size: passes and minibatch per training phase.
        clip_eps: PPO clip range; kl_coef: weight of the k3 KL to the frozen reference (0 = off).
        max_grad_norm: gradient clipping (L2 norm).
        threads: torch threads per worker (1 = one core per "GPU").
        rollout_backend / train_backend: names in :mod:`actors.backends` (``hf``/``vllm``/``sched``, ``torch``/``deepspeed``).
        response_tail_sigma: long-tailed response lengths (0 = off): each response's minimum length
            is drawn log-normal with shape ``sigma`` and mean ``min_new_tokens`` (capped at
            ``max_new_tokens``), so a few stragglers run far longer (RollMux Fig. 11;
            ``hf`` / ``vllm`` rollout only).
        zero_stage: DeepSpeed ZeRO stage (``train_backend: deepspeed`` only; CPU: 1 or 2 tested).
        torch_adam: DeepSpeed uses ``torch.optim.AdamW`` (no Adam op build; ``deepspeed`` only).
        device: ``cpu`` or ``cuda``.
        vllm_kv_cache_bytes: ``rollout_backend: vllm``: the engine's KV cache size per device,
            bytes (None: the job's batch of ``max_position_embeddings``-token sequences). Always
            explicit, so vLLM skips the start-up memory profile that fails when a DeepSpeed worker
            on the same GPU frees memory meanwhile (and on CPU does not take 90% of the host).
        fail_in_train_at: raise inside the training phase of this iteration (failure-isolation demo).
    """

    task: Literal["next", "copy", "add"] = "next"
    iterations: int = Field(default=20, gt=0, le=100_000)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    num_prompts: int = Field(default=16, gt=0, le=65_536)
    group_size: int = Field(default=8, ge=2, le=1024)
    answer_len: int = Field(default=1, gt=0, le=64)
    max_new_tokens: int = Field(default=2, gt=0, le=4096)
    min_new_tokens: int = Field(default=0, ge=0, le=4096)
    temperature: float = Field(default=1.0, gt=0, le=100.0)
    lr: float = Field(default=1e-3, gt=0, le=1.0)
    ppo_epochs: int = Field(default=1, gt=0, le=64)
    minibatch_size: int = Field(default=64, gt=0, le=1 << 20)
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    kl_coef: float = Field(default=0.0, ge=0, le=100.0)
    max_grad_norm: float = Field(default=1.0, gt=0, le=1e6)
    threads: int = Field(default=1, gt=0, le=256)
    rollout_backend: Literal["hf", "vllm", "sched"] = "hf"
    train_backend: Literal["torch", "deepspeed"] = "torch"
    response_tail_sigma: float = Field(default=0.0, ge=0.0, le=4.0)
    zero_stage: int = Field(default=2, ge=0, le=3)
    torch_adam: bool = True
    device: Literal["cpu", "cuda"] = "cpu"
    vllm_kv_cache_bytes: Optional[int] = Field(default=None, gt=0, le=2**40)
    fail_in_train_at: Optional[int] = Field(default=None, ge=0, le=100_000)

    @model_validator(mode="after")
    def _lens(self) -> "RunConfig":
        if self.max_new_tokens < self.answer_len:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be >= answer_len ({self.answer_len})")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) exceeds max_new_tokens ({self.max_new_tokens})")
        if self.response_tail_sigma > 0 and self.rollout_backend == "sched":
            raise ValueError("response_tail_sigma needs rollout_backend 'hf' or 'vllm'")
        if self.response_tail_sigma > 0 and self.min_new_tokens < 1:
            raise ValueError("response_tail_sigma needs min_new_tokens >= 1 (the lengths' mean)")
        if self.task == "add" and self.answer_len != 1:
            raise ValueError("answer_len must be 1 for task 'add'")
        return self

    @property
    def batch_size(self) -> int:
        """Samples per iteration = num_prompts x group_size."""
        return self.num_prompts * self.group_size


class GRPOJobConfig(_Strict):
    """A whole job file: admission spec + run hyper-parameters + model shape."""

    job: JobSpec
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()

    @model_validator(mode="after")
    def _fits(self) -> "GRPOJobConfig":
        need = prompt_len(self.run.task, self.run.answer_len) + self.run.max_new_tokens
        if need > self.model.max_position_embeddings:
            raise ValueError(
                f"model.max_position_embeddings ({self.model.max_position_embeddings}) < prompt + "
                f"run.max_new_tokens ({need} tokens)"
            )
        return self


def prompt_len(task: str, answer_len: int) -> int:
    """Prompt length in tokens incl. ``<bos>`` (``next``: 3, ``copy``: answer_len + 2, ``add``: 5)."""
    return {"next": 3, "copy": answer_len + 2, "add": 5}[task]


def load_job_config(path: str | Path, **run_overrides) -> GRPOJobConfig:
    """Load and validate a job file; ``run_overrides`` (non-None values) replace ``run`` fields.

    Raises:
        ConfigError: missing file, bad YAML, or a field that fails validation (named in the message).
    """
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a job file is a mapping with sections job, run, model")
    data = unify_job_file(data, path)  # num_prompts, group size, max tokens: one value each
    over = {k: v for k, v in run_overrides.items() if v is not None}
    if over:
        data = dict(data)
        data["run"] = {**(data.get("run") or {}), **over}
    try:
        return GRPOJobConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e
