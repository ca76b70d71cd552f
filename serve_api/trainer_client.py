"""A small Python client of the rollout service for trainers outside RollMux (``httpx``).

::

    c = TrainerClient("http://127.0.0.1:8000", token)
    ids = [a["id"] for a in c.submit([{"prompt": "2+2=", "max_tokens": 32, "critical": True,
                                       "policy_version": 3, "task_family": "math"}] * 8)]
    for r in c.stream(ids):            # results as they finish (one long-lived NDJSON response)
        ...
    c.cancel(leftover_ids)              # over-sampling: drop the rest
    c.push_weights(safetensors_bytes, version=4)   # the trainer's new policy (chunked, SHA-256 checked)

``TrainerClient(base, token, ingress=True)`` asks the admission API for the rollout ingress
(``GET /v1/rollouts:ingress``) and sends every call there (the same routes without Serve's proxy).
:class:`StepTimer` measures the trainer idle ratio from the trainer's side: per step, the time
from its first critical submit to its last critical result, over the step's wall time.
Every non-2xx answer raises :class:`RolloutError` (``status``, ``body``).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, AsyncIterator, Iterator, Optional

import httpx


class RolloutError(RuntimeError):
    def __init__(self, status: int, body: Any):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


def _check(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            body = r.json()
        except ValueError:
            body = r.text
        raise RolloutError(r.status_code, body)
    return r.json()


def _upload_start(data: bytes, version: int, pause_mode: str) -> dict:
    return {"weight_version": int(version), "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "pause_mode": pause_mode}


_OCTETS = {"Content-Type": "application/octet-stream"}


class TrainerClient:
    """Blocking client (one connection pool). ``ingress``: send every call to the rollout ingress
    (its address asked once from ``base_url``)."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 60.0, ingress: bool = False):
        headers = {"Authorization": f"Bearer {token}"}
        if ingress:
            base_url = _check(httpx.get(f"{base_url.rstrip('/')}/v1/rollouts:ingress", headers=headers,
                                        timeout=timeout_s))["url"]
        self.base_url = base_url
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def submit(self, requests: list[dict]) -> list[dict]:
        """Queue ``requests`` (at most 512) -> one ``{id, status, expected_window, ...}`` each."""
        return _check(self.http.post("/v1/rollouts", json={"requests": requests}))["requests"]

    def get(self, request_id: str) -> dict:
        return _check(self.http.get(f"/v1/rollouts/{request_id}"))

    def stream(self, ids: list[str] = (), session_id: Optional[str] = None, timeout_s: float = 600.0) -> Iterator[dict]:
        """Yield each result as it finishes (NDJSON); the end record is not yielded."""
        body: dict[str, Any] = {"ids": list(ids), "timeout_s": timeout_s}
        if session_id:
            body["session_id"] = session_id
        with self.http.stream("POST", "/v1/rollouts:stream", json=body, timeout=timeout_s + 30) as r:
            if r.status_code >= 400:
                r.read()
                _check(r)
            for line in r.iter_lines():
                if line:
                    obj = json.loads(line)
                    if obj.get("event") == "end":
                        return
                    yield obj

    def cancel(self, ids: list[str]) -> dict:
        return _check(self.http.post("/v1/rollouts:cancel", json={"ids": list(ids)}))

    def set_policy(self, version: int, min_version: Optional[int] = None) -> dict:
        body: dict[str, Any] = {"version": version}
        if min_version is not None:
            body["min_version"] = min_version
        return _check(self.http.post("/v1/policy", json=body))

    def stats(self) -> dict:
        return _check(self.http.get("/v1/stats"))

    def push_weights(self, data: bytes, version: int, pause_mode: str = "keep") -> dict:
        """Upload a safetensors file as weights ``version`` (chunked, SHA-256 checked) and apply it
        -> the update (``weights_sha256``, per-replica digests, ``load_s``)."""
        up = _check(self.http.post("/v1/weights/uploads", json=_upload_start(data, version, pause_mode)))
        n = up["chunk_bytes"]
        for i in range(up["chunks"]):
            _check(self.http.put(f"/v1/weights/uploads/{up['upload_id']}/chunks/{i}", content=data[i * n:(i + 1) * n],
                                 headers=_OCTETS))
        return _check(self.http.post(f"/v1/weights/uploads/{up['upload_id']}:commit", json={}))

    def update_from_disk(self, model_path: str, version: int, pause_mode: str = "keep") -> dict:
        return _check(self.http.post("/v1/weights/update_from_disk", json={
            "model_path": model_path, "weight_version": int(version), "pause_mode": pause_mode}))

    def weights(self) -> dict:
        return _check(self.http.get("/v1/weights"))


