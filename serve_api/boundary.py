"""The HTTP face's input boundary: what each job-spec field allows, the body guard, field errors.

Bad input gets a clear 4xx naming the field, never a traceback: a body that is not JSON -> 415,
one over ``max_request_bytes`` -> 413, one that is not UTF-8 or nests arrays / objects deeper than
:data:`MAX_JSON_DEPTH` -> 422 naming ``body`` (:class:`BodyGuard`, :func:`json_body_problem`), a malformed or invalid spec -> 422
with ``errors: [{field, msg, type}]`` whose ``msg`` ends with what the field allows
(:func:`allowed`, read from :class:`rollmux.models.JobSpec`'s JSON schema; :func:`field_error`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from fastapi.responses import JSONResponse

from rollmux.models import JobSpec


_UNITS = (("_usd_per_h", "USD/h"), ("_gbps", "Gbit/s"), ("_gb", "GB"), ("_s", "s"), ("_tokens", "tokens"),
          ("_gpus", "GPUs"), ("_params_b", "B params"))


def _unit(name: str) -> str:
    if name == "slo":
        return " x solo time"
    return next((" " + u for suffix, u in _UNITS if name.endswith(suffix)), "")


def _schema_of(path: list[str], root: Optional[dict] = None) -> Optional[dict]:
    """The JSON schema of field ``path`` (e.g. ``["measured", "t_roll_s"]``) of ``root`` (a model's
    JSON schema; default ``JobSpec``'s), or None. Integer parts index arrays."""
    root = root or JobSpec.model_json_schema()
    defs = root.get("$defs", {})
    node: Optional[dict] = root
    for part in path:
        if node is None:
            return None
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1]) or {}
        node = node.get("items") if part.isdigit() and node.get("type") == "array" else (node.get("properties") or {}).get(part)
        if node is None:
            return None
        opts = [node] + list(node.get("anyOf") or [])
        node = next((o for o in opts if o.get("type") not in (None, "null") or "$ref" in o or "enum" in o), node)
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1])
    return node


def allowed(path: list[str], root: Optional[dict] = None) -> str:
    """What field ``path`` of a job spec (or of the model whose JSON schema is ``root``) accepts,
    e.g. ``"a finite number, 0 < t_roll_s <= 604800 s"``."""
    sch = _schema_of(path, root)
    if not sch:
        return ""
    name, typ, unit = path[-1], sch.get("type"), _unit(path[-1])
    if "enum" in sch:
        return "one of " + ", ".join(repr(v) for v in sch["enum"])
    if typ in ("number", "integer"):
        lo = (f"{sch['exclusiveMinimum']:g} < " if "exclusiveMinimum" in sch
              else f"{sch['minimum']:g} <= " if "minimum" in sch else "")
        hi = (f" < {sch['exclusiveMaximum']:g}" if "exclusiveMaximum" in sch
              else f" <= {sch['maximum']:g}" if "maximum" in sch else "")
        kind = "an integer (JSON number without fraction, not a string or boolean)" if typ == "integer" \
            else "a finite number (not a string, boolean, NaN or Infinity)"
        return f"{kind}, {lo}{name}{hi}{unit}"
    if typ == "string":
        return f"a string matching {sch['pattern']}" if "pattern" in sch else "a string"
    if typ == "boolean":
        return "true or false"
    if typ == "object":
        return "an object with fields " + ", ".join(sch.get("properties") or {})
    return ""


