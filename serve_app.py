"""HTTP admission endpoint of RollMux: a Ray Serve deployment with a FastAPI ingress.

Routes (OpenAPI at ``/docs`` and ``/openapi.json``):

- ``POST /v1/jobs`` (token): admit a :class:`rollmux.models.JobSpec` -> 201 with job id, co-execution
  group id, placement (rollout / training nodes), marginal provisioning cost (USD/h), predicted
  worst-case slowdown of every group member and the decision's explanation; a refusal (state larger
  than any node, SLO unreachable even alone, cluster out of GPUs, duplicate job id) -> 409 with the
  reason; a malformed spec -> 422 naming the field and what it allows; a body that is not
  ``application/json`` -> 415; a body over ``max_request_bytes`` -> 413.
- ``POST /v1/jobs:dry-run`` (token): the same decision and status codes, nothing changed.
- ``GET /v1/jobs``, ``GET /v1/jobs/{job_id}`` (404 if unknown), ``DELETE /v1/jobs/{job_id}`` (token;
  departure: nodes released, groups shrink or dissolve), ``GET /v1/groups``, ``GET /healthz``.

Every error is a JSON body ``{"error": <kind>, "detail": <reason>}``; the scheduler being
unreachable gives 503. The policy lives in :mod:`rollmux.admission` behind the ``GlobalScheduler``
actor (``actors/global_scheduler.py``); this module only translates HTTP to actor calls.
Source: RollMux §4.2 (Alg. 1, admission).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import time
from typing import Any, Optional

import ray
from fastapi import Depends, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from starlette.exceptions import HTTPException

from actors.naming import NAMESPACE, SCHEDULER_NAME, control_plane_resources
from rollmux.config import ServeConfig
from rollmux.models import JOB_ID_MAX_LEN, JOB_ID_PATTERN, JobSpec
from rollmux.records import JobRecord, MoveRecord

log = logging.getLogger("rollmux.serve")

API_VERSION = "v1"
#: default bound on a request body, bytes (a job spec is well under 2 KB).
MAX_REQUEST_BYTES = 64 * 1024


# ----------------------------------------------------------------------------- response models
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(_Open):
    """Every non-2xx answer: ``error`` kind (e.g. ``not_admitted``, ``invalid_request``) and a reason."""

    error: str
    detail: str


class PlacementView(_Open):
    rollout_nodes: list[str] = Field(description="rollout node ids, e.g. rollout-0")
    train_nodes: list[str] = Field(description="training node ids, e.g. train-0")


class Explanation(_Open):
    """Why the scheduler decided so (RollMux Alg. 1): strategy, candidates compared, groups pruned."""

    code: str = Field(description='"ok" | "never" | "retry_later" | "duplicate" | "invalid"')
    reason: str
    strategy: Optional[str] = Field(default=None, description='"direct" | "scale_out" | "isolated"')
    candidates: list[Any] = []
    pruned: list[Any] = []


class AdmissionView(_Open):
    """An admission decision as returned by ``POST /v1/jobs`` (201) and ``:dry-run`` (200)."""

    job_id: str
    admitted: bool
    dry_run: bool
    group_id: Optional[str] = None
    placement: Optional[PlacementView] = None
    marginal_cost_usd_per_h: Optional[float] = Field(default=None, description="Cost(G') - Cost(G), USD/h")
    predicted_slowdowns: dict[str, Optional[float]] = Field(
        default={}, description="worst-case co-executed / solo iteration time per group member"
    )
    explanation: Explanation
    latency_ms: Optional[float] = Field(default=None, description="scheduler decision time, ms")


#: One departure re-packing move: the scheduler's own record type (validated on the way out).
MoveView = MoveRecord
#: A job as the scheduler tracks it: the scheduler's own :class:`rollmux.records.JobRecord`
#: (state, group and placement, iterations, predicted vs measured phase times, slowdown vs SLO,
#: moves). ``GET /v1/jobs`` replies are validated against it.
JobView = JobRecord


class DepartureView(_Open):
    """``DELETE /v1/jobs/{id}``: what the departure released and which jobs departure re-packing moved."""

    job_id: str
    state: str = Field(description='the job\'s state now: "finished"')
    released_nodes: list[str] = Field(default=[], description="nodes the cluster no longer uses (incl. dissolved groups')")
    group_dissolved: bool = Field(default=False, description="the job's own group ceased to exist")
    dissolved_groups: list[str] = Field(default=[], description="every group that ceased to exist")
    moves: list[MoveView] = Field(default=[], description="jobs moved into other groups to lower the $/h")


class GroupView(_Open):
    """A co-execution group: members, nodes, cost (USD/h), natural cycle, busiest-node load, slack (s)."""

    group_id: str
    members: list[str] = []
    rollout_nodes: list[str] = []
    train_nodes: list[str] = []
    cost_usd_per_h: Optional[float] = None
    t_cycle_s: Optional[float] = None
    t_load_s: Optional[float] = None
    slack_s: Optional[float] = None


class HealthView(_Open):
    ok: bool
    jobs: Optional[int] = None
    groups: Optional[int] = None


# ----------------------------------------------------------------------------- settings, client
class AppSettings(BaseModel):
    """What a Serve replica needs; the token travels only as its SHA-256."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)
    token_sha256: str = Field(min_length=64, max_length=64)
    open_read_routes: bool = True
    scheduler_name: Optional[str] = None
    request_timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_request_bytes: int = Field(default=MAX_REQUEST_BYTES, ge=1024, le=16 << 20)

    @classmethod
    def from_config(cls, cfg: ServeConfig, token: str) -> "AppSettings":
        """Raises ValueError when ``token`` is empty (admission must be protected)."""
        if not token:
            raise ValueError("an API token is required (set $ROLLMUX_API_TOKEN or token_file in configs/serve.yaml)")
        return cls(
            token_sha256=_sha256(token),
            open_read_routes=cfg.open_read_routes,
            scheduler_name=cfg.scheduler_name,
            request_timeout_s=cfg.request_timeout_s,
            max_request_bytes=cfg.max_request_bytes,
        )


