"""The weight payload of a rollout engine's weight update: plain (name, dtype, shape, bytes) rows.

Why not tensors: ``vllm.LLM`` (0.33) runs its engine core in another process and sends
``collective_rpc(method, args=...)`` there as a utility request encoded by
``vllm.v1.serial_utils.MsgpackEncoder`` (msgspec msgpack). The encoder turns a tensor into
``(dtype, shape, data)`` where ``data`` is the bytes inline (under 256 B) or the index of an
out-of-band buffer; the engine side decodes utility arguments *untyped*, so no tensor is rebuilt:
the worker receives ``[dtype, shape, data]`` lists (with a stale buffer index for tensors of
256 B or more), and a weight update raised ``AttributeError: 'list' object has no attribute 'to'``.

Rows made only of ``str``, a list of ``int`` and ``bytes`` survive any msgpack round trip
(tuples come back as lists, ``bytes`` as ``bytes``); :func:`decode_weights` rebuilds the tensors
in the receiving process (the worker extension), bit for bit, for every dtype torch has
(bfloat16 included: the bytes are the tensor's own storage, not a NumPy conversion).

Imports torch only (the vLLM worker process imports this module to decode).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

#: One row: [name, dtype (torch's name without "torch."), shape, raw bytes (C order)].
PayloadRow = list


def encode_weights(weights: Mapping[str, torch.Tensor]) -> list[PayloadRow]:
    """``{name: tensor}`` -> ``[[name, dtype, shape, bytes], ...]`` (CPU copies, C order).

    Raises TypeError for a value that is not a tensor (naming its key)."""
    rows = []
    for name, t in weights.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"weight payload: {name!r} is a {type(t).__name__}, not a tensor")
        c = t.detach().to("cpu").contiguous()
        raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
        rows.append([str(name), str(c.dtype).removeprefix("torch."), [int(s) for s in c.shape], raw])
    return rows


def payload_bytes(rows: Iterable[PayloadRow]) -> int:
    """Total tensor bytes of a payload."""
    return sum(len(r[3]) for r in rows)


def decode_weights(rows: Iterable) -> list[tuple[str, torch.Tensor]]:
    """``[[name, dtype, shape, bytes], ...]`` (lists or tuples; ``bytes``, ``bytearray`` or
    ``memoryview``) -> ``[(name, CPU tensor)]`` owning its memory.

    Raises ValueError naming the row when it is malformed (not four fields, unknown dtype, byte
    count not matching the shape) or when a row holds a tensor or its ``[dtype, shape, data]``
    encoding instead of bytes (the payload was built from tensors: the bug this format avoids)."""
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 4:
            got = type(row).__name__ if not isinstance(row, (list, tuple)) else f"{len(row)} fields"
            raise ValueError(f"weight payload row {i}: expected [name, dtype, shape, bytes], got {got} "
                             "(was it built with encode_weights?)")
        name, dtype, shape, raw = row
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise ValueError(f"weight payload row {i} ({name!r}): data is a {type(raw).__name__}, not bytes "
                             "(a tensor does not survive vLLM's untyped RPC arguments; use encode_weights)")
        dt = getattr(torch, str(dtype), None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"weight payload row {i} ({name!r}): unknown dtype {dtype!r}")
        shape = [int(s) for s in shape]
        n = 1
        for s in shape:
            n *= s
        size = n * torch.empty((), dtype=dt).element_size()
        if len(raw) != size:
            raise ValueError(f"weight payload row {i} ({name!r}): {len(raw)} bytes for shape {shape} of {dtype} "
                             f"(expected {size})")
        if n == 0:
            t = torch.empty(shape, dtype=dt)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)
        out.append((str(name), t))
    return out
