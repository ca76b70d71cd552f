"""Stage 2 of a scheduling window: which queued requests run now, in what order.

One interface (:class:`SchedulingPolicy`), a registry (:data:`POLICIES`, :func:`make_policy`)
and three policies:

* ``fifo``: arrival order, head-of-line blocking, no classes (baseline 2).
* ``prefix``: longest prefix hit first (SGLang-style longest-prefix-match; baseline 1).
* ``mixed``: this scheduler: a short lane (oldest short requests first,
  bounded wait), then classes critical > reusable > background, each ordered by the weighted
  score ``w_p*hit/len + w_c*critical + w_w*wait/scale + w_d*div(family) - w_cost*kv/scale``
  (``div``: :meth:`WindowContext.diversity`, +1 under-served .. -1 over-served family)
  with a lazy-greedy max-heap (diversity is re-evaluated against the batch being built); background
  only when every higher-class request was admitted (idle capacity); a replay quota.

Policies never mutate the queue; the scheduler dispatches what they return.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from rollmux.rollout_sched.budget import WindowBudget
from rollmux.rollout_sched.config import RolloutSchedConfig, SchedProfile
from rollmux.rollout_sched.radix import RadixPrefixIndex
from rollmux.rollout_sched.requests import Request, RequestClass, RequestType

MAX_MISFITS = 64  # bounded scan: stop a window after this many requests that do not fit


@dataclass(slots=True)
class QueueEntry:
    """A queued request with its scheduler-side state (submission order, class, short flag)."""

    req: Request
    seq: int
    short: bool
    cls: RequestClass
    hit: int = -1  # cached prefix hit, tokens (-1: unknown)
    hit_window: int = -1  # window of the last refresh
    hit_epoch: int = -1  # index epoch of the last refresh


@dataclass
class WindowContext:
    """What a policy may read in one window: clock, active profile, config, index, family history."""

    now_s: float
    profile: SchedProfile
    config: RolloutSchedConfig
    index: RadixPrefixIndex
    family_hist: dict[str, float] = field(default_factory=dict)
    window: int = 0
    refresh_windows: int = 1
    _picked_prompts: set = field(default_factory=set)
    _hist_total: float | None = None
    _fresh: set = field(default_factory=set)  # request ids looked up in this window (index is fixed during select)

    def hit(self, e: QueueEntry, fresh: bool = False) -> int:
        """Prefix hit of a queued request, tokens. Cached per entry; looked up again when
        ``fresh``, when the index lost entries since (its ``epoch`` moved: hits may have shrunk)
        or every ``refresh_windows`` windows (inserts may have grown it). Policies refresh a
        candidate before taking it, so the cache only affects the order of evaluation."""
        if fresh and e.req.request_id in self._fresh:
            return e.hit  # already looked up in this window: the index does not change during select
        if fresh or e.hit < 0 or e.hit_epoch != self.index.epoch or self.window - e.hit_window >= self.refresh_windows:
            e.hit = self.index.match(e.req.prompt_token_ids, touch=False)
            e.hit_window, e.hit_epoch = self.window, self.index.epoch
            self._fresh.add(e.req.request_id)
        return e.hit

    def prefill_cost(self, e: QueueEntry) -> int:
        """Uncached prompt tokens ``e`` would add: 0 if the same prompt is already in this
        window's batch (GRPO samples of one prompt), else prompt length - (fresh) index hit."""
        if e.req.prompt_token_ids in self._picked_prompts:
            return 0
        return len(e.req.prompt_token_ids) - self.hit(e, fresh=True)

    def picked(self, req: Request) -> None:
        """Record that ``req`` joins this window's batch."""
        self._picked_prompts.add(req.prompt_token_ids)

    def family_share(self, family: str, batch_counts: dict[str, int], batch_total: int) -> float:
        """Share of ``family`` among recently dispatched requests plus the batch being built."""
        if self._hist_total is None:
            self._hist_total = sum(self.family_hist.values())
        total = self._hist_total + batch_total
        if total <= 0:
            return 0.0
        return (self.family_hist.get(family, 0.0) + batch_counts.get(family, 0)) / total

    def diversity(self, family: str, batch_counts: dict[str, int], batch_total: int, n_families: int) -> float:
        """Diversity term in [-1, 1]: ``1 - min(2, share x n_families)``; +1 for a family not
        served recently, 0 at its fair share ``1 / n_families``, -1 at twice its fair share."""
        return 1.0 - min(2.0, self.family_share(family, batch_counts, batch_total) * max(1, n_families))


