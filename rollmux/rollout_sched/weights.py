"""Weight updates of the rollout service: the update messages, the canonical weights digest and
the checks of a safetensors file against the engine's tensors (pure Python, no torch, no Ray).

A trainer hands the service a new policy as one safetensors file (what ``safetensors.torch.save``
writes): from a checkpoint directory under the service's ``weights_root``, or uploaded over HTTP
in chunks (size-limited, SHA-256 checked), or, inside RollMux, over the topology-aware sync plan
(:mod:`rollmux.sync_plan`). Every update names its version; the engines report the digest of the
weights they serve per version (:func:`digest_rows`, the same on the trainer's side:
``actors.rollout.weights.state_digest``).

The digest (``weights_sha256``) is SHA-256 over the tensors in name order, each as
``name \\0 dtype \\0 d0,d1,... \\0 <8-byte little-endian byte count> <bytes>``; ``dtype`` is
torch's name without ``torch.`` and the bytes are the tensor's C-order storage. It is independent
of how a file orders or pads its tensors, so a trainer, a safetensors file and an engine's live
model agree on it exactly when their tensors are bit-identical.

The file format (safetensors): 8 bytes little-endian header length N, N bytes of JSON
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the data; offsets are relative to the end of the header. Source: huggingface/safetensors.
"""

from __future__ import annotations

import hashlib
import json
import struct
from enum import Enum
from typing import Any, Iterable, Optional

from pydantic import BaseModel, ConfigDict, Field

from rollmux.rollout_sched.requests import MAX_VERSION

#: safetensors dtype codes -> torch dtype names (element size in bytes).
SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
    "BOOL": ("bool", 1), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own bound on the JSON header
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class PauseMode(str, Enum):
    """What running requests do around a weight update (vLLM's ``/pause?mode=``; SGLang's
    ``pause_generation`` modes ``in_place`` / ``abort`` / drain):

    * ``keep``: they go on with the new weights from the next time slice; every token records
      the version of the weights that sampled it (``token_versions``);
    * ``abort``: they are stopped and re-queued; they start again on the new version (their
      earlier tokens are dropped, so every token of the result is of one version);
    * ``wait``: the update waits until they end (nothing new starts meanwhile)."""

    KEEP = "keep"
    ABORT = "abort"
    WAIT = "wait"


class TensorSpec(BaseModel):
    """Name, dtype (torch's name) and shape of one tensor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    dtype: str
    shape: tuple[int, ...]


class WeightsLoad(BaseModel):
    """One complete weight version as it travels to an engine replica: a safetensors file.

    ``sha256``: the canonical digest of its tensors (:func:`digest_rows`); ``data``: the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=0, le=MAX_VERSION)
    sha256: str = Field(pattern=SHA256_PATTERN)
    data: bytes = Field(repr=False)
    source: str = Field(default="upload", description="upload | disk | sync")

    @property
    def nbytes(self) -> int:
        return len(self.data)


class SyncOffer(BaseModel):
    """A weight version sent to the service's replicas over a topology-aware sync plan
    (:mod:`rollmux.sync_plan`, executed by :mod:`collectives`): the plan (N training workers ->
    M = the service's replicas; one model copy across the pool link, then a broadcast among the
    replicas), the rendezvous store ``addr`` (``host:port``) and ``job_id`` of its endpoints.
    ``rollout_index`` is set per replica by the service."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    version: int = Field(ge=0, le=MAX_VERSION)
    plan: Any = Field(description="rollmux.sync_plan.SyncPlan")
    addr: str = Field(min_length=3, max_length=300)
    job_id: str = Field(min_length=1, max_length=200)
    backend: str = "gloo"
    bind_host: str = "127.0.0.1"
    pause_mode: PauseMode = PauseMode.KEEP
    sha256: Optional[str] = Field(default=None, pattern=SHA256_PATTERN, description="expected digest")
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    rollout_index: int = Field(default=0, ge=0)


class SyncReceipt(BaseModel):
    """What one replica received over a sync plan (staged, not yet served)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_index: int
    version: int
    sha256: str
    received_bytes: int
    recv_s: float


