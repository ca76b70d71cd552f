"""Rollout backend on vLLM (GPU): offline ``LLM`` engine with sleep mode for warm start.

Written against vLLM's public offline API as of vLLM 0.33 (``vllm.LLM``, ``SamplingParams``,
``TokensPrompt``, ``LLM.sleep(level=1)`` / ``LLM.wake_up()`` from ``enable_sleep_mode=True``).
Weight updates go through a *named* worker-extension method (``worker_extension_cls`` =
:class:`WeightUpdateExtension`, called with ``LLM.collective_rpc("rollmux_load_weights", ...)``):
vLLM's RPC serializer refuses pickled callables by default, so a lambda through ``apply_model``
does not run. The weights travel as ``[name, dtype, shape, bytes]`` rows
(:mod:`actors.backends.weight_payload`) and are rebuilt into tensors in the extension: the
engine core decodes ``collective_rpc`` arguments untyped, so a tensor sent as such arrives as a
``[dtype, shape, buffer index]`` list (the first weight update failed with ``AttributeError:
'list' object has no attribute 'to'``). Import-guarded: constructing it without vLLM or CUDA
raises :class:`~actors.backends.BackendUnavailable`.

Engine start (a GPU shared with DeepSpeed workers): vLLM profiles free memory at start-up and
asserts it did not grow meanwhile, which a ZeRO-1/2 engine freeing its reduce buckets on the same
GPU can trip. Pass ``kv_cache_memory_bytes`` (the KV cache size then needs no profiling of the
rest of the GPU), start the engines before the co-executed jobs train (e.g. build every job's
rollout state first), and keep DeepSpeed's buckets small (``reduce_bucket_size`` in
:func:`actors.backends.deepspeed_train.zero_config`). Test models in float32 with a head size of
16 run on vLLM's FlexAttention fallback, not the production FlashAttention path (bf16 / fp16,
head sizes such as 64 or 128).

Lifetime: RollMux keeps the engine across cold switches (``Job(rebuild_resident=False)``, the
default) and calls :meth:`VLLMRolloutBackend.close` when the job leaves the worker, which shuts
the engine core process down.

The engine cannot be pickled and owns CUDA memory, so it is *resident* (``rollmux_resident``):
RollMux keeps it alive in the RolloutWorker process between phases and calls ``offload()``
(``sleep``: weights to host memory, KV cache dropped) at the end of a phase and ``load()``
(``wake_up``) at the next warm start (RollMux §5 "warm start").

Sampling is seeded per request (``SamplingParams.seed``) from the job's own generator, so a
rollout is reproducible independent of other jobs sharing the engine's process. Progress: the
offline ``generate`` call is blocking, so ``progress(total, total)`` is reported at its end.
"""

from __future__ import annotations

import tempfile
from typing import Optional

import torch

from actors.backends.base import BackendUnavailable, ProgressFn, RolloutBackend, pad_to

try:  # import guard: vLLM exists on GPU hosts only
    import vllm  # noqa: F401
    from vllm import LLM, SamplingParams

    try:
        from vllm.inputs import TokensPrompt
    except ImportError:  # older layouts
        TokensPrompt = None  # type: ignore[assignment]
    HAVE_VLLM = True
except Exception:  # pragma: no cover - CPU machines
    HAVE_VLLM = False


EXTENSION = "actors.backends.vllm_rollout.WeightUpdateExtension"


class WeightUpdateExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``): in-place weight loading.

    ``rollmux_load_weights(rows)``: ``rows`` is the payload of
    :func:`actors.backends.weight_payload.encode_weights` (``[name, dtype, shape, bytes]``, as
    msgpack delivers it: lists); each row is rebuilt into a tensor, moved to the worker's device
    and handed to the model's own ``load_weights`` (which maps HF names onto vLLM's fused
    layers). Returns the number of tensors loaded. Raises ValueError naming a malformed row.
    """

    def rollmux_load_weights(self, rows) -> int:  # runs inside the vLLM worker process
        from actors.backends.weight_payload import decode_weights

        items = decode_weights(rows)
        model = self.model_runner.model  # type: ignore[attr-defined]
        dev = next(model.parameters()).device
        model.load_weights(weights=[(k, v.to(dev)) for k, v in items])
        return len(items)


class VLLMRolloutBackend(RolloutBackend):
    """vLLM engine serving a transformers causal LM saved to a temp dir (no download).

    Args:
        model: the initial policy (a transformers ``PreTrainedModel``); saved with
            ``save_pretrained`` and loaded by vLLM (``skip_tokenizer_init``: prompts are token ids).
        gpu_memory_utilization: fraction of the GPU vLLM may take (several jobs share one GPU).
        dtype: vLLM dtype (``"float32"`` keeps bit-level parity with the HF path easier to inspect;
            ``"bfloat16"`` takes the production attention path).
        kv_cache_memory_bytes: KV cache size per GPU, bytes (vLLM then does not size it from a
            profile of the GPU's free memory, which other processes on the GPU change; None:
            ``gpu_memory_utilization`` decides).
        ignore_eos: generate every row to ``max_new_tokens`` (length-exact tests, benchmarks).
    Raises:
        BackendUnavailable: vLLM or CUDA missing.
    """

    name = "vllm"
    rollmux_resident = True

    def __init__(self, model: torch.nn.Module, *, gpu_memory_utilization: float = 0.2, dtype: str = "float32",
                 enforce_eager: bool = True, seed: int = 0, kv_cache_memory_bytes: Optional[int] = None,
                 ignore_eos: bool = False) -> None:
        if not HAVE_VLLM:
            raise BackendUnavailable("rollout_backend 'vllm' needs the vllm package (pip install 'rollmux[gpu]')")
        if not torch.cuda.is_available():
            raise BackendUnavailable("rollout_backend 'vllm' needs a CUDA device")
        self._dir = tempfile.TemporaryDirectory(prefix="rollmux-vllm-")
        model.save_pretrained(self._dir.name, safe_serialization=True)
        kw = {} if kv_cache_memory_bytes is None else {"kv_cache_memory_bytes": int(kv_cache_memory_bytes)}
        self.llm = LLM(model=self._dir.name, skip_tokenizer_init=True, enable_sleep_mode=True, dtype=dtype,
                       worker_extension_cls=EXTENSION,
                       gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager, seed=seed,
                       max_model_len=int(getattr(model.config, "max_position_embeddings", 2048)), **kw)
        self.asleep = False
        self.ignore_eos = bool(ignore_eos)
        self.closed = False

    def generate(self, prompt_ids, *, max_new_tokens, temperature, seed, eos_id, pad_id,
                 progress: Optional[ProgressFn] = None, min_new_tokens: int = 0):
        B, P = prompt_ids.shape
        rows = prompt_ids.tolist()
        prompts = [TokensPrompt(prompt_token_ids=r) if TokensPrompt else {"prompt_token_ids": r} for r in rows]
        mins = (min_new_tokens.reshape(B).tolist() if isinstance(min_new_tokens, torch.Tensor)
                else [int(min_new_tokens)] * B)  # per-row minimum lengths (long-tailed responses)
        params = [SamplingParams(n=1, temperature=float(temperature), top_k=-1, top_p=1.0, max_tokens=int(max_new_tokens),
                                 min_tokens=int(mins[i]), seed=int(seed) + i, detokenize=False,
                                 **({"ignore_eos": True} if self.ignore_eos else {"stop_token_ids": [eos_id]}))
                  for i in range(B)]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        seq = torch.full((B, P + max_new_tokens), pad_id, dtype=torch.long)
        seq[:, :P] = prompt_ids
        for i, o in enumerate(outs):
            toks = list(o.outputs[0].token_ids)[:max_new_tokens]
            seq[i, P:P + len(toks)] = torch.tensor(toks, dtype=torch.long)
        if progress:
            progress(B, B)
        return pad_to(seq, P + max_new_tokens, pad_id)

    def load_weights(self, weights):
        """Install ``weights`` ({name: CPU tensor}) through the named extension method (wakes a
        sleeping engine first: a sleeping engine has no device weights to overwrite)."""
        from actors.backends.weight_payload import encode_weights

        self.load()
        rows = encode_weights(weights)  # plain rows: tensors do not survive the engine core's RPC decoding
        done = self.llm.collective_rpc("rollmux_load_weights", args=(rows,))
        if not done or any(int(n) != len(rows) for n in done):
            raise RuntimeError(f"vLLM weight update: workers loaded {done} of {len(rows)} tensors")

    def offload(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def load(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine down (its engine-core process and GPU memory): called by RollMux when
        the job leaves the worker, or when a cold start replaces the engine. Idempotent."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        llm, self.llm = self.llm, None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del llm
        try:
            self._dir.cleanup()
        except Exception:
            pass
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    sleep = offload
    wake_up = load
