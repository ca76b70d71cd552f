"""The GlobalScheduler's handles: :class:`SchedulerHandle` (drivers, controllers, the CLI, scripts)
and :class:`AsyncSchedulerHandle` (the HTTP face)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable, Optional

from actors.handles.base import (
    QUERY_TIMEOUT_S, REPORT_TIMEOUT_S, RETRY_PAUSE_S, ActorLost, CallTimeout, Pending, T, _Handle, _translate,
)
from actors.naming import NAMESPACE, SCHEDULER_NAME, get_actor

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle
from rollmux.answers import Admission, AdmitCall, Departure, GroupRecord, SchedulerHealth, SnapshotDelta, Unavailable
from rollmux.messages import AttachTicket, MemberTarget, MembershipPush, ProgressReport, RuntimeEvent, TimelineEntry
from rollmux.models import ClusterSpec, JobSpec
from rollmux.records import JobRecord


class SchedulerHandle(_Handle):
    """The GlobalScheduler for drivers, controllers and operator commands (blocking calls; the
    ``*_nowait`` ones fire and forget)."""

    def __init__(self, actor: Optional[ActorHandle] = None, *, name: Optional[str] = None):
        super().__init__(actor, name=name or (None if actor is not None else SCHEDULER_NAME))

    @classmethod
    def connect(cls, name: Optional[str] = None) -> "SchedulerHandle":
        """Connect this process to Ray and find the running scheduler ``name``. Raises
        :class:`ActorLost` (``missing``) when it does not exist."""
        from actors.naming import ensure_ray

        ensure_ray()
        h = cls(name=name or SCHEDULER_NAME)
        h.actor  # noqa: B018  (looked up now: a missing scheduler is reported here)
        return h

    def admit(self, spec: JobSpec, dry_run: bool = False, queue: bool = False) -> Admission:
        """:meth:`GlobalSchedulerImpl.admit`: the decision."""
        return self._call(lambda a: a.admit.remote(spec, dry_run, queue), timeout_s=None, what="admit")

    def admit_batched_nowait(self, spec: JobSpec, dry_run: bool = False, queue: bool = False,
                             explain: str = "chosen") -> Pending[Admission]:
        """:meth:`GlobalSchedulerImpl.admit_batched` (group commit) without waiting (a benchmark's batch)."""
        return Pending(self.actor.admit_batched.remote(spec, dry_run, queue, explain), "admit_batched")

    def attach(self, job_id: str) -> Optional[AttachTicket]:
        """The job's :class:`AttachTicket` (its group's controller created and told first); None
        for an unknown job."""
        return self._call(lambda a: a.attach.remote(job_id), timeout_s=None, what="attach")

    def get_job(self, job_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> Optional[JobRecord]:
        return self._call(lambda a: a.get_job.remote(job_id), timeout_s=timeout_s, what="get_job")

    def list_jobs(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[JobRecord]:
        return self._call(lambda a: a.list_jobs.remote(), timeout_s=timeout_s, what="list_jobs")

    def list_groups(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[GroupRecord]:
        return self._call(lambda a: a.list_groups.remote(), timeout_s=timeout_s, what="list_groups")

    def depart(self, job_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> Optional[Departure]:
        return self._call(lambda a: a.depart.remote(job_id), timeout_s=timeout_s, what="depart")

    def health(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> SchedulerHealth:
        return self._call(lambda a: a.health.remote(), timeout_s=timeout_s, what="health")

    def cluster_spec(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> ClusterSpec:
        return self._call(lambda a: a.cluster_spec.remote(), timeout_s=timeout_s, what="cluster_spec")

    def group_timeline(self, group_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[TimelineEntry]:
        return self._call(lambda a: a.group_timeline.remote(group_id), timeout_s=timeout_s, what="group_timeline")

    def ensure_controller(self, group_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> str:
        """The group's GroupController, created if needed (an operator's or a test's query; drivers
        use :meth:`attach`): its actor name. Raises KeyError for a group without an active job."""
        return self._call(lambda a: a.ensure_controller.remote(group_id), timeout_s=timeout_s, what="ensure_controller")

    def group_members(self, group_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[MemberTarget]:
        """The group's active members in the planned round-robin order (an operator's query)."""
        return self._call(lambda a: a.group_members.remote(group_id), timeout_s=timeout_s, what="group_members")

    def report(self, job_id: str, message: RuntimeEvent | ProgressReport,
               timeout_s: Optional[float] = REPORT_TIMEOUT_S) -> Optional[JobRecord]:
        """Report ``message`` and wait for the job's record (a driver's final report)."""
        return self._call(lambda a: a.report.remote(job_id, message), timeout_s=timeout_s, what="report")

    def report_nowait(self, job_id: str, message: RuntimeEvent | ProgressReport) -> Optional[Pending[Optional[JobRecord]]]:
        """Report ``message`` without waiting (soft state: a report that cannot be sent is logged)."""
        return self._send(lambda a: a.report.remote(job_id, message), what=f"report of {job_id}")

    def keep_timeline_nowait(self, group_id: str, records: list[TimelineEntry]) -> Optional[Pending[bool]]:
        """Hand a dissolved group's timeline to the scheduler before its controller exits
        (awaitable; None when the scheduler cannot be reached)."""
        return self._send(lambda a: a.keep_timeline.remote(group_id, records), what=f"timeline of {group_id}")

    def membership(self, group_id: str) -> Pending[MembershipPush]:
        """The group's target membership, as a push (a restarted controller pulls it; awaitable)."""
        return Pending(self.actor.membership.remote(group_id), "membership")


class AsyncSchedulerHandle(_Handle):
    """The GlobalScheduler for the HTTP face: every call is awaited with ``timeout_s``; a lost
    scheduler is looked up again once (after a short pause) and the call resent, except a
    *commit* (``retry=False``: an admission or a departure), which is never sent twice.

    Raises :class:`CallTimeout` (``outcome_unknown`` set for a commit), :class:`ActorLost`
    (``outcome_unknown`` set for a commit that was sent) and the scheduler's own exception."""

    def __init__(self, name: Optional[str] = None, timeout_s: float = 30.0, actor: Optional[ActorHandle] = None):
        super().__init__(actor, name=name or SCHEDULER_NAME)
        self.timeout_s = timeout_s

    @property
    def namespace(self) -> str:
        return NAMESPACE

    async def _acall(self, submit: Callable[[ActorHandle], ObjectRef[T]], what: str, retry: bool = True) -> T:
        last: Optional[BaseException] = None
        for attempt in range(2):
            sent = False
            try:
                if self._actor is None:
                    self._actor = await asyncio.to_thread(get_actor, self.name)
                ref = submit(self._actor)
                sent = True
                return await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.timeout_s)
            except BaseException as e:
                err = _translate(e) if not isinstance(e, asyncio.TimeoutError) else CallTimeout(what)
                if isinstance(err, (CallTimeout, asyncio.TimeoutError)):
                    t = CallTimeout(f"the scheduler did not answer {what} within {self.timeout_s:g} s")
                    t.outcome_unknown = not retry  # type: ignore[attr-defined]
                    raise t from None
                if isinstance(e, ValueError) or isinstance(err, ActorLost):
                    self._actor = None
                    lost = err if isinstance(err, ActorLost) else ActorLost(f"ValueError: {e}", missing=True)
                    lost.outcome_unknown = sent and not retry  # type: ignore[attr-defined]
                    if lost.outcome_unknown:  # type: ignore[attr-defined]
                        raise lost from None
                    last = lost
                    if attempt == 0:
                        await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                raise err from None
        out = ActorLost(f"scheduler {NAMESPACE}/{self.name} unreachable ({str(last).splitlines()[0] if last else ''})")
        out.outcome_unknown = False  # type: ignore[attr-defined]
        raise out

    async def health(self) -> SchedulerHealth:
        return await self._acall(lambda a: a.health.remote(), "health")

    async def admit_batched(self, spec: JobSpec, dry_run: bool, queue: bool, explain: str) -> Admission:
        """A dry run (resent if the scheduler restarted: it changes nothing)."""
        return await self._acall(lambda a: a.admit_batched.remote(spec, dry_run, queue, explain), "admit_batched")

    async def admit_many(self, calls: list[AdmitCall]) -> list[Admission]:
        """A batch of admissions (a commit: never resent)."""
        return await self._acall(lambda a: a.admit_many.remote(calls), "admit_many", retry=False)

    async def depart_batched(self, job_id: str) -> Optional[Departure | Unavailable]:
        """A departure (a commit: never resent)."""
        return await self._acall(lambda a: a.depart_batched.remote(job_id), "depart_batched", retry=False)

    async def list_jobs(self) -> list[JobRecord]:
        return await self._acall(lambda a: a.list_jobs.remote(), "list_jobs")

    async def get_job(self, job_id: str) -> Optional[JobRecord]:
        return await self._acall(lambda a: a.get_job.remote(job_id), "get_job")

    async def list_groups(self) -> list[GroupRecord]:
        return await self._acall(lambda a: a.list_groups.remote(), "list_groups")

    async def snapshot_since(self, epoch: Optional[str], version: int, wait_s: float, policy: bool) -> SnapshotDelta:
        return await self._acall(lambda a: a.snapshot_since.remote(epoch, version, wait_s, policy), "snapshot_since")
