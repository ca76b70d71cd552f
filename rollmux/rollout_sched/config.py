"""Configuration models of the rollout request scheduler (``configs/rollout_sched.yaml``).

All models are pydantic v2, ``extra="forbid"``: a typo or a bad value raises
:class:`pydantic.ValidationError` naming the field. Units are in the names (``_tokens``,
``_bytes``, ``_s``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollmux.rollout_sched.service_config import ServiceConfig


#: bounds shared by the fields below: weights of a score, tokens, bytes, windows, seconds.
MAX_WEIGHT = 1000.0
MAX_TOKENS = 1 << 30  # KV slots of one engine, tokens
MAX_BYTES = 1 << 40  # 1 TiB
MAX_REQUESTS = 1 << 20
MAX_STEPS = 1 << 31
MAX_SECONDS = 7 * 24 * 3600.0


class _Cfg(BaseModel):
    # every number finite (no NaN / Infinity) and bounded above and below
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SchedProfile(_Cfg):
    """Weights and knobs of one scheduling profile (cold start or stable).

    Attributes:
        prefix_weight: weight of prefix reuse, hit length / prompt length in [0, 1].
        critical_weight: weight of the critical flag (the current training step waits on it).
        waiting_weight: weight per ``waiting_scale_s`` seconds spent queued (linear, uncapped).
        diversity_weight: weight of task-family diversity, 1 - recent share of the family.
        cost_weight: penalty per ``cost_scale_tokens`` of worst-case KV footprint.
        max_batch_requests: most requests admitted per scheduling window (small early).
        prefix_ttl_versions: prefix-index entries older than this many policy versions stop counting.
    """

    prefix_weight: float = Field(ge=0, le=MAX_WEIGHT)
    critical_weight: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)
    waiting_weight: float = Field(default=0.2, ge=0, le=MAX_WEIGHT)
    diversity_weight: float = Field(ge=0, le=MAX_WEIGHT)
    cost_weight: float = Field(default=0.05, ge=0, le=MAX_WEIGHT)
    max_batch_requests: int = Field(gt=0, le=MAX_REQUESTS)
    prefix_ttl_versions: int = Field(ge=0, le=MAX_STEPS)


class ColdStartConfig(_Cfg):
    """Cold-start switch (step and entropy double threshold).

    The scheduler starts in ``cold`` and switches (once) to ``stable`` when the training step is
    at least ``switch_step`` AND the normalised output entropy (over the last
    ``entropy_window_tokens`` generated tokens) is at most ``switch_entropy``; after
    ``max_cold_steps`` it switches regardless (a bounded cold phase).
    """

    cold: SchedProfile
    stable: SchedProfile
    switch_step: int = Field(default=5, ge=0, le=MAX_STEPS)
    switch_entropy: float = Field(default=0.6, ge=0, le=1)
    max_cold_steps: int = Field(default=50, ge=0, le=MAX_STEPS)
    entropy_window_tokens: int = Field(default=4096, gt=0, le=MAX_TOKENS)
    vocab_size: int = Field(default=32000, gt=1, le=1 << 24)

    @model_validator(mode="after")
    def _order(self) -> "ColdStartConfig":
        if self.max_cold_steps < self.switch_step:
            raise ValueError(f"max_cold_steps ({self.max_cold_steps}) must be >= switch_step ({self.switch_step})")
        return self


class BudgetConfig(_Cfg):
    """Stage-1 resource budget (``budget``).

    Attributes:
        kv_capacity_tokens: KV-cache slots of the inference engine, tokens.
        busy_trainer_fraction: share of the KV capacity inference may use while the trainer is
            busy (not waiting on rollout data); 1.0 when it is waiting. Use 1.0 on fully
            disaggregated pools, < 1 where training shares the device.
        short_reserved_fraction: share of the usable KV kept for short requests (the short lane).
        short_slots_per_window: short requests the lane dispatches per window (oldest first).
        short_max_tokens: a generation/state query with max_tokens <= this is short; reward
            queries are always short.
        replay_quota: most replay requests per window as a share of ``max_batch_requests``;
            replay KV is bounded by the same share of the long budget.
        critical_reserve_fraction: while the trainer is busy training, share of the long KV that
            non-critical long requests may not occupy (kept free for the next critical batch).
        waiting_noncritical_fraction: while the trainer waits on critical data, non-critical long
            requests may hold at most this share of the long KV (new ones are held back, so the
            critical batch decodes with fewer co-runners; nothing is preempted).
        max_prefill_tokens_per_window: uncached prompt tokens admitted per window (like vLLM's
            ``max_num_batched_tokens``); bounds a window's duration. Applies to every policy.
    """

    kv_capacity_tokens: int = Field(gt=0, le=MAX_TOKENS)
    busy_trainer_fraction: float = Field(default=1.0, gt=0, le=1)
    short_reserved_fraction: float = Field(default=0.1, ge=0, lt=1)
    short_slots_per_window: int = Field(default=4, ge=1, le=MAX_REQUESTS)
    short_max_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS)
    replay_quota: float = Field(default=0.25, ge=0, le=1)
    critical_reserve_fraction: float = Field(default=0.0, ge=0, lt=1)
    waiting_noncritical_fraction: float = Field(default=1.0, ge=0, le=1)
    max_prefill_tokens_per_window: int = Field(default=1 << 30, gt=0, le=MAX_TOKENS)


class IndexConfig(_Cfg):
    """Prefix index bounds and maintenance.

    Memory figure of a node = ``node_overhead_bytes + bytes_per_token * len(edge)``.
    When the figure exceeds ``max_bytes`` least-recently-used leaves are evicted down to
    ``evict_low_watermark * max_bytes``. Every ``merge_every_windows`` windows, a node with at
    least ``merge_min_siblings`` leaf children whose edges are short (at most
    ``merge_max_tail_tokens``, or at most ``merge_max_tail_fraction`` of the node's depth) and that
    were not used since the previous merge pass has those near-duplicate tails folded into itself.
    """

    max_bytes: int = Field(default=4 << 20, gt=0, le=MAX_BYTES)
    node_overhead_bytes: int = Field(default=96, ge=0, le=1 << 20)
    bytes_per_token: int = Field(default=4, gt=0, le=1 << 20)
    evict_low_watermark: float = Field(default=0.9, gt=0, le=1)
    merge_min_siblings: int = Field(default=4, ge=2, le=MAX_REQUESTS)
    merge_max_tail_tokens: int = Field(default=8, ge=1, le=MAX_TOKENS)
    merge_max_tail_fraction: float = Field(default=0.0, ge=0, le=1)
    merge_every_windows: int = Field(default=32, ge=1, le=MAX_STEPS)


class RolloutSchedConfig(_Cfg):
    """Top-level rollout request scheduler config.

    Attributes:
        slice_tokens: decode steps per running generation per scheduling window (time slice);
            new requests enter at slice boundaries. Must be >= ``budget.short_max_tokens`` so a
            short request finishes within one slice.
        waiting_scale_s: seconds of queueing that add ``waiting_weight`` to a score.
        cost_scale_tokens: KV tokens that subtract ``cost_weight`` from a score.
        diversity_decay: per-window decay of the recent family histogram (0..1).
        hit_refresh_windows: a queued request's cached prefix hit is looked up again at least
            every this many windows (and whenever the index lost entries); candidates are always
            refreshed before being taken. 1 = exact every window, O(queue) index lookups.
        prefix_block_tokens: the engine reuses prefix KV in whole blocks of this many tokens
            (vLLM: its block size; the CPU engine: 16), so a dispatch is credited the whole blocks
            of its match only; 1 = per token (the simulated engine).
        service: the rollout service over engines of this section
            (:class:`rollmux.rollout_sched.service_config.ServiceConfig`; defaults when absent).
    """

    slice_tokens: int = Field(default=32, gt=0, le=MAX_TOKENS)
    waiting_scale_s: float = Field(default=10.0, gt=0, le=MAX_SECONDS)
    cost_scale_tokens: int = Field(default=4096, gt=0, le=MAX_TOKENS)
    diversity_decay: float = Field(default=0.9, ge=0, le=1)
    hit_refresh_windows: int = Field(default=8, ge=1, le=MAX_STEPS)
    prefix_block_tokens: int = Field(default=1, ge=1, le=4096)
    budget: BudgetConfig
    index: IndexConfig = IndexConfig()
    coldstart: ColdStartConfig
    service: ServiceConfig = ServiceConfig()

    @model_validator(mode="after")
    def _short_fits_slice(self) -> "RolloutSchedConfig":
        if self.budget.short_max_tokens > self.slice_tokens:
            raise ValueError(
                f"budget.short_max_tokens ({self.budget.short_max_tokens}) must be <= slice_tokens "
                f"({self.slice_tokens}) so that a short request finishes within one time slice"
            )
        return self


DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "configs" / "rollout_sched.yaml"


def load_rollout_sched_config(path: str | Path = DEFAULT_CONFIG_PATH, section: str | None = None) -> RolloutSchedConfig:
    """Load a :class:`RolloutSchedConfig` from YAML.

    ``section`` picks a named sub-mapping (e.g. ``"cpu_engine"``) of a multi-profile file; the
    file's top-level ``rollout_sched:`` key is used otherwise. Raises
    :class:`rollmux.config.ConfigError` naming the file and field.
    """
    from pydantic import ValidationError

    from rollmux.config import ConfigError, read_yaml

    data = read_yaml(path)
    key = section or "rollout_sched"
    if not isinstance(data, dict) or key not in data:
        raise ConfigError(f"{path}: missing top-level section {key!r}")
    try:
        return RolloutSchedConfig.model_validate(data[key])
    except ValidationError as e:
        raise ConfigError(f"{path}: section {key}: {e}") from e
