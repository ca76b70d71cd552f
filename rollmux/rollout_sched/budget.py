"""Stage 1 of a scheduling window: the resource budget (``budget``).

Given the engine's KV occupancy and whether the trainer is waiting on critical rollout data,
decide how many KV tokens and requests new work may take in this window, how much is kept for
short requests (the short lane that bounds their wait) and the replay quota.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollmux.rollout_sched.config import BudgetConfig


@dataclass(frozen=True)
class EngineState:
    """KV occupancy of an inference engine at a window boundary, tokens.

    ``kv_long_in_use_tokens`` / ``kv_short_in_use_tokens``: worst-case footprint
    (prompt + max_tokens) of running long / short requests; ``running``: requests in flight.
    """

    kv_capacity_tokens: int
    kv_long_in_use_tokens: int = 0
    kv_short_in_use_tokens: int = 0
    running: int = 0

    @property
    def kv_in_use_tokens(self) -> int:
        return self.kv_long_in_use_tokens + self.kv_short_in_use_tokens


@dataclass(frozen=True)
class WindowBudget:
    """What new work may take in one scheduling window.

    Attributes:
        long_kv_tokens: KV tokens for new long requests (the short lane excluded).
        noncritical_kv_tokens: of those, what non-critical long requests may take.
        prefill_tokens: uncached prompt tokens new requests may add in this window.
        short_kv_tokens: KV tokens of the short lane (only short requests use it).
        free_kv_tokens: all free usable KV tokens (what a policy without a lane may take).
        max_requests: most requests admitted this window.
        short_slots: short requests the lane dispatches this window.
        replay_max_requests / replay_kv_tokens: the replay quota of this window.
        trainer_waiting: whether the trainer waits on critical rollout data.
    """

    long_kv_tokens: int
    short_kv_tokens: int
    noncritical_kv_tokens: int
    prefill_tokens: int
    free_kv_tokens: int
    max_requests: int
    short_slots: int
    replay_max_requests: int
    replay_kv_tokens: int
    trainer_waiting: bool


class ResourceBudget:
    """Computes the :class:`WindowBudget` of each window from a :class:`BudgetConfig`.

    usable = capacity x (1 if the trainer waits else ``busy_trainer_fraction``);
    lane = ``short_reserved_fraction`` x usable; long = usable - lane - long KV in use;
    short = lane - short KV in use; non-critical long = (usable - lane) x share - non-critical long
    KV in use, share = ``waiting_noncritical_fraction`` while the trainer waits, else
    1 - ``critical_reserve_fraction``; prefill = ``max_prefill_tokens_per_window``;
    replay = ``replay_quota`` x (requests, long tokens).
    The budget follows the trainer state; short requests get reserved slots.
    """

    def __init__(self, config: BudgetConfig):
        self.config = config

    def compute(
        self, engine: EngineState, *, trainer_waiting: bool, max_batch_requests: int, noncritical_long_in_use_tokens: int = 0
    ) -> WindowBudget:
        """Budget of one window. Raises ValueError if ``max_batch_requests`` < 1."""
        if max_batch_requests < 1:
            raise ValueError(f"max_batch_requests must be >= 1, got {max_batch_requests}")
        c = self.config
        cap = engine.kv_capacity_tokens
        usable = int(cap * (1.0 if trainer_waiting else c.busy_trainer_fraction))
        lane = int(usable * c.short_reserved_fraction)
        long_free = max(0, usable - lane - engine.kv_long_in_use_tokens)
        short_free = max(0, lane - engine.kv_short_in_use_tokens)
        free = max(0, usable - engine.kv_in_use_tokens)
        share = c.waiting_noncritical_fraction if trainer_waiting else 1.0 - c.critical_reserve_fraction
        noncrit_cap = int((usable - lane) * share)
        noncrit_free = max(0, noncrit_cap - noncritical_long_in_use_tokens)
        return WindowBudget(
            long_kv_tokens=min(long_free, free),
            short_kv_tokens=min(short_free, free),
            noncritical_kv_tokens=min(noncrit_free, long_free, free),
            prefill_tokens=c.max_prefill_tokens_per_window,
            free_kv_tokens=free,
            max_requests=max_batch_requests,
            short_slots=c.short_slots_per_window,
            replay_max_requests=math.floor(c.replay_quota * max_batch_requests),
            replay_kv_tokens=int(c.replay_quota * long_free),
            trainer_waiting=trainer_waiting,
        )
