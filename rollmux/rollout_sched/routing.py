"""Prefix-aware routing of rollout requests across engine replicas, and the window estimate.

Pure functions (no Ray). :func:`route` sends a request to the live replica with the longest
prefix match in its index among those with room in their budget for it; without a useful
match (or without room anywhere) to the least-loaded live replica. A session's turns stay on
their replica while it lives (its KV holds their history).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as routing sees it.

    Attributes:
        replica: its index.
        alive: its engine answers.
        match_tokens: prompt tokens of this request found in the replica's prefix index.
        backlog_kv_tokens: worst-case KV (prompt + max_tokens) of the requests queued and running there.
        kv_capacity_tokens: the replica's KV budget, tokens.
    """

    replica: int
    alive: bool
    match_tokens: int
    backlog_kv_tokens: int
    kv_capacity_tokens: int


def route(kv_tokens: int, loads: Sequence[ReplicaLoad], *, sticky: Optional[int] = None,
          room_windows: float = 2.0, min_match_tokens: int = 1) -> Optional[int]:
    """The replica for a request of worst-case KV ``kv_tokens``, or None when no replica is alive.

    Rule: ``sticky`` (a session's replica) when alive; else, among live replicas whose backlog
    plus this request fits ``room_windows`` x their KV capacity ("room in the budget"), the one
    with the longest match of at least ``min_match_tokens`` (ties: the smaller backlog, then the
    lower index); else the live replica with the smallest backlog relative to its capacity.
    """
    live = [r for r in loads if r.alive]
    if not live:
        return None
    if sticky is not None and any(r.replica == sticky for r in live):
        return sticky
    room = [r for r in live if r.backlog_kv_tokens + kv_tokens <= room_windows * r.kv_capacity_tokens]
    matched = [r for r in room if r.match_tokens >= min_match_tokens]
    if matched:
        return min(matched, key=lambda r: (-r.match_tokens, r.backlog_kv_tokens, r.replica)).replica
    return min(live, key=lambda r: (r.backlog_kv_tokens / max(1, r.kv_capacity_tokens), r.replica)).replica


def expected_window(current_window: int, queue_position: int, per_window: int, *, short: bool = False,
                    short_slots_per_window: int = 1, shorts_ahead: int = 0) -> int:
    """Window a queued request is expected to start in: ``current + ceil(position / per_window)``;
    a short request is bounded by the short lane, ``current + ceil((shorts_ahead + 1) / slots)``
    (the mixed policy's starvation bound). An estimate: later arrivals of a higher class go first."""
    if short:
        return current_window + math.ceil((shorts_ahead + 1) / max(1, short_slots_per_window))
    return current_window + math.ceil(max(1, queue_position) / max(1, per_window))
