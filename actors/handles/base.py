"""What every handle shares: the errors, one call in flight (:class:`Pending`), the base handle.

The timeouts of the calls that have one, the translation of Ray's errors (the module docstring of
:mod:`actors.handles` says which), :func:`start_actor` (the one place the project creates actors)
and :class:`_Handle` (a named actor looked up again after it died).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Generic, Mapping, Optional, Sequence, TypeVar

from actors.naming import NAMESPACE, get_actor

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

#: the answer type of a call (:class:`Pending`)
T = TypeVar("T")

log = logging.getLogger("rollmux.handles")

#: Timeouts (s) of the calls that have one; a phase (``WorkerHandle.run``) and a permit
#: (``ControllerHandle.acquire``, bounded by the controller itself) wait as long as they take.
QUERY_TIMEOUT_S = 60.0  # a read (record, health, status, timeline)
RELEASE_TIMEOUT_S = 120.0  # a worker's permit release
HEARTBEAT_TIMEOUT_S = 30.0  # a driver's heartbeat
PLACE_TIMEOUT_S = 120.0  # where() / reserve_store() of a worker
REGISTER_TIMEOUT_S = 600.0  # registering a job's code on its workers (unpickling user code)
REPORT_TIMEOUT_S = 60.0  # a driver's final report
RETRY_PAUSE_S = 0.5  # pause before looking an actor up again


class ActorLost(RuntimeError):
    """The actor died, is restarting, or does not exist (its name is unknown): the call did not
    (or may not have) run. ``missing``: the name was never found."""

    def __init__(self, msg: str, missing: bool = False, kind: str = "ActorLost"):
        super().__init__(msg)
        self.missing = missing
        self.kind = kind  # the name of Ray's error (e.g. ActorDiedError), for messages


class CallTimeout(TimeoutError):
    """The actor did not answer within the call's timeout (the call may still run)."""


def unwrap(e: BaseException) -> BaseException:
    """The callee's exception out of a Ray ``RayTaskError`` (an instance of the original class)."""
    from ray.exceptions import RayTaskError

    if isinstance(e, RayTaskError):
        try:
            return e.as_instanceof_cause()
        except Exception:
            return e
    return e


def _translate(e: BaseException) -> BaseException:
    """Ray's error of a call as this module raises it (see the module docstring)."""
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

    if isinstance(e, RayTaskError):
        return unwrap(e)
    if isinstance(e, (RayActorError, ActorUnavailableError)):
        return ActorLost(f"{type(e).__name__}: {e}", kind=type(e).__name__)
    if isinstance(e, GetTimeoutError):
        return CallTimeout(str(e))
    return e


def start_actor(cls: type, args: tuple = (), kwargs: Optional[Mapping[str, object]] = None,
                **options: object) -> ActorHandle:
    """Create the Ray actor ``cls(*args, **kwargs)`` with ``options`` (name, namespace, lifetime,
    get_if_exists, resources, ...): the one place the project creates actors. Returns Ray's
    actor handle (wrap it in the handle of its kind)."""
    import ray

    return ray.remote(cls).options(**options).remote(*args, **(kwargs or {}))


def run_in_actor(actor: ActorHandle, fn: Callable[..., T], timeout_s: Optional[float] = None) -> T:
    """``fn(instance)`` run inside the actor ``actor`` (Ray's ``__ray_call__``), its result (bounded by
    ``timeout_s``; errors translated as the module docstring says). For benchmarks that instrument
    or read an actor's internals; the product's calls go through the typed handles."""
    return Pending(actor.__ray_call__.remote(fn), getattr(fn, "__name__", "__ray_call__")).result(timeout_s)


class Pending(Generic[T]):
    """One call in flight (a Ray ObjectRef) whose answer is a ``T``: :meth:`result` waits for it
    (bounded), ``await`` awaits it; errors as the module docstring says."""

    __slots__ = ("ref", "what")

    def __init__(self, ref: ObjectRef[T], what: str = ""):
        self.ref, self.what = ref, what

    def result(self, timeout_s: Optional[float] = None) -> T:
        import ray

        try:
            return ray.get(self.ref, timeout=timeout_s)
        except BaseException as e:
            raise _translate(e) from None

    def done(self) -> bool:
        """True when the call has finished (answered or failed); never waits."""
        import ray

        ready, _ = ray.wait([self.ref], num_returns=1, timeout=0)
        return bool(ready)

    def __await__(self):
        return self._await().__await__()

    async def _await(self) -> T:
        try:
            return await self.ref
        except BaseException as e:
            raise _translate(e) from None


def gather(pending: Sequence[Pending[T]], timeout_s: Optional[float] = None) -> list[T]:
    """The results of several calls, in order (the first failure raises, translated)."""
    import ray

    try:
        return ray.get([p.ref for p in pending], timeout=timeout_s)
    except BaseException as e:
        raise _translate(e) from None


def watch_failures(pending: Mapping[Pending, str], stop: threading.Event,
                   on_fail: Callable[[str], None], name: str = "rollmux-watch") -> threading.Thread:
    """A thread that calls ``on_fail(reason)`` as soon as one of ``pending`` (call -> the name of
    the worker running it) fails, until ``stop`` is set (polls every 0.2 s)."""
    import ray

    def loop() -> None:
        left = {p.ref: n for p, n in pending.items()}
        while left and not stop.is_set():
            ready, _ = ray.wait(list(left), num_returns=1, timeout=0.2)
            for r in ready:
                who = left.pop(r)
                try:
                    ray.get(r, timeout=0)
                except Exception as e:
                    msg = str(e).strip().splitlines()
                    on_fail(f"{who}: its sync task failed ({type(e).__name__}: {msg[-1][:300] if msg else ''})")
                    return

    t = threading.Thread(target=loop, name=name, daemon=True)
    t.start()
    return t


class _Handle:
    """A named RollMux actor: the Ray handle is cached and looked up by name again after the
    actor died (when the handle has a name)."""

    def __init__(self, actor: Optional[ActorHandle] = None, *, name: Optional[str] = None):
        if actor is None and name is None:
            raise ValueError("a handle needs an actor handle or an actor name")
        self._actor, self.name = actor, name

    @property
    def actor(self) -> ActorHandle:
        if self._actor is None:
            try:
                self._actor = get_actor(self.name)
            except ValueError as e:
                raise ActorLost(f"no actor {NAMESPACE}/{self.name} ({e})", missing=True) from None
        return self._actor

    def forget(self) -> None:
        """Drop the cached Ray handle (the next call looks the actor up by name)."""
        if self.name is not None:
            self._actor = None

    def _call(self, submit: Callable[[ActorHandle], ObjectRef[T]], *, timeout_s: Optional[float], retries: int = 0,
              what: str = "") -> T:
        """``submit(actor)`` (one ``.remote`` call) and its result; on a lost actor the handle
        looks it up again and resends, ``retries`` times."""
        for attempt in range(retries + 1):
            try:
                return Pending(submit(self.actor), what).result(timeout_s)
            except ActorLost:
                self.forget()
                if attempt == retries:
                    raise
                time.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, submit: Callable[[ActorHandle], ObjectRef[T]], what: str = "") -> Optional[Pending[T]]:
        """Fire and forget ``submit(actor)``; a stale handle is looked up again once. None (logged)
        when the actor cannot be reached."""
        for attempt in range(2):
            try:
                return Pending(submit(self.actor), what)
            except Exception as e:
                self.forget()
                if attempt:
                    log.warning("%s to %s not sent: %s", what or "call", self.name, e)
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
