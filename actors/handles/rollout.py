"""The rollout service's handles: :class:`RolloutReplicaHandle` (one engine replica),
:class:`RolloutIngressHandle` (the rollout routes' own HTTP server) and :class:`RolloutServiceHandle`
(the service actor)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable, Optional

from actors.handles.base import QUERY_TIMEOUT_S, RETRY_PAUSE_S, ActorLost, CallTimeout, Pending, T, _Handle
from actors.naming import NAMESPACE, get_actor
from rollmux.rollout_sched.api import (
    CancelReply, Limits, PolicyView, PollReply, Refusal, RolloutView, ServiceStats, SubmitBatch, SubmitReply, TokenCursor,
    TokensReply, WindowCall, WindowReply,
)
from rollmux.rollout_sched.service_config import ServiceConfig
from rollmux.rollout_sched.weights import (
    DiskUpdateBody, SyncOffer, SyncReceipt, TensorSpec, UploadStartBody, UploadView, WeightsLoad, WeightsView,
    WeightUpdateView,
)

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle


class RolloutReplicaHandle(_Handle):
    """One engine replica of the rollout service (``actors/rollout/replica.py``): the service's
    serving loop runs one scheduling window per call (awaited; a dead replica raises :class:`ActorLost`)."""

    async def window(self, call: WindowCall) -> WindowReply:
        """Run one window (:class:`rollmux.rollout_sched.api.WindowCall` -> ``WindowReply``: load weights
        when the call carries them, abort, admit, one slice)."""
        return await Pending(self.actor.window.remote(call), "window")

    async def manifest(self) -> Optional[list[TensorSpec]]:
        """Name, dtype and shape of every tensor the replica's engine serves (None: not known)."""
        return await Pending(self.actor.manifest.remote(), "manifest")

    async def weights_sha256(self) -> Optional[str]:
        """The digest of the weights the replica serves (None: not known)."""
        return await Pending(self.actor.weights_sha256.remote(), "weights_sha256")

    async def receive_sync(self, offer: SyncOffer) -> SyncReceipt:
        """Receive a weight version over a sync plan as its rollout worker ``offer.rollout_index``
        (staged until :meth:`window` installs it)."""
        return await Pending(self.actor.receive_sync.remote(offer), "receive_sync")

    async def export_weights(self, version: int) -> WeightsLoad:
        """The weights the replica serves (or has staged as ``version``), as a complete load."""
        return await Pending(self.actor.export_weights.remote(version), "export_weights")

    async def ping(self, timeout_s: float = QUERY_TIMEOUT_S) -> int:
        """The replica's index once its engine is built."""
        return await asyncio.wait_for(Pending(self.actor.ping.remote(), "ping")._await(), timeout_s)

    def kill(self) -> None:
        """Kill the replica's process (fault injection and shutdown; no restart)."""
        import ray

        ray.kill(self.actor, no_restart=True)


class RolloutIngressHandle(_Handle):
    """The rollout ingress actor (``serve_api/rollout_ingress.py``): the rollout routes on an HTTP
    server of their own, without Serve's proxy."""

    async def start(self, timeout_s: float = QUERY_TIMEOUT_S) -> str:
        """Start its server (once) -> its base URL (``http://host:port``)."""
        return await asyncio.wait_for(Pending(self.actor.start.remote(), "start")._await(), timeout_s)


