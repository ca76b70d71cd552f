"""GPU executor of a sync plan over cupy-NCCL (``cupy.cuda.nccl``); import-guarded.

Same algorithm as the gloo executor (:class:`collectives.base.SyncExecutor`), on CUDA tensors:
point-to-point ``send``/``recv`` over a *world* communicator (N trainers + M rollout workers; the
cross-cluster scatter of RollMux §5.2) and ``bcast`` over a *rollout* communicator (the
intra-cluster broadcast). Communicators are created once per job (``ncclCommInitRank`` through
``NcclCommunicator(ndev, unique_id, rank)``) and kept alive across phases (RollMux §5.1); the
unique ids are exchanged through the job's ``torch.distributed.TCPStore`` (:func:`collectives.base.host_store`).

Each communicator has its own CUDA stream; a handle is a CUDA event recorded after the call and
waited on by polling (bounded by ``timeout_s``, interrupted by
:meth:`~collectives.base.SyncExecutor.abort`; on timeout or abort the communicators are aborted
with ``ncclCommAbort`` so peers fail too). Shard digests are computed on host copies of each bucket
(correct, not the fastest path). Needs ``cupy-cuda13x`` (``pip install rollmux[gpu]``) and a GPU;
otherwise constructing the executor raises :class:`~rollmux.sync_plan.SyncError`.
"""

from __future__ import annotations

import pickle
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from collectives.base import SyncExecutor, open_job_store, register
from rollmux.sync_plan import Role, SyncAbortedError, SyncError, SyncPlan

try:  # GPU-only dependency
    from cupy.cuda import nccl  # type: ignore[import-not-found]
except Exception as _e:  # pragma: no cover - depends on the machine
    nccl = None
    _IMPORT_ERROR: Optional[str] = f"{type(_e).__name__}: {_e}"
else:
    _IMPORT_ERROR = None


def available() -> tuple[bool, str]:
    """Whether this machine can run the NCCL executor, and why not. CuPy 13/14 import
    ``cupy.cuda.nccl`` even where the NCCL library is missing; ``cupy.cuda.nccl.available`` says
    whether it loaded."""
    if nccl is None:
        return False, f"cupy.cuda.nccl not importable ({_IMPORT_ERROR}); install rollmux[gpu]"
    if not getattr(nccl, "available", False):
        return False, "cupy.cuda.nccl.available is False (CuPy found no NCCL library)"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, "ok"


class _Handle:
    """Completion handle of a call issued inside an NCCL group (its event exists after groupEnd)."""

    ev: Any = None

    def query(self) -> bool:
        return self.ev is not None and self.ev.query()


