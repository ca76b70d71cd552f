"""Handles: every Ray call to a RollMux actor goes through here (RollMux §5).

In the spirit of Ray Serve's ``ActorReplicaWrapper`` (every Ray API call of the deployment state
goes through one wrapper, so the state logic can be tested with fakes): one small handle class
per actor kind, with typed methods taking and returning the messages of
:mod:`rollmux.messages`, and the timeouts, retries and the translation of Ray's errors in one
place. No method is chosen by a string; outside this module no module of the project calls
``.remote(`` (``tests/test_handles.py`` reads the sources for it), so a reader (or a tool)
follows a job from the HTTP face to the worker running its phase by the handles' methods.

- :class:`SchedulerHandle` (drivers, controllers, the CLI, scripts) and
  :class:`AsyncSchedulerHandle` (the HTTP face: async, a per-call timeout, never resends a commit)
  for the ``GlobalScheduler``;
- :class:`ControllerHandle` for a ``GroupController``;
- :class:`WorkerHandle` for a ``RolloutWorker`` / ``TrainWorker``;
- :func:`start_actor` creates an actor; :class:`Pending` is one call in flight (an ObjectRef:
  :meth:`Pending.result`, ``await``, :func:`gather`, :func:`watch_failures`).

Errors, the same for every handle: the callee's own exception is re-raised as itself
(``PermitError``, ``WorkerLost``, a user's phase error: Ray's ``RayTaskError`` unwrapped, still an
instance of the original class); a dead, restarting or missing actor raises :class:`ActorLost`
(after the handle's retries, which look the actor up by name again); a call not answered in time
raises :class:`CallTimeout`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

from actors.naming import NAMESPACE, SCHEDULER_NAME, controller_name, get_actor, worker_name
from rollmux.messages import (
    AbortOutcome, AttachReply, AttachTicket, Grant, JobHosting, MemberTarget, MembershipPush, MovedState, PhaseCall,
    PhaseOutcome, PhaseRecord, ProgressReport, RolloutProgress, RuntimeEvent, SyncSignal, TailDecision, WorkerPlace,
)
from rollmux.rollout_sched.api import (
    CancelReply, Limits, PolicyView, PollReply, Refusal, RolloutView, SubmitBatch, SubmitReply, TokenCursor,
    TokensReply, WindowCall, WindowReply,
)
from rollmux.rollout_sched.weights import (
    DiskUpdateBody, SyncOffer, SyncReceipt, TensorSpec, UploadStartBody, UploadView, WeightsLoad, WeightsView,
    WeightUpdateView,
)

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


def start_actor(cls: type, args: tuple = (), kwargs: Optional[dict] = None, **options: Any):
    """Create the Ray actor ``cls(*args, **kwargs)`` with ``options`` (name, namespace, lifetime,
    get_if_exists, resources, ...): the one place the project creates actors. Returns Ray's
    actor handle (wrap it in the handle of its kind)."""
    import ray

    return ray.remote(cls).options(**options).remote(*args, **(kwargs or {}))


def run_in_actor(actor: Any, fn: Callable[[Any], Any], timeout_s: Optional[float] = None) -> Any:
    """``fn(instance)`` run inside the actor ``actor`` (Ray's ``__ray_call__``), its result (bounded by
    ``timeout_s``; errors translated as the module docstring says). For benchmarks that instrument
    or read an actor's internals; the product's calls go through the typed handles."""
    return Pending(actor.__ray_call__.remote(fn), getattr(fn, "__name__", "__ray_call__")).result(timeout_s)


class Pending:
    """One call in flight (a Ray ObjectRef): :meth:`result` waits for it (bounded), ``await``
    awaits it; errors as the module docstring says."""

    __slots__ = ("ref", "what")

    def __init__(self, ref: Any, what: str = ""):
        self.ref, self.what = ref, what

    def result(self, timeout_s: Optional[float] = None) -> Any:
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

    async def _await(self) -> Any:
        try:
            return await self.ref
        except BaseException as e:
            raise _translate(e) from None


def gather(pending: Sequence[Pending], timeout_s: Optional[float] = None) -> list:
    """The results of several calls, in order (the first failure raises, translated)."""
    import ray

    try:
        return ray.get([p.ref for p in pending], timeout=timeout_s)
    except BaseException as e:
        raise _translate(e) from None


def watch_failures(pending: dict[Pending, str], stop: threading.Event,
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

    def __init__(self, actor: Any = None, *, name: Optional[str] = None):
        if actor is None and name is None:
            raise ValueError("a handle needs an actor handle or an actor name")
        self._actor, self.name = actor, name

    @property
    def actor(self) -> Any:
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

    def _call(self, submit: Callable[[Any], Any], *, timeout_s: Optional[float], retries: int = 0,
              what: str = "") -> Any:
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

    def _send(self, submit: Callable[[Any], Any], what: str = "") -> Optional[Pending]:
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


# ----------------------------------------------------------------------------- GlobalScheduler
class SchedulerHandle(_Handle):
    """The GlobalScheduler for drivers, controllers and operator commands (blocking calls; the
    ``*_nowait`` ones fire and forget)."""

    def __init__(self, actor: Any = None, *, name: Optional[str] = None):
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

    def admit(self, spec: dict, dry_run: bool = False, queue: bool = False) -> dict:
        """:meth:`GlobalSchedulerImpl.admit` (a decision: ``AdmissionDecision.to_dict()``)."""
        return self._call(lambda a: a.admit.remote(spec, dry_run, queue), timeout_s=None, what="admit")

    def admit_batched_nowait(self, spec: dict, dry_run: bool = False, queue: bool = False,
                             explain: str = "chosen") -> Pending:
        """:meth:`GlobalSchedulerImpl.admit_batched` (group commit) without waiting (a benchmark's batch)."""
        return Pending(self.actor.admit_batched.remote(spec, dry_run, queue, explain), "admit_batched")

    def attach(self, job_id: str) -> Optional[AttachTicket]:
        """The job's :class:`AttachTicket` (its group's controller created and told first); None
        for an unknown job."""
        return self._call(lambda a: a.attach.remote(job_id), timeout_s=None, what="attach")

    def get_job(self, job_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> Optional[dict]:
        return self._call(lambda a: a.get_job.remote(job_id), timeout_s=timeout_s, what="get_job")

    def list_jobs(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[dict]:
        return self._call(lambda a: a.list_jobs.remote(), timeout_s=timeout_s, what="list_jobs")

    def list_groups(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[dict]:
        return self._call(lambda a: a.list_groups.remote(), timeout_s=timeout_s, what="list_groups")

    def depart(self, job_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> Optional[dict]:
        return self._call(lambda a: a.depart.remote(job_id), timeout_s=timeout_s, what="depart")

    def health(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> dict:
        return self._call(lambda a: a.health.remote(), timeout_s=timeout_s, what="health")

    def cluster_spec(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> dict:
        return self._call(lambda a: a.cluster_spec.remote(), timeout_s=timeout_s, what="cluster_spec")

    def group_timeline(self, group_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[dict]:
        return self._call(lambda a: a.group_timeline.remote(group_id), timeout_s=timeout_s, what="group_timeline")

    def ensure_controller(self, group_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> str:
        """The group's GroupController, created if needed (an operator's or a test's query; drivers
        use :meth:`attach`): its actor name. Raises KeyError for a group without an active job."""
        return self._call(lambda a: a.ensure_controller.remote(group_id), timeout_s=timeout_s, what="ensure_controller")

    def group_members(self, group_id: str, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[MemberTarget]:
        """The group's active members in the planned round-robin order (an operator's query)."""
        return self._call(lambda a: a.group_members.remote(group_id), timeout_s=timeout_s, what="group_members")

    def report(self, job_id: str, message: RuntimeEvent | ProgressReport,
               timeout_s: Optional[float] = REPORT_TIMEOUT_S) -> Optional[dict]:
        """Report ``message`` and wait for the job's record (a driver's final report)."""
        return self._call(lambda a: a.report.remote(job_id, message), timeout_s=timeout_s, what="report")

    def report_nowait(self, job_id: str, message: RuntimeEvent | ProgressReport) -> Optional[Pending]:
        """Report ``message`` without waiting (soft state: a report that cannot be sent is logged)."""
        return self._send(lambda a: a.report.remote(job_id, message), what=f"report of {job_id}")

    def keep_timeline_nowait(self, group_id: str, records: list[dict]) -> Optional[Pending]:
        """Hand a dissolved group's timeline to the scheduler before its controller exits
        (awaitable; None when the scheduler cannot be reached)."""
        return self._send(lambda a: a.keep_timeline.remote(group_id, records), what=f"timeline of {group_id}")

    def membership(self, group_id: str) -> Pending:
        """The group's target membership, as a push (a restarted controller pulls it; awaitable)."""
        return Pending(self.actor.membership.remote(group_id), "membership")


class AsyncSchedulerHandle(_Handle):
    """The GlobalScheduler for the HTTP face: every call is awaited with ``timeout_s``; a lost
    scheduler is looked up again once (after a short pause) and the call resent, except a
    *commit* (``retry=False``: an admission or a departure), which is never sent twice.

    Raises :class:`CallTimeout` (``outcome_unknown`` set for a commit), :class:`ActorLost`
    (``outcome_unknown`` set for a commit that was sent) and the scheduler's own exception."""

    def __init__(self, name: Optional[str] = None, timeout_s: float = 30.0, actor: Any = None):
        super().__init__(actor, name=name or SCHEDULER_NAME)
        self.timeout_s = timeout_s

    @property
    def namespace(self) -> str:
        return NAMESPACE

    async def _acall(self, submit: Callable[[Any], Any], what: str, retry: bool = True) -> Any:
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

    async def health(self) -> dict:
        return await self._acall(lambda a: a.health.remote(), "health")

    async def admit_batched(self, spec: dict, dry_run: bool, queue: bool, explain: str) -> dict:
        """A dry run (resent if the scheduler restarted: it changes nothing)."""
        return await self._acall(lambda a: a.admit_batched.remote(spec, dry_run, queue, explain), "admit_batched")

    async def admit_many(self, calls: list) -> list[dict]:
        """A batch of admissions (a commit: never resent)."""
        return await self._acall(lambda a: a.admit_many.remote(calls), "admit_many", retry=False)

    async def depart_batched(self, job_id: str) -> Optional[dict]:
        """A departure (a commit: never resent)."""
        return await self._acall(lambda a: a.depart_batched.remote(job_id), "depart_batched", retry=False)

    async def list_jobs(self) -> list[dict]:
        return await self._acall(lambda a: a.list_jobs.remote(), "list_jobs")

    async def get_job(self, job_id: str) -> Optional[dict]:
        return await self._acall(lambda a: a.get_job.remote(job_id), "get_job")

    async def list_groups(self) -> list[dict]:
        return await self._acall(lambda a: a.list_groups.remote(), "list_groups")

    async def snapshot_since(self, epoch: Optional[str], version: int, wait_s: float, policy: bool) -> dict:
        return await self._acall(lambda a: a.snapshot_since.remote(epoch, version, wait_s, policy), "snapshot_since")


# ----------------------------------------------------------------------------- GroupController
class ControllerHandle(_Handle):
    """A group's GroupController (by actor name; looked up again after it died)."""

    @classmethod
    def of_group(cls, group_id: str, scheduler_name: Optional[str] = None) -> "ControllerHandle":
        return cls(name=controller_name(group_id, scheduler_name))

    # drivers
    def attach(self, job_id: str, *, has_sync: Optional[bool] = None, driver: Optional[str] = None) -> AttachReply:
        return self._call(lambda a: a.attach.remote(job_id, has_sync=has_sync, driver=driver), timeout_s=None,
                          what="attach")

    def configure_job_nowait(self, job_id: str, *, has_sync: bool) -> Pending:
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

    def timeline(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> list[dict]:
        return self._call(lambda a: a.get_timeline.remote(), timeout_s=timeout_s, what="get_timeline")

    async def timeline_async(self, timeout_s: float) -> list[dict]:
        return await asyncio.wait_for(Pending(self.actor.get_timeline.remote(), "get_timeline"), timeout=timeout_s)

    def status(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> dict:
        return self._call(lambda a: a.status.remote(), timeout_s=timeout_s, what="status")

    # the releaser (the leader worker)
    def phase_started_nowait(self, job_id: str, phase: str) -> Optional[Pending]:
        return self._send(lambda a: a.phase_started.remote(job_id, phase), what="phase_started")

    def release(self, grant: Grant, record: PhaseRecord) -> dict:
        """Give ``grant`` back with what the phase did; a dead controller is looked up again once
        (a restarted one records the release and changes nothing)."""
        return self._call(lambda a: a.release.remote(grant, record), timeout_s=RELEASE_TIMEOUT_S, retries=1,
                          what="release")

    def progress(self, report: RolloutProgress, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> Optional[TailDecision]:
        """Long-tail progress of a running rollout and the controller's decision (a driver-side
        job's driver reads it: ``actors.driver.permits``)."""
        return self._call(lambda a: a.progress.remote(report), timeout_s=timeout_s, what="progress")

    def progress_nowait(self, report: RolloutProgress) -> Optional[Pending]:
        """Long-tail progress of a running rollout (its :class:`TailDecision` answer is not read)."""
        return self._send(lambda a: a.progress.remote(report), what="progress")

    # the scheduler
    def push(self, push: MembershipPush) -> Pending:
        """Send the group's target membership (never awaited by the scheduler: it tracks the
        acknowledgement with :meth:`Pending.done`)."""
        return Pending(self.actor.sync_members.remote(push), "sync_members")


# ----------------------------------------------------------------------------- workers
class WorkerHandle(_Handle):
    """A node's RolloutWorker / TrainWorker (by actor name; ``actor``: a handle already held)."""

    @classmethod
    def of_node(cls, node: str, actor: Any = None) -> "WorkerHandle":
        return cls(actor, name=worker_name(node))

    # drivers
    def where(self, timeout_s: Optional[float] = PLACE_TIMEOUT_S) -> WorkerPlace:
        return self._call(lambda a: a.where.remote(), timeout_s=timeout_s, what="where")

    def where_nowait(self) -> Pending:
        return Pending(self.actor.where.remote(), "where")

    def reserve_store(self, key: str, host: str) -> str:
        return self._call(lambda a: a.reserve_store.remote(key, host), timeout_s=PLACE_TIMEOUT_S, what="reserve_store")

    def register_job_nowait(self, key: str, hosting: bytes | JobHosting, moved: Optional[MovedState] = None,
                            recover: bool = False) -> Pending:
        return Pending(self.actor.register_job.remote(key, hosting, moved, recover), "register_job")

    def run(self, key: str, call: PhaseCall, args: tuple, kwargs: dict) -> PhaseOutcome:
        """Run a granted phase on this (leader) worker; waits as long as the phase takes."""
        return self._call(lambda a: a.run.remote(key, call, args, kwargs), timeout_s=None, what="run")

    def run_follower(self, key: str, call: PhaseCall, args: tuple, kwargs: dict) -> Pending:
        """The leader starts the same phase on a follower rank (no permit bookkeeping there)."""
        return Pending(self.actor.run.remote(key, call, args, kwargs, True), "run")

    def export_job_nowait(self, key: str) -> Pending:
        return Pending(self.actor.export_job.remote(key), "export_job")

    def unregister_job_nowait(self, key: str, admission: Optional[str] = None) -> Optional[Pending]:
        return self._send(lambda a: a.unregister_job.remote(key, admission), what="unregister_job")

    def hosts(self, key: str, admission: Optional[str], timeout_s: float = 30.0) -> bool:
        return self._call(lambda a: a.hosts.remote(key, admission), timeout_s=timeout_s, what="hosts")

    def hosted(self, timeout_s: Optional[float] = QUERY_TIMEOUT_S) -> dict:
        return self._call(lambda a: a.hosted.remote(), timeout_s=timeout_s, what="hosted")

    # weight sync (the leader and its peers)
    # ``version``: the policy version the weights are (the sync's grant, rollmux.staleness)
    def receive_weights_nowait(self, key: str, refs: list, version: Optional[int] = None) -> Pending:
        return Pending(self.actor.receive_weights.remote(key, refs, version), "receive_weights")

    def receive_sync_nowait(self, key: str, version: Optional[int] = None) -> Pending:
        return Pending(self.actor.receive_sync.remote(key, version), "receive_sync")

    def receive_counted_nowait(self, key: str, weights: dict, cross_bytes: int, intra_bytes: int,
                               version: Optional[int] = None) -> Pending:
        return Pending(self.actor.receive_counted.remote(key, weights, cross_bytes, intra_bytes, version), "receive_counted")

    def sync_signal_nowait(self, key: str, signal: SyncSignal) -> Optional[Pending]:
        return self._send(lambda a: a.sync_signal.remote(key, signal), what="sync_signal")

    def sync_caps_nowait(self) -> Pending:
        return Pending(self.actor.sync_caps.remote(), "sync_caps")

    def open_sync_endpoint_nowait(self, key: str, plan: Any, addr: str, index: int, host: str, backend: str,
                                  gen: int) -> Pending:
        return Pending(self.actor.open_sync_endpoint.remote(key, plan, addr, index, host, backend, gen),
                       "open_sync_endpoint")


# ----------------------------------------------------------------------------- rollout service
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

    async def stats(self) -> dict:
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


__all__ = ["ActorLost", "CallTimeout", "Pending", "gather", "watch_failures", "start_actor", "unwrap",
           "SchedulerHandle", "AsyncSchedulerHandle", "ControllerHandle", "WorkerHandle",
           "RolloutIngressHandle", "RolloutReplicaHandle", "RolloutServiceHandle"]