# ----------------------------------------------------------------------------- HTTP bodies
class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DiskUpdateBody(_In):
    """``POST /v1/weights/update_from_disk`` (SGLang's ``update_weights_from_disk``): a safetensors
    file, or a directory holding ``model.safetensors``, under the service's ``weights_root``."""

    model_path: str = Field(min_length=1, max_length=4096, description="file or checkpoint directory")
    weight_version: int = Field(ge=0, le=MAX_VERSION, description="the version these weights are")
    pause_mode: PauseMode = Field(default=PauseMode.KEEP, description="keep | abort | wait")
    sha256: Optional[str] = Field(default=None, pattern=SHA256_PATTERN,
                                  description="expected weights digest (refused when it differs)")


class UploadStartBody(_In):
    """``POST /v1/weights/uploads``: announce an upload of ``size_bytes`` bytes (a safetensors file)
    whose SHA-256 is ``sha256``; then PUT its chunks and commit."""

    weight_version: int = Field(ge=0, le=MAX_VERSION)
    size_bytes: int = Field(ge=8, le=1 << 40, description="the file's size, bytes")
    sha256: str = Field(pattern=SHA256_PATTERN, description="SHA-256 of the whole file (hex)")
    pause_mode: PauseMode = Field(default=PauseMode.KEEP)


class UploadView(BaseModel):
    """An upload in progress: where to PUT chunk ``i`` (bytes ``[i * chunk_bytes, ...)``)."""

    upload_id: str
    weight_version: int
    size_bytes: int
    chunk_bytes: int
    chunks: int
    received_bytes: int = 0
    missing_chunks: list[int] = []
    expires_in_s: float


class ReplicaWeights(BaseModel):
    replica: int
    alive: bool = True
    weights_version: Optional[int] = None
    weights_sha256: Optional[str] = None


class WeightUpdateView(BaseModel):
    """An applied update: the version, its digest (what the trainer compares), bytes, how long the
    load took and what each replica serves now."""

    weight_version: int
    weights_sha256: str
    bytes: int
    source: str
    pause_mode: PauseMode
    load_s: float = Field(description="from the update's commit to the last replica serving it, s")
    requeued: int = Field(default=0, description="running requests re-queued (pause_mode abort)")
    replicas: list[ReplicaWeights]
    success: bool = True
    message: str = ""


class WeightsView(BaseModel):
    """``GET /v1/weights``: the latest complete version, every replica's version and digest, and
    the recent updates (version, digest, bytes, load time)."""

    weight_version: Optional[int]
    weights_sha256: Optional[str]
    bytes: int = 0
    replicas: list[ReplicaWeights]
    history: list[dict] = []


# ----------------------------------------------------------------------------- digest and checks
class StreamDigest:
    """The canonical digest (:func:`digest_rows`) computed while rows arrive one by one, in name
    order, without holding them: what an engine computes on the tensors it loads as they stream in.
    :meth:`hexdigest` is None when a name arrived out of order or twice (the stream was not in
    name order, so its digest is not the canonical one)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._last: Optional[str] = None
        self.ordered = True

    def add(self, name: str, dtype: str, shape: Iterable[int], raw: bytes | memoryview) -> None:
        if self._last is not None and name <= self._last:
            self.ordered = False
        self._last = name
        self._h.update(f"{name}\0{dtype}\0{','.join(str(int(d)) for d in shape)}\0".encode())
        self._h.update(struct.pack("<Q", memoryview(raw).nbytes))
        self._h.update(raw)

    def hexdigest(self) -> Optional[str]:
        return self._h.hexdigest() if self.ordered else None


def digest_rows(rows: Iterable[tuple[str, str, Iterable[int], bytes | memoryview]]) -> str:
    """Canonical SHA-256 (hex) of ``(name, dtype, shape, bytes)`` rows (any order; see module doc)."""
    d = StreamDigest()
    for name, dtype, shape, raw in sorted(rows, key=lambda r: r[0]):
        d.add(name, dtype, shape, raw)
    return d._h.hexdigest()


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file; ``field`` names what is wrong."""

    def __init__(self, field: str, msg: str):
        super().__init__(f"{field}: {msg}")
        self.field, self.msg = field, msg


