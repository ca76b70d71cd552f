"""Compute backends of a job's phases: a rollout engine and a training engine.

A job's phase code talks to these interfaces only, so the same RL script runs on this CPU machine
(``hf`` rollout = transformers ``generate``, ``torch`` or ``deepspeed`` ZeRO training over gloo)
and on GPUs (``vllm`` rollout with sleep/wake for warm start, ``deepspeed`` over NCCL) without
change; ``vllm`` also runs on vLLM's CPU build (its own environment: ``scripts/vllm_env.sh``).

Warm start (RollMux §5; actors/worker/README.md "Runtime conventions"): between phases the runtime keeps a job's
state in host memory and the process alive; a backend's ``offload()`` moves device state to the
host (vLLM: ``sleep``), ``load()`` moves it back (vLLM: ``wake_up``). On CPU both are no-ops that
only record that they ran. Cold start rebuilds the backend from a checkpoint on disk.

Registry: :func:`make_rollout_backend` / :func:`make_train_backend` by name; GPU backends are
import-guarded and raise :class:`BackendUnavailable` (naming the missing package) where absent.
"""

from __future__ import annotations

import torch

from actors.backends.base import (  # noqa: F401  (the interfaces, re-exported)
    GLOBAL_RNG_LOCK, BackendUnavailable, ProgressFn, RolloutBackend, TrainBackend, pad_to,
)


def make_rollout_backend(name: str, model: torch.nn.Module, *, device: str = "cpu", **kw) -> RolloutBackend:
    """Rollout backend by name: ``hf`` (transformers generate), ``vllm`` (CUDA or vLLM's CPU build) or ``sched``
    (generation as requests through the rollout request scheduler, CPU; ``kw``: ``task_family``, ``policy``).

    Raises:
        ValueError: unknown name, or a model vLLM's kernels cannot run here. BackendUnavailable: vLLM missing.
    """
    if name == "hf":
        from actors.backends.hf_rollout import HFRolloutBackend

        return HFRolloutBackend(model, device=device)
    if name == "vllm":
        from actors.backends.vllm_rollout import VLLMRolloutBackend

        return VLLMRolloutBackend(model, **kw)
    if name == "sched":
        from actors.backends.sched_rollout import SchedRolloutBackend

        return SchedRolloutBackend(model, device=device, **kw)
    raise ValueError(f"rollout_backend: unknown backend {name!r} (known: hf, vllm, sched)")


def make_train_backend(
    name: str, model: torch.nn.Module, *, lr: float, max_grad_norm: float = 1.0, device: str = "cpu", **kw
) -> TrainBackend:
    """Training backend by name: ``torch`` (plain AdamW) or ``deepspeed`` (ZeRO on the
    accelerator DeepSpeed finds: CPU over gloo, or CUDA over NCCL; ``kw``: ``stage``,
    ``micro_batch``, ``rank``, ``world_size``, ``store``, ``master_addr``, ``master_port``, ``torch_adam``;
    ``torch``: ``group``, the job's process group for data-parallel training).

    Raises:
        ValueError: unknown name. BackendUnavailable: DeepSpeed missing, or its process group conflicts.
    """
    if name == "torch":
        from actors.backends.torch_train import TorchTrainBackend

        return TorchTrainBackend(model, lr=lr, max_grad_norm=max_grad_norm, device=device, group=kw.get("group"))
    if name == "deepspeed":
        from actors.backends.deepspeed_train import DeepSpeedTrainBackend

        kw.pop("device", None)  # DeepSpeed uses its accelerator's device (cpu, or this process's GPU)
        return DeepSpeedTrainBackend(model, lr=lr, max_grad_norm=max_grad_norm, **kw)
    raise ValueError(f"train_backend: unknown backend {name!r} (known: torch, deepspeed)")