def _finite(x: Any) -> Any:
    """JSON-safe copy: non-finite floats (inf / NaN, e.g. an unbounded slowdown) become ``None``."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _sha256(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


class ApiError(Exception):
    """An error answered as ``status`` with JSON ``{"error": kind, "detail": detail, **extra}``."""

    def __init__(self, status: int, kind: str, detail: str, **extra: Any):
        super().__init__(detail)
        self.status, self.kind, self.detail, self.extra = status, kind, detail, extra

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "5"} if self.status == 503 else ({"WWW-Authenticate": "Bearer"} if self.status == 401 else None)
        return JSONResponse({"error": self.kind, "detail": self.detail, **self.extra}, status_code=self.status, headers=headers)


class SchedulerClient:
    """Calls the named ``GlobalScheduler`` actor; re-resolves the handle after a restart.

    The handle is cached; on ``RayActorError`` / ``ActorUnavailableError`` / "actor not found" it
    is dropped and looked up again by name and namespace once (after a short pause).
    Raises :class:`ApiError` 503 when the scheduler stays unreachable or a call exceeds
    ``timeout_s``; 500 (JSON, no traceback) when the actor raised.
    """

    def __init__(self, name: Optional[str] = None, timeout_s: float = 30.0):
        self.name, self.namespace = name or SCHEDULER_NAME, NAMESPACE
        self.timeout_s = timeout_s
        self._handle = None

    async def call(self, method: str, *args: Any, retry: bool = True, outcome: Optional[str] = None) -> Any:
        """``scheduler.<method>(*args)``. ``retry=False`` (a commit): if the actor dies after the call
        was sent, answer 503 "outcome unknown" instead of sending it twice; if it does not answer
        within ``timeout_s``, 504 "outcome unknown, GET <outcome>" (the URL to read the outcome)."""
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

        last = ""
        for attempt in range(2):
            sent = False
            try:
                if self._handle is None:
                    self._handle = await asyncio.to_thread(ray.get_actor, self.name, namespace=self.namespace)
                ref = getattr(self._handle, method).remote(*args)
                sent = True
                return _finite(await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.timeout_s))
            except (asyncio.TimeoutError, GetTimeoutError):
                if not retry:  # a commit was sent and may still be applied: say so (retrying the same spec is safe)
                    raise ApiError(504, "outcome_unknown", f"the scheduler did not answer {method} within "
                                   f"{self.timeout_s:g} s; outcome unknown, GET {outcome or '/v1/jobs/{id}'}")
                raise ApiError(503, "scheduler_timeout", f"the scheduler did not answer {method} within {self.timeout_s:g} s")
            except RayTaskError as e:  # the actor method raised: report it without the traceback
                cause = e.cause if getattr(e, "cause", None) is not None else e
                log.error("scheduler.%s raised: %r", method, cause)
                raise ApiError(500, "scheduler_error", f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")
            except (RayActorError, ActorUnavailableError, ValueError) as e:
                self._handle = None
                last = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                if sent and not retry:
                    raise ApiError(503, "scheduler_restarted",
                                   f"the scheduler failed during {method}; the outcome is unknown: check GET /v1/jobs/<job_id>")
                if attempt == 0:
                    await asyncio.sleep(0.5)
        raise ApiError(503, "scheduler_unavailable", f"scheduler {self.namespace}/{self.name} unreachable ({last})")


# ----------------------------------------------------------------------------- the input boundary
_UNITS = (("_usd_per_h", "USD/h"), ("_gbps", "Gbit/s"), ("_gb", "GB"), ("_s", "s"), ("_tokens", "tokens"),
          ("_gpus", "GPUs"), ("_params_b", "B params"))


def _unit(name: str) -> str:
    if name == "slo":
        return " x solo time"
    return next((" " + u for suffix, u in _UNITS if name.endswith(suffix)), "")


def _schema_of(path: list[str]) -> Optional[dict]:
    """The JSON schema of ``JobSpec`` field ``path`` (e.g. ``["measured", "t_roll_s"]``), or None."""
    root = JobSpec.model_json_schema()
    defs = root.get("$defs", {})
    node: Optional[dict] = root
    for part in path:
        if node is None:
            return None
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return None
        opts = [node] + list(node.get("anyOf") or [])
        node = next((o for o in opts if o.get("type") not in (None, "null") or "$ref" in o or "enum" in o), node)
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1])
    return node


def allowed(path: list[str]) -> str:
    """What field ``path`` of a job spec accepts, e.g. ``"a finite number, 0 < t_roll_s <= 604800 s"``."""
    sch = _schema_of(path)
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


class _BodyGuard:
    """ASGI middleware on every ``POST``/``PUT``/``PATCH`` under ``/v1/``: the body must be
    ``application/json`` (or ``application/*+json``), else 415; at most ``max_bytes`` bytes (by
    ``Content-Length`` and by counting a streamed body), else 413. The body is read once here,
    bounded, and handed on unchanged."""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") not in ("POST", "PUT", "PATCH") \
                or not str(scope.get("path", "")).startswith("/v1/"):
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers") or []}
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        media = ctype.split(";", 1)[0].strip().lower()
        if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
            return await JSONResponse(
                {"error": "unsupported_media_type",
                 "detail": f"Content-Type {ctype or '(none)'!s} is not accepted: send the job spec as JSON "
                           "with Content-Type: application/json"}, status_code=415)(scope, receive, send)
        too_big = JSONResponse({"error": "request_too_large",
                                "detail": f"the request body exceeds {self.max_bytes} bytes (max_request_bytes)"},
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

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _field_error(e: dict) -> dict:
    """One pydantic error as ``{field, msg, type}``: the field's dotted path, the message and what
    the field allows; malformed JSON names the body and the position, not an offset as a field."""
    loc = [p for p in e.get("loc", ()) if p != "body"]
    typ = e.get("type", "")
    if typ == "json_invalid":
        pos = loc[0] if loc and isinstance(loc[0], int) else None
        why = (e.get("ctx") or {}).get("error") or e.get("msg", "")
        return {"field": "body", "msg": f"malformed JSON: {why}" + (f" at character {pos}" if pos is not None else ""),
                "type": typ}
    path = [str(p) for p in loc]
    msg = e.get("msg", "")
    if path and typ != "extra_forbidden" and (what := allowed(path)):
        msg = f"{msg} (allowed: {what})"
    elif path and typ == "extra_forbidden":
        parent = _schema_of(path[:-1]) if len(path) > 1 else JobSpec.model_json_schema()
        msg = f"{msg} (unknown field; allowed fields: {', '.join((parent or {}).get('properties') or {})})"
    return {"field": ".".join(path) or "body", "msg": msg, "type": typ}


# ----------------------------------------------------------------------------- the FastAPI app
def _admission_view(d: dict, dry_run: bool) -> dict:
    return {
        "job_id": d.get("job_id"),
        "admitted": bool(d.get("admitted")),
        "dry_run": dry_run,
        "group_id": d.get("group_id"),
        "placement": d.get("placement"),
        "marginal_cost_usd_per_h": d.get("delta_usd_per_h"),
        "predicted_slowdowns": d.get("predicted_slowdowns") or {},
        "explanation": {
            "code": d.get("code", "ok" if d.get("admitted") else "never"),
            "reason": d.get("reason", ""),
            "strategy": d.get("strategy"),
            "candidates": d.get("candidates") or [],
            "pruned": d.get("pruned") or [],
        },
        "latency_ms": d.get("latency_ms"),
    }


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


def create_app(settings: AppSettings, client: Optional[SchedulerClient] = None) -> FastAPI:
    """Build the FastAPI app (one per Serve replica). ``client`` defaults to the named scheduler."""
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
    app.add_middleware(_BodyGuard, max_bytes=settings.max_request_bytes)
    bearer = HTTPBearer(auto_error=False, description="RollMux API token (see `rollmux urls`)")
    err = {"model": ErrorBody}

    def _check(creds: Optional[HTTPAuthorizationCredentials]) -> None:
        if creds is None or creds.scheme.lower() != "bearer":
            raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)")
        if not hmac.compare_digest(_sha256(creds.credentials), settings.token_sha256):
            raise ApiError(401, "unauthorized", "invalid bearer token")

    def need_token(creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        _check(creds)

    def read_access(creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if not settings.open_read_routes:
            _check(creds)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_field_error(e) for e in exc.errors()]
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

    async def _admit(spec: JobSpec, dry_run: bool) -> JSONResponse:
        t0 = time.perf_counter()
        d = await client.call("admit", spec.model_dump(mode="json"), dry_run, retry=dry_run,
                              outcome=f"/v1/jobs/{spec.job_id}")
        view = _admission_view(d, dry_run)
        view["scheduler_call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        if not view["admitted"]:
            code = view["explanation"]["code"]
            if code == "invalid":  # the scheduler's own validation (the API validated first)
                return JSONResponse({"error": "invalid_request", "detail": view["explanation"]["reason"]}, status_code=422)
            kind = "duplicate_job_id" if code == "duplicate" else f"not_admitted:{code}"
            return JSONResponse({"error": kind, "detail": view["explanation"]["reason"], "decision": view}, status_code=409)
        checked = AdmissionView.model_validate(view)  # a 2xx reply is validated against its model
        # a retry of an admitted spec gets the original decision again: 200 (idempotent), not 201
        return JSONResponse(checked.model_dump(mode="json"), status_code=200 if dry_run or d.get("replayed") else 201)

    @app.get("/healthz", response_model=HealthView, responses={503: err}, tags=["ops"])
    async def healthz() -> Any:
        """Liveness of the API and of the GlobalScheduler (503 with a reason if unreachable)."""
        return await client.call("health")

    @app.post(
        "/v1/jobs", status_code=201, response_model=AdmissionView, dependencies=[Depends(need_token)],
        responses={200: {"model": AdmissionView, "description": "a retry of an admitted spec: the original decision"},
                   401: err, 409: err, 413: err, 415: err, 422: err, 503: err, 504: err}, tags=["jobs"],
    )
    async def admit_job(spec: JobSpec) -> Any:
        """Admit a job (RollMux Alg. 1): 201 with its group, placement, marginal cost and predicted
        slowdowns; 200 with the original decision when the same spec is posted again under a live
        id (retries are safe); 409 when it cannot be admitted (the reason says why) or its id is
        live with a different spec; 504 "outcome unknown" when the scheduler did not answer in time
        (read ``GET /v1/jobs/{id}``, or post the same spec again)."""
        return await _admit(spec, dry_run=False)

    @app.post(
        "/v1/jobs:dry-run", response_model=AdmissionView, dependencies=[Depends(need_token)],
        responses={401: err, 409: err, 413: err, 415: err, 422: err, 503: err}, tags=["jobs"],
    )
    async def dry_run_job(spec: JobSpec) -> Any:
        """What-if: the decision ``POST /v1/jobs`` would take now (200 or 409); nothing changes."""
        return await _admit(spec, dry_run=True)

    @app.get("/v1/jobs", response_model=list[JobView], dependencies=[Depends(read_access)], responses={401: err, 503: err}, tags=["jobs"])
    async def list_jobs() -> Any:
        """Every job the scheduler knows: state, group, iterations, slowdown vs SLO."""
        return await client.call("list_jobs")

    @app.get("/v1/jobs/{job_id}", response_model=JobView, dependencies=[Depends(read_access)], responses={401: err, 404: err, 503: err}, tags=["jobs"])
    async def get_job(job_id: str = PathParam(max_length=JOB_ID_MAX_LEN, pattern=JOB_ID_PATTERN)) -> Any:
        """One job: state, iterations done, measured vs predicted phase times (s), slowdown vs SLO."""
        job = await client.call("get_job", job_id)
        if job is None:
            raise ApiError(404, "not_found", f"unknown job_id {job_id!r}")
        return job

    @app.delete("/v1/jobs/{job_id}", response_model=DepartureView, dependencies=[Depends(need_token)], responses={401: err, 404: err, 409: err, 503: err}, tags=["jobs"])
    async def delete_job(job_id: str = PathParam(max_length=JOB_ID_MAX_LEN, pattern=JOB_ID_PATTERN)) -> Any:
        """Departure: the job leaves its group; nodes no remaining member uses are released, an
        empty group dissolves; then departure re-packing may move jobs of small groups into other
        groups when every SLO still holds and the $/h drops (``moves``). 404 for an unknown id,
        409 ``already_ended`` for a job that already finished or failed."""
        out = await client.call("depart", job_id)
        if out is None:
            raise ApiError(404, "not_found", f"unknown job_id {job_id!r}")
        if out.get("already_ended"):
            raise ApiError(409, "already_ended", f"job {job_id!r} is already {out.get('state')}")
        return out

    @app.get("/v1/groups", response_model=list[GroupView], dependencies=[Depends(read_access)], responses={401: err, 503: err}, tags=["groups"])
    async def list_groups() -> Any:
        """Co-execution groups: members, nodes, cost (USD/h), T_cycle, T_load and slack (s)."""
        return await client.call("list_groups")

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
    settings = AppSettings.from_config(cfg, token)
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, proxy_location="HeadOnly")
    opts: dict[str, Any] = {"num_cpus": 0}
    if res := control_plane_resources():
        opts["resources"] = res
    app = RollMuxAPI.options(num_replicas=cfg.num_replicas, max_ongoing_requests=cfg.max_ongoing_requests,
                             ray_actor_options=opts).bind(settings.model_dump())
    serve.run(app, name=cfg.app_name, route_prefix=route_prefix)
    return cfg.base_url
