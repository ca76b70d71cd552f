"""The input boundary of the rollout routes (``/v1/rollouts*``, ``/v1/policy``, ``/v1/completions``,
``/v1/chat/completions``), checked before FastAPI parses a body:

- ``Content-Type`` not ``application/json`` (or ``application/*+json``) -> 415;
- a body over ``max_request_bytes`` of the service settings (1 MiB by default) -> 413;
- a body that is not UTF-8 -> 422 (field ``body``, the byte offset);
- JSON nested deeper than 16 levels (objects and arrays) -> 422;
- ``NaN`` / ``Infinity`` or a number too large for a float -> 422;
- an upload chunk (``PUT /v1/weights/uploads/{id}/chunks/{i}``): raw bytes
  (``application/octet-stream``, else 415), at most ``weights_chunk_bytes`` (413).

Both are :class:`serve_api.boundary.BodyGuard` (one implementation), with the rollout bounds here
and the admission API's for every other path.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from rollmux.rollout_sched.service_config import MAX_JSON_DEPTH
from serve_api.boundary import BodyGuard, json_body_problem

ROLLOUT_PATHS = ("/v1/rollouts", "/v1/policy", "/v1/completions", "/v1/chat/completions", "/v1/stats", "/v1/weights",
                 "/v1/models")
CHUNK_PATH = re.compile(r"^/v1/weights/uploads/[^/]+/chunks/[^/]+$")


def service_settings() -> Any:
    """The rollout service's settings (``service:`` of ``configs/rollout_sched.yaml`` ``cpu_engine``)."""
    from rollmux.rollout_sched.config import DEFAULT_CONFIG_PATH, load_rollout_sched_config

    return load_rollout_sched_config(DEFAULT_CONFIG_PATH, "cpu_engine").service


def is_rollout_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") or path.startswith(p + ":") for p in ROLLOUT_PATHS)


class NotFinite(ValueError):
    """A JSON number that is not finite (``NaN``, ``Infinity``) or does not fit a float."""


def _no_constant(name: str) -> Any:
    raise NotFinite(f"{name} is not a JSON number (finite numbers only)")


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise NotFinite(f"{s[:40]} does not fit a finite float")
    return v


def finite_numbers(body: bytes) -> Optional[tuple[str, str]]:
    """``(msg, "finite_number")`` when the JSON text holds ``NaN`` / ``Infinity`` or a number too large
    for a float; None otherwise (malformed JSON is left to FastAPI's 422 with the position)."""
    try:
        json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
    except NotFinite as e:
        return str(e), "finite_number"
    except ValueError:  # malformed JSON: FastAPI's 422 names the position
        pass
    except RecursionError:  # pragma: no cover - bounded by the depth check that runs first
        return "JSON nested too deep", "json_invalid"
    return None


def check_body(body: bytes) -> Optional[tuple[str, str]]:
    """What the rollout routes' guard answers 422 for, before parsing: not UTF-8, nested deeper than
    ``MAX_JSON_DEPTH`` (16), or a non-finite number; ``(msg, type)`` or None."""
    problem = json_body_problem(body, MAX_JSON_DEPTH)
    return (problem, "json_invalid") if problem is not None else finite_numbers(body)


class RolloutBoundary:
    """ASGI middleware: the rollout routes through one :class:`BodyGuard` with the rollout service's
    bounds (``rollout_max_bytes``, depth 16, finite numbers), every other request through the
    admission API's (``max_bytes``)."""

    def __init__(self, app: Any, max_bytes: int, rollout_max_bytes: int, chunk_max_bytes: int = 4 << 20):
        self.app = app
        self.guarded = BodyGuard(app, max_bytes=max_bytes)
        self.rollout = BodyGuard(app, max_bytes=rollout_max_bytes, max_depth=MAX_JSON_DEPTH, check=finite_numbers,
                                 limit_name="rollout service max_request_bytes", what="the request")
        self.chunk = BodyGuard(app, max_bytes=chunk_max_bytes, limit_name="rollout service weights_chunk_bytes",
                               what="an upload chunk", binary=True)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") == "http" and is_rollout_path(path):
            return await (self.chunk if CHUNK_PATH.match(path) else self.rollout)(scope, receive, send)
        return await self.guarded(scope, receive, send)
