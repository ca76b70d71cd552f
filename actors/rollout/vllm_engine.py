"""vLLM as an engine of the rollout request scheduler (:class:`actors.rollout.engine.RolloutEngine`):
the scheduler's batches become ``LLMEngine.add_request`` calls, one window runs ``slice_steps``
engine steps, a cancelled request is ``abort_request``-ed, a weight update resets the prefix cache.

Runs on vLLM's CPU build (``tests/vllm_cpu/``) and on CUDA; engine settings (the KV cache size,
the CPU head sizes and process layout) come from :mod:`actors.backends.vllm_common`.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from actors.rollout.engine import _seed_of, _WallClockEngine
from rollmux.rollout_sched import Completion, Request, RequestType


class VLLMEngine(_WallClockEngine):
    """vLLM ``LLMEngine`` adapter with automatic prefix caching.

    Each window adds the scheduler's batch with ``LLMEngine.add_request`` and runs
    ``slice_steps`` engine steps; finished ``RequestOutput`` s become completions. Generation is
    sampled at temperature 1 with a per-request seed (from the request id and ``seed``, as the CPU
    engine), so a request is reproducible whatever runs beside it. Reward queries run with
    ``max_tokens=1`` and ``logprobs=1`` (score: the sampled token's log-probability); replay items
    with ``prompt_logprobs=0`` (score: mean prompt log-probability). ``on_weights_updated`` resets
    vLLM's prefix cache (KV made by old weights is stale). ``ignore_eos``: generation requests run
    to their ``max_tokens`` (length-exact tests).

    Args:
        model: a local model directory (``config.json`` + safetensors) or a name vLLM can load.
        kv_capacity_tokens: tokens the KV cache holds (the scheduler's
            ``budget.kv_capacity_tokens``: the engine holds what the scheduler plans with);
            None: vLLM sizes it (``gpu_memory_utilization``).
        engine_kwargs: more ``vllm.EngineArgs`` (``max_model_len``, ``dtype`` (float32 by
            default), ``skip_tokenizer_init`` (True by default: requests are token ids), ...).
    Raises:
        BackendUnavailable: vLLM is not installed here. ValueError: a model the platform's kernels
        cannot run (CPU head sizes).
    """

    def __init__(self, model: str, *, slice_steps: int = 8, seed: int = 0, ignore_eos: bool = False,
                 kv_capacity_tokens: Optional[int] = None, **engine_kwargs: Any):
        from actors.backends.vllm_common import check_model, cpu_environment, kv_cache_bytes, read_config, vllm_platform

        platform = vllm_platform()
        from vllm import EngineArgs, LLMEngine

        kw: dict[str, Any] = {"skip_tokenizer_init": True, "dtype": "float32", "enforce_eager": True,
                              **(cpu_environment() if platform == "cpu" else {}), **engine_kwargs}
        cfg = None
        try:
            cfg = read_config(model)
        except FileNotFoundError:
            pass  # a hub name: vLLM reads the config itself
        if cfg is not None:
            check_model(cfg, platform)
            if kv_capacity_tokens and "kv_cache_memory_bytes" not in kw:
                max_len = int(kw.get("max_model_len") or cfg.get("max_position_embeddings") or 2048)
                kw["kv_cache_memory_bytes"] = kv_cache_bytes(cfg, str(kw["dtype"]), tokens=int(kv_capacity_tokens),
                                                             max_model_len=max_len)
        engine = LLMEngine.from_engine_args(EngineArgs(model=model, enable_prefix_caching=True, seed=seed, **kw))
        self._setup(engine, slice_steps=slice_steps, seed=seed, ignore_eos=ignore_eos)

    @classmethod
    def from_engine(cls, engine: Any, *, slice_steps: int = 8, seed: int = 0, ignore_eos: bool = False) -> "VLLMEngine":
        """Serve requests on an existing ``LLMEngine`` (e.g. ``VLLMRolloutBackend.llm.llm_engine``:
        one engine for both paths)."""
        self = cls.__new__(cls)
        self._setup(engine, slice_steps=slice_steps, seed=seed, ignore_eos=ignore_eos)
        return self

    def _setup(self, engine: Any, *, slice_steps: int, seed: int, ignore_eos: bool) -> None:
        from vllm import SamplingParams

        self._SamplingParams = SamplingParams
        self.engine = engine
        self.slice_steps = int(slice_steps)
        self.seed = int(seed)
        self.ignore_eos = bool(ignore_eos)  # generations run to max_tokens (a random model may emit <eos> early)
        self._t0 = time.monotonic()
        self._types: dict[str, RequestType] = {}

    @property
    def running(self) -> int:
        return len(self._types)

    def admit(self, batch: list[Request], hits: dict[str, int]) -> None:
        SP = self._SamplingParams
        for r in batch:
            if r.type is RequestType.REWARD:
                p = SP(max_tokens=1, logprobs=1, temperature=1.0, seed=_seed_of(r.request_id, self.seed), detokenize=False)
            elif r.type is RequestType.REPLAY:
                p = SP(max_tokens=1, prompt_logprobs=0, detokenize=False)
            else:
                p = SP(max_tokens=r.max_tokens, temperature=1.0, ignore_eos=self.ignore_eos,
                       seed=_seed_of(r.request_id, self.seed), detokenize=False)
            self._types[r.request_id] = r.type
            self.engine.add_request(r.request_id, {"prompt_token_ids": list(r.prompt_token_ids)}, p)

    def step(self) -> list[Completion]:
        done = []
        for _ in range(self.slice_steps):
            if not self.engine.has_unfinished_requests():
                break
            for out in self.engine.step():
                if not out.finished or out.request_id not in self._types:
                    continue
                t = self._types.pop(out.request_id)
                o = out.outputs[0]
                score = None
                if t is RequestType.REWARD and o.logprobs:
                    score = float(o.logprobs[0][o.token_ids[0]].logprob)
                elif t is RequestType.REPLAY and out.prompt_logprobs:
                    vals = [next(iter(d.values())).logprob for d in out.prompt_logprobs if d]
                    score = float(np.mean(vals)) if vals else 0.0
                toks = () if t in (RequestType.REWARD, RequestType.REPLAY) else tuple(o.token_ids)
                done.append(Completion(out.request_id, toks, self.now(), score=score))
        return done

    def on_weights_updated(self, version: int) -> None:
        self.engine.reset_prefix_cache()

    def abort(self, request_ids: list[str]) -> None:
        ids = [rid for rid in request_ids if rid in self._types]
        if ids:
            self.engine.abort_request(ids)
        for rid in ids:
            self._types.pop(rid, None)
