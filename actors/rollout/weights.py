"""Weights in and out of the rollout service's engines (torch side; no Ray).

* :func:`state_digest`: the canonical digest of a state dict (:func:`rollmux.rollout_sched.weights.digest_rows`
  over its tensors): a trainer computes it on its model, an engine on the model it serves.
* :func:`check_state`: a state dict against an engine's tensors (names, dtypes, shapes).
* :func:`encode` / :func:`decode`: a state dict as one safetensors file and back (bit for bit).
* :func:`read_checkpoint`: a checkpoint's safetensors file under an allowed root (the path is
  resolved, symlinks included, and must stay inside the root).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from rollmux.rollout_sched.weights import TensorSpec, WeightsLoad, digest_rows

CHECKPOINT_FILE = "model.safetensors"


def state_digest(state: Mapping[str, Any]) -> str:
    """Canonical SHA-256 of a state dict's tensors (names, dtypes, shapes, bytes): equal exactly when
    the tensors are bit-identical, whatever their order or device."""
    from actors.backends.weight_payload import encode_weights

    return digest_rows((name, dtype, shape, raw) for name, dtype, shape, raw in encode_weights(state))


def specs_of(state: Mapping[str, Any]) -> list[TensorSpec]:
    """Name, dtype and shape of every tensor of a state dict."""
    return [TensorSpec(name=k, dtype=str(v.dtype).removeprefix("torch."), shape=tuple(v.shape)) for k, v in state.items()]


def check_state(state: Mapping[str, Any], specs: list[TensorSpec]) -> None:
    """Check that ``state`` holds exactly the tensors of ``specs`` (names, dtypes, shapes). Raises
    ValueError naming the missing / unexpected tensors, or the first of another dtype or shape."""
    want = {s.name: s for s in specs}
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        raise ValueError(f"tensors: missing {missing[:4]}, unexpected {extra[:4]}")
    for k, s in want.items():
        w = state[k]
        if tuple(w.shape) != tuple(s.shape) or str(w.dtype).removeprefix("torch.") != s.dtype:
            raise ValueError(f"tensors.{k}: {w.dtype} {list(w.shape)}, the model's is torch.{s.dtype} {list(s.shape)}")


def encode(state: Mapping[str, Any]) -> bytes:
    """A state dict as a safetensors file (CPU copies; tensors sharing memory are written apart)."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()})


def decode(load: WeightsLoad | bytes) -> dict[str, Any]:
    """The tensors of a safetensors file (a :class:`WeightsLoad` or its bytes), CPU."""
    from safetensors.torch import load as st_load

    return st_load(load.data if isinstance(load, WeightsLoad) else bytes(load))


class CheckpointError(ValueError):
    """A checkpoint path that cannot be read; ``status`` is the HTTP status it answers (403 outside
    the allowed root or none configured, 404 missing, 413 too large, 422 not a safetensors file)."""

    def __init__(self, status: int, msg: str):
        super().__init__(msg)
        self.status = status


def checkpoint_file(model_path: str, root: str | None) -> Path:
    """The safetensors file of ``model_path`` (a ``.safetensors`` file, or a directory holding
    ``model.safetensors``), which must resolve inside ``root``. Raises :class:`CheckpointError`."""
    if not root:
        raise CheckpointError(403, "model_path: loading from disk is off (set the rollout service's weights_root)")
    base = Path(root).expanduser().resolve()
    p = Path(model_path).expanduser()
    p = (p if p.is_absolute() else base / p).resolve()
    if p != base and base not in p.parents:
        raise CheckpointError(403, f"model_path: {model_path!r} is outside the allowed root {str(base)!r}")
    if p.is_dir():
        p = p / CHECKPOINT_FILE
    if not p.is_file():
        raise CheckpointError(404, f"model_path: no safetensors file at {str(p)!r}")
    if p.suffix != ".safetensors":
        raise CheckpointError(422, f"model_path: {p.name!r} is not a .safetensors file")
    return p


def read_checkpoint(model_path: str, root: str | None, max_bytes: int) -> bytes:
    """The bytes of ``model_path``'s safetensors file (:func:`checkpoint_file`), at most ``max_bytes``."""
    p = checkpoint_file(model_path, root)
    size = os.path.getsize(p)
    if size > max_bytes:
        raise CheckpointError(413, f"model_path: {size} bytes exceed max_weights_bytes {max_bytes}")
    return p.read_bytes()


__all__ = ["CHECKPOINT_FILE", "CheckpointError", "check_state", "checkpoint_file", "decode", "encode", "read_checkpoint",
           "specs_of", "state_digest"]
