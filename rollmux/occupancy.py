"""Busy and dependency-bubble ratios of GPU pools, computed from phase records.

One definition, used by the simulator summary, the runtime metrics and the runtime demo alike
(RollMux §2 "dependency bubble", §7.4 bubble ratios):

* **GPU-weighted.** A GPU idles unless a phase uses it: a record that uses ``gpus`` of a node's
  ``G`` GPUs keeps ``gpus`` busy, the other ``G - gpus`` idle (a 4-GPU job on an 8-GPU node
  leaves half the node idle). A record without a GPU count uses the whole node.
* **Union of busy intervals.** Overlapping records on one node are not summed past the node: at
  every instant a node's busy GPUs are ``min(G, sum of the running records' GPUs)``. So a long
  tail and the next rollout that run side by side after long-tail migration (RollMux §4.3) are
  busy time once, not twice.
* **Whole lifetime.** Ratios are taken over a window that the caller gives (default: first
  start to last end of the records), so warm-up (the first rollout, training idle) and drain
  (the last training, rollout idle) count; nodes without any record count as idle throughout.

``busy_ratio = busy GPU-seconds / (GPUs x window)`` and ``bubble_ratio = 1 - busy_ratio`` per
pool (``"rollout"``, ``"train"``; sync runs on the training pool).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

POOLS = ("rollout", "train")


@dataclass(frozen=True)
class PoolOccupancy:
    """One pool over a window: busy and provisioned GPU-seconds.

    Attributes:
        busy_gpu_s: GPU-seconds some phase used (union per node, GPU-weighted).
        capacity_gpu_s: provisioned GPU-seconds (the pool's GPUs x window length).
    """

    busy_gpu_s: float
    capacity_gpu_s: float

    @property
    def busy_ratio(self) -> float:
        """Busy fraction in [0, 1] (0 when nothing is provisioned)."""
        return self.busy_gpu_s / self.capacity_gpu_s if self.capacity_gpu_s > 0 else 0.0

    @property
    def bubble_ratio(self) -> float:
        """Idle (dependency-bubble) fraction, ``1 - busy_ratio`` (0 when nothing is provisioned)."""
        return 1.0 - self.busy_ratio if self.capacity_gpu_s > 0 else 0.0


def _field(r: Any, name: str, default=None):
    if isinstance(r, Mapping):
        return r.get(name, default)
    return getattr(r, name, default)


class BusyCurve:
    """Cumulative busy GPU-seconds of each pool as a function of time, from phase records.

    Built once (one sweep over the records per node), then :meth:`busy_gpu_s` answers any
    window in O(log n). Records are objects or dicts with ``pool``, ``node``, ``start_s``,
    ``end_s`` and optionally ``gpus`` (GPUs of that node the phase uses; ``None`` = all).

    Args:
        records: the phase records (e.g. :class:`rollmux.intra_group.PhaseRecord`).
        nodes: provisioned GPUs per node of each pool, ``{"rollout": {"rollout-0": 8}, ...}``.
            Pools missing from the mapping have no nodes.
    Raises:
        ValueError: a record on a node that is not in ``nodes``, an unknown pool, a negative
            GPU count or a record that ends before it starts.
    """

    def __init__(self, records: Iterable[Any], nodes: Mapping[str, Mapping[str, float]]) -> None:
        self.nodes = {p: dict(nodes.get(p, {})) for p in POOLS}
        for p, nm in nodes.items():
            if p not in POOLS:
                raise ValueError(f"unknown pool {p!r} (known: {', '.join(POOLS)})")
            for n, g in nm.items():
                if not g > 0:
                    raise ValueError(f"node {n!r} of pool {p!r}: GPU count must be > 0, got {g}")
        deltas: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in records:
            if isinstance(r, dict) or not hasattr(r, "start_s"):
                pool, node = _field(r, "pool"), _field(r, "node")
                s, e, g = float(_field(r, "start_s")), float(_field(r, "end_s")), _field(r, "gpus")
            else:  # a record object (the common case: PhaseRecord); no Mapping check per record
                pool, node, s, e, g = r.pool, r.node, float(r.start_s), float(r.end_s), getattr(r, "gpus", None)
            if pool not in POOLS:
                raise ValueError(f"record of pool {pool!r}: unknown pool (known: {', '.join(POOLS)})")
            if node not in self.nodes[pool]:
                raise ValueError(f"record on node {node!r} of pool {pool!r}, which is not provisioned")
            if e < s:
                raise ValueError(f"record on node {node!r} ends ({e}) before it starts ({s})")
            g = self.nodes[pool][node] if g is None else float(g)
            if g < 0:
                raise ValueError(f"record on node {node!r}: gpus must be >= 0, got {g}")
            if e > s and g > 0:
                deltas.setdefault((pool, node), []).extend(((s, g), (e, -g)))
        self._build(deltas)

    @classmethod
    def from_deltas(cls, deltas: dict[tuple[str, str], list[tuple[float, float]]],
                    nodes: Mapping[str, Mapping[str, float]]) -> "BusyCurve":
        """The curve from per-node busy-GPU changes, without per-record checks: ``deltas[(pool,
        node)]`` lists ``(start_s, +gpus)`` and ``(end_s, -gpus)`` of each record with ``end_s >
        start_s`` and ``gpus > 0`` (what the constructor builds from records; the caller
        guarantees valid nodes and times). Same curve as the constructor on the same records."""
        self = cls.__new__(cls)
        self.nodes = {p: dict(nodes.get(p, {})) for p in POOLS}
        self._build(deltas)
        return self

    def _build(self, deltas: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
        # per pool: breakpoints of the pool's busy-GPU step function and its integral
        self._t: dict[str, list[float]] = {}
        self._cum: dict[str, list[float]] = {}
        self._rate: dict[str, list[float]] = {}
        for pool in POOLS:
            steps: dict[float, float] = {}
            for (p, node), ev in deltas.items():
                if p != pool:
                    continue
                cap = self.nodes[pool][node]
                level, prev_busy = 0.0, 0.0
                ev.sort()
                i = 0
                while i < len(ev):
                    t = ev[i][0]
                    while i < len(ev) and ev[i][0] == t:
                        level += ev[i][1]
                        i += 1
                    busy = min(cap, max(0.0, level))
                    if busy != prev_busy:
                        steps[t] = steps.get(t, 0.0) + busy - prev_busy
                        prev_busy = busy
            ts = sorted(steps)
            cum, rate, c, r, last = [], [], 0.0, 0.0, None
            for t in ts:
                if last is not None:
                    c += r * (t - last)
                r += steps[t]
                cum.append(c)
                rate.append(r)
                last = t
            self._t[pool], self._cum[pool], self._rate[pool] = ts, cum, rate

    def gpus(self, pool: str) -> float:
        """Provisioned GPUs of ``pool``."""
        return float(sum(self.nodes[pool].values()))

    def span(self) -> tuple[float, float]:
        """(first start, last end) over every record; (0, 0) without records."""
        ts = [t for p in POOLS for t in self._t[p]]
        return (min(ts), max(ts)) if ts else (0.0, 0.0)

    def cumulative(self, pool: str, t: float) -> float:
        """Busy GPU-seconds of ``pool`` from the first record to time ``t``."""
        ts = self._t[pool]
        i = bisect.bisect_right(ts, t) - 1
        if i < 0:
            return 0.0
        return self._cum[pool][i] + self._rate[pool][i] * (t - ts[i])

    def busy_gpu_s(self, pool: str, t0: float, t1: float) -> float:
        """Busy GPU-seconds of ``pool`` within ``[t0, t1]``."""
        return max(0.0, self.cumulative(pool, t1) - self.cumulative(pool, t0)) if t1 > t0 else 0.0

    def occupancy(self, window: Optional[Sequence[float]] = None) -> dict[str, PoolOccupancy]:
        """Per pool occupancy over ``window`` (default: :meth:`span`)."""
        t0, t1 = (float(window[0]), float(window[1])) if window is not None else self.span()
        if t1 < t0:
            raise ValueError(f"window ends ({t1}) before it starts ({t0})")
        return {p: PoolOccupancy(self.busy_gpu_s(p, t0, t1), self.gpus(p) * (t1 - t0)) for p in POOLS}


def occupancy(records: Iterable[Any], nodes: Mapping[str, Mapping[str, float]],
              window: Optional[Sequence[float]] = None) -> dict[str, PoolOccupancy]:
    """Busy / bubble ratios of each pool from phase records: GPU-weighted, the union of busy
    intervals per node, over ``window`` (default: first start to last end of the records).

    Args:
        records: phase records (objects or dicts) with ``pool``, ``node``, ``start_s``, ``end_s``
            (seconds) and optionally ``gpus`` (GPUs of that node used; ``None`` = the whole node).
        nodes: ``{pool: {node: provisioned GPUs}}``; nodes without records count as idle.
        window: ``(t0, t1)`` seconds, the lifetime to measure (records are clipped to it).
    Returns:
        ``{"rollout": PoolOccupancy, "train": PoolOccupancy}``.
    Raises:
        ValueError: see :class:`BusyCurve`; a window that ends before it starts.
    Source: RollMux §2 (dependency bubbles), §7.4 (bubble ratios of the pools).
    """
    return BusyCurve(records, nodes).occupancy(window)
