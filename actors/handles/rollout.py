"""The rollout service's handles: :class:`RolloutReplicaHandle` (one engine replica) and
:class:`RolloutServiceHandle` (the service actor)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

from actors.handles.base import QUERY_TIMEOUT_S, RETRY_PAUSE_S, ActorLost, CallTimeout, Pending, _Handle
from actors.naming import NAMESPACE, get_actor
from rollmux.rollout_sched.api import (
    CancelReply, Limits, PolicyView, PollReply, Refusal, RolloutView, SubmitBatch, SubmitReply, WindowCall, WindowReply,
)


class RolloutReplicaHandle(_Handle):
    """One engine replica of the rollout service (``actors/rollout/replica.py``): the service's
    serving loop runs one scheduling window per call (awaited; a dead replica raises :class:`ActorLost`)."""

    async def window(self, call: WindowCall) -> WindowReply:
        """Run one window (:class:`rollmux.rollout_sched.api.WindowCall` -> ``WindowReply``)."""
        return await Pending(self.actor.window.remote(call), "window")

    async def ping(self, timeout_s: float = QUERY_TIMEOUT_S) -> int:
        """The replica's index once its engine is built."""
        return await asyncio.wait_for(Pending(self.actor.ping.remote(), "ping")._await(), timeout_s)

    def kill(self) -> None:
        """Kill the replica's process (fault injection and shutdown; no restart)."""
        import ray

        ray.kill(self.actor, no_restart=True)


class RolloutServiceHandle(_Handle):
    """The rollout service actor (``actors/rollout/service.py``), for the HTTP face (async, every
    call bounded by ``timeout_s``; reads are resent once after a lost actor, a submit never is)
    and for operators and tests (the ``*_sync`` methods)."""

    def __init__(self, name: str, timeout_s: float = 30.0, actor: Any = None):
        super().__init__(actor, name=name)
        self.timeout_s = timeout_s

    async def _acall(self, submit: Callable[[Any], Any], what: str, retry: bool = True,
                     timeout_s: Optional[float] = None) -> Any:
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

    async def detach(self, ids: list[str]) -> None:
        """The stream of ``ids`` ended early: cancel them after the grace period unless claimed again."""
        return await self._acall(lambda a: a.detach.remote(ids), "detach")

    async def cancel(self, ids: list[str]) -> CancelReply:
        return await self._acall(lambda a: a.cancel.remote(ids), "cancel", retry=False)

    async def set_policy(self, version: int, min_version: Optional[int]) -> PolicyView | Refusal:
        return await self._acall(lambda a: a.set_policy.remote(version, min_version), "set_policy", retry=False)

    async def stats(self) -> dict:
        return await self._acall(lambda a: a.stats.remote(), "stats")

    async def limits(self) -> Limits:
        return await self._acall(lambda a: a.limits.remote(), "limits")

    async def wait_result(self, request_id: str, timeout_s: float) -> Optional[RolloutView]:
        """The request's view once it ended, or as it is after ``timeout_s``."""
        return await self._acall(lambda a: a.wait_result.remote(request_id, timeout_s), "wait_result",
                                 timeout_s=timeout_s + self.timeout_s)

    def stats_sync(self, timeout_s: float = QUERY_TIMEOUT_S) -> dict:
        return self._call(lambda a: a.stats.remote(), timeout_s=timeout_s, retries=1, what="stats")

    def configure_sync(self, overrides: dict, timeout_s: float = QUERY_TIMEOUT_S) -> dict:
        """Change service settings at run time (``ServiceConfig`` fields, validated) -> the new settings."""
        return self._call(lambda a: a.configure.remote(overrides), timeout_s=timeout_s, what="configure")

    def replica_names_sync(self, timeout_s: float = QUERY_TIMEOUT_S) -> list[str]:
        return self._call(lambda a: a.replica_names.remote(), timeout_s=timeout_s, retries=1, what="replica_names")

    def ready_sync(self, timeout_s: float = 300.0) -> dict:
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
