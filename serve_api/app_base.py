"""What every FastAPI app of the HTTP face shares: the body guards, the bearer token and the
open-read rate limit, and the error handlers (every error is JSON ``{"error", "detail"}``, a 422
lists ``errors: [{field, msg, type}]``, never a traceback). Used by the admission API
(:func:`serve_app.create_app`) and the rollout ingress (:mod:`serve_api.rollout_ingress`)."""

from __future__ import annotations

import hmac
import logging
from typing import Callable, Optional

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from serve_api.boundary import field_error
from serve_api.ratelimit import ClientRateLimit
from serve_api.rollout_boundary import RolloutBoundary, service_settings
from serve_api.views import ApiError, AppSettings, _sha256

log = logging.getLogger("rollmux.serve")


def _body_schema(request: Request) -> Optional[dict]:
    """The JSON schema of the matched route's pydantic body model (what a 422 lists as allowed), or
    None (the job spec's: the admission routes parse their body themselves)."""
    field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(field, "field_info", None), "annotation", None)
    return model.model_json_schema() if isinstance(model, type) and issubclass(model, BaseModel) else None


def guard(app: FastAPI, settings: AppSettings) -> tuple[Callable[..., None], Callable[..., None]]:
    """Install the body guards and error handlers on ``app``; returns its two auth dependencies
    ``(need_token, read_access)``: writes need the bearer token, reads follow ``open_read_routes``
    (rate-limited per client address without a token)."""
    svc = service_settings()
    # the admission routes' BodyGuard; the rollout routes' own bounds (serve_api/rollout_boundary.py)
    app.add_middleware(RolloutBoundary, max_bytes=settings.max_request_bytes, rollout_max_bytes=svc.max_request_bytes,
                       chunk_max_bytes=svc.weights_chunk_bytes)
    bearer = HTTPBearer(auto_error=False, description="RollMux API token (see `rollmux urls`)")

    def _check(creds: Optional[HTTPAuthorizationCredentials]) -> None:
        if creds is None or creds.scheme.lower() != "bearer":
            raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)")
        if not hmac.compare_digest(_sha256(creds.credentials), settings.token_sha256):
            raise ApiError(401, "unauthorized", "invalid bearer token")

    def need_token(creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        _check(creds)

    limit = ClientRateLimit(settings.open_read_rate_per_s, settings.open_read_burst)

    def read_access(request: Request, creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if not settings.open_read_routes:
            _check(creds)
        elif creds is None or not hmac.compare_digest(_sha256(creds.credentials), settings.token_sha256):
            wait = limit.take(request.client.host if request.client else "?")  # per client address, this replica
            if wait:
                raise ApiError(429, "rate_limited", "too many reads without a token from this address "
                               f"(open_read_rate_per_s={settings.open_read_rate_per_s:g}); retry later or send the "
                               "API token", retry_after_s=ClientRateLimit.retry_after_s(wait))

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [field_error(e, _body_schema(request)) for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['msg']}" for e in errors) or "invalid request"
        return JSONResponse({"error": "invalid_request", "detail": detail, "errors": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": "http_error", "detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.middleware("http")
    async def _never_a_traceback(request: Request, call_next):
        try:
            return await call_next(request)
        except Exception as e:  # a bug: log it, answer JSON without the traceback
            log.exception("unhandled error on %s %s", request.method, request.url.path)
            return JSONResponse({"error": "internal", "detail": f"{type(e).__name__}"}, status_code=500)

    return need_token, read_access


__all__ = ["guard"]
