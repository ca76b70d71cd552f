"""CPU executor of a sync plan over gloo (``torch.distributed.ProcessGroupGloo``).

Each endpoint owns its process groups (no global default group), so several jobs' endpoints can
live in one process (one Ray actor hosting several jobs) without interfering: every job uses its
own TCP store address or a job-prefixed store. Groups are created once per job and kept across
phases (RollMux §5.1 "control plane stays alive"); a failed sync aborts them (peers fail fast).

Waits are interruptible: a gloo wait cannot be cancelled (``ProcessGroupGloo.abort`` neither wakes
a pending send/recv nor tells the peers), so each wait runs on the endpoint's waiter thread while
the caller wakes on completion, on :meth:`~collectives.base.SyncExecutor.abort` (called by the
runtime when a peer's task died), or when another endpoint of the job published that it failed
(it writes ``abort/<seq>`` in the job's store; waits poll it every ``ABORT_POLL_S``). An abandoned wait finishes in the background within
``timeout_s`` (its buffers stay referenced until then); the endpoint is broken meanwhile.

Groups: ``world`` (trainers + rollout workers; point-to-point across the boundary, votes) and
``rollout`` (rollout workers only; the intra-cluster broadcasts of RollMux §5.2 step 2).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from collectives.base import ABORT_POLL_S, SyncExecutor, open_job_store, register
from rollmux.sync_plan import Role, SyncAbortedError, SyncPlan


@register("gloo")
class GlooExecutor(SyncExecutor):
    """Sync endpoint over gloo TCP (CPU tensors).

    Args:
        plan, role, index, job_id, timeout_s, fault_after_buckets: see :class:`SyncExecutor`.
        addr: ``"host:port"`` of the job's rendezvous store, already hosted
            (:func:`collectives.base.host_store`; the endpoint connects to it as a client).
        bind_host: local address gloo binds to (e.g. ``"127.0.0.1"`` or the node IP);
            ``interface``: or a network interface name; neither: gloo's default (hostname).
        store: the store itself, instead of ``addr`` (in the process that hosts it).
    Raises:
        SyncPlanError: bad ``addr``/role/index; SyncMismatchError: endpoints hold different plans;
        RuntimeError from torch when the rendezvous times out.
    """

    def __init__(self, plan: SyncPlan, role: Role, index: int, *, addr: Optional[str] = None, job_id: str,
                 timeout_s: float = 60.0, bind_host: Optional[str] = None, interface: Optional[str] = None,
                 store: Optional[dist.Store] = None, fault_after_buckets: Optional[int] = None) -> None:
        super().__init__(plan, role, index, job_id=job_id, timeout_s=timeout_s,
                         fault_after_buckets=fault_after_buckets)
        td = timedelta(seconds=self.timeout_s)
        self._store = open_job_store(addr, store, prefix=f"rollmux-sync/{job_id}/",
                                     timeout_s=self.timeout_s)

        def group(prefix: str, rank: int, size: int) -> dist.ProcessGroupGloo:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = td
            if bind_host or interface:
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=bind_host or "",
                                                                     interface=interface or "")]
            else:
                opts._devices = [dist.ProcessGroupGloo.create_default_device()]
            return dist.ProcessGroupGloo(dist.PrefixStore(prefix, self._store), rank, size, opts)

        self._waiter = ThreadPoolExecutor(1, thread_name_prefix=f"rollmux-sync-{job_id}")
        self._cv = threading.Condition()
        self.aborted = _NotifyingEvent(self._cv)
        self._world = group("world/", self.rank, plan.world_size)
        self._roll = group("rollout/", index, plan.num_rollout) if role == "rollout" and plan.num_rollout > 1 else None
        self._check_plan()

    # ---- primitives ----------------------------------------------------------------------------
    def _isend(self, buf: torch.Tensor, dst: int, tag: int) -> Any:
        return self._world.send([buf], dst, tag)

    def _irecv(self, buf: torch.Tensor, src: int, tag: int) -> Any:
        return self._world.recv([buf], src, tag)

    def _ibroadcast(self, buf: torch.Tensor, root_rollout: int) -> Any:
        assert self._roll is not None
        opts = dist.BroadcastOptions()
        opts.rootRank = root_rollout
        opts.rootTensor = 0
        return self._roll.broadcast([buf], opts)

    def _wait(self, handle: Any) -> None:
        self._check_aborted()
        td = timedelta(seconds=self.timeout_s)
        fut = self._waiter.submit(handle.wait, td)
        fut.add_done_callback(lambda _: self._notify())
        deadline = time.monotonic() + self.timeout_s + 5.0  # the gloo wait itself ends by timeout_s
        while not fut.done():
            with self._cv:  # wakes on completion, on abort(), or to poll the store for a peer's abort
                self._cv.wait_for(lambda: fut.done() or self.aborted.is_set(), ABORT_POLL_S)
            if not fut.done():
                self._check_aborted()
                if time.monotonic() > deadline:
                    raise SyncAbortedError(f"timed out after {self.timeout_s} s")
        if fut.result() is False:
            raise SyncAbortedError(f"timed out after {self.timeout_s} s")

    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        self._wait(self._world.allreduce([t]))
        return t

    def _abort(self) -> None:
        for g in (self._world, self._roll):
            if g is not None:
                g.abort()

    def close(self) -> None:
        """Release the groups (idempotent, never blocks): shutting a gloo group down waits for its
        pending operations, so after an aborted sync the waiter thread does it once the abandoned
        wait has ended (within ``timeout_s``)."""
        groups = [g for g in (getattr(self, "_roll", None), getattr(self, "_world", None)) if g is not None]
        self._roll = self._world = None
        self._store = None  # drops this endpoint's reference to the job's store (the host keeps its own)
        waiter = getattr(self, "_waiter", None)
        if waiter is None:
            _shutdown(groups)
            return
        try:
            waiter.submit(_shutdown, groups)
        except RuntimeError:  # already closed
            pass
        waiter.shutdown(wait=False)


def _shutdown(groups: list) -> None:
    for g in groups:
        try:
            g.shutdown()
        except Exception:  # pragma: no cover - best effort on teardown
            pass


class _NotifyingEvent(threading.Event):
    """``threading.Event`` that also wakes the endpoint's condition (an abort interrupts a wait)."""

    def __init__(self, cv: threading.Condition) -> None:
        super().__init__()
        self._wake = cv

    def set(self) -> None:
        super().set()
        with self._wake:
            self._wake.notify_all()
