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
per commit; :meth:`actors.global_scheduler.GlobalSchedulerImpl.snapshot_since`, a long poll) and
answers ``GET /v1/jobs`` / ``/v1/groups`` and dry-runs from it, never queueing behind the scheduler's writes; a
write waits until the replica's copy holds it, so a client reads its own writes. Writes use the
scheduler's group commit (``admit_batched`` / ``depart_batched``: one checkpoint write per batch).
Overload is bounded: each replica holds at most ``max_pending_writes`` writes in flight (more ->
429 with ``Retry-After``), and Serve's ``max_queued_requests`` bounds the requests queued at the
proxy (more -> 503 with ``Retry-After``, Serve's ``BackpressureConfig``).

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
from fastapi import Query
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from starlette.exceptions import HTTPException

from actors.naming import NAMESPACE, SCHEDULER_NAME, control_plane_resources
from rollmux.config import ServeConfig
from rollmux.models import JOB_ID_MAX_LEN, JOB_ID_PATTERN, JobSpec
from rollmux.records import JobRecord, MoveRecord, queued_records

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
    queued: bool = Field(default=False, description="held by the admission queue (202)")
    queue_position: Optional[int] = Field(default=None, description="place in the admission queue, 1 = next")


class SubmitRequest(JobSpec):
    """``POST /v1/jobs`` body: a :class:`rollmux.models.JobSpec` plus ``queue``."""

    queue: bool = Field(default=False, description="on a bounded cluster, hold the job in the admission queue "
                        "when it does not fit now (202) instead of refusing it (409 retry_later)")


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
    max_pending_writes: int = Field(default=256, ge=1, le=100_000)

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
            max_pending_writes=cfg.max_pending_writes,
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
        headers = ({"Retry-After": str(self.extra.pop("retry_after_s", 5))} if self.status in (429, 503)
                   else ({"WWW-Authenticate": "Bearer"} if self.status == 401 else None))
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


class SnapshotCache:
    """A replica's copy of the scheduler's published snapshot (jobs, groups, admission queue).

    A background task long-polls ``snapshot_since(epoch, version)`` and applies each reply (a
    delta, or everything after a scheduler restart); reads are answered from the copy, so they
    never queue behind the scheduler's writes. Each job's JSON is encoded once per change, so a
    list costs a join, not a re-encoding. ``ready`` is False until the first snapshot arrived or
    after the scheduler stayed unreachable (readers then fall back to asking the scheduler).
    """

    LONG_POLL_S = 5.0

    def __init__(self, client: "SchedulerClient"):
        self.client = client
        self.epoch: Optional[str] = None
        self.version = -1
        self.jobs: dict[str, dict] = {}
        self._json: dict[str, bytes] = {}
        self.groups: dict[str, dict] = {}
        self._groups_json: Optional[bytes] = None
        self.queue: list[dict] = []
        # the policy's table (dry-runs): the raw group snapshots, and a copy of the policy built on the
        # first dry-run, then brought up to date lazily (only the groups changed since the last one)
        self.cluster: Optional[dict] = None
        self._policy_header: Optional[dict] = None
        self._policy_groups: dict[str, dict] = {}
        self._policy = None
        self._policy_pending: dict[str, Optional[dict]] = {}
        self.want_policy = False  # set by the first dry-run: the follower then resyncs with the policy table
        self.has_policy = False
        self.ready = False
        self._changed = asyncio.Event()
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        """Start following (idempotent; on the first request, inside the replica's event loop; a
        test client running each request on a new loop gets a follower per loop)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._changed = asyncio.Event()
            self.ready = False
            self._task = loop.create_task(self._follow())

    async def _follow(self) -> None:
        import json

        while True:
            try:
                ask = self.want_policy
                resync = ask and not self.has_policy  # everything once, the policy table with it
                d = await self.client.call("snapshot_since", None if resync else self.epoch, self.version,
                                           self.LONG_POLL_S if self.ready and not resync else 0.0, ask)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler restarts: readers fall back, we try again
                log.warning("snapshot follow failed: %s", e)
                self.ready = False
                await asyncio.sleep(0.5)
                continue
            if d.get("full"):
                self.jobs, self._json, self.groups = {}, {}, {}
                self.cluster = d.get("cluster")
                self._policy_groups, self._policy, self._policy_pending = {}, None, {}
                self.has_policy = ask and "policy" in d
            pol = d.get("policy") or {}
            if pol.get("header") is not None:
                self._policy_header = pol["header"]
            for gid, snap in (pol.get("groups") or {}).items():
                if snap is None:
                    self._policy_groups.pop(gid, None)
                else:
                    self._policy_groups[gid] = snap
                if self._policy is not None:
                    self._policy_pending[gid] = snap
            for jid, view in d["jobs"].items():
                if view is None:
                    self.jobs.pop(jid, None)
                    self._json.pop(jid, None)
                else:
                    self.jobs.pop(jid, None)  # a re-admitted id moves to the end (admission order)
                    self.jobs[jid] = view
                    self._json[jid] = json.dumps(view, separators=(",", ":")).encode()
            if d["groups"] or d.get("full"):
                for gid, view in d["groups"].items():
                    if view is None:
                        self.groups.pop(gid, None)
                    else:
                        self.groups[gid] = view
                self._groups_json = None
            if d.get("queue") is not None:
                self.queue = d["queue"]
            self.epoch, self.version, self.ready = d["epoch"], d["version"], True
            ev, self._changed = self._changed, asyncio.Event()
            ev.set()

    async def wait_version(self, version: Optional[int], timeout_s: float = 2.0) -> bool:
        """Wait (bounded) until the copy holds ``version``; True when it does."""
        self.start()
        return await self._wait_until(lambda: self.ready and (version is None or self.version >= version), timeout_s)

    async def _wait_until(self, done, timeout_s: float) -> bool:
        """Wait (bounded by ``timeout_s`` seconds) until ``done()`` holds, re-checking at every
        change the follower applies; True when it holds."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return False
        return True

    def _policy_now(self):
        """The copy of the policy's table at this copy's version (built once, then updated with
        the groups changed since the last call; :meth:`rollmux.admission.InterGroupScheduler.load_groups`)."""
        from rollmux.admission import InterGroupScheduler
        from rollmux.models import ClusterSpec

        if self._policy is None:
            self._policy = InterGroupScheduler.restore(
                ClusterSpec.model_validate(self.cluster), {**self._policy_header, "groups": list(self._policy_groups.values())})
            self._policy_pending = {}
        elif self._policy_pending:
            self._policy.load_groups(self._policy_header, self._policy_pending)
            self._policy_pending = {}
        return self._policy

    async def follow_policy(self, timeout_s: float = 2.0) -> bool:
        """Follow the policy table too (the first dry-run asks): the follower's long poll is
        restarted as one full read with the table; waits (bounded) until the copy holds it."""
        if not self.has_policy and not self.want_policy:
            self.want_policy = True
            if self._task is not None and not self._task.done():
                self._task.cancel()  # only ever cancelled while awaiting a reply, never mid-apply
            self._task = asyncio.get_running_loop().create_task(self._follow())
        return await self._wait_until(lambda: self.has_policy, timeout_s)

    def what_if(self, spec: JobSpec, queue: bool, explain: str) -> Optional[dict]:
        """The dry-run answer from this copy (:func:`rollmux.admission_queue.what_if`, the function
        the scheduler answers its own dry-runs with), with ``snapshot_version``; None when the
        scheduler must answer: the copy is not ready, or the job id is admitted, running or queued
        (a replay or a duplicate, decided from the scheduler's records)."""
        from rollmux.admission_queue import what_if
        from rollmux.records import JobState

        if not self.has_policy:
            return None
        if not self.ready or self.cluster is None or self._policy_header is None:
            return None
        view = self.jobs.get(spec.job_id)
        if view is not None and JobState(view["state"]).is_active():
            return None
        if any(q["job_id"] == spec.job_id for q in self.queue):
            return None
        pol = self._policy_now()
        out = what_if(pol, spec, [int(q.get("gpus", 0)) for q in self.queue], backfill=pol.config.queue_backfill,
                      queue=queue, explain=explain)
        out["snapshot_version"] = self.version
        return _finite(out)

    def jobs_body(self, limit: Optional[int], offset: int) -> bytes:
        """``GET /v1/jobs`` from the copy: records in admission order, then the queued jobs."""
        import itertools

        parts = self._json.values()
        if self.queue:
            import json

            parts = itertools.chain(parts, [json.dumps(v, separators=(",", ":")).encode()
                                            for v in queued_records(self.queue, time.time())])
        # a page costs its own length, not the number of stored jobs (dict views are not sliceable)
        page = itertools.islice(parts, offset, None if limit is None else offset + limit)
        return b"[" + b",".join(page) + b"]"

    def job(self, job_id: str) -> Optional[dict]:
        if job_id in self.jobs:
            return self.jobs[job_id]
        for v in queued_records(self.queue, time.time()) if any(q["job_id"] == job_id for q in self.queue) else ():
            if v["job_id"] == job_id:
                return v
        return None

    def groups_body(self, limit: Optional[int], offset: int) -> bytes:
        import json

        if self._groups_json is None or limit is not None or offset:
            views = list(self.groups.values())[offset: None if limit is None else offset + limit]
            body = json.dumps(_finite(views), separators=(",", ":")).encode()
            if limit is None and not offset:
                self._groups_json = body
            return body
        return self._groups_json


class _AdmitBatcher:
    """Sends a replica's admissions to the scheduler in batches (``admit_many``: one actor call
    for many requests, decided one at a time in arrival order). A request is sent at once while
    fewer than ``max_inflight`` batches are in flight, else it joins the next batch (at most
    ``max_batch``), so a lone request waits for nothing and under load the actor calls per
    admission fall with the load. A failed call fails every request of its batch alike (a commit
    is never resent: 503 / 504 "outcome unknown", see :class:`SchedulerClient`)."""

    def __init__(self, client: "SchedulerClient", max_inflight: int = 2, max_batch: int = 64):
        self.client, self.max_inflight, self.max_batch = client, max_inflight, max_batch
        self._queue: list[tuple[list, asyncio.Future]] = []
        self._inflight = 0

    async def admit(self, args: list) -> dict:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((args, fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        while self._queue and self._inflight < self.max_inflight:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
            self._inflight += 1
            asyncio.get_running_loop().create_task(self._send(batch))

    async def _send(self, batch: list) -> None:
        try:
            outs = await self.client.call("admit_many", [a for a, _ in batch], retry=False,
                                          outcome="/v1/jobs/{job_id}")
            for (_, f), out in zip(batch, outs):
                if not f.done():
                    f.set_result(out)
        except BaseException as e:  # noqa: BLE001 - handed to every waiting request
            for args, f in batch:
                if f.done():
                    continue
                if isinstance(e, ApiError):  # each request names its own job's URL to read the outcome
                    f.set_exception(ApiError(e.status, e.kind, e.detail.replace("{job_id}", str(args[0].get("job_id"))),
                                             **e.extra))
                else:
                    f.set_exception(e)
        finally:
            self._inflight -= 1
            self._kick()


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
            **({"candidates_listed": d["candidates_listed"], "pruned_groups": d.get("pruned_groups")}
               if d.get("candidates_listed") else {}),
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

    cache = SnapshotCache(client)
    writes = {"pending": 0}
    batcher = _AdmitBatcher(client)

    class _WriteSlot:
        """Bounds the writes this replica has in flight: beyond ``max_pending_writes`` -> 429."""

        def __enter__(self):
            if writes["pending"] >= settings.max_pending_writes:
                raise ApiError(429, "overloaded", f"{writes['pending']} writes are in flight on this replica "
                               f"(max_pending_writes); retry after the Retry-After seconds", retry_after_s=1)
            writes["pending"] += 1

        def __exit__(self, *exc):
            writes["pending"] -= 1

    async def _admit(spec: JobSpec, dry_run: bool, queue: bool = False, explain: str = "full") -> JSONResponse:
        t0 = time.perf_counter()
        body = spec.model_dump(mode="json", exclude={"queue"})
        d = None
        if dry_run and await cache.wait_version(None) and await cache.follow_policy():
            d = cache.what_if(JobSpec.model_validate(body), queue, explain)  # this replica's snapshot copy answers
        if d is None:
            with _WriteSlot():
                if dry_run:  # the copy is not ready, or the id is live: the scheduler answers
                    d = await client.call("admit_batched", body, dry_run, queue, explain, retry=True)
                else:
                    d = await batcher.admit([body, False, queue, explain])
                if not dry_run and d.get("snapshot_version") is not None:
                    await cache.wait_version(d["snapshot_version"])  # this replica then reads its own write
        view = _admission_view(d, dry_run)
        view["queued"], view["queue_position"] = bool(d.get("queued")), d.get("queue_position")
        view["scheduler_call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        if not view["admitted"]:
            code = view["explanation"]["code"]
            if code == "invalid":  # the scheduler's own validation (the API validated first)
                return JSONResponse({"error": "invalid_request", "detail": view["explanation"]["reason"]}, status_code=422)
            if code == "queued":
                return JSONResponse(AdmissionView.model_validate(view).model_dump(mode="json"), status_code=202)
            if code == "queue_full":
                raise ApiError(429, "queue_full", view["explanation"]["reason"], retry_after_s=30)
            if code == "unavailable":
                raise ApiError(503, "scheduler_unavailable", view["explanation"]["reason"], retry_after_s=1)
            kind = "duplicate_job_id" if code == "duplicate" else f"not_admitted:{code}"
            extra = {"would_queue": True} if d.get("would_queue") else {}
            return JSONResponse({"error": kind, "detail": view["explanation"]["reason"], "decision": view, **extra},
                                status_code=409)
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
                   202: {"model": AdmissionView, "description": "held by the admission queue (\"queue\": true)"},
                   401: err, 409: err, 413: err, 415: err, 422: err, 429: err, 503: err, 504: err}, tags=["jobs"],
    )
    async def admit_job(spec: SubmitRequest, explain: str = Query(
            default="chosen", pattern="^(chosen|full)$",
            description="candidates listed in an admission's explanation: the chosen one, or every one considered")) -> Any:
        """Admit a job (RollMux Alg. 1): 201 with its group, placement, marginal cost and predicted
        slowdowns; 200 with the original decision when the same spec is posted again under a live
        id (retries are safe); 409 when it cannot be admitted (the reason says why) or its id is
        live with a different spec; 504 "outcome unknown" when the scheduler did not answer in time
        (read ``GET /v1/jobs/{id}``, or post the same spec again). With ``"queue": true`` a job
        that does not fit now is queued: 202 with ``queue_position`` (admitted after a departure
        frees room); 429 when the queue or this replica is full. The explanation lists the chosen
        candidate (``?explain=full``: every one considered)."""
        return await _admit(spec, dry_run=False, queue=spec.queue, explain=explain)

    @app.post(
        "/v1/jobs:dry-run", response_model=AdmissionView, dependencies=[Depends(need_token)],
        responses={401: err, 409: err, 413: err, 415: err, 422: err, 429: err, 503: err}, tags=["jobs"],
    )
    async def dry_run_job(spec: SubmitRequest, explain: str = Query(
            default="full", pattern="^(chosen|full)$",
            description="candidates listed: every one considered (default), or the chosen one")) -> Any:
        """What-if: the decision ``POST /v1/jobs`` would take now (200 or 409, with ``would_queue``
        when ``"queue": true`` would hold it); nothing changes."""
        return await _admit(spec, dry_run=True, queue=spec.queue, explain=explain)

    @app.get("/v1/jobs", response_model=list[JobView], dependencies=[Depends(read_access)], responses={401: err, 503: err}, tags=["jobs"])
    async def list_jobs(limit: Optional[int] = Query(default=None, ge=1, le=100_000, description="at most this many"),
                        offset: int = Query(default=0, ge=0, le=10_000_000, description="skip this many first")) -> Any:
        """Every job the scheduler knows (admission order, then the queued jobs in line order):
        state, group, iterations, slowdown vs SLO; queued jobs with ``queue_position`` and
        ``waited_s``. Served from this replica's copy of the published snapshot."""
        if await cache.wait_version(None):
            return Response(cache.jobs_body(limit, offset), media_type="application/json")
        jobs = await client.call("list_jobs")
        return jobs[offset: None if limit is None else offset + limit]

    @app.get("/v1/jobs/{job_id}", response_model=JobView, dependencies=[Depends(read_access)], responses={401: err, 404: err, 503: err}, tags=["jobs"])
    async def get_job(job_id: str = PathParam(max_length=JOB_ID_MAX_LEN, pattern=JOB_ID_PATTERN)) -> Any:
        """One job: state, iterations done, measured vs predicted phase times (s), slowdown vs SLO
        (a queued job: ``queue_position`` and ``waited_s``)."""
        job = cache.job(job_id) if await cache.wait_version(None) else None
        if job is None:  # not in this replica's copy (yet): ask the scheduler
            job = await client.call("get_job", job_id)
        if job is None:
            raise ApiError(404, "not_found", f"unknown job_id {job_id!r}")
        return job

    @app.delete("/v1/jobs/{job_id}", response_model=DepartureView, dependencies=[Depends(need_token)], responses={401: err, 404: err, 409: err, 503: err}, tags=["jobs"])
    async def delete_job(job_id: str = PathParam(max_length=JOB_ID_MAX_LEN, pattern=JOB_ID_PATTERN)) -> Any:
        """Departure: the job leaves its group; nodes no remaining member uses are released, an
        empty group dissolves; then departure re-packing may move jobs of small groups into other
        groups when every SLO still holds and the $/h drops (``moves``). 404 for an unknown id,
        409 ``already_ended`` for a job that already finished or failed. Queued jobs that fit into
        the freed room are admitted (``admitted_from_queue``); a queued job is cancelled."""
        with _WriteSlot():
            out = await client.call("depart_batched", job_id)
            if out is not None and out.get("unavailable"):
                raise ApiError(503, "scheduler_unavailable", out["unavailable"], retry_after_s=1)
            if out is not None and out.get("snapshot_version") is not None:
                await cache.wait_version(out.pop("snapshot_version"))
        if out is None:
            raise ApiError(404, "not_found", f"unknown job_id {job_id!r}")
        if out.get("already_ended"):
            raise ApiError(409, "already_ended", f"job {job_id!r} is already {out.get('state')}")
        return out

    @app.get("/v1/groups", response_model=list[GroupView], dependencies=[Depends(read_access)], responses={401: err, 503: err}, tags=["groups"])
    async def list_groups(limit: Optional[int] = Query(default=None, ge=1, le=100_000, description="at most this many"),
                          offset: int = Query(default=0, ge=0, le=10_000_000, description="skip this many first")) -> Any:
        """Co-execution groups: members, nodes, cost (USD/h), T_cycle, T_load and slack (s).
        Served from this replica's copy of the published snapshot."""
        if await cache.wait_version(None):
            return Response(cache.groups_body(limit, offset), media_type="application/json")
        groups = await client.call("list_groups")
        return groups[offset: None if limit is None else offset + limit]

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
