"""Topology-aware weight-sync *plan*: who sends which bytes of the model to whom (pure, no I/O).

After each training phase a job's updated weights move from its training workers (training
cluster, e.g. H800) to its rollout workers (rollout cluster, e.g. H20). The two clusters are
joined by a slow cross-cluster link (paper: 20 Gbps Ethernet) while each cluster has a fast
internal fabric (400 Gbps InfiniBand). RollMux §5.2 ("topology-aware model sync", Fig. 8):

1. *Cross-cluster scatter*: split the model into N disjoint shards (N = training workers); each
   training worker sends its shard point-to-point to one rollout worker, so exactly one model copy
   crosses the slow link.
2. *Intra-cluster broadcast*: each receiving rollout worker broadcasts its shard to every other
   rollout worker over the fast fabric.

The *flat* baseline (veRL-style all-gather / broadcast over one flat group) makes every rollout
worker pull a full copy across the boundary: M copies for M rollout workers.

This module works on tensor *metadata* only (name, shape, dtype, nbytes); the executors in
``collectives/`` run a plan over gloo (CPU) or cupy-NCCL (GPU). Bytes are addressed in each tensor's
flat (row-major, contiguous) byte image, so a large tensor can be cut at any byte offset.
Tensors move in *buckets* of at most ``bucket_bytes`` so the transit memory is bounded.

Rank layout used by every executor: training worker ``i`` is global rank ``i`` (0..N-1), rollout
worker ``j`` is global rank ``N + j``.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Optional

Scheme = Literal["topo", "flat"]
Role = Literal["train", "rollout"]

DEFAULT_BUCKET_BYTES = 32 * 1024 * 1024


# ----------------------------------------------------------------------------------------- errors
# sync transports a job may ask for (rollmux.Job(sync_backend=...)); collectives.select picks for "auto"
#: weight transports a job may ask for; ``"counted"``: the plan's bytes are counted, not moved
#: (emulated accelerators, docs/EMULATION.md)
SYNC_BACKENDS = ("auto", "nccl", "gloo", "object_store", "counted")


class SyncError(RuntimeError):
    """Base class of weight-sync failures (RollMux §5.2). Rollout weights are left unchanged."""


class SyncPlanError(SyncError, ValueError):
    """Invalid plan input (layout, tensor metadata, bucket size); the message names the field."""


class SyncMismatchError(SyncError, ValueError):
    """Trainer and rollout models (or plans) disagree on names / shapes / dtypes.

    Raised before any weight byte moves.
    """


class SyncAbortedError(SyncError):
    """A sync failed midway (peer died, timeout, checksum mismatch).

    Every rollout worker keeps its previous complete weights (staged buffers are discarded).
    """


# --------------------------------------------------------------------------------------- metadata
@dataclass(frozen=True)
class TensorMeta:
    """Metadata of one model tensor.

    Attributes:
        name: state-dict key.
        shape: tensor shape.
        dtype: dtype name as ``str(torch_dtype)`` without the ``torch.`` prefix (e.g. ``"bfloat16"``).
        nbytes: size of the tensor's contiguous byte image, bytes (= numel x element size).
    Raises:
        SyncPlanError: empty name, negative dims or nbytes.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def __post_init__(self) -> None:
        if not self.name:
            raise SyncPlanError("tensors[].name: must be non-empty")
        if any(int(d) < 0 for d in self.shape):
            raise SyncPlanError(f"tensors[{self.name}].shape: negative dimension in {self.shape}")
        if self.nbytes < 0:
            raise SyncPlanError(f"tensors[{self.name}].nbytes: must be >= 0, got {self.nbytes}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @staticmethod
    def of(name: str, tensor: Any) -> "TensorMeta":
        """Metadata of a torch-like tensor (duck-typed: ``shape``, ``dtype``, ``numel()``,
        ``element_size()``); no torch import here."""
        dtype = str(tensor.dtype).removeprefix("torch.")
        return TensorMeta(name, tuple(tensor.shape), dtype, int(tensor.numel()) * int(tensor.element_size()))


def metas_of(state_dict: Mapping[str, Any]) -> tuple[TensorMeta, ...]:
    """Metadata of every tensor of a state dict, in its iteration order."""
    return tuple(TensorMeta.of(k, v) for k, v in state_dict.items())


def compare_metas(expected: Iterable[TensorMeta], actual: Iterable[TensorMeta], *,
                  subset: bool = False) -> list[str]:
    """Differences between two tensor lists (names, shapes, dtypes); empty list when they agree.

    ``subset=True`` accepts ``actual`` holding only some of the expected tensors (a trainer may
    pass just the tensors of its own shard). Order does not matter.
    """
    exp = {m.name: m for m in expected}
    act = {m.name: m for m in actual}
    problems: list[str] = []
    for name, a in act.items():
        e = exp.get(name)
        if e is None:
            problems.append(f"{name}: unexpected tensor (not in the trainer's model)")
        elif (e.shape, e.dtype, e.nbytes) != (a.shape, a.dtype, a.nbytes):
            problems.append(f"{name}: expected shape {e.shape} dtype {e.dtype}, got shape {a.shape} dtype {a.dtype}")
    if not subset:
        problems += [f"{n}: missing tensor" for n in exp if n not in act]
    return problems


# ------------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class ParallelLayout:
    """Worker layout of one side: ``tp`` x ``dp`` workers (GPUs), i.e. ``workers = tp * dp``.

    Each worker takes part in the sync as one endpoint; every rollout worker ends with a full copy.
    """

    tp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for f in ("tp", "dp"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise SyncPlanError(f"layout.{f}: must be an integer >= 1, got {v!r}")

    @property
    def workers(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True)
class Segment:
    """Bytes ``[start, stop)`` of tensor ``tensor``'s flat byte image."""

    tensor: str
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Bucket:
    """One message of the data plane: consecutive segments of one shard, <= ``bucket_bytes``.

    ``seq`` is the bucket's position inside its shard; ``tag`` is unique in the plan (p2p tag).
    """

    shard: int
    seq: int
    tag: int
    segments: tuple[Segment, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)


@dataclass(frozen=True)
class Shard:
    """A disjoint part of the model sent by training worker ``sender``.

    ``receiver`` is the rollout worker that takes it across the boundary (topo scheme); ``None`` in
    the flat scheme, where every rollout worker receives it directly from ``sender``.
    """

    index: int
    sender: int
    receiver: Optional[int]
    segments: tuple[Segment, ...]
    buckets: tuple[Bucket, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)


@dataclass(frozen=True)
class LinkModel:
    """Link bandwidths for the predicted sync time (RollMux §6.1: 20 Gbps cross, 400 Gbps intra).

    Attributes:
        cross_gbps: the one shared cross-cluster link, Gbit/s (all cross traffic shares it).
        intra_gbps: rollout-cluster fabric, Gbit/s; per worker NIC (each worker's egress and
            ingress) unless ``intra_shared``, where all intra-cluster bytes share one link of that
            rate (e.g. the loopback of one network namespace in ``scripts/bench_sync.py``).
        latency_s: per-bucket fixed cost on each stage, seconds.
    """

    cross_gbps: float
    intra_gbps: float
    intra_shared: bool = False
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.cross_gbps > 0:
            raise SyncPlanError(f"links.cross_gbps: must be > 0, got {self.cross_gbps}")
        if not self.intra_gbps > 0:
            raise SyncPlanError(f"links.intra_gbps: must be > 0, got {self.intra_gbps}")
        if self.latency_s < 0:
            raise SyncPlanError(f"links.latency_s: must be >= 0, got {self.latency_s}")


@dataclass(frozen=True)
class SyncPrediction:
    """Predicted sync time, seconds: ``cross_s`` on the slow link, ``intra_s`` on the fabric and
    ``total_s`` for the bucket-pipelined two-stage transfer."""

    cross_s: float
    intra_s: float
    total_s: float


@dataclass(frozen=True)
class SyncPlan:
    """A complete weight-sync plan for one job (RollMux §5.2, Fig. 8).

    Attributes:
        scheme: ``"topo"`` (scatter across, broadcast within) or ``"flat"`` (every rollout worker
            pulls a full copy across the boundary).
        train / rollout: worker layouts; N = ``train.workers`` shards, M = ``rollout.workers``.
        tensors: the model's tensor metadata (trainer side), canonical order.
        shards: N disjoint shards covering every byte of every tensor exactly once.
        bucket_bytes: max message size, bytes.
        broadcast_order: (shard, seq) of every bucket in the order the rollout cluster broadcasts
            them (round-robin over shards so receivers overlap); empty for ``flat``.
    """

    scheme: Scheme
    train: ParallelLayout
    rollout: ParallelLayout
    tensors: tuple[TensorMeta, ...]
    shards: tuple[Shard, ...]
    bucket_bytes: int
    broadcast_order: tuple[tuple[int, int], ...] = field(default=())

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def num_train(self) -> int:
        return self.train.workers

    @property
    def num_rollout(self) -> int:
        return self.rollout.workers

    @property
    def world_size(self) -> int:
        return self.num_train + self.num_rollout

    @property
    def model_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def global_rank(self, role: Role, index: int) -> int:
        """Global rank of ``role`` worker ``index`` (trainers first, then rollout workers).

        Raises SyncPlanError when ``index`` is out of range."""
        n = self.num_train if role == "train" else self.num_rollout
        if role not in ("train", "rollout") or not 0 <= index < n:
            raise SyncPlanError(f"endpoint: no {role} worker {index} in a {self.num_train}->{self.num_rollout} plan")
        return index if role == "train" else self.num_train + index

    def shards_sent_by(self, train_index: int) -> tuple[Shard, ...]:
        return tuple(s for s in self.shards if s.sender == train_index)

    def shards_received_by(self, rollout_index: int) -> tuple[Shard, ...]:
        """Shards that rollout worker ``rollout_index`` takes across the boundary (topo)."""
        return tuple(s for s in self.shards if s.receiver == rollout_index)

    def tensors_of_shards(self, shards: Iterable[Shard]) -> tuple[str, ...]:
        names = {seg.tensor for s in shards for seg in s.segments}
        return tuple(t.name for t in self.tensors if t.name in names)

    # -- traffic -------------------------------------------------------------------------------
    @property
    def cross_bytes(self) -> int:
        """Bytes crossing the cluster boundary: one model copy (topo) or M copies (flat)."""
        copies = 1 if self.scheme == "topo" else self.num_rollout
        return copies * self.model_bytes

    def intra_link_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes on each directed intra-rollout-cluster link ``(src, dst)`` (rollout indices)."""
        out: dict[tuple[int, int], int] = {}
        if self.scheme != "topo":
            return out
        for s in self.shards:
            for dst in range(self.num_rollout):
                if dst != s.receiver:
                    out[(s.receiver, dst)] = out.get((s.receiver, dst), 0) + s.nbytes
        return out

    def received_bytes(self) -> list[int]:
        """Bytes each rollout worker takes across the boundary (topo; all zero for flat), length M."""
        out = [0] * self.num_rollout
        if self.scheme == "topo":
            for s in self.shards:
                out[s.receiver] += s.nbytes
        return out

    @property
    def intra_bytes(self) -> int:
        """Total intra-cluster bytes: (M - 1) model copies for topo, 0 for flat."""
        return (self.num_rollout - 1) * self.model_bytes if self.scheme == "topo" else 0

    def cross_link_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes of each (train sender, rollout receiver) stream across the boundary."""
        out: dict[tuple[int, int], int] = {}
        for s in self.shards:
            dsts = [s.receiver] if self.scheme == "topo" else range(self.num_rollout)
            for d in dsts:
                out[(s.sender, d)] = out.get((s.sender, d), 0) + s.nbytes
        return out

    def predict(self, links: LinkModel) -> SyncPrediction:
        """Predicted sync time from link bandwidths (bytes / rate; RollMux §5.2).

        Cross stage: ``cross_bytes`` over the one shared cross-cluster link. Intra stage: the
        busiest rollout NIC (or, with ``intra_shared``, all intra bytes over one link). The two
        stages are pipelined bucket by bucket: with B bucket rounds, total = max + min / B
        (a two-stage pipeline of B equal steps), plus ``latency_s`` per round.
        """
        cross_s = self.cross_bytes * 8 / (links.cross_gbps * 1e9)
        if links.intra_shared:
            intra_b = self.intra_bytes
        elif self.scheme != "topo" or self.num_rollout < 2:
            intra_b = 0
        else:
            # per-NIC totals of intra_link_bytes() in O(N + M): a receiver sends each shard it
            # took to the M - 1 others (egress) and takes every shard it did not receive (ingress)
            got = self.received_bytes()
            m = self.num_rollout
            intra_b = max(max(g * (m - 1) for g in got), max(self.model_bytes - g for g in got))
        intra_s = intra_b * 8 / (links.intra_gbps * 1e9)
        rounds = max((len(s.buckets) for s in self.shards), default=1) or 1
        if self.scheme == "flat" or intra_s == 0:
            total = cross_s
        else:
            total = max(cross_s, intra_s) + min(cross_s, intra_s) / rounds
        return SyncPrediction(cross_s, intra_s, total + links.latency_s * rounds)

    def digest(self) -> str:
        """Stable hex digest of the plan; every endpoint of a job must hold the same plan."""
        h = hashlib.blake2b(digest_size=16)
        h.update(repr((self.scheme, self.train, self.rollout, self.tensors, self.bucket_bytes,
                       [(s.index, s.sender, s.receiver, s.segments) for s in self.shards])).encode())
        return h.hexdigest()

    def summary(self) -> dict:
        """JSON-able summary: layout, bytes across the boundary and within, shard sizes."""
        sizes = [s.nbytes for s in self.shards]
        return {
            "scheme": self.scheme, "train_workers": self.num_train, "rollout_workers": self.num_rollout,
            "model_bytes": self.model_bytes, "cross_bytes": self.cross_bytes, "intra_bytes": self.intra_bytes,
            "cross_copies": self.cross_bytes / self.model_bytes if self.model_bytes else 0.0,
            "shard_bytes": sizes, "buckets": sum(len(s.buckets) for s in self.shards),
            "bucket_bytes": self.bucket_bytes,
        }


# -------------------------------------------------------------------------------------- builder
def _split_contiguous(tensors: tuple[TensorMeta, ...], n: int) -> list[list[Segment]]:
    """Cut the model's concatenated byte image into ``n`` contiguous parts of equal size (±1 byte);
    tensors straddling a boundary are split by byte range."""
    total = sum(t.nbytes for t in tensors)
    bounds = [(total * k) // n for k in range(n + 1)]
    parts: list[list[Segment]] = [[] for _ in range(n)]
    off = 0
    k = 0
    for t in tensors:
        pos = 0
        while pos < t.nbytes:
            while bounds[k + 1] <= off + pos:
                k += 1
            take = min(t.nbytes - pos, bounds[k + 1] - (off + pos))
            parts[k].append(Segment(t.name, pos, pos + take))
            pos += take
        off += t.nbytes
    return parts


def _split_greedy(tensors: tuple[TensorMeta, ...], n: int) -> list[list[Segment]]:
    """Whole tensors, largest first, each onto the least-loaded shard (LPT greedy). Shards may be
    uneven (a tensor larger than total / n makes its shard larger); some may be empty."""
    heap = [(0, k) for k in range(n)]
    parts: list[list[Segment]] = [[] for _ in range(n)]
    for t in sorted(tensors, key=lambda t: (-t.nbytes, t.name)):
        load, k = heapq.heappop(heap)
        if t.nbytes:  # empty tensors carry no bytes; metadata checks still cover them
            parts[k].append(Segment(t.name, 0, t.nbytes))
        heapq.heappush(heap, (load + t.nbytes, k))
    order = {t.name: i for i, t in enumerate(tensors)}
    return [sorted(p, key=lambda s: order[s.tensor]) for p in parts]


def _bucketize(shard: int, segments: list[Segment], bucket_bytes: int, tag0: int) -> list[Bucket]:
    buckets: list[Bucket] = []
    cur: list[Segment] = []
    room = bucket_bytes
    for seg in segments:
        pos = seg.start
        while pos < seg.stop:
            take = min(room, seg.stop - pos)
            cur.append(Segment(seg.tensor, pos, pos + take))
            pos += take
            room -= take
            if room == 0:
                buckets.append(Bucket(shard, len(buckets), tag0 + len(buckets), tuple(cur)))
                cur, room = [], bucket_bytes
    if cur:
        buckets.append(Bucket(shard, len(buckets), tag0 + len(buckets), tuple(cur)))
    return buckets


def build_plan(tensors: Iterable[TensorMeta], train: ParallelLayout | int, rollout: ParallelLayout | int, *,
               scheme: Scheme = "topo", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
               split_tensors: bool = True) -> SyncPlan:
    """Build the sync plan of one job (RollMux §5.2, Fig. 8).

    Args:
        tensors: the trainer model's tensor metadata (e.g. :func:`metas_of`), canonical order.
        train: training layout (TP x DP) or its worker count N; N shards, shard i sent by trainer i.
        rollout: rollout layout or its worker count M.
        scheme: ``"topo"`` (one copy across, then broadcast inside the rollout cluster) or
            ``"flat"`` (every rollout worker pulls every shard across: M copies).
        bucket_bytes: max bytes per message (bounds the transit memory), > 0.
        split_tensors: True cuts the model's byte image into N equal contiguous shards (tensors
            split by byte range); False assigns whole tensors greedily by bytes (uneven shards).
    Receivers: shard i goes to rollout worker ``i mod M`` (round-robin), so with M < N some
    receivers take several shards and with M > N only the first N rollout workers receive across.
    Raises:
        SyncPlanError: no tensors, duplicate names, bad layout, scheme or bucket size.
    """
    tensors = tuple(tensors)
    train = ParallelLayout(dp=train) if isinstance(train, int) else train
    rollout = ParallelLayout(dp=rollout) if isinstance(rollout, int) else rollout
    if scheme not in ("topo", "flat"):
        raise SyncPlanError(f"scheme: must be 'topo' or 'flat', got {scheme!r}")
    if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise SyncPlanError(f"bucket_bytes: must be an integer > 0, got {bucket_bytes!r}")
    if not tensors:
        raise SyncPlanError("tensors: the model has no tensors")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SyncPlanError(f"tensors: duplicate tensor names {dup}")
    n, m = train.workers, rollout.workers
    parts = _split_contiguous(tensors, n) if split_tensors else _split_greedy(tensors, n)
    shards = []
    tag = 0
    for i, segs in enumerate(parts):
        buckets = _bucketize(i, segs, bucket_bytes, tag)
        tag += len(buckets)
        shards.append(Shard(i, i, (i % m) if scheme == "topo" else None, tuple(segs), tuple(buckets)))
    order: tuple[tuple[int, int], ...] = ()
    if scheme == "topo" and m > 1:
        rounds = max(len(s.buckets) for s in shards)
        order = tuple((s.index, r) for r in range(rounds) for s in shards if r < len(s.buckets))
    return SyncPlan(scheme, train, rollout, tensors, tuple(shards), bucket_bytes, order)


def max_imbalance(plan: SyncPlan) -> float:
    """Largest shard over the mean shard size (1.0 = perfectly balanced)."""
    mean = plan.model_bytes / plan.num_train
    return max(s.nbytes for s in plan.shards) / mean if mean else 1.0


def shard_bound_bytes(plan: SyncPlan) -> int:
    """Upper bound on any shard's size for the balanced split: ceil(model_bytes / N)."""
    return math.ceil(plan.model_bytes / plan.num_train)
