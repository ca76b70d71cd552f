"""Rollout backend on vLLM (GPU): offline ``LLM`` engine with sleep mode for warm start.

Written against vLLM's public offline API as of vLLM 0.33 (``vllm.LLM``, ``SamplingParams``,
``TokensPrompt``, ``LLM.sleep(level=1)`` / ``LLM.wake_up()`` from ``enable_sleep_mode=True``).
Weight updates go through a *named* worker-extension method (``worker_extension_cls`` =
:class:`WeightUpdateExtension`, called with ``LLM.collective_rpc("rollmux_load_weights", ...)``):
vLLM's RPC serializer refuses pickled callables by default, so a lambda through ``apply_model``
does not run. Import-guarded: constructing it without vLLM or CUDA raises
:class:`~actors.backends.BackendUnavailable`.

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

from actors.backends import BackendUnavailable, ProgressFn, RolloutBackend, pad_to

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

    ``rollmux_load_weights(items)``: ``items`` is a list of ``(name, CPU tensor)``; each tensor is
    moved to the worker's device and handed to the model's own ``load_weights`` (which maps HF
    names onto vLLM's fused layers). Returns the number of tensors loaded.
    """

    def rollmux_load_weights(self, items) -> int:  # runs inside the vLLM worker process
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
        dtype: vLLM dtype (``"float32"`` keeps bit-level parity with the HF path easier to inspect).
    Raises:
        BackendUnavailable: vLLM or CUDA missing.
    """

    name = "vllm"
    rollmux_resident = True

    def __init__(self, model: torch.nn.Module, *, gpu_memory_utilization: float = 0.2, dtype: str = "float32",
                 enforce_eager: bool = True, seed: int = 0) -> None:
        if not HAVE_VLLM:
            raise BackendUnavailable("rollout_backend 'vllm' needs the vllm package (pip install 'rollmux[gpu]')")
        if not torch.cuda.is_available():
            raise BackendUnavailable("rollout_backend 'vllm' needs a CUDA device")
        self._dir = tempfile.TemporaryDirectory(prefix="rollmux-vllm-")
        model.save_pretrained(self._dir.name, safe_serialization=True)
        self.llm = LLM(model=self._dir.name, skip_tokenizer_init=True, enable_sleep_mode=True, dtype=dtype,
                       worker_extension_cls=EXTENSION,
                       gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager, seed=seed,
                       max_model_len=int(getattr(model.config, "max_position_embeddings", 2048)))
        self.asleep = False

    def generate(self, prompt_ids, *, max_new_tokens, temperature, seed, eos_id, pad_id,
                 progress: Optional[ProgressFn] = None, min_new_tokens: int = 0):
        B, P = prompt_ids.shape
        rows = prompt_ids.tolist()
        prompts = [TokensPrompt(prompt_token_ids=r) if TokensPrompt else {"prompt_token_ids": r} for r in rows]
        mins = (min_new_tokens.reshape(B).tolist() if isinstance(min_new_tokens, torch.Tensor)
                else [int(min_new_tokens)] * B)  # per-row minimum lengths (long-tailed responses)
        params = [SamplingParams(n=1, temperature=float(temperature), top_k=-1, top_p=1.0, max_tokens=int(max_new_tokens),
                                 min_tokens=int(mins[i]), seed=int(seed) + i, stop_token_ids=[eos_id], detokenize=False)
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
        self.load()
        items = [(k, v.detach().to("cpu").contiguous()) for k, v in weights.items()]
        done = self.llm.collective_rpc("rollmux_load_weights", args=(items,))
        if not done or any(int(n) != len(items) for n in done):
            raise RuntimeError(f"vLLM weight update: workers loaded {done} of {len(items)} tensors")

    def offload(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def load(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    sleep = offload
    wake_up = load
