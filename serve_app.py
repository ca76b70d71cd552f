"""HTTP admission endpoint of RollMux: a Ray Serve deployment with a FastAPI ingress.

Routes (OpenAPI at ``/docs`` and ``/openapi.json``):

- ``POST /v1/jobs`` (token): admit a :class:`rollmux.models.JobSpec` -> 201 with job id, co-execution
  group id, placement (rollout / training nodes), marginal provisioning cost (USD/h), predicted
  worst-case slowdown of every group member and the decision's explanation; a refusal (state larger
  than any node, SLO unreachable even alone, cluster out of GPUs, duplicate job id) -> 409 with the
  reason; a malformed spec -> 422 naming the field and what it allows; a body that is not
  ``application/json`` -> 415; a body over ``max_request_bytes`` -> 413.
- ``POST /v1/jobs:dry-run`` (token): the same decision and status codes, nothing changed; answered by the
  replica from its copy of the published policy table (``SnapshotCache.what_if``).
- ``POST /v1/jobs`` with ``"queue": true`` on a bounded cluster: a job that does not fit now is
  held by the admission queue -> 202 with ``queue_position``; it is admitted after a departure
  frees room (in order, smaller jobs backfilling; :mod:`rollmux.admission_queue`). A full queue
  -> 429 with ``Retry-After``.
- ``GET /v1/jobs`` (optional ``limit`` / ``offset``), ``GET /v1/jobs/{job_id}`` (404 if unknown; a
  queued job: state ``queued`` with ``queue_position`` and ``waited_s``), ``DELETE
  /v1/jobs/{job_id}`` (token; departure: nodes released, groups shrink or dissolve, queued jobs
  admitted into the room; a queued job is cancelled), ``GET /v1/groups``, ``GET /healthz``.

Reads scale with replicas: each replica follows the scheduler's *published snapshot* (one version
per commit; :meth:`actors.scheduler.global_scheduler.GlobalSchedulerImpl.snapshot_since`, a long poll) and
answers ``GET /v1/jobs`` / ``/v1/groups`` and dry-runs from it, never queueing behind the scheduler's writes; a
write waits until the replica's copy holds it, so a client reads its own writes. Writes use the
scheduler's group commit (``admit_batched`` / ``depart_batched``: one checkpoint write per batch).
Overload is bounded: each replica holds at most ``max_pending_writes`` writes in flight (more ->
429 with ``Retry-After``), and Serve's ``max_queued_requests`` bounds the requests queued at the
proxy (more -> 503 with ``Retry-After``, Serve's ``BackpressureConfig``).

Every error is a JSON body ``{"error": <kind>, "detail": <reason>}``; the scheduler being
unreachable gives 503. The policy lives in :mod:`rollmux.admission` behind the ``GlobalScheduler``
actor (``actors/scheduler/global_scheduler.py``); this module only assembles the app (one ``APIRouter``
per concern, :data:`ROUTERS`: add a router builder there to serve more routes) from its parts in
:mod:`serve_api` (types, input boundary, the scheduler client, the snapshot copy, the routes)
and deploys it on Ray Serve. Source: RollMux §4.2 (Alg. 1, admission).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from fastapi import FastAPI
from ray import serve

from actors.naming import control_plane_resources
from rollmux.config import ServeConfig
from serve_api.app_base import guard
from serve_api.boundary import BodyGuard, allowed, field_error  # noqa: F401  (allowed re-exported)
from serve_api.client import AdmitBatcher, SchedulerApi, SchedulerClient  # noqa: F401  (re-exported)
from serve_api.jobs import AppContext, jobs_router
from serve_api.rollout_ingress import ingress_router
from serve_api.rollouts import rollouts_router
from serve_api.snapshot import SnapshotCache  # noqa: F401  (re-exported)
from serve_api.weights import weights_router
from serve_api.views import (  # noqa: F401  (re-exported: the API's types)
    MAX_REQUEST_BYTES, AdmissionView, ApiError, AppSettings, DepartureView, ErrorBody, GroupView, HealthView,
    JobView, MoveView, SubmitRequest, _finite, _sha256,
)

log = logging.getLogger("rollmux.serve")

API_VERSION = "v1"

#: The app's routers: ``builder(ctx: AppContext) -> APIRouter``, included in this order.
ROUTERS: tuple[Callable[[AppContext], Any], ...] = (jobs_router, rollouts_router, weights_router, ingress_router)



def _mount_offline_docs(app: FastAPI) -> None:
    """Serve ``/docs`` (Swagger UI) from the ``swagger-ui-bundle`` package instead of a CDN."""
    import swagger_ui_bundle
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    app.mount("/static/swagger", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger")

    @app.get("/docs", include_in_schema=False)
    async def swagger_docs():
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - docs",
            swagger_js_url="/static/swagger/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger/swagger-ui.css",
            swagger_favicon_url="/static/swagger/favicon-32x32.png",
        )


def create_app(settings: AppSettings, client: Optional[SchedulerApi] = None) -> FastAPI:
    """Build the FastAPI app (one per Serve replica) from :data:`ROUTERS`. ``client`` (a
    :class:`serve_api.client.SchedulerApi`) defaults to the named scheduler's :class:`SchedulerClient`."""
    client = client or SchedulerClient(settings.scheduler_name, settings.request_timeout_s)
    app = FastAPI(
        title="RollMux admission API",
        version="0.1.0",
        description=(
            "Admit RL post-training jobs into co-execution groups (RollMux §4.2, Alg. 1). "
            "POST/DELETE need `Authorization: Bearer <token>`."
        ),
        docs_url=None,  # served below from the bundled Swagger UI assets (no CDN: works offline)
    )
    _mount_offline_docs(app)
    need_token, read_access = guard(app, settings)

    ctx = AppContext(settings=settings, client=client, cache=SnapshotCache(client), batcher=AdmitBatcher(client),
                     need_token=need_token, read_access=read_access)
    for build in ROUTERS:
        app.include_router(build(ctx))
    return app


# ----------------------------------------------------------------------------- Serve deployment
@serve.deployment(name="RollMuxAPI", ray_actor_options={"num_cpus": 0})
@serve.ingress()
class RollMuxAPI:
    """Serve replica of the admission API; the FastAPI app is built per replica from ``settings``."""

    def __init__(self, settings: dict):
        self._settings = AppSettings.model_validate(settings)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self._settings)


def deploy(cfg: ServeConfig, token: str, *, route_prefix: str = "/") -> str:
    """Start Serve (HTTP on ``cfg.host:cfg.port``, proxy on the head only) and run the API app.

    Needs a connected Ray driver. Replicas are pinned to the head (``rollmux_head`` resource)
    when the cluster has one. Returns the base URL. Raises ValueError without a token.
    """
    from ray.serve.config import BackpressureConfig

    settings = AppSettings.from_config(cfg, token)
    logging = {"enable_access_log": cfg.access_log}
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, proxy_location="HeadOnly", logging_config=logging)
    opts: dict[str, Any] = {"num_cpus": 0}
    if res := control_plane_resources():
        opts["resources"] = res
    app = RollMuxAPI.options(num_replicas=cfg.num_replicas, max_ongoing_requests=cfg.max_ongoing_requests,
                             max_queued_requests=cfg.max_queued_requests,
                             backpressure_config=BackpressureConfig(status_code=503, retry_after_s=1),
                             logging_config=logging,
                             ray_actor_options=opts).bind(settings.model_dump())
    serve.run(app, name=cfg.app_name, route_prefix=route_prefix)
    return cfg.base_url
