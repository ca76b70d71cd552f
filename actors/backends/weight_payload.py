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

Streaming (:func:`iter_buckets`): a weight update is sent as a sequence of buckets of at most
``bucket_bytes`` (a tensor larger than that travels alone), each encoded only when it is sent, so
the update holds in host memory the weights it reads from plus a few copies of one bucket (the
encoded rows, the RPC frames, the decoded tensors in the worker) instead of every stage's copy of
the whole model at once. :func:`bucket_bytes_for` sizes the bucket for a model.

Imports torch only (the vLLM worker process imports this module to decode).
"""

from __future__ import annotations

import warnings
from typing import Iterable, Iterator, Mapping

import torch

#: One row: [name, dtype (torch's name without "torch."), shape, raw bytes (C order)].
PayloadRow = list


#: Bucket bounds, bytes (:func:`bucket_bytes_for`).
MIN_BUCKET_BYTES = 1 << 20
MAX_BUCKET_BYTES = 64 << 20


def encode_row(name: str, t: torch.Tensor) -> PayloadRow:
    """One tensor -> ``[name, dtype, shape, bytes]`` (a CPU copy, C order).

    Raises TypeError for a value that is not a tensor (naming its key)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"weight payload: {name!r} is a {type(t).__name__}, not a tensor")
    c = t.detach().to("cpu").contiguous()
    return [str(name), str(c.dtype).removeprefix("torch."), [int(s) for s in c.shape], bytes(tensor_bytes(c))]


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The C-order storage bytes of a contiguous CPU tensor, without a copy (any dtype, bfloat16
    included: the bytes are the tensor's own, not a NumPy conversion)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def encode_weights(weights: Mapping[str, torch.Tensor]) -> list[PayloadRow]:
    """``{name: tensor}`` -> ``[[name, dtype, shape, bytes], ...]`` (every row at once: the
    whole model copied; a weight update streams :func:`iter_buckets` instead).

    Raises TypeError for a value that is not a tensor (naming its key)."""
    return [encode_row(name, t) for name, t in weights.items()]


def bucket_bytes_for(weights: Mapping[str, torch.Tensor]) -> int:
    """Bucket size for streaming ``weights``: 1/32 of the model, within [1 MiB, 64 MiB], bytes.

    About four copies of one bucket exist at once (the encoded rows, the RPC frame, its decoding
    in the worker, the rows it holds until their layer is complete), plus the one tensor being
    reassembled from chunks in the worker, so an update adds at most ~1/8 of the model plus its
    largest tensor to the weights it reads from (for models of 32 MiB and more; below that, a few
    MiB in all)."""
    total = sum(t.numel() * t.element_size() for t in weights.values() if isinstance(t, torch.Tensor))
    return int(min(MAX_BUCKET_BYTES, max(MIN_BUCKET_BYTES, total // 32)))


def iter_buckets(weights: Mapping[str, torch.Tensor], bucket_bytes: int) -> Iterator[list[PayloadRow]]:
    """Rows of ``weights`` in their order, grouped into buckets of at most ``bucket_bytes`` tensor
    bytes, each bucket encoded when it is asked for. A tensor larger than a bucket travels as
    chunk rows ``[name, dtype, shape, bytes, start]`` (``bytes``: the flattened tensor from element
    ``start`` on), one bucket each, put back together by :class:`Assembler`.

    Raises ValueError for ``bucket_bytes < 1``; TypeError for a value that is not a tensor."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    rows: list[PayloadRow] = []
    size = 0
    for name, t in weights.items():
        n = t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        if rows and size + n > bucket_bytes:
            yield rows
            rows, size = [], 0
        if n <= bucket_bytes:
            rows.append(encode_row(name, t))
            size += n
            continue
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        step = max(1, bucket_bytes // t.element_size())
        for start in range(0, flat.numel(), step):
            part = encode_row(name, flat[start:start + step])
            yield [[part[0], part[1], [int(x) for x in t.shape], part[3], int(start)]]
    if rows:
        yield rows


class Assembler:
    """Receiving side of :func:`iter_buckets`: whole rows pass through, chunk rows are copied into
    a buffer of their tensor (allocated at its first chunk), which is handed on once every element
    arrived. :meth:`feed` returns the tensors complete after a bucket; :attr:`pending` names those
    still missing chunks. Raises ValueError for a malformed row or a chunk outside its tensor."""

    def __init__(self) -> None:
        self._bufs: dict[str, tuple[torch.Tensor, int]] = {}  # name -> (flat buffer, elements filled)

    @property
    def pending(self) -> list[str]:
        return sorted(self._bufs)

    def feed(self, rows: Iterable, *, copy: bool = False) -> list[tuple[str, torch.Tensor]]:
        whole, out = [], []
        for i, row in enumerate(rows):
            if isinstance(row, (list, tuple)) and len(row) == 5:
                name, dtype, shape, raw, start = row
                (_, part), = decode_weights([[name, dtype, [len(raw) // max(1, _itemsize(dtype, i, name))], raw]],
                                            copy=False)
                buf, filled = self._bufs.get(name) or (torch.empty([int(x) for x in shape], dtype=part.dtype).reshape(-1), 0)
                start = int(start)
                if start < 0 or start + part.numel() > buf.numel() or buf.dtype != part.dtype:
                    raise ValueError(f"weight payload row {i} ({name!r}): chunk [{start}, {start + part.numel()}) "
                                     f"does not fit its tensor of {buf.numel()} {buf.dtype} elements")
                buf[start:start + part.numel()] = part
                filled += part.numel()
                if filled >= buf.numel():
                    self._bufs.pop(name, None)
                    out.append((str(name), buf.reshape([int(x) for x in shape])))
                else:
                    self._bufs[name] = (buf, filled)
            else:
                whole.append(row)
        return decode_weights(whole, copy=copy) + out


def _itemsize(dtype: str, i: int, name: str) -> int:
    dt = getattr(torch, str(dtype), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"weight payload row {i} ({name!r}): unknown dtype {dtype!r}")
    return torch.empty((), dtype=dt).element_size()


def payload_bytes(rows: Iterable[PayloadRow]) -> int:
    """Total tensor bytes of a payload (chunk rows count their own bytes)."""
    return sum(len(r[3]) for r in rows)


def decode_weights(rows: Iterable, *, copy: bool = True) -> list[tuple[str, torch.Tensor]]:
    """``[[name, dtype, shape, bytes], ...]`` (lists or tuples; ``bytes``, ``bytearray`` or
    ``memoryview``) -> ``[(name, CPU tensor)]`` owning its memory (``copy=False``: tensors over the
    received ``bytes``, read-only, for a receiver that copies them into its own parameters).

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
        elif isinstance(raw, bytes) and not copy:  # read-only view of the received bytes: no copy
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": never written
                t = torch.frombuffer(raw, dtype=torch.uint8).view(dt).reshape(shape)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)
        out.append((str(name), t))
    return out
