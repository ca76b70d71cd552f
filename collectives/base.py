"""Executor interface for a :class:`rollmux.sync_plan.SyncPlan` and the backend registry.

One executor object is one *sync endpoint*: a training worker or a rollout worker of one job,
created once per job per worker process and kept alive across phases (RollMux §5.1: the control
plane, i.e. communicators, survives suspension). The same algorithm runs on every backend; a
backend only supplies the transport primitives (point-to-point send/recv across the world group,
broadcast inside the rollout group, a small all-reduce for votes, a key-value store for messages).

Protocol of one sync (RollMux §5.2, atomic variant):

1. *Pre-flight vote*: every endpoint checks its state dict against ``plan.tensors`` (names, shapes,
   dtypes) and the plan digest; any mismatch is refused on every rank with
   :class:`~rollmux.sync_plan.SyncMismatchError` before a weight byte moves.
2. *Data*: trainers stream their shards bucket by bucket (``flat``: to every rollout worker;
   ``topo``: to one receiver, which broadcasts each bucket inside the rollout cluster). Rollout
   workers write into a separate *staging* copy of the model, never into the live weights.
3. *Verify and commit*: each shard's sender sends a blake2b digest of the shard's bytes; every
   rollout worker checks the digest of what it staged; a world vote commits. Only then are staged
   weights returned (or copied into the live tensors). Any failure (peer death, timeout, digest
   mismatch, a negative vote) raises :class:`~rollmux.sync_plan.SyncAbortedError` and leaves the
   live weights untouched; the endpoint is then broken and must be re-created.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional

import torch

from rollmux.sync_plan import (
    Bucket,
    Role,
    SyncAbortedError,
    SyncError,
    SyncMismatchError,
    SyncPlan,
    SyncPlanError,
    compare_metas,
    metas_of,
)

log = logging.getLogger(__name__)

DIGEST_BYTES = 16
ABORT_POLL_S = 0.2  # how often a waiting endpoint looks for a peer's abort in the job's store
DIGEST_TAG_BASE = 1 << 24  # p2p tag of shard i's digest = base + i (bucket tags are below)


@dataclass(frozen=True)
class SyncStats:
    """What one sync did on this endpoint: wall time (s), bytes sent / received on this endpoint
    across the boundary and inside the rollout cluster, and the sync's sequence number."""

    seq: int
    wall_s: float
    cross_sent_bytes: int = 0
    cross_recv_bytes: int = 0
    intra_sent_bytes: int = 0
    intra_recv_bytes: int = 0


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """1-D ``uint8`` view of a contiguous tensor's byte image (a copy if ``t`` is not contiguous)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def host_store(host: str, *, timeout_s: float = 60.0) -> tuple[Any, str]:
    """Host a job's rendezvous store (a ``torch.distributed.TCPStore`` server) on ``host``.

    The server binds a port the kernel picks and the address is read back from the bound socket,
    so no other socket can take the port between choosing and binding it (choosing a "free" port
    first and binding it later races with every outgoing connection on the host, whose local ports
    come from the same range). Returns ``(store, "host:port")``: give ``store`` to the endpoint in
    this process and the address to the others; the store lives as long as a reference to it.
    Raises RuntimeError from torch when ``host`` is not an address of this machine.
    """
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(host, 0, world_size=None, is_master=True, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return store, f"{host}:{store.port}"


def open_job_store(addr: Optional[str], store: Any, *, prefix: str, timeout_s: float) -> Any:
    """The job's rendezvous store (``torch.distributed.PrefixStore`` under ``prefix``).

    Uses ``store`` when given, else connects as a client to the store already hosted at ``addr``
    (``"host:port"``, see :func:`host_store`). Raises :class:`SyncPlanError` when neither is
    given or ``addr`` is malformed, RuntimeError from torch when nothing answers within
    ``timeout_s`` seconds.
    """
    from datetime import timedelta

    import torch.distributed as dist

    td = timedelta(seconds=timeout_s)
    if store is None:
        if addr is None:
            raise SyncPlanError("addr: required when no store is given")
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SyncPlanError(f"addr: expected 'host:port' with a port in 1..65535, got {addr!r}")
        store = dist.TCPStore(host, int(port), world_size=None, is_master=False, timeout=td)
    prefixed = dist.PrefixStore(prefix, store)
    prefixed.set_timeout(td)
    return prefixed


class SyncExecutor(abc.ABC):
    """One endpoint (role ``"train"`` or ``"rollout"``, worker ``index``) of one job's weight sync.

    Subclasses implement the transport primitives below; :meth:`send` / :meth:`receive` are the
    public API (see ``collectives/__init__.py``). Ranks: trainer i = i, rollout j = N + j.

    Args:
        plan: the job's :class:`SyncPlan` (identical on every endpoint; checked by digest).
        role / index: this endpoint's worker.
        timeout_s: bound on any single wait, seconds.
        fault_after_buckets: fault injection for tests (RollMux has none in production): the
            endpoint raises after moving that many buckets of a sync, as if its process died.
    """

    backend: ClassVar[str] = ""
    # control plane: rollmux.phase_api keeps it alive in the worker process between phases (§5.1)
    rollmux_resident: ClassVar[bool] = True

    def __init__(self, plan: SyncPlan, role: Role, index: int, *, job_id: str, timeout_s: float = 60.0,
                 fault_after_buckets: Optional[int] = None) -> None:
        if role not in ("train", "rollout"):
            raise SyncPlanError(f"role: must be 'train' or 'rollout', got {role!r}")
        if timeout_s <= 0:
            raise SyncPlanError(f"timeout_s: must be > 0, got {timeout_s}")
        self.plan, self.role, self.index, self.job_id = plan, role, index, job_id
        self.rank = plan.global_rank(role, index)
        self.timeout_s = float(timeout_s)
        self.fault_after_buckets = fault_after_buckets
        self.seq = 0
        self.broken: Optional[str] = None
        self.aborted = threading.Event()  # set by :meth:`abort` (any thread): pending waits give up
        self.abort_reason: Optional[str] = None
        self._next_poll = 0.0  # monotonic time of the next poll of the store for a peer's abort
        self._staging: Optional[dict[str, torch.Tensor]] = None
        self._moved = 0
        self.last_stats: Optional[SyncStats] = None  # of the last successful sync on this endpoint

    # ---- transport primitives (backend-specific) ---------------------------------------------
    @abc.abstractmethod
    def _isend(self, buf: torch.Tensor, dst: int, tag: int) -> Any: ...

    @abc.abstractmethod
    def _irecv(self, buf: torch.Tensor, src: int, tag: int) -> Any: ...

    @abc.abstractmethod
    def _ibroadcast(self, buf: torch.Tensor, root_rollout: int) -> Any:
        """Broadcast ``buf`` from rollout worker ``root_rollout`` to the rollout group."""

    @abc.abstractmethod
    def _wait(self, handle: Any) -> None: ...

    @abc.abstractmethod
    def _allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` (int64, host) over the world group."""

    def _kv_set(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key`` in the job's rendezvous store (``self._store``)."""
        self._store.set(key, value)

    def _kv_get(self, key: str) -> str:
        """Read ``key`` from the job's rendezvous store (blocks until set, up to its timeout)."""
        return self._store.get(key).decode()

    def _empty(self, nbytes: int) -> torch.Tensor:
        """A ``uint8`` buffer on this backend's device."""
        return torch.empty(nbytes, dtype=torch.uint8, device=self._device())

    def _group_start(self) -> None:
        """Open a group of point-to-point calls issued together (NCCL: ncclGroupStart)."""

    def _group_end(self) -> None:
        """Close the group opened by :meth:`_group_start`."""

    @abc.abstractmethod
    def _abort(self) -> None:
        """Tear down communicators so that peers blocked on this endpoint fail fast."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release communicators (idempotent)."""

    def abort(self, reason: str) -> None:
        """Abort this endpoint from any thread (e.g. the runtime learnt that a peer of the sync
        died): the sync in progress here, if any, raises :class:`SyncAbortedError` naming
        ``reason`` within a fraction of a second instead of waiting ``timeout_s``; the rollout
        weights stay unchanged and the endpoint is broken (re-create the job's endpoints)."""
        if self.abort_reason is None:
            self.abort_reason = reason
        self.broken = self.broken or f"aborted: {reason}"
        self.aborted.set()

    def _publish_abort(self, seq: int, why: str) -> None:
        """Tell the job's other endpoints (through the store) that sync ``seq`` failed here, so
        that their pending waits give up at their next poll instead of waiting ``timeout_s``.
        The first reason published stays. Best effort: a dead store is a failure they see anyway."""
        key = f"abort/{seq}"
        try:
            if not self._store.check([key]):
                self._kv_set(key, why)
        except Exception:  # store gone (its host died): peers' own store polls fail too
            log.debug("abort publish failed", exc_info=True)

    def _peer_abort(self) -> Optional[str]:
        """Why another endpoint aborted the sync in progress, or None; polls the store at most
        every :data:`ABORT_POLL_S` seconds (an unreachable store counts as an abort)."""
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + ABORT_POLL_S
        key = f"abort/{self.seq}"
        try:
            if self._store.check([key]):
                return self._kv_get(key)
        except Exception as e:
            return f"the job's rendezvous store is unreachable ({type(e).__name__}: {e})"
        return None

    def _check_aborted(self) -> None:
        """Raise :class:`SyncAbortedError` when :meth:`abort` was called (backends call it while waiting)."""
        if not self.aborted.is_set():
            why = self._peer_abort()
            if why is None:
                return
            self.abort_reason = self.abort_reason or f"peer failed: {why}"
            self.aborted.set()
        raise SyncAbortedError(f"job {self.job_id}: sync {self.seq} aborted on {self.role} {self.index}: "
                               f"{self.abort_reason}; rollout weights unchanged")

    def _digest(self) -> Any:
        return hashlib.blake2b(digest_size=DIGEST_BYTES)

    def _hash_update(self, h: Any, buf: torch.Tensor) -> None:
        if buf.numel():
            h.update(memoryview(buf.detach().cpu().numpy()))

    # ---- public API ----------------------------------------------------------------------------
    def send(self, state_dict: Mapping[str, torch.Tensor]) -> SyncStats:
        """Trainer side: push this worker's shard(s) of ``state_dict`` (RollMux §5.2 step 1).

        ``state_dict`` must hold at least the tensors of this worker's shards with the plan's
        shapes and dtypes (other entries are ignored). Blocks until the job's rollout workers
        committed. Raises SyncMismatchError (refused before any byte moved) or SyncAbortedError.
        """
        if self.role != "train":
            raise SyncPlanError(f"send: endpoint is a {self.role} worker; only trainers send")
        mine = self.plan.tensors_of_shards(self.plan.shards_sent_by(self.index))
        local = {k: state_dict[k] for k in mine if k in state_dict}
        problems = compare_metas(self.plan.tensors, metas_of(local), subset=True)
        problems += [f"{n}: missing tensor (needed by shard of trainer {self.index})" for n in mine if n not in local]
        return self._run(problems, lambda: self._send_data(local))[1]

    def receive(self, state_dict: Mapping[str, torch.Tensor], *, in_place: bool = False) -> dict[str, torch.Tensor]:
        """Rollout side: receive the new weights; atomic (RollMux §5.2 step 2 + commit).

        Args:
            state_dict: the live rollout model's tensors (only read for metadata unless
                ``in_place``); it must match the plan's names, shapes and dtypes exactly.
            in_place: copy the committed weights into ``state_dict``'s tensors and return it;
                otherwise return a fresh dict of new tensors and leave ``state_dict`` untouched.
        Returns:
            state dict bit-identical to the trainers' weights.
        Raises:
            SyncMismatchError: metadata mismatch anywhere (nothing moved, nothing changed).
            SyncAbortedError: failure midway; ``state_dict`` still holds the previous weights.
        """
        if self.role != "rollout":
            raise SyncPlanError(f"receive: endpoint is a {self.role} worker; only rollout workers receive")
        problems = compare_metas(self.plan.tensors, metas_of(state_dict))
        staged, _ = self._run(problems, self._receive_data)
        if not in_place:
            self._staging = None  # handed to the caller; next sync stages into fresh buffers
            return staged
        with torch.no_grad():
            for k, t in state_dict.items():
                t.copy_(staged[k])
        return dict(state_dict)

    # ---- protocol ----------------------------------------------------------------------------
    def _run(self, problems: list[str], body: Callable[[], tuple[Any, SyncStats, list[str]]]) -> tuple[Any, SyncStats]:
        if self.broken:
            self._publish_abort(self.seq + 1, f"{self.role} {self.index}: endpoint is broken ({self.broken})")
            raise SyncAbortedError(f"job {self.job_id}: {self.role} {self.index}: endpoint is broken "
                                   f"({self.broken}); re-create the sync endpoints")
        self.seq += 1
        t0 = time.perf_counter()
        self._moved = 0
        try:
            self._vote("preflight", problems, SyncMismatchError)
            out, st, late = body()
            self._vote("commit", late, SyncAbortedError)
        except SyncMismatchError:
            self._staging = None
            raise
        except SyncError as e:
            self._fail(str(e))
            raise
        except Exception as e:  # transport errors (peer closed, timeout) from the backend
            self._fail(f"{type(e).__name__}: {e}")
            raise SyncAbortedError(f"job {self.job_id}: sync {self.seq} aborted on {self.role} {self.index}: "
                                   f"{type(e).__name__}: {e}; rollout weights unchanged") from e
        self.last_stats = SyncStats(self.seq, time.perf_counter() - t0, st.cross_sent_bytes, st.cross_recv_bytes,
                                    st.intra_sent_bytes, st.intra_recv_bytes)
        return out, self.last_stats

    def _fail(self, why: str) -> None:
        self.broken = why
        self._staging = None
        self._publish_abort(self.seq, f"{self.role} {self.index}: {why}")
        try:
            self._abort()
        except Exception:  # pragma: no cover - best effort
            log.debug("abort failed", exc_info=True)

    def _vote(self, stage: str, problems: list[str], exc: type[SyncError]) -> None:
        """World vote: every rank learns which ranks refused, and why (via the store)."""
        if problems:
            self._kv_set(f"{self.seq}/{stage}/{self.rank}", "; ".join(problems))
        flags = torch.zeros(self.plan.world_size, dtype=torch.int64)
        flags[self.rank] = 1 if problems else 0
        flags = self._allreduce_sum(flags)
        bad = [r for r in range(self.plan.world_size) if int(flags[r])]
        if bad:
            reasons = []
            for r in bad:
                who = f"train {r}" if r < self.plan.num_train else f"rollout {r - self.plan.num_train}"
                reasons.append(f"{who}: {self._kv_get(f'{self.seq}/{stage}/{r}')}")
            verb = "refused before any byte moved" if stage == "preflight" else "aborted at commit"
            raise exc(f"job {self.job_id}: sync {self.seq} {verb}: " + " | ".join(reasons))

    def _check_plan(self) -> None:
        """Called once by a backend after its communicators are up: every endpoint must hold
        the same plan (digest vote). Raises SyncMismatchError on every rank otherwise."""
        mine = self.plan.digest()
        self._kv_set(f"plan/{self.rank}", mine)
        ref = self._kv_get("plan/0")
        problems = [] if ref == mine else [f"plan digest {mine} differs from trainer 0's {ref}"]
        self._vote("plan", problems, SyncMismatchError)

    def _tick(self) -> None:
        self._moved += 1
        if self.fault_after_buckets is not None and self._moved > self.fault_after_buckets:
            raise SyncAbortedError(f"injected fault after {self.fault_after_buckets} buckets")

    # ---- data movement -------------------------------------------------------------------------
    def _bucket_view(self, flat: Mapping[str, torch.Tensor], b: Bucket) -> Optional[torch.Tensor]:
        if len(b.segments) == 1:
            s = b.segments[0]
            return flat[s.tensor][s.start:s.stop]
        return None

    def _pack(self, flat: Mapping[str, torch.Tensor], b: Bucket, buf: torch.Tensor) -> torch.Tensor:
        view = self._bucket_view(flat, b)
        if view is not None:
            return view
        pos = 0
        for s in b.segments:
            buf[pos:pos + s.nbytes].copy_(flat[s.tensor][s.start:s.stop])
            pos += s.nbytes
        return buf[:pos]

    def _unpack(self, flat: Mapping[str, torch.Tensor], b: Bucket, buf: torch.Tensor) -> None:
        if self._bucket_view(flat, b) is not None:
            return  # received in place
        pos = 0
        for s in b.segments:
            flat[s.tensor][s.start:s.stop].copy_(buf[pos:pos + s.nbytes])
            pos += s.nbytes

    def _send_data(self, local: Mapping[str, torch.Tensor]) -> tuple[None, SyncStats, list[str]]:
        plan = self.plan
        flat = {k: flat_bytes(v.to(self._device())) for k, v in local.items()}
        dsts_all = list(range(plan.num_rollout))
        bufs = [self._empty(plan.bucket_bytes), self._empty(plan.bucket_bytes)]
        sent = 0
        pending: list[Any] = []
        for shard in plan.shards_sent_by(self.index):
            dsts = [shard.receiver] if plan.scheme == "topo" else dsts_all
            h = self._digest()
            for k, b in enumerate(shard.buckets):
                self._tick()
                data = self._pack(flat, b, bufs[k % 2])
                self._hash_update(h, data)
                for w in pending:  # at most one bucket in flight while the next one is packed
                    self._wait(w)
                self._group_start()
                pending = [self._isend(data, plan.num_train + d, b.tag) for d in dsts]
                self._group_end()
                sent += data.numel() * len(dsts)
            for w in pending:
                self._wait(w)
            pending = []
            dig = torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8).to(self._device())
            for d in dsts:
                self._wait(self._isend(dig, plan.num_train + d, DIGEST_TAG_BASE + shard.index))
        return None, SyncStats(self.seq, 0.0, cross_sent_bytes=sent), []

    def _staging_for(self) -> dict[str, torch.Tensor]:
        if self._staging is None:
            dev = self._device()
            self._staging = {t.name: torch.empty(t.shape, dtype=getattr(torch, t.dtype), device=dev)
                             for t in self.plan.tensors}
        return self._staging

    def _receive_data(self) -> tuple[dict[str, torch.Tensor], SyncStats, list[str]]:
        plan = self.plan
        staging = self._staging_for()
        flat = {k: flat_bytes(v) for k, v in staging.items()}
        hashers = {s.index: self._digest() for s in plan.shards}
        cross = intra_s = intra_r = 0
        if plan.scheme == "flat":
            rounds = max(len(s.buckets) for s in plan.shards)
            bufs = {s.index: self._empty(plan.bucket_bytes) for s in plan.shards}
            for r in range(rounds):
                live = [(s, s.buckets[r]) for s in plan.shards if r < len(s.buckets)]
                self._tick()
                targets = []
                self._group_start()
                for s, b in live:
                    tgt = self._bucket_view(flat, b)
                    tgt = bufs[s.index][:b.nbytes] if tgt is None else tgt
                    targets.append((s, b, tgt, self._irecv(tgt, s.sender, b.tag)))
                self._group_end()
                for s, b, tgt, w in targets:
                    self._wait(w)
                    self._unpack(flat, b, tgt)
                    self._hash_update(hashers[s.index], tgt)
                    cross += b.nbytes
            expected = {}
            for s in plan.shards:
                dig = self._empty(DIGEST_BYTES)
                self._wait(self._irecv(dig, s.sender, DIGEST_TAG_BASE + s.index))
                expected[s.index] = bytes(dig.cpu().numpy())
        else:
            order = list(plan.broadcast_order) or [(s.index, b.seq) for s in plan.shards for b in s.buckets]
            mine = [(s, q) for s, q in order if plan.shards[s].receiver == self.index]
            bufs = [self._empty(plan.bucket_bytes), self._empty(plan.bucket_bytes)]
            posted: dict[tuple[int, int], tuple[torch.Tensor, Any]] = {}
            nxt = 0

            def post() -> None:  # keep one cross-cluster receive in flight ahead of the broadcasts
                nonlocal nxt
                if nxt < len(mine):
                    s, q = mine[nxt]
                    b = plan.shards[s].buckets[q]
                    tgt = self._bucket_view(flat, b)
                    tgt = bufs[nxt % 2][:b.nbytes] if tgt is None else tgt
                    posted[(s, q)] = (tgt, self._irecv(tgt, plan.shards[s].sender, b.tag))
                    nxt += 1

            post()
            for s, q in order:
                b = plan.shards[s].buckets[q]
                self._tick()
                root = plan.shards[s].receiver
                if root == self.index:
                    tgt, w = posted.pop((s, q))
                    self._wait(w)
                    post()
                    cross += b.nbytes
                    if plan.num_rollout > 1:
                        self._wait(self._ibroadcast(tgt, root))
                        intra_s += b.nbytes * (plan.num_rollout - 1)
                else:
                    tgt = self._bucket_view(flat, b)
                    if tgt is None:  # the buffer the in-flight cross-cluster receive is not using
                        tgt = bufs[nxt % 2][:b.nbytes]
                    self._wait(self._ibroadcast(tgt, root))
                    intra_r += b.nbytes
                self._unpack(flat, b, tgt)
                self._hash_update(hashers[s], tgt)
            digs: dict[int, torch.Tensor] = {}
            for s in plan.shards_received_by(self.index):
                digs[s.index] = self._empty(DIGEST_BYTES)
                self._wait(self._irecv(digs[s.index], s.sender, DIGEST_TAG_BASE + s.index))
            expected = {}
            for s in plan.shards:
                dig = digs.get(s.index)
                if dig is None:
                    dig = self._empty(DIGEST_BYTES)
                if plan.num_rollout > 1:
                    self._wait(self._ibroadcast(dig, s.receiver))
                expected[s.index] = bytes(dig.cpu().numpy())
        bad = [i for i, h in hashers.items() if h.digest() != expected[i]]
        late = [f"checksum mismatch on shards {bad}"] if bad else []
        return staging, SyncStats(self.seq, 0.0, cross_recv_bytes=cross, intra_sent_bytes=intra_s,
                                  intra_recv_bytes=intra_r), late

    def _device(self) -> torch.device:
        return torch.device("cpu")


_REGISTRY: dict[str, type[SyncExecutor]] = {}


def register(name: str) -> Callable[[type[SyncExecutor]], type[SyncExecutor]]:
    """Class decorator: register an executor under backend ``name`` (e.g. ``"gloo"``, ``"nccl"``)."""

    def deco(cls: type[SyncExecutor]) -> type[SyncExecutor]:
        cls.backend = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_executor(backend: str) -> type[SyncExecutor]:
    """Executor class for ``backend``. Raises SyncPlanError naming the known backends."""
    if backend not in _REGISTRY:
        raise SyncPlanError(f"backend: unknown sync backend {backend!r} (known: {sorted(_REGISTRY)})")
    return _REGISTRY[backend]


def backends() -> list[str]:
    return sorted(_REGISTRY)
