"""Compute backends of a job's phases: a rollout engine and a training engine.

A job's phase code talks to these interfaces only, so the same RL script runs on this CPU machine
(``hf`` rollout = transformers ``generate``, ``torch`` or ``deepspeed`` ZeRO training over gloo)
and on GPUs (``vllm`` rollout with sleep/wake for warm start, ``deepspeed`` over NCCL) without
change.

Warm start (RollMux §5, DESIGN.md "Execution plane"): between phases the runtime keeps a job's
state in host memory and the process alive; a backend's ``offload()`` moves device state to the
host (vLLM: ``sleep``), ``load()`` moves it back (vLLM: ``wake_up``). On CPU both are no-ops that
only record that they ran. Cold start rebuilds the backend from a checkpoint on disk.

Registry: :func:`make_rollout_backend` / :func:`make_train_backend` by name; GPU backends are
import-guarded and raise :class:`BackendUnavailable` (naming the missing package) where absent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
import threading
from typing import Callable, Optional

import torch

ProgressFn = Callable[[int, int], None]

#: torch's global RNG is process-wide. Code that seeds it (``fork_rng`` + ``manual_seed``: HF
#: sampling, seeded model init) holds this lock, so that phases of different jobs running at the
#: same time in one worker process (long-tail migration starts a rollout beside another job's
#: tail) stay reproducible: co-executed == solo, bit for bit.
GLOBAL_RNG_LOCK = threading.RLock()


class BackendUnavailable(RuntimeError):
    """A backend's package (vLLM, DeepSpeed) or device (CUDA) is missing on this machine."""


class RolloutBackend(ABC):
    """Generates responses for a batch of prompts with the current policy weights."""

    name: str = "?"

    @abstractmethod
    def generate(
        self,
        prompt_ids: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        eos_id: int,
        pad_id: int,
        progress: Optional[ProgressFn] = None,
        min_new_tokens: int = 0,
    ) -> torch.Tensor:
        """Sample one response per prompt row.

        Args:
            prompt_ids: LongTensor ``[B, P]`` (equal-length prompts).
            max_new_tokens: generation cap ``N``; min_new_tokens: ``<eos>`` is suppressed before this many
                (an int, or a LongTensor ``[B]`` of per-row minimums: ``hf`` and ``vllm`` backends).
            seed: seeds this call's sampling (from the job's own generator; no global RNG).
            progress: called ``progress(done, total)`` as responses finish (long-tail migration).
        Returns:
            LongTensor ``[B, P + N]`` on CPU; after a row's ``<eos>`` it is padded with ``pad_id``.
        """

    @abstractmethod
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Install the policy weights published by training (sync phase)."""

    def offload(self) -> None:
        """Release device memory, keeping weights in host memory (vLLM ``sleep``)."""

    def load(self) -> None:
        """Bring weights back to the device (vLLM ``wake_up``)."""

    sleep = offload
    wake_up = load


class TrainBackend(ABC):
    """Holds the trainable policy and its optimizer; one optimizer step per :meth:`backward_step`."""

    name: str = "?"

    @abstractmethod
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, L, V]`` (float32) for tokens ``[B, L]``."""

    @abstractmethod
    def backward_step(self, loss: torch.Tensor) -> float:
        """Back-propagate ``loss``, clip gradients, step the optimizer; returns the grad norm."""

    @abstractmethod
    def weights(self) -> dict[str, torch.Tensor]:
        """Full policy weights as detached CPU tensors (what the sync phase sends to rollout)."""

    def offload(self) -> None:
        """Move parameters and optimizer state to host memory."""

    def load(self) -> None:
        """Move parameters and optimizer state back to the device."""


def make_rollout_backend(name: str, model: torch.nn.Module, *, device: str = "cpu", **kw) -> RolloutBackend:
    """Rollout backend by name: ``hf`` (transformers generate), ``vllm`` (GPU only) or ``sched``
    (generation as requests through the rollout request scheduler, CPU; ``kw``: ``task_family``, ``policy``).

    Raises:
        ValueError: unknown name. BackendUnavailable: vLLM or CUDA missing.
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
    ``micro_batch``, ``rank``, ``world_size``, ``master_addr``, ``master_port``, ``torch_adam``).

    Raises:
        ValueError: unknown name. BackendUnavailable: DeepSpeed missing, or its process group conflicts.
    """
    if name == "torch":
        from actors.backends.torch_train import TorchTrainBackend

        return TorchTrainBackend(model, lr=lr, max_grad_norm=max_grad_norm, device=device)
    if name == "deepspeed":
        from actors.backends.deepspeed_train import DeepSpeedTrainBackend

        kw.pop("device", None)  # DeepSpeed uses its accelerator's device (cpu, or this process's GPU)
        return DeepSpeedTrainBackend(model, lr=lr, max_grad_norm=max_grad_norm, **kw)
    raise ValueError(f"train_backend: unknown backend {name!r} (known: torch, deepspeed)")


def pad_to(seq: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    """Right-pad ``[B, L]`` to ``[B, length]`` with ``pad_id``."""
    if seq.shape[1] >= length:
        return seq[:, :length]
    return torch.cat([seq, seq.new_full((seq.shape[0], length - seq.shape[1]), pad_id)], dim=1)