def read_header(data: bytes | memoryview) -> tuple[dict[str, TensorSpec], dict[str, tuple[int, int]], int]:
    """Parse a safetensors file: ``(specs by name, (begin, end) byte range in ``data``, data start)``.

    Raises :class:`SafetensorsError` (field ``body``, or ``tensors.<name>``) for a truncated file,
    a bad header, an unknown dtype, or offsets that do not match the shape or overlap."""
    if len(data) < 8:
        raise SafetensorsError("body", f"{len(data)} bytes: a safetensors file starts with an 8-byte header length")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise SafetensorsError("body", f"header length {n} does not fit the {len(data)}-byte file (truncated?)")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except ValueError as e:
        raise SafetensorsError("body", f"the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError("body", "the header is not a JSON object")
    start, size = 8 + n, len(data) - 8 - n
    specs: dict[str, TensorSpec] = {}
    ranges: dict[str, tuple[int, int]] = {}
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        f = f"tensors.{name}"
        if not isinstance(meta, dict) or not {"dtype", "shape", "data_offsets"} <= set(meta):
            raise SafetensorsError(f, "needs dtype, shape and data_offsets")
        code = meta["dtype"]
        if code not in SAFETENSORS_DTYPES:
            raise SafetensorsError(f"{f}.dtype", f"unknown safetensors dtype {code!r}")
        dtype, esize = SAFETENSORS_DTYPES[code]
        shape = meta["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{f}.shape", f"not a list of dimensions: {shape!r}")
        off = meta["data_offsets"]
        if not (isinstance(off, list) and len(off) == 2 and all(isinstance(o, int) for o in off)
                and 0 <= off[0] <= off[1] <= size):
            raise SafetensorsError(f"{f}.data_offsets", f"{off!r} is outside the {size} data bytes (truncated?)")
        numel = 1
        for d in shape:
            numel *= d
        if off[1] - off[0] != numel * esize:
            raise SafetensorsError(f"{f}.data_offsets", f"{off[1] - off[0]} bytes for shape {shape} of {dtype} "
                                   f"(expected {numel * esize})")
        specs[name] = TensorSpec(name=name, dtype=dtype, shape=tuple(shape))
        ranges[name] = (start + off[0], start + off[1])
        spans.append((off[0], off[1], name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1 and b1 > b0 and a1 > a0:
            raise SafetensorsError(f"tensors.{bn}.data_offsets", f"overlaps tensor {an!r}")
    return specs, ranges, start


def file_digest(data: bytes | memoryview) -> tuple[str, dict[str, TensorSpec]]:
    """The canonical digest of a safetensors file's tensors and their specs (raises SafetensorsError)."""
    specs, ranges, _ = read_header(data)
    mv = memoryview(data)
    rows = [(n, s.dtype, s.shape, mv[ranges[n][0]:ranges[n][1]]) for n, s in specs.items()]
    return digest_rows(rows), specs


def check_specs(got: dict[str, TensorSpec], want: Iterable[TensorSpec]) -> list[tuple[str, str, str]]:
    """``(field, msg, type)`` of each difference between an update's tensors and the engine's:
    missing, unexpected, wrong dtype or shape (``tensors.<name>[.dtype|.shape]``); empty when they match."""
    want_by = {s.name: s for s in want}
    errs = []
    for name in sorted(set(want_by) - set(got)):
        errs.append((f"tensors.{name}", "missing: the engine's model has this tensor", "missing_tensor"))
    for name in sorted(set(got) - set(want_by)):
        errs.append((f"tensors.{name}", "unexpected: the engine's model has no such tensor", "unexpected_tensor"))
    for name in sorted(set(got) & set(want_by)):
        g, w = got[name], want_by[name]
        if g.dtype != w.dtype:
            errs.append((f"tensors.{name}.dtype", f"{g.dtype}, the engine serves {w.dtype}", "dtype_mismatch"))
        if tuple(g.shape) != tuple(w.shape):
            errs.append((f"tensors.{name}.shape", f"{list(g.shape)}, the engine's is "
                                   f"{list(w.shape)}", "shape_mismatch"))
    return errs


__all__ = ["DiskUpdateBody", "PauseMode", "ReplicaWeights", "SafetensorsError", "SyncOffer", "SyncReceipt", "TensorSpec", "UploadStartBody",
           "UploadView", "WeightUpdateView", "WeightsLoad", "WeightsView", "StreamDigest", "check_specs", "digest_rows",
           "file_digest", "read_header"]