class SchedulingPolicy(ABC):
    """Picks the requests of one window within a :class:`WindowBudget`.

    ``adaptive``: follows the cold-start profile switch (else the stable profile always);
    ``maintains_index``: runs near-duplicate merging on the prefix index.
    """

    name: ClassVar[str]
    adaptive: ClassVar[bool] = False
    maintains_index: ClassVar[bool] = False

    @abstractmethod
    def select(
        self,
        queue: dict[str, QueueEntry],
        shorts: dict[str, QueueEntry],
        budget: WindowBudget,
        ctx: WindowContext,
    ) -> list[QueueEntry]:
        """Requests to dispatch this window, in dispatch order. ``queue`` holds every queued
        request in submission order; ``shorts`` the short, non-background subset."""


POLICIES: dict[str, type[SchedulingPolicy]] = {}


def register_policy(cls: type[SchedulingPolicy]) -> type[SchedulingPolicy]:
    """Class decorator adding a policy to :data:`POLICIES` under ``cls.name``."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str) -> SchedulingPolicy:
    """Instantiate a registered policy. Raises ValueError naming the known policies."""
    if name not in POLICIES:
        raise ValueError(f"unknown rollout scheduling policy {name!r} (known: {sorted(POLICIES)})")
    return POLICIES[name]()


@register_policy
class FifoPolicy(SchedulingPolicy):
    """Arrival order; stops at the first request that does not fit (head-of-line blocking)."""

    name = "fifo"

    def select(self, queue, shorts, budget, ctx):
        out: list[QueueEntry] = []
        free, prefill = budget.free_kv_tokens, budget.prefill_tokens
        for e in queue.values():
            if len(out) >= budget.max_requests or e.req.kv_tokens > free:
                break
            cost = ctx.prefill_cost(e)
            if cost > prefill and out:
                break
            out.append(e)
            ctx.picked(e.req)
            free -= e.req.kv_tokens
            prefill -= cost
        return out


@register_policy
class PrefixPolicy(SchedulingPolicy):
    """Longest prefix hit first (ties: arrival order); top-k from a heap, no classes."""

    name = "prefix"

    def select(self, queue, shorts, budget, ctx):
        heap = [(-ctx.hit(e), e.seq, e) for e in queue.values()]
        heapq.heapify(heap)
        out: list[QueueEntry] = []
        free, prefill, misfits = budget.free_kv_tokens, budget.prefill_tokens, 0
        while heap and len(out) < budget.max_requests and misfits < MAX_MISFITS:
            _, seq, e = heapq.heappop(heap)
            h = ctx.hit(e, fresh=True)
            if heap and -h > heap[0][0]:  # the cached hit was stale (too high): re-queue
                heapq.heappush(heap, (-h, seq, e))
                continue
            cost = ctx.prefill_cost(e)
            if e.req.kv_tokens > free or (cost > prefill and out):
                misfits += 1
                continue
            out.append(e)
            ctx.picked(e.req)
            free -= e.req.kv_tokens
            prefill -= cost
        return out


def static_score(e: QueueEntry, ctx: WindowContext, fresh: bool = False) -> float:
    """Score terms that do not depend on the batch: prefix reuse, criticality, waiting, cost."""
    p, cfg, r = ctx.profile, ctx.config, e.req
    hit = ctx.hit(e, fresh) if p.prefix_weight > 0 else 0
    return (
        p.prefix_weight * hit / len(r.prompt_token_ids)
        + p.critical_weight * (1.0 if r.critical else 0.0)
        + p.waiting_weight * max(0.0, ctx.now_s - r.arrival_s) / cfg.waiting_scale_s
        - p.cost_weight * r.kv_tokens / cfg.cost_scale_tokens
    )


@register_policy
class MixedPolicy(SchedulingPolicy):
    """RollMux's mixed rollout policy; see the module doc.

    Stage-1 budget use: the lane (``short_slots_per_window`` oldest shorts, own KV, not counted in
    ``max_batch_requests``); non-critical long requests also respect ``noncritical_kv_tokens``
    (the critical reserve) and are held back in a window where short requests remain queued
    after the lane (their prefill would lengthen the window the shorts wait for).

    Starvation bound: a short, non-background request (``Request.is_short``) with ``q`` short
    requests submitted before it and still queued is dispatched within
    ``ceil((q + 1) / short_slots_per_window)`` windows of its submission, however many and however
    long the other requests are, provided its KV footprint fits the lane
    (``short_reserved_fraction`` x usable KV / ``short_slots_per_window``). Shorts finish within one
    slice (``short_max_tokens <= slice_tokens``) so the lane frees every window; in time the bound
    is that many windows x the slice duration.
    """

    name = "mixed"
    adaptive = True
    maintains_index = True

    def select(self, queue, shorts, budget, ctx):
        out: list[QueueEntry] = []
        taken: set[str] = set()
        lane, long_free, noncrit_free = budget.short_kv_tokens, budget.long_kv_tokens, budget.noncritical_kv_tokens
        prefill = budget.prefill_tokens
        # 1) short lane: oldest short requests first, its own slots (not counted in max_requests).
        for e in shorts.values():
            if len(out) >= budget.short_slots:
                break
            cost = ctx.prefill_cost(e)
            if e.req.kv_tokens <= lane and (cost <= prefill or not out):
                out.append(e)
                ctx.picked(e.req)
                taken.add(e.req.request_id)
                lane -= e.req.kv_tokens
                prefill -= cost
        limit = len(out) + budget.max_requests
        # shorts still queued after the lane: non-critical long work waits this window
        shorts_waiting = any(rid not in taken for rid in shorts)
        # 2) classes in order, weighted score, lazy-greedy heap (diversity depends on the batch).
        w_d = ctx.profile.diversity_weight
        counts: dict[str, int] = {}
        for e in out:
            counts[e.req.task_family] = counts.get(e.req.task_family, 0) + 1
        replay_n, replay_kv = 0, budget.replay_kv_tokens
        blocked = False
        buckets: dict[RequestClass, list[QueueEntry]] = {c: [] for c in RequestClass}
        for e in queue.values():
            if e.req.request_id not in taken and (e.short or not shorts_waiting or e.cls is RequestClass.CRITICAL):
                buckets[e.cls].append(e)
        for cls in (RequestClass.CRITICAL, RequestClass.REUSABLE, RequestClass.BACKGROUND):
            cands = buckets[cls]
            if cls is RequestClass.BACKGROUND and blocked:
                break  # background only fills idle capacity
            fams = {e.req.task_family for e in cands}
            nfam = len(fams)
            div0 = {f: w_d * ctx.diversity(f, counts, len(out), nfam) for f in fams}
            heap = []
            for e in cands:
                s = static_score(e, ctx)
                heap.append((-(s + div0[e.req.task_family]), e.seq, s, e))
            heapq.heapify(heap)
            misfits = 0
            while heap and len(out) < limit and misfits < MAX_MISFITS:
                neg, seq, s, e = heapq.heappop(heap)
                s = static_score(e, ctx, fresh=True)
                fresh = s + w_d * ctx.diversity(e.req.task_family, counts, len(out), nfam)
                # lazy greedy: a popped key whose diversity fell below the next key is re-queued. Keys
                # of families not picked can only rise a little meanwhile; that staleness is accepted.
                if heap and fresh < -heap[0][0] - 1e-12:
                    heapq.heappush(heap, (-fresh, seq, s, e))
                    continue
                kv, is_replay = e.req.kv_tokens, e.req.type is RequestType.REPLAY
                if is_replay and (replay_n >= budget.replay_max_requests or kv > replay_kv):
                    misfits += 1
                    continue
                cost = ctx.prefill_cost(e)
                if cost > prefill and out:
                    misfits += 1
                    continue
                if e.short and kv <= lane:
                    lane -= kv
                elif kv <= long_free and (e.req.critical or kv <= noncrit_free):
                    long_free -= kv
                    if not e.req.critical:
                        noncrit_free -= kv
                else:
                    misfits += 1
                    continue
                if is_replay:
                    replay_n += 1
                    replay_kv -= kv
                prefill -= cost
                ctx.picked(e.req)
                out.append(e)
                taken.add(e.req.request_id)
                counts[e.req.task_family] = counts.get(e.req.task_family, 0) + 1
            blocked = blocked or bool(heap)
        return out

