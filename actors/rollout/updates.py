"""Weight updates of the rollout service: uploads in chunks, checkpoints from disk, the checks every
update passes before any engine sees it, and the record of applied versions. No Ray; used by the
service actor (:mod:`actors.rollout.service`), its only writer.

An update becomes a :class:`rollmux.rollout_sched.weights.WeightsLoad` (a complete safetensors
file, its version and its canonical digest) only when every check passed, so an engine never
receives a truncated, oversize, mis-shaped or corrupted file and goes on serving its previous
version when an update is refused:

* an upload: ``size_bytes`` at most ``max_weights_bytes`` (413 naming ``size_bytes``); chunks of
  ``weights_chunk_bytes`` (the last one shorter) at their index (422 naming ``index`` / ``body``);
  at commit every byte received (422 naming ``size_bytes``, with the missing chunks: a truncated
  upload) and the file's SHA-256 equal to the announced one (422 naming ``sha256``);
* from disk: the path resolves inside ``weights_root`` (403 naming ``model_path``), the file exists
  (404), at most ``max_weights_bytes`` (413);
* every source: a well-formed safetensors file (422 naming ``body`` or ``tensors.<name>``), the
  engine's tensors exactly (422 naming ``tensors.<name>[.dtype|.shape]`` for a missing, unexpected,
  mis-typed or mis-shaped tensor), a version above the latest one (409 naming ``weight_version``),
  and, when the caller names it, the expected digest (422 naming ``sha256``).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Optional

from rollmux.rollout_sched.api import FieldError, Refusal
from rollmux.rollout_sched.service_config import ServiceConfig
from rollmux.rollout_sched.weights import (
    PauseMode, SafetensorsError, TensorSpec, UploadStartBody, UploadView, WeightsLoad, check_specs, file_digest,
)

MAX_UPLOADS = 2  # uploads in progress at once (each holds its announced size in memory); a third drops the stalest
HISTORY = 64  # applied updates kept for GET /v1/weights


def _bad(status: int, error: str, field: str, msg: str, typ: str = "value_error") -> Refusal:
    return Refusal(status=status, error=error, detail=f"{field}: {msg}", errors=[FieldError(field=field, msg=msg, type=typ)])


@dataclass
class _Upload:
    id: str
    body: UploadStartBody
    chunk_bytes: int
    buf: bytearray
    have: set[int] = field(default_factory=set)
    expires: float = 0.0

    @property
    def chunks(self) -> int:
        return max(1, -(-self.body.size_bytes // self.chunk_bytes))

    def received(self) -> int:
        last = self.chunks - 1
        return sum(self.body.size_bytes - i * self.chunk_bytes if i == last else self.chunk_bytes for i in self.have)

    def view(self, now: float) -> UploadView:
        return UploadView(upload_id=self.id, weight_version=self.body.weight_version, size_bytes=self.body.size_bytes,
                          chunk_bytes=self.chunk_bytes, chunks=self.chunks, received_bytes=self.received(),
                          missing_chunks=[i for i in range(self.chunks) if i not in self.have][:64],
                          expires_in_s=round(max(0.0, self.expires - now), 3))


class WeightUpdates:
    """Uploads in progress, the latest complete version and the history of applied ones.

    Args:
        svc: the service settings (``max_weights_bytes``, ``weights_chunk_bytes``, ``upload_ttl_s``,
            ``weights_root``).
    """

    def __init__(self, svc: ServiceConfig):
        self.svc = svc
        self.manifest: Optional[list[TensorSpec]] = None  # the engine's tensors (set once a replica answered)
        self.latest: Optional[WeightsLoad] = None  # the latest complete version
        self.mode: PauseMode = PauseMode.KEEP  # the pause mode of the latest update
        self.uploads: OrderedDict[str, _Upload] = OrderedDict()
        self.history: deque[dict] = deque(maxlen=HISTORY)

    # ------------------------------------------------------------------ checks
    def check_version(self, version: int) -> Optional[Refusal]:
        if self.latest is not None and version <= self.latest.version:
            return _bad(409, "stale_weight_version", "weight_version",
                        f"{version} is not above the latest weights version {self.latest.version}", "stale_version")
        return None

    def validate(self, data: bytes, version: int, source: str, expected: Optional[str] = None) -> WeightsLoad | Refusal:
        """A complete file -> :class:`WeightsLoad`, or the refusal naming what is wrong."""
        if (r := self.check_version(version)) is not None:
            return r
        if len(data) > self.svc.max_weights_bytes:
            return _bad(413, "weights_too_large", "size_bytes",
                        f"{len(data)} bytes exceed max_weights_bytes {self.svc.max_weights_bytes}", "too_large")
        try:
            digest, specs = file_digest(data)
        except SafetensorsError as e:
            return _bad(422, "invalid_weights", e.field, e.msg, "safetensors")
        if self.manifest is not None and (errs := check_specs(specs, self.manifest)):
            return Refusal(status=422, error="invalid_weights", detail="; ".join(f"{f}: {m}" for f, m, _ in errs[:8]),
                           errors=[FieldError(field=f, msg=m, type=t) for f, m, t in errs])
        if expected is not None and expected != digest:
            return _bad(422, "digest_mismatch", "sha256", f"the weights' digest is {digest}, not {expected}",
                        "digest_mismatch")
        return WeightsLoad(version=version, sha256=digest, data=bytes(data), source=source)

    # ------------------------------------------------------------------ uploads
    def _prune(self, now: float) -> None:
        for uid in [u.id for u in self.uploads.values() if u.expires < now]:
            del self.uploads[uid]

    def start_upload(self, body: UploadStartBody) -> UploadView | Refusal:
        now = time.monotonic()
        self._prune(now)
        if body.size_bytes > self.svc.max_weights_bytes:
            return _bad(413, "weights_too_large", "size_bytes",
                        f"{body.size_bytes} bytes exceed max_weights_bytes {self.svc.max_weights_bytes}", "too_large")
        if (r := self.check_version(body.weight_version)) is not None:
            return r
        while len(self.uploads) >= MAX_UPLOADS:  # the least recently touched one gives way (an abandoned upload)
            self.uploads.pop(min(self.uploads.values(), key=lambda u: u.expires).id)
        u = _Upload(f"u-{uuid.uuid4().hex[:16]}", body, self.svc.weights_chunk_bytes, bytearray(body.size_bytes),
                    expires=now + self.svc.upload_ttl_s)
        self.uploads[u.id] = u
        return u.view(now)

    def _get(self, upload_id: str) -> _Upload | Refusal:
        self._prune(time.monotonic())
        u = self.uploads.get(upload_id)
        if u is None:
            return Refusal(status=404, error="not_found",
                           detail=f"upload_id: unknown or expired upload {upload_id!r} (uploads live upload_ttl_s)")
        return u

    def put_chunk(self, upload_id: str, index: int, data: bytes) -> UploadView | Refusal:
        u = self._get(upload_id)
        if isinstance(u, Refusal):
            return u
        if not 0 <= index < u.chunks:
            return _bad(422, "invalid_request", "index", f"{index} is outside 0..{u.chunks - 1} "
                        f"({u.body.size_bytes} bytes in chunks of {u.chunk_bytes})", "chunk_index")
        start = index * u.chunk_bytes
        want = min(u.chunk_bytes, u.body.size_bytes - start)
        if len(data) != want:
            return _bad(422 if len(data) < want else 413, "invalid_request" if len(data) < want else "request_too_large",
                        "body", f"chunk {index} must be {want} bytes, got {len(data)}", "chunk_size")
        u.buf[start:start + want] = data
        u.have.add(index)
        now = time.monotonic()
        u.expires = now + self.svc.upload_ttl_s
        return u.view(now)

    def commit(self, upload_id: str) -> tuple[WeightsLoad, PauseMode] | Refusal:
        """Check the upload (complete, SHA-256, file, tensors, version) -> the load; the upload is
        forgotten either way once it is complete."""
        u = self._get(upload_id)
        if isinstance(u, Refusal):
            return u
        if len(u.have) < u.chunks:
            v = u.view(time.monotonic())
            return _bad(422, "incomplete_upload", "size_bytes", f"received {v.received_bytes} of {u.body.size_bytes} "
                        f"bytes; missing chunks {v.missing_chunks}", "truncated")
        del self.uploads[upload_id]
        got = hashlib.sha256(u.buf).hexdigest()
        if got != u.body.sha256:
            return _bad(422, "digest_mismatch", "sha256", f"the uploaded file's SHA-256 is {got}, not {u.body.sha256}",
                        "digest_mismatch")
        out = self.validate(bytes(u.buf), u.body.weight_version, "upload")
        return out if isinstance(out, Refusal) else (out, u.body.pause_mode)

    def cancel(self, upload_id: str) -> bool:
        return self.uploads.pop(upload_id, None) is not None

    # ------------------------------------------------------------------ applied
    def applied(self, load: WeightsLoad, mode: PauseMode) -> None:
        self.latest, self.mode = load, mode

    def record(self, entry: dict) -> None:
        self.history.append(entry)


__all__ = ["MAX_UPLOADS", "WeightUpdates"]
