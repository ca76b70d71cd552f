"""The rollout request scheduler used by the rollout workers' engines.

API (one object per engine / rollout worker)::

    sched = RolloutRequestScheduler(load_rollout_sched_config(), policy="mixed")
    sched.submit(request)                        # any time
    sched.set_policy_version(step)               # after each weight sync: the engine dropped its prefix KV
    sched.set_policy_version(step, cache_reset=False)  # an engine that keeps it: TTL expiry only
    sched.set_trainer_waiting(True)              # the trainer waits on critical rollout data
    batch = sched.next_batch(now_s)              # stage 1 budget + stage 2 ordering, one window
    sched.on_complete(request_id, output_ids, now_s)
    sched.cancel(request_id)                     # drop a queued request, or abort a running one
    engine.abort(sched.take_aborts())            # the engine stops the aborted running requests
    sched.metrics()                              # dict; export_prometheus(sched.metrics()) optional

The scheduler tracks the KV it dispatched (worst case, prompt + max_tokens) until ``on_complete``,
so ``next_batch`` needs no engine state; an engine that knows better may pass an
:class:`EngineState`.

Prefix credit follows the engine's cache: a hit is credited only for KV the engine still holds.
Engines reset their prefix cache when new weights are loaded (vLLM ``reset_prefix_cache``, the CPU
engine), so a version change with ``cache_reset=True`` (the default) empties the index; the
profile's ``prefix_ttl_versions`` only matters for an engine that keeps KV across versions.
An aborted running request releases its KV at once (its slot is reusable in the same window). Modules: receiver, prefix indexer, budget
controller, priority queue; the executor is ``actors.rollout.engine``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rollmux.rollout_sched.budget import EngineState, ResourceBudget, WindowBudget
from rollmux.rollout_sched.coldstart import ColdStartController
from rollmux.rollout_sched.config import RolloutSchedConfig, SchedProfile
from rollmux.rollout_sched.policies import QueueEntry, SchedulingPolicy, WindowContext, make_policy
from rollmux.rollout_sched.radix import RadixPrefixIndex
from rollmux.rollout_sched.requests import Request, RequestClass, RequestType


@dataclass(frozen=True)
class DispatchRecord:
    """One dispatched request: queueing delay ``wait_s``, prefix ``hit_tokens`` of ``prompt_tokens``."""

    request_id: str
    type: RequestType
    task_family: str
    critical: bool
    short: bool
    cls: RequestClass
    arrival_s: float
    dispatch_s: float
    wait_s: float
    hit_tokens: int
    prompt_tokens: int
    window: int


class RolloutRequestScheduler:
    """Two-stage rollout request scheduler over one policy of the registry.

    Args:
        config: :class:`RolloutSchedConfig`.
        policy: a registered policy name (``"fifo"``, ``"prefix"``, ``"mixed"``) or an instance.
        log_limit: most :class:`DispatchRecord` kept in ``dispatch_log``.

    Raises:
        ValueError: unknown policy.
    """

    def __init__(self, config: RolloutSchedConfig, policy: str | SchedulingPolicy = "mixed", *, log_limit: int = 1_000_000):
        self.config = config
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.coldstart = ColdStartController(config.coldstart)
        self.budgeter = ResourceBudget(config.budget)
        ic = config.index
        self.index = RadixPrefixIndex(
            ttl_versions=self.profile.prefix_ttl_versions,
            max_bytes=ic.max_bytes,
            node_overhead_bytes=ic.node_overhead_bytes,
            bytes_per_token=ic.bytes_per_token,
            evict_low_watermark=ic.evict_low_watermark,
        )
        self.queue: dict[str, QueueEntry] = {}
        self.shorts: dict[str, QueueEntry] = {}
        self.inflight: dict[str, tuple[QueueEntry, int]] = {}  # id -> (entry, hit tokens)
        self.dispatch_log: list[DispatchRecord] = []
        self._log_limit = log_limit
        self._seq = 0
        self._kv_long = 0
        self._kv_noncrit_long = 0
        self._kv_short = 0
        self._family_hist: dict[str, float] = {}
        self.trainer_waiting = False
        self.policy_version = 0
        self.window = 0
        self.counters = {
            "submitted": 0,
            "dispatched": 0,
            "completed": 0,
            "hit_tokens": 0,
            "prompt_tokens": 0,
            "profile_switches": 0,
            "cancelled": 0,
            "aborted": 0,
            "cache_resets": 0,
            "requeued": 0,
        }
        self._aborts: list[str] = []

    # ------------------------------------------------------------------ state
    @property
    def profile(self) -> SchedProfile:
        """Active profile: the cold-start controller's for adaptive policies, else stable."""
        return self.coldstart.profile if self.policy.adaptive else self.config.coldstart.stable

    @property
    def pending(self) -> int:
        return len(self.queue)

    @property
    def running(self) -> int:
        return len(self.inflight)

    def submit(self, req: Request | dict[str, Any]) -> None:
        """Queue a request (a :class:`Request` or a dict validated into one).

        Raises:
            pydantic.ValidationError: a dict that is not a valid request (names the field).
            ValueError: duplicate ``request_id``, or ``kv_tokens`` above ``budget.kv_capacity_tokens``.
        """
        if not isinstance(req, Request):
            req = Request.model_validate(req)
        rid = req.request_id
        if rid in self.queue or rid in self.inflight:
            raise ValueError(f"request_id {rid!r} is already queued or running")
        cap = self.config.budget.kv_capacity_tokens
        if req.kv_tokens > cap:
            raise ValueError(
                f"request {rid!r}: prompt_token_ids + max_tokens = {req.kv_tokens} exceeds "
                f"budget.kv_capacity_tokens = {cap}"
            )
        short = req.is_short(self.config.budget.short_max_tokens)
        e = QueueEntry(req=req, seq=self._seq, short=short, cls=req.request_class())
        self._seq += 1
        self.queue[rid] = e
        if short and e.cls is not RequestClass.BACKGROUND:
            self.shorts[rid] = e
        self.counters["submitted"] += 1

    def set_policy_version(self, version: int, *, cache_reset: bool = True) -> None:
        """New policy weights (training step ``version``): advance the cold-start step; when the
        version changed and the engine reset its prefix cache with the weight load
        (``cache_reset``, the default: vLLM, SGLang and the CPU engine do), forget every prefix
        (:meth:`on_engine_cache_reset`), else expire entries older than the profile's TTL.
        Raises ValueError on a negative version."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        changed = version != self.policy_version
        self.policy_version = version
        if changed and cache_reset:
            self.on_engine_cache_reset()
        switched = self.coldstart.on_step(version) and self.policy.adaptive
        self._apply_profile(expire=changed or switched, switched=switched)

    def on_engine_cache_reset(self) -> None:
        """The engine dropped its prefix KV (weight load, restart, a fresh engine): no prefix can be
        reused, so the index is emptied and queued requests' cached hits are looked up again."""
        self.index.clear()
        self.counters["cache_resets"] += 1

    def _apply_profile(self, *, expire: bool, switched: bool) -> None:
        """After a possible cold -> stable switch: count it, take the active profile's prefix TTL
        and (when asked) expire index entries older than it."""
        if switched:
            self.counters["profile_switches"] += 1
        self.index.ttl_versions = self.profile.prefix_ttl_versions
        if expire:
            self.index.expire(self.policy_version)

    def set_trainer_waiting(self, waiting: bool) -> None:
        """Whether the trainer is waiting on critical rollout data (drives the stage-1 budget)."""
        self.trainer_waiting = bool(waiting)

    def engine_state(self) -> EngineState:
        """KV occupancy as tracked from dispatches and completions."""
        return EngineState(self.config.budget.kv_capacity_tokens, self._kv_long, self._kv_short, len(self.inflight))

    # ------------------------------------------------------------------ the two stages
    def budget(self, engine: EngineState | None = None) -> WindowBudget:
        """Stage 1: the window's :class:`WindowBudget`."""
        return self.budgeter.compute(
            engine or self.engine_state(),
            trainer_waiting=self.trainer_waiting,
            max_batch_requests=self.profile.max_batch_requests,
            noncritical_long_in_use_tokens=self._kv_noncrit_long,
        )

    def next_batch(self, now_s: float, budget: WindowBudget | None = None, engine: EngineState | None = None) -> list[Request]:
        """Stage 2: requests to start in this window (time slice), in dispatch order.

        Each dispatched request's prefix hit is measured against the index, then its prompt is
        inserted (the engine now holds its KV). Returns an empty list when nothing fits.
        """
        self.window += 1
        if self.policy.adaptive:  # output entropy may have fallen since the last version change
            switched = self.coldstart.maybe_switch()
            self._apply_profile(expire=switched, switched=switched)
        decay = self.config.diversity_decay
        for f in list(self._family_hist):
            self._family_hist[f] *= decay
        if not self.queue:
            return []
        b = budget or self.budget(engine)
        ctx = WindowContext(now_s, self.profile, self.config, self.index, self._family_hist, self.window,
                            self.config.hit_refresh_windows)
        picked = self.policy.select(self.queue, self.shorts, b, ctx)
        out = []
        for e in picked:
            r = e.req
            rid = r.request_id
            del self.queue[rid]
            self.shorts.pop(rid, None)
            # an engine computes at least the last prompt token (its logits start the generation):
            # a full-prompt match reuses len - 1 tokens (vLLM and the CPU engine alike)
            # a replay item needs the logits of every prompt position (vLLM skips its prefix cache for
            # prompt_logprobs, the CPU engine recomputes): nothing of it is reused, nothing credited
            # an engine with block-granular prefix caching reuses whole blocks of the match only
            hit = 0 if r.type is RequestType.REPLAY else min(self.index.match(r.prompt_token_ids),
                                                             len(r.prompt_token_ids) - 1)
            hit -= hit % self.config.prefix_block_tokens
            self.index.insert(r.prompt_token_ids)
            self.inflight[rid] = (e, hit)
            if e.short:
                self._kv_short += r.kv_tokens
            else:
                self._kv_long += r.kv_tokens
                if not r.critical:
                    self._kv_noncrit_long += r.kv_tokens
            self._family_hist[r.task_family] = self._family_hist.get(r.task_family, 0.0) + 1.0
            self.counters["dispatched"] += 1
            self.counters["hit_tokens"] += hit
            self.counters["prompt_tokens"] += len(r.prompt_token_ids)
            if len(self.dispatch_log) < self._log_limit:
                self.dispatch_log.append(
                    DispatchRecord(rid, r.type, r.task_family, r.critical, e.short, e.cls, r.arrival_s, now_s,
                                   max(0.0, now_s - r.arrival_s), hit, len(r.prompt_token_ids), self.window)
                )
            out.append(r)
        if self.policy.maintains_index and self.window % self.config.index.merge_every_windows == 0:
            ic = self.config.index
            self.index.merge_near_duplicates(ic.merge_min_siblings, ic.merge_max_tail_tokens, ic.merge_max_tail_fraction)
        return out

    def cancel(self, request_id: str) -> bool:
        """Drop a queued request, or abort a running one (e.g. the trainer already has enough
        samples). A running request's KV is released at once (the next :meth:`next_batch` can use
        the slot) and its id is handed to the engine by :meth:`take_aborts`; a late completion of
        it is ignored by :func:`actors.rollout.engine.serve`. Returns False for an unknown or
        finished id."""
        e = self.queue.pop(request_id, None)
        if e is not None:
            self.shorts.pop(request_id, None)
            self.counters["cancelled"] += 1
            return True
        if request_id not in self.inflight:
            return False
        self._release(request_id)
        self._aborts.append(request_id)
        self.counters["aborted"] += 1
        return True

    def requeue(self, request_id: str) -> bool:
        """Stop a running request and queue it again in its old place (a weight update with pause
        mode ``abort``: it starts over on the new weights). Its KV is released at once and its id
        handed to the engine by :meth:`take_aborts`. Returns False for an id that is not running."""
        if request_id not in self.inflight:
            return False
        e = self._release(request_id)
        self._aborts.append(request_id)
        self.queue[request_id] = e
        if e.short and e.cls is not RequestClass.BACKGROUND:
            self.shorts[request_id] = e
        self.counters["requeued"] += 1
        return True

    def take_aborts(self) -> list[str]:
        """Running requests aborted by :meth:`cancel` since the last call: the engine must stop them."""
        out, self._aborts = self._aborts, []
        return out

    def _release(self, request_id: str) -> QueueEntry:
        e, _ = self.inflight.pop(request_id)
        if e.short:
            self._kv_short -= e.req.kv_tokens
        else:
            self._kv_long -= e.req.kv_tokens
            if not e.req.critical:
                self._kv_noncrit_long -= e.req.kv_tokens
        return e

    def hit_of(self, request_id: str) -> int:
        """Prefix hit (tokens) measured when ``request_id`` was dispatched. Raises KeyError if not running."""
        return self.inflight[request_id][1]

    def on_complete(self, request_id: str, output_token_ids: tuple[int, ...] | list[int] = (), now_s: float | None = None) -> None:
        """A dispatched request finished: release its KV, feed generated tokens to the cold-start
        entropy estimate. Raises KeyError for an id that is not running."""
        if request_id not in self.inflight:
            raise KeyError(f"request {request_id!r} is not running")
        e = self._release(request_id)
        if e.req.type in (RequestType.GENERATION, RequestType.STATE_QUERY) and output_token_ids:
            self.coldstart.observe_tokens(output_token_ids)
        self.counters["completed"] += 1

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, Any]:
        """Scheduler metrics: queue sizes per class, counters, prefix hit ratio, index memory,
        cold-start state (phase, step, entropy, thresholds)."""
        by_cls = {c.name.lower(): 0 for c in RequestClass}
        for e in self.queue.values():
            by_cls[e.cls.name.lower()] += 1
        c = self.counters
        m: dict[str, Any] = {
            "policy": self.policy.name,
            "window": self.window,
            "policy_version": self.policy_version,
            "trainer_waiting": self.trainer_waiting,
            "queue_len": len(self.queue),
            "queue_short": len(self.shorts),
            **{f"queue_{k}": v for k, v in by_cls.items()},
            "running": len(self.inflight),
            "kv_in_use_tokens": self._kv_long + self._kv_short,
            **c,
            "prefix_hit_ratio": c["hit_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0,
            "index_bytes": self.index.memory_bytes,
            "index_peak_bytes": self.index.peak_bytes,
            "index_nodes": self.index.num_nodes,
            "index_ttl_versions": self.index.ttl_versions,
            **{f"index_{k}": v for k, v in self.index.stats.items()},
            "profile_max_batch_requests": self.profile.max_batch_requests,
            "profile_prefix_weight": self.profile.prefix_weight,
            **self.coldstart.metrics(),
        }
        return m


def short_wait_bound_windows(queued_shorts_ahead: int, short_slots_per_window: int) -> int:
    """The mixed policy's starvation bound in windows: ``ceil((q + 1) / slots)`` (see MixedPolicy)."""
    return math.ceil((queued_shorts_ahead + 1) / short_slots_per_window)


def export_prometheus(metrics: dict[str, Any], registry: Any = None, prefix: str = "rollmux_rollout_sched_") -> dict[str, Any]:
    """Publish the numeric entries of ``metrics`` as prometheus_client gauges (optional).

    ``registry``: a ``prometheus_client.CollectorRegistry`` (a fresh one by default). The string
    ``coldstart_phase`` becomes ``<prefix>coldstart_stable`` (0/1). Returns ``{name: Gauge}``.
    Raises ImportError when prometheus_client is not installed.
    """
    from prometheus_client import CollectorRegistry, Gauge

    reg = registry if registry is not None else CollectorRegistry()
    gauges = {}
    values = dict(metrics)
    values["coldstart_stable"] = 1.0 if metrics.get("coldstart_phase") == "stable" else 0.0
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        g = Gauge(prefix + k, f"rollout scheduler metric {k}", registry=reg)
        g.set(float(v))
        gauges[prefix + k] = g
    return gauges