class RolloutServiceHandle(_Handle):
    """The rollout service actor (``actors/rollout/service.py``), for the HTTP face (async, every
    call bounded by ``timeout_s``; reads are resent once after a lost actor, a submit never is)
    and for operators and tests (the ``*_sync`` methods)."""

    def __init__(self, name: str, timeout_s: float = 30.0, actor: Optional[ActorHandle] = None):
        super().__init__(actor, name=name)
        self.timeout_s = timeout_s

    async def _acall(self, submit: Callable[[ActorHandle], ObjectRef[T]], what: str, retry: bool = True,
                     timeout_s: Optional[float] = None) -> T:
        for attempt in range(2):
            try:
                if self._actor is None:
                    self._actor = await asyncio.to_thread(get_actor, self.name)
                return await asyncio.wait_for(Pending(submit(self._actor), what)._await(), timeout_s or self.timeout_s)
            except asyncio.TimeoutError:
                raise CallTimeout(f"the rollout service did not answer {what} within {timeout_s or self.timeout_s:g} s") from None
            except (ActorLost, ValueError) as e:
                self._actor = None
                if attempt or not retry:
                    raise e if isinstance(e, ActorLost) else ActorLost(f"no actor {NAMESPACE}/{self.name}", missing=True) from None
                await asyncio.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")  # pragma: no cover

    async def submit(self, batch: SubmitBatch) -> SubmitReply | Refusal:
        """Queue a :class:`SubmitBatch` -> ``SubmitReply`` or ``Refusal`` (a commit: never resent)."""
        return await self._acall(lambda a: a.submit.remote(batch), "submit", retry=False)

    async def get(self, request_id: str) -> Optional[RolloutView]:
        return await self._acall(lambda a: a.get.remote(request_id), "get")

    async def poll(self, ids: list[str], session_id: Optional[str], wait_s: float) -> PollReply:
        """Finished results among ``ids`` (and the session's), waiting up to ``wait_s`` (renews the stream lease)."""
        return await self._acall(lambda a: a.poll.remote(ids, session_id, wait_s), "poll", timeout_s=wait_s + self.timeout_s)

    async def tokens(self, cursors: list[TokenCursor], wait_s: float) -> TokensReply:
        """The tokens the requests of ``cursors`` produced past them, their restarts and ends
        (waiting up to ``wait_s`` for news)."""
        return await self._acall(lambda a: a.tokens.remote(cursors, wait_s), "tokens",
                                 timeout_s=wait_s + self.timeout_s)

    async def detach(self, ids: list[str]) -> None:
        """The stream of ``ids`` ended early: cancel them after the grace period unless claimed again."""
        return await self._acall(lambda a: a.detach.remote(ids), "detach")

    async def cancel(self, ids: list[str]) -> CancelReply:
        return await self._acall(lambda a: a.cancel.remote(ids), "cancel", retry=False)

    async def set_policy(self, version: int, min_version: Optional[int]) -> PolicyView | Refusal:
        return await self._acall(lambda a: a.set_policy.remote(version, min_version), "set_policy", retry=False)

    async def stats(self) -> ServiceStats:
        return await self._acall(lambda a: a.stats.remote(), "stats")

    async def limits(self) -> Limits:
        return await self._acall(lambda a: a.limits.remote(), "limits")

    async def wait_result(self, request_id: str, timeout_s: float) -> Optional[RolloutView]:
        """The request's view once it ended, or as it is after ``timeout_s``."""
        return await self._acall(lambda a: a.wait_result.remote(request_id, timeout_s), "wait_result",
                                 timeout_s=timeout_s + self.timeout_s)

    # weights: an update is a commit (never resent); it answers when every replica serves it
    async def start_upload(self, body: UploadStartBody) -> UploadView | Refusal:
        return await self._acall(lambda a: a.start_upload.remote(body), "start_upload", retry=False)

    async def put_chunk(self, upload_id: str, index: int, data: bytes) -> UploadView | Refusal:
        return await self._acall(lambda a: a.put_chunk.remote(upload_id, index, data), "put_chunk", retry=False)

    async def cancel_upload(self, upload_id: str) -> bool:
        return await self._acall(lambda a: a.cancel_upload.remote(upload_id), "cancel_upload", retry=False)

    async def commit_upload(self, upload_id: str, timeout_s: float) -> WeightUpdateView | Refusal:
        return await self._acall(lambda a: a.commit_upload.remote(upload_id), "commit_upload", retry=False,
                                 timeout_s=timeout_s + self.timeout_s)

    async def update_from_disk(self, body: DiskUpdateBody, timeout_s: float) -> WeightUpdateView | Refusal:
        return await self._acall(lambda a: a.update_from_disk.remote(body), "update_from_disk", retry=False,
                                 timeout_s=timeout_s + self.timeout_s)

    async def update_from_sync(self, offer: SyncOffer, timeout_s: float) -> WeightUpdateView | Refusal:
        """Receive ``offer``'s version over its sync plan on every replica and apply it."""
        return await self._acall(lambda a: a.update_from_sync.remote(offer), "update_from_sync", retry=False,
                                 timeout_s=timeout_s + self.timeout_s)

    async def weights_view(self) -> WeightsView:
        return await self._acall(lambda a: a.weights_view.remote(), "weights_view")

    async def replica_digests(self) -> list[Optional[str]]:
        """The digest each replica computes now on the weights it serves (None: dead)."""
        return await self._acall(lambda a: a.replica_digests.remote(), "replica_digests")

    def stats_sync(self, timeout_s: float = QUERY_TIMEOUT_S) -> ServiceStats:
        return self._call(lambda a: a.stats.remote(), timeout_s=timeout_s, retries=1, what="stats")

    def configure_sync(self, change: ServiceConfig, timeout_s: float = QUERY_TIMEOUT_S) -> ServiceConfig:
        """Change service settings at run time: the fields set in ``change`` (e.g.
        ``ServiceConfig(queue_capacity=8)``) replace the current ones -> the new settings."""
        return self._call(lambda a: a.configure.remote(change), timeout_s=timeout_s, what="configure")

    def replica_names_sync(self, timeout_s: float = QUERY_TIMEOUT_S) -> list[str]:
        return self._call(lambda a: a.replica_names.remote(), timeout_s=timeout_s, retries=1, what="replica_names")

    def ready_sync(self, timeout_s: float = 300.0) -> Limits:
        """Wait until every replica's engine is built -> the limits."""
        return self._call(lambda a: a.ready.remote(), timeout_s=timeout_s, retries=1, what="ready")

    def shutdown_sync(self, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        """Stop the loops and kill the replicas, then the service actor itself."""
        import ray

        try:
            self._call(lambda a: a.shutdown.remote(), timeout_s=timeout_s, what="shutdown")
        finally:
            try:
                ray.kill(self.actor, no_restart=True)
            except (ActorLost, ValueError):
                pass
