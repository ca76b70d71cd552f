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

from actors.handles.base import (  # noqa: F401  (the timeouts, re-exported)
    HEARTBEAT_TIMEOUT_S, PLACE_TIMEOUT_S, QUERY_TIMEOUT_S, REGISTER_TIMEOUT_S, RELEASE_TIMEOUT_S, REPORT_TIMEOUT_S,
    RETRY_PAUSE_S, ActorLost, CallTimeout, Pending, gather, run_in_actor, start_actor, unwrap, watch_failures,
)
from actors.handles.rollout import RolloutIngressHandle, RolloutReplicaHandle, RolloutServiceHandle
from actors.handles.runtime import ControllerHandle, WorkerHandle
from actors.handles.scheduler import AsyncSchedulerHandle, SchedulerHandle

__all__ = ["ActorLost", "CallTimeout", "Pending", "gather", "watch_failures", "start_actor", "unwrap",
           "SchedulerHandle", "AsyncSchedulerHandle", "ControllerHandle", "WorkerHandle",
           "RolloutIngressHandle", "RolloutReplicaHandle", "RolloutServiceHandle"]