@register("nccl")
class NcclExecutor(SyncExecutor):
    """Sync endpoint over cupy-NCCL (CUDA tensors on ``device``, default the current device).

    Args: as :class:`collectives.gloo_executor.GlooExecutor` (``addr`` of the job's hosted TCP store
    or the ``store`` itself, ``job_id``, ``timeout_s``), plus ``device`` (CUDA device index). ``bind_host`` /
    ``interface`` are accepted for a uniform endpoint signature: NCCL picks its own interfaces
    (``NCCL_SOCKET_IFNAME``); the store listens on ``addr``.
    Raises:
        SyncError: cupy-NCCL or CUDA missing. SyncMismatchError: endpoints hold different plans.
    """

    def __init__(self, plan: SyncPlan, role: Role, index: int, *, addr: Optional[str] = None, job_id: str,
                 timeout_s: float = 60.0, device: Optional[int] = None, store: Optional[dist.Store] = None,
                 fault_after_buckets: Optional[int] = None, bind_host: Optional[str] = None,
                 interface: Optional[str] = None) -> None:
        ok, why = available()
        if not ok:
            raise SyncError(f"nccl sync backend unavailable: {why}")
        super().__init__(plan, role, index, job_id=job_id, timeout_s=timeout_s,
                         fault_after_buckets=fault_after_buckets)

        if device is not None:
            torch.cuda.set_device(device)
        self._dev = torch.device("cuda", torch.cuda.current_device())
        self._grouped: Optional[list] = None
        self._store = open_job_store(addr, store, prefix=f"rollmux-sync-nccl/{job_id}/",
                                     timeout_s=self.timeout_s)
        self._world = self._communicator("world", self.rank, plan.world_size, creator=self.rank == 0)
        self._roll = None
        if role == "rollout" and plan.num_rollout > 1:
            self._roll = self._communicator("rollout", index, plan.num_rollout, creator=index == 0)
        self._s_world = torch.cuda.Stream(device=self._dev)
        self._s_roll = torch.cuda.Stream(device=self._dev)
        self._check_plan()

    def _communicator(self, name: str, rank: int, size: int, creator: bool) -> Any:
        key = f"uid/{name}"
        if creator:
            self._store.set(key, pickle.dumps(nccl.get_unique_id()).hex())
        uid = pickle.loads(bytes.fromhex(self._store.get(key).decode()))
        with torch.cuda.device(self._dev):
            return nccl.NcclCommunicator(size, uid, rank)

    # ---- primitives ----------------------------------------------------------------------------
    def _enqueue(self, stream: torch.cuda.Stream, call: Any) -> Any:
        stream.wait_stream(torch.cuda.current_stream(self._dev))  # buffers were written on the compute stream
        with torch.cuda.stream(stream):
            call(stream.cuda_stream)
            if self._grouped is not None:  # grouped calls are launched at groupEnd: record then
                h = _Handle()
                self._grouped.append((h, stream))
                return h
            ev = torch.cuda.Event()
            ev.record(stream)
        return ev

    def _isend(self, buf: torch.Tensor, dst: int, tag: int) -> Any:
        return self._enqueue(self._s_world, lambda s: self._world.send(buf.data_ptr(), buf.numel(),
                                                                       nccl.NCCL_UINT8, dst, s))

    def _irecv(self, buf: torch.Tensor, src: int, tag: int) -> Any:
        return self._enqueue(self._s_world, lambda s: self._world.recv(buf.data_ptr(), buf.numel(),
                                                                       nccl.NCCL_UINT8, src, s))

    def _ibroadcast(self, buf: torch.Tensor, root_rollout: int) -> Any:
        assert self._roll is not None
        return self._enqueue(self._s_roll, lambda s: self._roll.bcast(buf.data_ptr(), buf.numel(),
                                                                      nccl.NCCL_UINT8, root_rollout, s))

    def _group_start(self) -> None:
        nccl.groupStart()
        self._grouped = []

    def _group_end(self) -> None:
        nccl.groupEnd()
        grouped, self._grouped = self._grouped or [], None
        for h, stream in grouped:
            h.ev = torch.cuda.Event()
            h.ev.record(stream)

    def _wait(self, handle: Any) -> None:
        deadline = time.monotonic() + self.timeout_s
        delay = 1e-5
        while not handle.query():  # bounded polling: NCCL calls have no timeout of their own
            self._check_aborted()  # abort() from another thread, or a peer published its failure
            if time.monotonic() > deadline:
                raise SyncAbortedError(f"NCCL operation timed out after {self.timeout_s} s")
            for comm in (self._world, self._roll):
                if comm is not None:
                    comm.check_async_error()
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def _allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        d = t.to(self._dev)
        self._wait(self._enqueue(self._s_world, lambda s: self._world.allReduce(
            d.data_ptr(), d.data_ptr(), d.numel(), nccl.NCCL_INT64, nccl.NCCL_SUM, s)))
        return d.cpu()

    def _device(self) -> torch.device:
        return self._dev

    def _abort(self) -> None:
        for comm in (self._world, self._roll):
            if comm is not None:
                comm.abort()
        self._world = self._roll = None

    def close(self) -> None:
        for name in ("_roll", "_world"):
            comm = getattr(self, name, None)
            if comm is not None:
                comm.destroy()
                setattr(self, name, None)
        self._store = None