class AsyncTrainerClient:
    """The same calls on ``httpx.AsyncClient`` (``max_connections`` concurrent connections);
    :meth:`create` with ``ingress=True`` follows the rollout ingress."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 60.0, max_connections: int = 64):
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.base_url = base_url
        self.http = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {token}"},
                                      timeout=timeout_s, limits=limits)

    @classmethod
    async def create(cls, base_url: str, token: str, timeout_s: float = 60.0, max_connections: int = 64,
                     ingress: bool = False) -> "AsyncTrainerClient":
        if ingress:
            async with httpx.AsyncClient(timeout=timeout_s) as c:
                base_url = _check(await c.get(f"{base_url.rstrip('/')}/v1/rollouts:ingress",
                                              headers={"Authorization": f"Bearer {token}"}))["url"]
        return cls(base_url, token, timeout_s, max_connections)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def submit(self, requests: list[dict]) -> list[dict]:
        return _check(await self.http.post("/v1/rollouts", json={"requests": requests}))["requests"]

    async def stream(self, ids: list[str], timeout_s: float = 600.0) -> AsyncIterator[dict]:
        async with self.http.stream("POST", "/v1/rollouts:stream", json={"ids": list(ids), "timeout_s": timeout_s},
                                    timeout=timeout_s + 30) as r:
            if r.status_code >= 400:
                await r.aread()
                _check(r)
            async for line in r.aiter_lines():
                if line:
                    obj = json.loads(line)
                    if obj.get("event") == "end":
                        return
                    yield obj

    async def cancel(self, ids: list[str]) -> dict:
        return _check(await self.http.post("/v1/rollouts:cancel", json={"ids": list(ids)}))

    async def set_policy(self, version: int) -> dict:
        return _check(await self.http.post("/v1/policy", json={"version": version}))

    async def stats(self) -> dict:
        return _check(await self.http.get("/v1/stats"))

    async def push_weights(self, data: bytes, version: int, pause_mode: str = "keep") -> dict:
        """:meth:`TrainerClient.push_weights` (chunks sent one after another)."""
        up = _check(await self.http.post("/v1/weights/uploads", json=_upload_start(data, version, pause_mode)))
        n = up["chunk_bytes"]
        for i in range(up["chunks"]):
            _check(await self.http.put(f"/v1/weights/uploads/{up['upload_id']}/chunks/{i}",
                                       content=data[i * n:(i + 1) * n], headers=_OCTETS))
        return _check(await self.http.post(f"/v1/weights/uploads/{up['upload_id']}:commit", json={}))


class StepTimer:
    """Trainer idle ratio, measured by the trainer: per step, first critical submit -> last critical
    result (``waiting``) over the step's wall time (its first critical submit -> the next step's)."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float, float]] = []  # (start, critical done, end)
        self._start: Optional[float] = None
        self._done: Optional[float] = None

    def critical_submitted(self) -> None:
        if self._start is None:
            self._start = time.monotonic()

    def critical_done(self) -> None:
        self._done = time.monotonic()

    def end_step(self) -> None:
        if self._start is not None:
            end = time.monotonic()
            self.steps.append((self._start, self._done or end, end))
        self._start = self._done = None

    def idle_ratio(self) -> float:
        wall = sum(e - s for s, _, e in self.steps)
        return sum(d - s for s, d, _ in self.steps) / wall if wall > 0 else 0.0
