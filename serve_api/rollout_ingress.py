"""The rollout ingress: the rollout routes served without Serve's proxy.

Through Serve, every request to ``/v1/rollouts`` crosses the HTTP proxy actor, then the API
replica, then the rollout service actor: two Python hops before the service (about 14 ms of the
~20 ms a one-request submit took at p50 on a 2-core host was the proxy alone). The ingress is a
second HTTP server (uvicorn) on the API replica's own event loop that serves the same rollout,
weight and OpenAI-style routes (:func:`serve_api.rollouts.rollouts_router`,
:func:`serve_api.weights.weights_router`, the same token, bounds and errors), so a request crosses
one hop: this process -> the service actor. ``GET /v1/rollouts:ingress`` (on the main API) starts
it on the replica that answers, on ``service.ingress_host``:``service.ingress_port`` (0: the kernel
picks a port), and tells its address; :class:`serve_api.trainer_client.TrainerClient` follows it
with ``ingress=True``. Everything else (jobs, admission) stays on the main API.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import JSONResponse

from serve_api.app_base import guard
from serve_api.rollout_boundary import service_settings
from serve_api.rollouts import rollouts_router
from serve_api.views import ApiError, AppSettings, ErrorBody
from serve_api.weights import weights_router

START_TIMEOUT_S = 30.0


class _Ctx:
    """What the rollout routers need of an app: its settings and the two auth dependencies."""

    def __init__(self, settings: AppSettings, need_token: Any, read_access: Any):
        self.settings, self.need_token, self.read_access = settings, need_token, read_access


def create_ingress_app(settings: AppSettings) -> FastAPI:
    """The ingress app: the rollout, weight and OpenAI-style routes with the admission API's guards."""
    app = FastAPI(title="RollMux rollout ingress", version="0.1.0", docs_url=None, redoc_url=None,
                  description="The rollout service's routes without Serve's proxy (see GET /v1/rollouts:ingress "
                              "on the admission API).")
    need_token, read_access = guard(app, settings)
    ctx = _Ctx(settings, need_token, read_access)
    app.include_router(rollouts_router(ctx))
    app.include_router(weights_router(ctx))
    return app


class RolloutIngress:
    """A uvicorn server of :func:`create_ingress_app` on the running event loop."""

    def __init__(self, settings: AppSettings, host: str, port: int):
        self.settings, self.host, self.port = settings, host, port
        self._server: Any = None
        self._task: Optional[asyncio.Task] = None
        self.url: Optional[str] = None

    async def start(self) -> str:
        """Start serving (once) -> the base URL. Raises RuntimeError when it cannot bind."""
        if self.url is not None and self._task is not None and not self._task.done():
            return self.url
        import uvicorn

        cfg = uvicorn.Config(create_ingress_app(self.settings), host=self.host, port=self.port, log_level="warning",
                             access_log=False, lifespan="off", timeout_keep_alive=75)
        self._server = uvicorn.Server(cfg)
        self._server.install_signal_handlers = lambda: None  # not the main thread: the host process owns signals
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not self._server.started:
            if self._task.done() or asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the rollout ingress could not start on {self.host}:{self.port}")
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url


def ingress_router(ctx: Any) -> APIRouter:
    """``GET /v1/rollouts:ingress`` on the main API: start this replica's ingress and tell its address."""
    svc = service_settings()
    app = APIRouter()
    ingress = RolloutIngress(ctx.settings, svc.ingress_host, svc.ingress_port)
    lock = asyncio.Lock()

    @app.get("/v1/rollouts:ingress", dependencies=[Depends(ctx.need_token)], tags=["rollouts"],
             responses={401: {"model": ErrorBody}, 503: {"model": ErrorBody}})
    async def rollout_ingress() -> Any:
        """The address of the rollout ingress: the rollout, weight and OpenAI-style routes served
        without Serve's proxy (same token and answers; lower latency per request)."""
        async with lock:
            try:
                url = await ingress.start()
            except (RuntimeError, OSError) as e:
                raise ApiError(503, "ingress_unavailable", f"ingress_port: {e}", retry_after_s=1) from None
        return JSONResponse({"url": url, "routes": ["/v1/rollouts*", "/v1/policy", "/v1/weights*", "/v1/stats*",
                                                    "/v1/completions", "/v1/chat/completions", "/v1/models"]})

    return app


__all__ = ["RolloutIngress", "create_ingress_app", "ingress_router"]