class BodyGuard:
    """ASGI middleware on every ``POST``/``PUT``/``PATCH`` under ``/v1/``: the body must be
    ``application/json`` (or ``application/*+json``), else 415; at most ``max_bytes`` bytes (by
    ``Content-Length`` and by counting a streamed body), else 413. The body is read once here,
    bounded, and handed on unchanged. A body that is not UTF-8 or nests deeper than ``max_depth``
    -> 422 naming ``body``; ``check`` (optional: body -> ``(msg, type)`` of a further 422, or None)
    adds a route family's own rule. ``limit_name`` names the setting in the 413, ``what`` the body
    in the 415. The rollout routes use a second instance with their own bounds
    (:mod:`serve_api.rollout_boundary`)."""

    def __init__(self, app: Any, max_bytes: int, max_depth: Optional[int] = None,
                 check: Optional[Callable[[bytes], Optional[tuple[str, str]]]] = None,
                 limit_name: str = "max_request_bytes", what: str = "the job spec", binary: bool = False):
        self.app, self.max_bytes = app, max_bytes
        self.max_depth = MAX_JSON_DEPTH if max_depth is None else max_depth
        self.check, self.limit_name, self.what = check, limit_name, what
        self.binary = binary  # raw bytes (application/octet-stream), no JSON checks: an upload chunk

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") not in ("POST", "PUT", "PATCH") \
                or not str(scope.get("path", "")).startswith("/v1/"):
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers") or []}
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        media = ctype.split(";", 1)[0].strip().lower()
        if self.binary and media != "application/octet-stream":
            return await JSONResponse(
                {"error": "unsupported_media_type",
                 "detail": f"Content-Type {ctype or '(none)'!s} is not accepted: send {self.what} as raw bytes "
                           "with Content-Type: application/octet-stream"}, status_code=415)(scope, receive, send)
        if not self.binary and not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
            return await JSONResponse(
                {"error": "unsupported_media_type",
                 "detail": f"Content-Type {ctype or '(none)'!s} is not accepted: send {self.what} as JSON "
                           "with Content-Type: application/json"}, status_code=415)(scope, receive, send)
        too_big = JSONResponse({"error": "request_too_large",
                                "detail": f"the request body exceeds {self.max_bytes} bytes ({self.limit_name})"},
                               status_code=413)
        length = headers.get(b"content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > self.max_bytes):
            return await too_big(scope, receive, send)
        chunks, total, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            chunks.append(msg.get("body", b""))
            total += len(chunks[-1])
            more = msg.get("more_body", False)
            if total > self.max_bytes:
                return await too_big(scope, receive, send)
        body, sent = b"".join(chunks), False
        problem = None if self.binary else json_body_problem(body, self.max_depth)
        bad = (problem, "json_invalid") if problem is not None else self.check(body) if self.check and not self.binary \
            else None
        if bad is not None:
            return await JSONResponse({"error": "invalid_request", "detail": f"body: {bad[0]}",
                                       "errors": [{"field": "body", "msg": bad[0], "type": bad[1]}]},
                                      status_code=422)(scope, receive, send)

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


MAX_JSON_DEPTH = 32  # nesting levels of arrays / objects a request body may have (a job spec has 2)


def json_body_problem(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Optional[str]:
    """Why ``body`` cannot be a request (answered 422 by :class:`BodyGuard`): not UTF-8 (the
    byte offset named), or arrays / objects nested deeper than ``max_depth``; None otherwise
    (the JSON itself is parsed, and its errors named, by the route). O(len(body))."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"malformed JSON: not valid UTF-8 (byte {e.start})"
    if text.count("[") + text.count("{") <= max_depth:
        return None
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return f"malformed JSON: nested deeper than {max_depth} levels at character {i}"
        elif ch in "]}":
            depth -= 1
    return None


_NAMED = re.compile(r"^(Value error, )?([a-z_][a-z0-9_]*): (.*)$", re.S)  # "field: why" from a model validator


def field_error(e: dict, root: Optional[dict] = None) -> dict:
    """One pydantic error as ``{field, msg, type}``: the field's dotted path, the message and what
    the field allows (``root``: the JSON schema of the route's body model; default ``JobSpec``'s);
    malformed JSON names the body and the position, not an offset as a field. A model validator's
    ``ValueError("name: why")`` names field ``name`` under the model's path."""
    loc = [p for p in e.get("loc", ()) if p != "body"]
    typ = e.get("type", "")
    if typ == "json_invalid":
        pos = loc[0] if loc and isinstance(loc[0], int) else None
        why = (e.get("ctx") or {}).get("error") or e.get("msg", "")
        return {"field": "body", "msg": f"malformed JSON: {why}" + (f" at character {pos}" if pos is not None else ""),
                "type": typ}
    path = [str(p) for p in loc]
    msg = e.get("msg", "")
    if typ == "value_error" and (m := _NAMED.match(msg)):
        path, msg = path + [m.group(2)], (m.group(1) or "") + m.group(3)
    if path and typ != "extra_forbidden" and (what := allowed(path, root)):
        msg = f"{msg} (allowed: {what})"
    elif path and typ == "extra_forbidden":
        parent = _schema_of(path[:-1], root) if len(path) > 1 else (root or JobSpec.model_json_schema())
        names = ", ".join((parent or {}).get("properties") or {})
        msg = f"{msg} (unknown field; allowed fields: {names})" if names else f"{msg} (unknown field)"
    return {"field": ".".join(path) or "body", "msg": msg, "type": typ}
