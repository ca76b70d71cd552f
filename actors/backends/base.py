"""Interfaces of the compute backends (rollout engine, training engine) and their helpers.

The leaf of :mod:`actors.backends`: the implementations import these, the registry
(:func:`actors.backends.make_rollout_backend` / :func:`~actors.backends.make_train_backend`)
imports the implementations. Imports no Ray.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
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

    def weights_digest(self) -> str:
        """Canonical SHA-256 (hex) of the weights this backend serves: SHA-256 over the tensors in
        name order (name, dtype, shape, bytes; :func:`actors.rollout.weights.state_digest`), equal
        to the trainer's digest of its state dict exactly when the served weights are bit-identical.
        The default reads the backend's ``state_dict()``; a backend whose weights live elsewhere
        (vLLM's worker processes) overrides it. Raises NotImplementedError when neither exists."""
        state_dict = getattr(self, "state_dict", None)
        if state_dict is None:
            raise NotImplementedError(f"rollout backend {self.name!r} cannot report a weights digest")
        from actors.rollout.weights import state_digest

        return state_digest(state_dict())

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


def pad_to(seq: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    """Right-pad ``[B, L]`` to ``[B, length]`` with ``pad_id``."""
    if seq.shape[1] >= length:
        return seq[:, :length]
    return torch.cat([seq, seq.new_full((seq.shape[0], length - seq.shape[1]), pad_id)], dim=1)
