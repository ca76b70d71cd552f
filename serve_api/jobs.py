"""The jobs and groups routes of the admission API (one ``APIRouter``; :func:`jobs_router`).

``POST /v1/jobs`` / ``POST /v1/jobs:dry-run`` (admission, RollMux Alg. 1), ``GET /v1/jobs``,
``GET /v1/jobs/{job_id}``, ``DELETE /v1/jobs/{job_id}`` (departure), ``GET /v1/groups``,
``GET /healthz``. The status of a refused admission is its code's
(:data:`rollmux.codes.HTTP_STATUS`). Reads are answered from the replica's snapshot copy
(:class:`serve_api.snapshot.SnapshotCache`); writes go through the replica's scheduler client
and wait until the copy holds them (a client reads its own writes on that replica).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from fastapi import APIRouter, Depends, Query
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response

from rollmux.answers import AdmitCall, Unavailable
from rollmux.codes import HTTP_STATUS, Code
from rollmux.models import JOB_ID_MAX_LEN, JOB_ID_PATTERN, JobSpec
from serve_api.client import AdmitBatcher, SchedulerApi
from serve_api.snapshot import SnapshotCache
from serve_api.views import (
    AdmissionView, AppSettings, ApiError, DepartureView, ErrorBody, GroupView, HealthView, JobView, SubmitRequest,
    _finite, admission_view,
)


@dataclass
class AppContext:
    """What a replica's routers share: its settings, scheduler client, snapshot copy, admission
    batcher, the two auth dependencies and the bound on writes in flight."""

    settings: AppSettings
    client: SchedulerApi
    cache: SnapshotCache
    batcher: AdmitBatcher
    need_token: Callable[..., None]
    read_access: Callable[..., None]
    pending_writes: int = 0

    def write_slot(self) -> "_WriteSlot":
        return _WriteSlot(self)


class _WriteSlot:
    """Bounds the writes this replica has in flight: beyond ``max_pending_writes`` -> 429."""

    def __init__(self, ctx: AppContext):
        self.ctx = ctx

    def __enter__(self):
        if self.ctx.pending_writes >= self.ctx.settings.max_pending_writes:
            raise ApiError(429, "overloaded", f"{self.ctx.pending_writes} writes are in flight on this replica "
                           f"(max_pending_writes); retry after the Retry-After seconds", retry_after_s=1)
        self.ctx.pending_writes += 1

    def __exit__(self, *exc):
        self.ctx.pending_writes -= 1


def jobs_router(ctx: AppContext) -> APIRouter:
    """The jobs / groups / health routes of one replica."""
    app = APIRouter()
    client, cache, batcher = ctx.client, ctx.cache, ctx.batcher
    need_token, read_access = ctx.need_token, ctx.read_access
    err = {"model": ErrorBody}

    async def _admit(spec: SubmitRequest, dry_run: bool, queue: bool = False, explain: str = "full") -> JSONResponse:
        t0 = time.perf_counter()
        job = JobSpec.model_validate(spec.model_dump(mode="json", exclude={"queue"}))  # the job, without the request's field
        d = None
        if dry_run and await cache.wait_version(None) and await cache.follow_policy():
            d = cache.what_if(job, queue, explain)  # this replica's snapshot copy answers
        if d is None:
            with ctx.write_slot():
                if dry_run:  # the copy is not ready, or the id is live: the scheduler answers
                    d = await client.admit_batched(job, dry_run, queue, explain)
                else:
                    d = await batcher.admit(AdmitCall(job, False, queue, explain))
                if not dry_run and d.snapshot_version is not None:
                    await cache.wait_version(d.snapshot_version)  # this replica then reads its own write
        view = admission_view(d, dry_run)
        view["scheduler_call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        if not view["admitted"]:
            code = Code(view["explanation"]["code"])
            status = HTTP_STATUS[code]
            if code == Code.INVALID:  # the scheduler's own validation (the API validated first): as the API's 422s
                why = view["explanation"]["reason"]
                return JSONResponse({"error": "invalid_request", "detail": why,
                                     "errors": [{"field": d.field or "body", "msg": why, "type": "value_error"}]},
                                    status_code=status)
            if code == Code.QUEUED:
                return JSONResponse(AdmissionView.model_validate(view).model_dump(mode="json"), status_code=status)
            if code == Code.QUEUE_FULL:
                raise ApiError(status, "queue_full", view["explanation"]["reason"], retry_after_s=30)
            if code == Code.UNAVAILABLE:
                raise ApiError(status, "scheduler_unavailable", view["explanation"]["reason"], retry_after_s=1)
            kind = "duplicate_job_id" if code == Code.DUPLICATE else f"not_admitted:{code}"
            extra = {"would_queue": True} if d.would_queue else {}
            return JSONResponse({"error": kind, "detail": view["explanation"]["reason"], "decision": view, **extra},
                                status_code=status)
        checked = AdmissionView.model_validate(view)  # a 2xx reply is validated against its model
        # a retry of an admitted spec gets the original decision again: 200 (idempotent), not 201
        return JSONResponse(checked.model_dump(mode="json"),
                            status_code=200 if dry_run or d.replayed else HTTP_STATUS[Code.OK])

    @app.get("/healthz", response_model=HealthView, responses={503: err}, tags=["ops"])
    async def healthz() -> Any:
        """Liveness of the API and of the GlobalScheduler (503 with a reason if unreachable)."""
        return (await client.health()).to_dict()

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

    private = {"decision", "spec_sha256"}  # checkpoint-only fields of a record: never answered (JobRecord.public)

    @app.get("/v1/jobs", response_model=list[JobView], response_model_exclude=private, dependencies=[Depends(read_access)], responses={401: err, 429: err, 503: err}, tags=["jobs"])
    async def list_jobs(limit: Optional[int] = Query(default=None, ge=1, le=100_000, description="at most this many"),
                        offset: int = Query(default=0, ge=0, le=10_000_000, description="skip this many first")) -> Any:
        """Every job the scheduler knows (admission order, then the queued jobs in line order):
        state, group, iterations, slowdown vs SLO; queued jobs with ``queue_position`` and
        ``waited_s``. Served from this replica's copy of the published snapshot."""
        if await cache.wait_version(None):
            return Response(cache.jobs_body(limit, offset), media_type="application/json")
        jobs = await client.list_jobs()
        return _finite([r.public() for r in jobs[offset: None if limit is None else offset + limit]])

    @app.get("/v1/jobs/{job_id}", response_model=JobView, response_model_exclude=private, dependencies=[Depends(read_access)], responses={401: err, 429: err, 404: err, 503: err}, tags=["jobs"])
    async def get_job(job_id: str = PathParam(max_length=JOB_ID_MAX_LEN, pattern=JOB_ID_PATTERN)) -> Any:
        """One job: state, iterations done, measured vs predicted phase times (s), slowdown vs SLO
        (a queued job: ``queue_position`` and ``waited_s``)."""
        if await cache.wait_version(None):  # the copy answers, also "unknown" (a write waits until its copy holds it)
            job = cache.job(job_id)
        else:  # no copy yet (or the scheduler unreachable for the follower): ask the scheduler
            rec = await client.get_job(job_id)
            job = None if rec is None else _finite(rec.public())
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
        with ctx.write_slot():
            out = await client.depart_batched(job_id)
            if isinstance(out, Unavailable):
                raise ApiError(503, "scheduler_unavailable", out.reason, retry_after_s=1)
            if out is not None and out.snapshot_version is not None:
                await cache.wait_version(out.snapshot_version)
        if out is None:
            raise ApiError(404, "not_found", f"unknown job_id {job_id!r}")
        if out.already_ended:
            raise ApiError(409, "already_ended", f"job {job_id!r} is already {out.state}")
        return _finite(out.to_dict())

    @app.get("/v1/groups", response_model=list[GroupView], dependencies=[Depends(read_access)], responses={401: err, 429: err, 503: err}, tags=["groups"])
    async def list_groups(limit: Optional[int] = Query(default=None, ge=1, le=100_000, description="at most this many"),
                          offset: int = Query(default=0, ge=0, le=10_000_000, description="skip this many first")) -> Any:
        """Co-execution groups: members, nodes, cost (USD/h), T_cycle, T_load and slack (s).
        Served from this replica's copy of the published snapshot."""
        if await cache.wait_version(None):
            return Response(cache.groups_body(limit, offset), media_type="application/json")
        groups = await client.list_groups()
        return _finite([g.to_dict() for g in groups[offset: None if limit is None else offset + limit]])

    return app
