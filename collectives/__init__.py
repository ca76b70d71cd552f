"""Data plane of RollMux's weight sync: executors of a :class:`rollmux.sync_plan.SyncPlan`.

RollMux §5.2 (topology-aware model sync): one model copy crosses the slow cross-cluster link
(training worker i sends shard i to one rollout worker), then each receiver broadcasts its shard
inside the rollout cluster. Backends: ``"gloo"`` (CPU, :mod:`collectives.gloo_executor`) and
``"nccl"`` (cupy-NCCL on GPUs, :mod:`collectives.nccl_executor`, import-guarded);
:func:`collectives.select.choose_backend` picks one for a job's workers (``sync_backend="auto"``).
Both run the same algorithm (:class:`collectives.base.SyncExecutor`); only the transport differs.

API used by the runtime's sync phase (``TrainWorker`` / ``RolloutWorker`` Ray actors)
---------------------------------------------------------------------------------------
1. Once per job (e.g. in the job's driver / group controller), build the plan from the trainer
   model's metadata (no tensors move)::

       from rollmux.sync_plan import build_plan, metas_of, ParallelLayout
       plan = build_plan(metas_of(model.state_dict()), ParallelLayout(tp=2, dp=2), 4,
                         scheme="topo", bucket_bytes=32 << 20)

   and host the job's rendezvous store where trainer 0 runs (the kernel picks the port; no
   port is ever chosen ahead of binding it)::

       store, addr = host_store(trainer0_node_ip)   # addr == "ip:port"
2. Once per worker process (inside each actor's ``__init__`` or first sync; keep the object for
   the job's lifetime: communicators survive phase suspension)::

       ep = open_endpoint(plan, "train", 0, store=store, job_id=job_id, bind_host=node_ip)  # trainer 0
       ep = open_endpoint(plan, "train", i, addr=addr, job_id=job_id, bind_host=node_ip)    # trainers
       ep = open_endpoint(plan, "rollout", j, addr=addr, job_id=job_id, bind_host=node_ip)  # rollout

   All N + M endpoints of the job must be constructed concurrently (rendezvous); the constructor
   checks that every endpoint holds the same plan (SyncMismatchError otherwise). An endpoint has
   ``rollmux_resident = True``, so kept in a job's phase state it stays alive in the process
   between phases (``rollmux.phase_api``) instead of being stored.
3. Every sync phase, concurrently on all endpoints of the job::

       ep.send(trainer_state_dict)                      # trainer i; returns SyncStats
       new_sd = ep.receive(rollout_state_dict)           # rollout j; atomic, returns new tensors
       # or ep.receive(rollout_state_dict, in_place=True) to copy into the live tensors

   ``receive`` is all-or-nothing: on :class:`~rollmux.sync_plan.SyncAbortedError` (peer death,
   timeout, checksum mismatch) the live weights are unchanged and the endpoints are broken (close
   and re-open them); on :class:`~rollmux.sync_plan.SyncMismatchError` (names / shapes / dtypes
   differ) nothing moved and the endpoint stays usable.
   ``ep.abort(reason)`` (any thread) makes a sync in progress on that endpoint raise
   :class:`~rollmux.sync_plan.SyncAbortedError` at once (the runtime calls it on every endpoint of
   the job when one peer's task died), instead of waiting ``timeout_s``.
4. ``ep.close()`` when the job departs. Several jobs may share a process: each has its own groups,
   keyed by ``job_id`` and its own store address.
"""

from __future__ import annotations

from typing import Any

from collectives.base import SyncExecutor, SyncStats, backends, get_executor, host_store, register
from collectives.gloo_executor import GlooExecutor
from collectives.select import SYNC_BACKENDS, choose_backend, endpoint_caps
from rollmux.sync_plan import (
    Role,
    SyncAbortedError,
    SyncError,
    SyncMismatchError,
    SyncPlan,
    SyncPlanError,
)

try:  # registers "nccl" when cupy is importable; the module itself is import-guarded
    from collectives import nccl_executor as _nccl  # noqa: F401
except Exception:  # pragma: no cover - never fatal on CPU machines
    _nccl = None

SyncEndpoint = SyncExecutor


def open_endpoint(plan: SyncPlan, role: Role, index: int, *, backend: str = "gloo", **kwargs: Any) -> SyncExecutor:
    """Create this process's sync endpoint for one job (see module docstring for the protocol).

    ``kwargs`` go to the backend's executor (gloo: ``addr``, ``job_id``, ``timeout_s``,
    ``bind_host``/``interface``, ``store``). Raises SyncPlanError for an unknown backend, a bad
    role/index/address; SyncMismatchError when the job's endpoints hold different plans.
    """
    return get_executor(backend)(plan, role, index, **kwargs)


__all__ = [
    "SYNC_BACKENDS", "choose_backend", "endpoint_caps",
    "GlooExecutor", "SyncAbortedError", "SyncEndpoint", "SyncError", "SyncExecutor", "SyncMismatchError",
    "SyncPlanError", "SyncStats", "backends", "get_executor", "host_store", "open_endpoint", "register",
]
