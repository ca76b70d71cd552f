"""The rollout ingress: the rollout routes served without Serve's proxy.

Through Serve, every request to ``/v1/rollouts`` crosses the HTTP proxy actor, then the API
replica, then the rollout service actor: two Python hops before the service (a trivial route took
14 ms at p50 through the proxy on this 2-core host, 0.7 ms on an HTTP server in an actor). The
ingress is an actor of its own (:class:`RolloutIngressServer`, one per service, detached, on the
head like the service) running a uvicorn server of the same rollout, weight and OpenAI-style routes
(:func:`serve_api.rollouts.rollouts_router`, :func:`serve_api.weights.weights_router`: the same
token, bounds and errors), so a request crosses one hop: the ingress -> the service actor.
``GET /v1/rollouts:ingress`` (on the main API) starts it and tells its address
(``service.ingress_host``:``service.ingress_port``; port 0: the kernel picks one);
:class:`serve_api.trainer_client.TrainerClient` follows it with ``ingress=True``. Everything
else (jobs, admission) stays on the main API. ``rollmux down`` removes it with RollMux's other
named actors.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import JSONResponse

from actors.handles import ActorLost, CallTimeout, RolloutIngressHandle, start_actor
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


class RolloutIngressServer:
    """Actor body: a uvicorn server of :func:`create_ingress_app` on the actor's event loop.
    ``settings``: the API's :class:`serve_api.views.AppSettings` as a dict."""

    def __init__(self, settings: dict, host: str, port: int):
        self.settings, self.host, self.port = AppSettings.model_validate(settings), host, port
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
        self._server.install_signal_handlers = lambda: None  # not the main thread: Ray owns the signals
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not self._server.started:
            if self._task.done() or asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the rollout ingress could not start on {self.host}:{self.port}")
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url


def ensure_ingress(name: str, settings: AppSettings, host: str, port: int) -> RolloutIngressHandle:
    """The ingress actor ``name`` (created detached when missing). Needs a connected Ray driver."""
    from actors.naming import NAMESPACE, control_plane_resources

    opts: dict[str, Any] = {"num_cpus": 0, "namespace": NAMESPACE, "lifetime": "detached", "max_concurrency": 10_000}
    if res := control_plane_resources():
        opts["resources"] = res
    actor = start_actor(RolloutIngressServer, (settings.model_dump(), host, port), name=name, get_if_exists=True, **opts)
    return RolloutIngressHandle(actor, name=name)


def ingress_router(ctx: Any) -> APIRouter:
    """``GET /v1/rollouts:ingress`` on the main API: start the service's ingress and tell its address."""
    from actors.rollout.service import service_name

    svc = service_settings()
    app = APIRouter()
    name = service_name(ctx.settings.scheduler_name or "default") + "-ingress"
    lock = asyncio.Lock()

    @app.get("/v1/rollouts:ingress", dependencies=[Depends(ctx.need_token)], tags=["rollouts"],
             responses={401: {"model": ErrorBody}, 503: {"model": ErrorBody}})
    async def rollout_ingress() -> Any:
        """The address of the rollout ingress: the rollout, weight and OpenAI-style routes served
        without Serve's proxy (same token and answers; lower latency per request)."""
        async with lock:
            try:
                h = await asyncio.to_thread(ensure_ingress, name, ctx.settings, svc.ingress_host, svc.ingress_port)
                url = await h.start(timeout_s=START_TIMEOUT_S + 30)
            except (RuntimeError, OSError, ActorLost, CallTimeout) as e:
                raise ApiError(503, "ingress_unavailable", f"ingress_port: {str(e).splitlines()[0][:300]}",
                               retry_after_s=1) from None
        return JSONResponse({"url": url, "routes": ["/v1/rollouts*", "/v1/policy", "/v1/weights*", "/v1/stats*",
                                                    "/v1/completions", "/v1/chat/completions", "/v1/models"]})

    return app


__all__ = ["RolloutIngressServer", "create_ingress_app", "ensure_ingress", "ingress_router"]
