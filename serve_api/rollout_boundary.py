"""The input boundary of the rollout routes (``/v1/rollouts*``, ``/v1/policy``, ``/v1/completions``,
``/v1/chat/completions``), checked before FastAPI parses a body:

- ``Content-Type`` not ``application/json`` (or ``application/*+json``) -> 415;
- a body over ``max_request_bytes`` of the service settings (1 MiB by default) -> 413;
- a body that is not UTF-8 -> 422 (field ``body``, the byte offset);
- JSON nested deeper than 16 levels (objects and arrays) -> 422;
- ``NaN`` / ``Infinity`` or a number too large for a float -> 422.

Every other path goes to the admission API's :class:`serve_api.boundary.BodyGuard` unchanged.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi.responses import JSONResponse

from rollmux.rollout_sched.service_config import MAX_JSON_DEPTH
from serve_api.boundary import BodyGuard

ROLLOUT_PATHS = ("/v1/rollouts", "/v1/policy", "/v1/completions", "/v1/chat/completions", "/v1/stats")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def is_rollout_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") or path.startswith(p + ":") for p in ROLLOUT_PATHS)


def json_depth(body: bytes) -> int:
    """Deepest nesting of objects / arrays in a JSON text (strings skipped), without parsing it."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    depth = deepest = 0
    for b in brackets:
        if b in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _bad(detail: str, typ: str, status: int = 422) -> JSONResponse:
    return JSONResponse({"error": "invalid_request", "detail": f"body: {detail}",
                         "errors": [{"field": "body", "msg": detail, "type": typ}]}, status_code=status)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (finite numbers only)")


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"{s[:40]} does not fit a finite float")
    return v


def check_body(body: bytes) -> JSONResponse | None:
    """The 422 for a body the rollout routes refuse before parsing, or None."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return _bad(f"not valid UTF-8 (byte {e.start})", "utf8_invalid")
    if (d := json_depth(body)) > MAX_JSON_DEPTH:
        return _bad(f"JSON nested {d} levels deep; at most {MAX_JSON_DEPTH}", "json_too_deep")
    try:
        json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
    except ValueError as e:
        if "finite" in str(e) or "float" in str(e):
            return _bad(str(e), "finite_number")
        return None  # malformed JSON: FastAPI answers 422 with the position
    except RecursionError:  # pragma: no cover - bounded by the depth check
        return _bad("JSON nested too deep", "json_too_deep")
    return None


class RolloutBoundary:
    """ASGI middleware: the rollout routes' checks (module docstring); every other request goes
    through :class:`BodyGuard` (``max_bytes``: the admission API's bound)."""

    def __init__(self, app: Any, max_bytes: int, rollout_max_bytes: int):
        self.app, self.rollout_max_bytes = app, rollout_max_bytes
        self.guarded = BodyGuard(app, max_bytes=max_bytes)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") != "http" or not is_rollout_path(path):
            return await self.guarded(scope, receive, send)
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers") or []}
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        media = ctype.split(";", 1)[0].strip().lower()
        if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
            return await JSONResponse(
                {"error": "unsupported_media_type",
                 "detail": f"Content-Type {ctype or '(none)'!s} is not accepted: send JSON with "
                           "Content-Type: application/json"}, status_code=415)(scope, receive, send)
        too_big = JSONResponse({"error": "request_too_large",
                                "detail": f"the request body exceeds {self.rollout_max_bytes} bytes "
                                          "(rollout service max_request_bytes)"}, status_code=413)
        length = headers.get(b"content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > self.rollout_max_bytes):
            return await too_big(scope, receive, send)
        chunks, total, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            chunks.append(msg.get("body", b""))
            total += len(chunks[-1])
            more = msg.get("more_body", False)
            if total > self.rollout_max_bytes:
                return await too_big(scope, receive, send)
        body, sent = b"".join(chunks), False
        if (refusal := check_body(body)) is not None:
            return await refusal(scope, receive, send)

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
