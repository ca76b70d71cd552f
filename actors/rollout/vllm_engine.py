"""vLLM as an engine of the rollout request scheduler (:class:`actors.rollout.engine.RolloutEngine`):
the scheduler's batches become ``LLMEngine.add_request`` calls, one window runs ``slice_steps``
engine steps, a cancelled request is ``abort_request``-ed, new weights go through vLLM's in-place
reload and reset the prefix cache.

Runs on vLLM's CPU build (``tests/vllm_cpu/``) and on CUDA; engine settings (the KV cache size,
the CPU head sizes and process layout) come from :mod:`actors.backends.vllm_common`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np

from actors.rollout.engine import _WallClockEngine, request_seed
from rollmux.rollout_sched import Completion, Request, RequestType
from rollmux.rollout_sched.weights import SAFETENSORS_DTYPES, TensorSpec


class VLLMEngine(_WallClockEngine):
    """vLLM ``LLMEngine`` adapter with automatic prefix caching.

    Each window adds the scheduler's batch with ``LLMEngine.add_request`` and runs
    ``slice_steps`` engine steps; finished ``RequestOutput`` s become completions. A generation is
    sampled at its request's ``temperature`` (0: greedy) with its request's seed (its ``seed``,
    else derived from its id and ``seed``: :func:`actors.rollout.engine.request_seed`, as the CPU
    engine), so a request is reproducible whatever runs beside it; it stops at the model's end
    token unless the engine's or the request's ``ignore_eos``. Reward queries run with
    ``max_tokens=1`` and ``logprobs=1`` (score: the sampled token's log-probability); replay items
    with ``prompt_logprobs=0`` (score: mean prompt log-probability).

    Weights (:meth:`load_weights`): the tensors of the model's checkpoint (HF names, the
    checkpoint's dtypes and shapes: :meth:`manifest`) go through vLLM's in-place reload
    (:func:`actors.backends.vllm_rollout.load_in_place`, the rollout backend's path), then the
    prefix cache is reset with its running requests preempted (``reset_running_requests``): they
    resume with their KV recomputed by the new weights and keep the tokens sampled so far. The
    digest reported (:meth:`weights_sha256`) is the one vLLM's workers computed on the bytes they
    loaded, or that of the checkpoint the engine started from.

    Per-token versions: a generation's tokens arrive per engine step (``RequestOutputKind.DELTA``),
    and a step runs between two windows' weight loads, so each token records the weights version
    that sampled it exactly. This needs synchronous scheduling (with ``async_scheduling`` a step's
    tokens may have been sampled before the load): the engine turns it off (vLLM's CPU platform
    always does; an engine passed to :meth:`from_engine` is taken as it is). Token
    log-probabilities are not recorded by this adapter.

    Args:
        model: a local model directory (``config.json`` + safetensors) or a name vLLM can load
            (weights then load without a manifest check, and no digest is known before the first).
        kv_capacity_tokens: tokens the KV cache holds (the scheduler's
            ``budget.kv_capacity_tokens``: the engine holds what the scheduler plans with);
            None: vLLM sizes it (``gpu_memory_utilization``).
        ignore_eos: every generation runs to its ``max_tokens`` (length-exact tests).
        engine_kwargs: more ``vllm.EngineArgs`` (``max_model_len``, ``dtype`` (float32 by
            default), ``skip_tokenizer_init`` (True by default: requests are token ids), ...).
    Raises:
        BackendUnavailable: vLLM is not installed here. ValueError: a model the platform's kernels
        cannot run (CPU head sizes).
    """

    def __init__(self, model: str, *, slice_steps: int = 8, seed: int = 0, ignore_eos: bool = False,
                 kv_capacity_tokens: Optional[int] = None, **engine_kwargs: Any):
        from actors.backends.vllm_common import check_model, cpu_environment, kv_cache_bytes, read_config, vllm_platform
        from actors.backends.vllm_rollout import EXTENSION

        platform = vllm_platform()
        from vllm import EngineArgs, LLMEngine

        kw: dict[str, Any] = {"skip_tokenizer_init": True, "dtype": "float32", "enforce_eager": True,
                              "worker_extension_cls": EXTENSION, "async_scheduling": False,
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
        self._setup(engine, slice_steps=slice_steps, seed=seed, ignore_eos=ignore_eos,
                    model_dir=model if Path(model).is_dir() else None)

    @classmethod
    def from_engine(cls, engine: Any, *, slice_steps: int = 8, seed: int = 0, ignore_eos: bool = False,
                    model_dir: Optional[str] = None) -> "VLLMEngine":
        """Serve requests on an existing ``LLMEngine`` (e.g. ``VLLMRolloutBackend.llm.llm_engine``:
        one engine for both paths; ``model_dir``: the checkpoint it started from, for the manifest
        and the first digest)."""
        self = cls.__new__(cls)
        self._setup(engine, slice_steps=slice_steps, seed=seed, ignore_eos=ignore_eos, model_dir=model_dir)
        return self

    def _setup(self, engine: Any, *, slice_steps: int, seed: int, ignore_eos: bool, model_dir: Optional[str]) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._SamplingParams, self._delta = SamplingParams, RequestOutputKind.DELTA
        self.engine = engine
        self.slice_steps = int(slice_steps)
        self.seed = int(seed)
        self.ignore_eos = bool(ignore_eos)  # generations run to max_tokens (a random model may emit <eos> early)
        self.model_dir = model_dir
        self.weights_version = 0
        self._digest: Optional[str] = None  # of the weights served (None: not computed yet)
        self._manifest: Optional[list[TensorSpec]] = None
        self._t0 = time.monotonic()
        self._types: dict[str, RequestType] = {}
        self._out: dict[str, list[int]] = {}  # a running generation's tokens so far
        self._versions: dict[str, list[int]] = {}  # ... and the weights version of each

    @property
    def running(self) -> int:
        return len(self._types)

    def admit(self, batch: list[Request], hits: dict[str, int]) -> None:
        SP = self._SamplingParams
        for r in batch:
            seed = request_seed(r, self.seed)
            if r.type is RequestType.REWARD:
                p = SP(max_tokens=1, logprobs=1, temperature=1.0, seed=seed, detokenize=False)
            elif r.type is RequestType.REPLAY:
                p = SP(max_tokens=1, prompt_logprobs=0, detokenize=False)
            else:
                p = SP(max_tokens=r.max_tokens, temperature=r.temperature, ignore_eos=self.ignore_eos or r.ignore_eos,
                       seed=seed, detokenize=False, output_kind=self._delta)
                self._out[r.request_id], self._versions[r.request_id] = [], []
            self._types[r.request_id] = r.type
            self.engine.add_request(r.request_id, {"prompt_token_ids": list(r.prompt_token_ids)}, p)

    def step(self) -> list[Completion]:
        done = []
        for _ in range(self.slice_steps):
            if not self.engine.has_unfinished_requests():
                break
            for out in self.engine.step():
                rid = out.request_id
                if rid not in self._types:
                    continue
                o = out.outputs[0]
                if rid in self._out:  # a generation: this step's new tokens, sampled by the weights served now
                    self._out[rid].extend(o.token_ids)
                    self._versions[rid].extend([self.weights_version] * len(o.token_ids))
                if not out.finished:
                    continue
                t = self._types.pop(rid)
                score = None
                if t is RequestType.REWARD and o.logprobs:
                    score = float(o.logprobs[0][o.token_ids[0]].logprob)
                elif t is RequestType.REPLAY and out.prompt_logprobs:
                    vals = [next(iter(d.values())).logprob for d in out.prompt_logprobs if d]
                    score = float(np.mean(vals)) if vals else 0.0
                toks, versions = tuple(self._out.pop(rid, ())), self._versions.pop(rid, None)
                done.append(Completion(rid, toks, self.now(), score=score,
                                       token_versions=tuple(versions) if versions is not None else None))
        return done

    def partial_outputs(self, request_ids: list[str]) -> dict[str, list[int]]:
        return {rid: self._out[rid] for rid in request_ids if rid in self._out}

    def on_weights_updated(self, version: int) -> None:
        self.engine.reset_prefix_cache()

    def abort(self, request_ids: list[str]) -> None:
        ids = [rid for rid in request_ids if rid in self._types]
        if ids:
            self.engine.abort_request(ids)
        for rid in ids:
            self._types.pop(rid, None)
            self._out.pop(rid, None)
            self._versions.pop(rid, None)

    # ------------------------------------------------------------------ weights
    def manifest(self) -> Optional[list[TensorSpec]]:
        """Name, dtype and shape of every tensor of the checkpoint the engine started from (what an
        update must match; read from the safetensors headers); None for a model named on a hub."""
        if self._manifest is None and self.model_dir is not None:
            from safetensors import safe_open

            specs = []
            for f in sorted(Path(self.model_dir).glob("*.safetensors")):
                with safe_open(str(f), "pt") as st:
                    for k in st.keys():
                        sl = st.get_slice(k)
                        code = sl.get_dtype()
                        specs.append((k, SAFETENSORS_DTYPES.get(code, (code, 0))[0], tuple(sl.get_shape())))
            self._manifest = [TensorSpec(name=k, dtype=d, shape=s) for k, d, s in sorted(specs)]
        return self._manifest

    def load_weights(self, weights: Mapping[str, Any]) -> str:
        """Install ``weights`` (every tensor of :meth:`manifest`, same names, dtypes and shapes) in
        vLLM's workers and reset the prefix cache (running requests preempted, KV recomputed);
        returns the digest the workers computed on what they loaded. Raises ValueError naming the
        first mismatch before any tensor is sent; RuntimeError when the workers' load or the reset
        fails (the workers may then hold part of the update: the service replaces a replica whose
        window failed)."""
        from actors.backends.vllm_rollout import load_in_place
        from actors.rollout.weights import check_state

        if (specs := self.manifest()) is not None:
            check_state(weights, specs)
        digest = load_in_place(self.engine.collective_rpc, weights)
        if digest is None:
            raise RuntimeError("vLLM weight update: the workers report different digests of what they loaded")
        if not self.engine.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM weight update: the prefix cache could not be reset")
        self._digest = digest
        return digest

    def weights_sha256(self) -> Optional[str]:
        """Digest of the weights served (:func:`actors.rollout.weights.state_digest` of the tensors):
        the last update's as the workers loaded it, else the starting checkpoint's (read once);
        None for a hub model before its first update."""
        if self._digest is None and self.model_dir is not None:
            from actors.backends.vllm_rollout import checkpoint_digest

            self._digest = checkpoint_digest(self.model_dir)
        return self._digest

