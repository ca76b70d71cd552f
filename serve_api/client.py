"""The HTTP face's scheduler client: typed calls to the GlobalScheduler, answered as HTTP errors.

:class:`SchedulerClient` is the replica's one way to the scheduler: each method is one
:class:`actors.handles.AsyncSchedulerHandle` call (timeouts, the one re-lookup after a restart,
never resending a commit: all there); its errors become :class:`serve_api.views.ApiError` (503
unreachable / timed out, 504 "outcome unknown" for a commit not answered in time, 500 when the
actor raised: no traceback). Its answers are the scheduler's typed answers (:mod:`rollmux.answers`,
:class:`rollmux.records.JobRecord`); the routes turn them into JSON (:mod:`serve_api.views`).
:class:`SchedulerApi` is the interface the app uses (tests give an in-process one).
:class:`AdmitBatcher` sends a replica's admissions in batches (``admit_many``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional, Protocol

from actors.handles import ActorLost, AsyncSchedulerHandle, CallTimeout
from rollmux.answers import Admission, AdmitCall, Departure, GroupRecord, SchedulerHealth, SnapshotDelta, Unavailable
from rollmux.models import JobSpec
from rollmux.records import JobRecord
from serve_api.views import ApiError

log = logging.getLogger("rollmux.serve")


class SchedulerApi(Protocol):
    """What the HTTP app calls on the GlobalScheduler (typed answers)."""

    async def health(self) -> SchedulerHealth: ...

    async def admit_batched(self, spec: JobSpec, dry_run: bool, queue: bool, explain: str) -> Admission: ...

    async def admit_many(self, calls: list[AdmitCall]) -> list[Admission]: ...

    async def depart_batched(self, job_id: str) -> Optional[Departure | Unavailable]: ...

    async def list_jobs(self) -> list[JobRecord]: ...

    async def get_job(self, job_id: str) -> Optional[JobRecord]: ...

    async def list_groups(self) -> list[GroupRecord]: ...

    async def snapshot_since(self, epoch: Optional[str], version: int, wait_s: float, policy: bool) -> SnapshotDelta: ...


class SchedulerClient:
    """Calls the named ``GlobalScheduler`` actor; re-resolves the handle after a restart.

    Raises :class:`ApiError` 503 when the scheduler stays unreachable or a call exceeds
    ``timeout_s``; 504 "outcome unknown, GET <url>" when a commit (an admission batch, a
    departure) was not answered in time; 503 "outcome unknown" when the scheduler died during a
    commit (it is never sent twice); 500 (JSON, no traceback) when the actor raised.
    ``actor``: a Ray actor handle to use (tests), else the scheduler is looked up by name.
    """

    def __init__(self, name: Optional[str] = None, timeout_s: float = 30.0, actor: Any = None):
        self.handle = AsyncSchedulerHandle(name, timeout_s, actor=actor)
        self.name, self.namespace, self.timeout_s = self.handle.name, self.handle.namespace, timeout_s

    async def _run(self, what: str, call, outcome: Optional[str] = None) -> Any:
        try:
            return await call
        except CallTimeout as e:
            if getattr(e, "outcome_unknown", False):  # a commit was sent and may still be applied
                raise ApiError(504, "outcome_unknown", f"the scheduler did not answer {what} within "
                               f"{self.timeout_s:g} s; outcome unknown, GET {outcome or '/v1/jobs/{id}'}")
            raise ApiError(503, "scheduler_timeout", f"the scheduler did not answer {what} within {self.timeout_s:g} s")
        except ActorLost as e:
            if getattr(e, "outcome_unknown", False):
                raise ApiError(503, "scheduler_restarted",
                               f"the scheduler failed during {what}; the outcome is unknown: check GET /v1/jobs/<job_id>")
            raise ApiError(503, "scheduler_unavailable", str(e))
        except ApiError:
            raise
        except Exception as cause:  # the actor method raised: report it without the traceback
            log.error("scheduler.%s raised: %r", what, cause)
            raise ApiError(500, "scheduler_error", f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")

    async def health(self) -> SchedulerHealth:
        return await self._run("health", self.handle.health())

    async def admit_batched(self, spec: JobSpec, dry_run: bool, queue: bool, explain: str) -> Admission:
        return await self._run("admit_batched", self.handle.admit_batched(spec, dry_run, queue, explain))

    async def admit_many(self, calls: list[AdmitCall]) -> list[Admission]:
        return await self._run("admit_many", self.handle.admit_many(calls), outcome="/v1/jobs/{job_id}")

    async def depart_batched(self, job_id: str) -> Optional[Departure | Unavailable]:
        return await self._run("depart_batched", self.handle.depart_batched(job_id))

    async def list_jobs(self) -> list[JobRecord]:
        return await self._run("list_jobs", self.handle.list_jobs())

    async def get_job(self, job_id: str) -> Optional[JobRecord]:
        return await self._run("get_job", self.handle.get_job(job_id))

    async def list_groups(self) -> list[GroupRecord]:
        return await self._run("list_groups", self.handle.list_groups())

    async def snapshot_since(self, epoch: Optional[str], version: int, wait_s: float, policy: bool) -> SnapshotDelta:
        return await self._run("snapshot_since", self.handle.snapshot_since(epoch, version, wait_s, policy))


class AdmitBatcher:
    """Sends a replica's admissions to the scheduler in batches (``admit_many``: one actor call
    for many requests, decided one at a time in arrival order). A request is sent at once while
    fewer than ``max_inflight`` batches are in flight, else it joins the next batch (at most
    ``max_batch``), so a lone request waits for nothing and under load the actor calls per
    admission fall with the load. A failed call fails every request of its batch alike (a commit
    is never resent: 503 / 504 "outcome unknown", see :class:`SchedulerClient`)."""

    def __init__(self, client: "SchedulerClient", max_inflight: int = 2, max_batch: int = 64):
        self.client, self.max_inflight, self.max_batch = client, max_inflight, max_batch
        self._queue: list[tuple[AdmitCall, asyncio.Future]] = []
        self._inflight = 0

    async def admit(self, call: AdmitCall) -> Admission:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((call, fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        while self._queue and self._inflight < self.max_inflight:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
            self._inflight += 1
            asyncio.get_running_loop().create_task(self._send(batch))

    async def _send(self, batch: list) -> None:
        try:
            outs = await self.client.admit_many([a for a, _ in batch])
            for (_, f), out in zip(batch, outs):
                if not f.done():
                    f.set_result(out)
        except BaseException as e:  # noqa: BLE001 - handed to every waiting request
            for call, f in batch:
                if f.done():
                    continue
                if isinstance(e, ApiError):  # each request names its own job's URL to read the outcome
                    f.set_exception(ApiError(e.status, e.kind, e.detail.replace("{job_id}", str(call.spec.job_id)),
                                             **e.extra))
                else:
                    f.set_exception(e)
        finally:
            self._inflight -= 1
            self._kick()
