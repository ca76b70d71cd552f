"""The runtime's handles: :class:`ControllerHandle` (a group's GroupController) and
:class:`WorkerHandle` (a node's RolloutWorker / TrainWorker)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Optional

from actors.handles.base import (
    HEARTBEAT_TIMEOUT_S, PLACE_TIMEOUT_S, QUERY_TIMEOUT_S, RELEASE_TIMEOUT_S, Pending, _Handle,
)
from actors.naming import controller_name, worker_name

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from rollmux.sync_plan import SyncPlan
from rollmux.messages import (
    AbortOutcome, AttachReply, ControllerStatus, EndpointCaps, EndpointOpened, Grant, HostedJob, JobHosting,
    MembershipAck, MembershipPush, MovedState, PendingWeights, PhaseCall, PhaseOutcome, PhaseRecord, RolloutProgress,
    SyncAck, SyncSignal, TailDecision, TimelineEntry, WorkerPlace,
)


class ControllerHandle(_Handle):
    """A group's GroupController (by actor name; looked up again after it died)."""

    @classmethod
    def of_group(cls, group_id: str, scheduler_name: Optional[str] = None) -> "ControllerHandle":
        return cls(name=controller_name(group_id, scheduler_name))

    # drivers
    def attach(self, job_id: str, *, has_sync: Optional[bool] = None, driver: Optional[str] = None) -> AttachReply:
        return self._call(lambda a: a.attach.remote(job_id, has_sync=has_sync, driver=driver), timeout_s=None,
                          what="attach")

    def configure_job_nowait(self, job_id: str, *, has_sync: bool) -> Pending[bool]:
        return Pending(self.actor.configure_job.remote(job_id, has_sync=has_sync), "configure_job")

    def acquire(self, job_id: str, phase: str, *, iteration: int, has_sync: bool) -> Grant:
        """Block until the controller grants ``phase`` (it bounds the wait itself)."""
        return self._call(lambda a: a.acquire.remote(job_id, phase, iteration=iteration, has_sync=has_sync),
                          timeout_s=None, what="acquire")

    def heartbeat(self, job_id: str, driver: Optional[str]) -> bool:
        return self._call(lambda a: a.heartbeat.remote(job_id, driver), timeout_s=HEARTBEAT_TIMEOUT_S, what="heartbeat")

    def abort_phase(self, job_id: str, phase: str, reason: str) -> AbortOutcome:
        return AbortOutcome(self._call(lambda a: a.abort_phase.remote(job_id, phase, reason), timeout_s=None,
                                       what="abort_phase"))

    def timeline(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[TimelineEntry]:
        return self._call(lambda a: a.get_timeline.remote(), timeout_s=timeout_s, what="get_timeline")

    async def timeline_async(self, timeout_s: float) -> list[TimelineEntry]:
        return await asyncio.wait_for(Pending(self.actor.get_timeline.remote(), "get_timeline"), timeout=timeout_s)

    def status(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> ControllerStatus:
        return self._call(lambda a: a.status.remote(), timeout_s=timeout_s, what="status")

    # the releaser (the leader worker)
    def phase_started_nowait(self, job_id: str, phase: str) -> Optional[Pending[bool]]:
        return self._send(lambda a: a.phase_started.remote(job_id, phase), what="phase_started")

    def release(self, grant: Grant, record: PhaseRecord) -> TimelineEntry:
        """Give ``grant`` back with what the phase did (-> the timeline row it became); a dead
        controller is looked up again once (a restarted one records the release and changes nothing)."""
        return self._call(lambda a: a.release.remote(grant, record), timeout_s=RELEASE_TIMEOUT_S, retries=1,
                          what="release")

    def progress(self, report: RolloutProgress, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> Optional[TailDecision]:
        """Long-tail progress of a running rollout and the controller's decision (a driver-side
        job's driver reads it: ``actors.driver.permits``)."""
        return self._call(lambda a: a.progress.remote(report), timeout_s=timeout_s, what="progress")

    def progress_nowait(self, report: RolloutProgress) -> Optional[Pending[Optional[TailDecision]]]:
        """Long-tail progress of a running rollout (its :class:`TailDecision` answer is not read)."""
        return self._send(lambda a: a.progress.remote(report), what="progress")

    # the scheduler
    def push(self, push: MembershipPush) -> Pending[MembershipAck]:
        """Send the group's target membership (never awaited by the scheduler: it tracks the
        acknowledgement with :meth:`Pending.done`)."""
        return Pending(self.actor.sync_members.remote(push), "sync_members")


# ----------------------------------------------------------------------------- workers
class WorkerHandle(_Handle):
    """A node's RolloutWorker / TrainWorker (by actor name; ``actor``: a handle already held)."""

    @classmethod
    def of_node(cls, node: str, actor: Optional[ActorHandle] = None) -> "WorkerHandle":
        return cls(actor, name=worker_name(node))

    # drivers
    def where(self, timeout_s: Optional[float] = PLACE_TIMEOUT_S) -> WorkerPlace:
        return self._call(lambda a: a.where.remote(), timeout_s=timeout_s, what="where")

    def where_nowait(self) -> Pending[WorkerPlace]:
        return Pending(self.actor.where.remote(), "where")

    def reserve_store(self, key: str, host: str) -> str:
        return self._call(lambda a: a.reserve_store.remote(key, host), timeout_s=PLACE_TIMEOUT_S, what="reserve_store")

    def register_job_nowait(self, key: str, hosting: bytes | JobHosting, moved: Optional[MovedState] = None,
                            recover: bool = False) -> Pending[bool]:
        return Pending(self.actor.register_job.remote(key, hosting, moved, recover), "register_job")

    def run(self, key: str, call: PhaseCall) -> PhaseOutcome:
        """Run a granted phase on this (leader) worker; waits as long as the phase takes."""
        return self._call(lambda a: a.run.remote(key, call), timeout_s=None, what="run")

    def run_follower(self, key: str, call: PhaseCall) -> Pending[PhaseOutcome]:
        """The leader starts the same phase on a follower rank (no permit bookkeeping there)."""
        return Pending(self.actor.run.remote(key, call, True), "run")

    def export_job_nowait(self, key: str) -> Pending[Optional[MovedState]]:
        return Pending(self.actor.export_job.remote(key), "export_job")

    def unregister_job_nowait(self, key: str, admission: Optional[str] = None) -> Optional[Pending[bool]]:
        return self._send(lambda a: a.unregister_job.remote(key, admission), what="unregister_job")

    def hosts(self, key: str, admission: Optional[str], timeout_s: float = 30.0) -> bool:
        return self._call(lambda a: a.hosts.remote(key, admission), timeout_s=timeout_s, what="hosts")

    def hosted(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[HostedJob]:
        return self._call(lambda a: a.hosted.remote(), timeout_s=timeout_s, what="hosted")

    # weight sync (the leader and its peers)
    # ``version``: the policy version the weights are (the sync's grant, rollmux.staleness)
    def receive_weights_nowait(self, key: str, refs: list[ObjectRef], version: Optional[int] = None) -> Pending[SyncAck]:
        return Pending(self.actor.receive_weights.remote(key, refs, version), "receive_weights")

    def receive_sync_nowait(self, key: str, version: Optional[int] = None) -> Pending[SyncAck]:
        return Pending(self.actor.receive_sync.remote(key, version), "receive_sync")

    def receive_counted_nowait(self, key: str, weights: PendingWeights, cross_bytes: int, intra_bytes: int,
                               version: Optional[int] = None) -> Pending[SyncAck]:
        return Pending(self.actor.receive_counted.remote(key, weights, cross_bytes, intra_bytes, version),
                       "receive_counted")

    def sync_signal_nowait(self, key: str, signal: SyncSignal) -> Optional[Pending[bool]]:
        return self._send(lambda a: a.sync_signal.remote(key, signal), what="sync_signal")

    def sync_caps_nowait(self) -> Pending[EndpointCaps]:
        return Pending(self.actor.sync_caps.remote(), "sync_caps")

    def open_sync_endpoint_nowait(self, key: str, plan: SyncPlan, addr: str, index: int, host: str, backend: str,
                                  gen: int) -> Pending[EndpointOpened]:
        return Pending(self.actor.open_sync_endpoint.remote(key, plan, addr, index, host, backend, gen),
                       "open_sync_endpoint")
