"""Validated data models shared by the policy core, the simulator, the actors and the HTTP app.

Every quantity carries its unit in its name (``_s`` seconds, ``_gb`` gigabytes, ``_usd_per_h``
US dollars per hour, ``_gbps`` gigabits per second). All models are pydantic v2 models; invalid
input raises :class:`pydantic.ValidationError` whose message names the field and the reason.

Source: RollMux (arXiv 2512.11306) §3 "Problem formulation".
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollmux.staleness import MAX_STALENESS, StalenessMode, solo_iteration_s

PoolName = Literal["rollout", "train"]
PhaseName = Literal["rollout", "train", "sync"]
#: The pool each phase runs on: sync holds the training nodes (RollMux §4.3). The one copy of
#: this mapping; everything else calls :func:`pool_of_phase`.
POOL_OF_PHASE: dict[str, PoolName] = {"rollout": "rollout", "train": "train", "sync": "train"}


def pool_of_phase(phase: str) -> PoolName:
    """The pool of ``phase`` ("rollout" | "train" | "sync"). Raises KeyError for another name."""
    return POOL_OF_PHASE[phase]


# --- input bounds (the hard boundary; every request and config number is finite and below these) ---
#: longest phase of one iteration (rollout, training or sync), s: 7 days.
MAX_PHASE_S = 7 * 24 * 3600.0
#: largest policy model, billions of parameters (today's largest dense/MoE models are ~1-2T).
MAX_MODEL_PARAMS_B = 2000.0
#: smallest policy model, billions of parameters (1e-6 B = 1,000 parameters): below it no job can
#: exist, and a measured profile of such a "model" would steer admission with noise.
MIN_MODEL_PARAMS_B = 1e-6
#: shortest phase time a job may declare or report, s (1 ms): a rollout, training step or weight
#: sync shorter than this is a measurement artefact (sync may also be exactly 0: no sync).
MIN_PHASE_S = 1e-3
#: longest prompt or response, tokens (1 Mi tokens).
MAX_TOKENS = 1 << 20
#: most prompts per iteration.
MAX_PROMPTS = 1_000_000
#: most samples per prompt (GRPO group size).
MAX_RESPONSES_PER_PROMPT = 1024
#: most multi-turn rounds per sample.
MAX_TURNS = 1000
#: most GPUs one job asks for in one pool.
MAX_JOB_GPUS = 65_536
#: largest slowdown SLO (co-executed / solo iteration time).
MAX_SLO = 100.0
#: largest host memory of one node, and largest per-node state of one job, GB (64 TB).
MAX_HOST_MEM_GB = 65_536.0
#: largest HBM of one GPU, GB.
MAX_HBM_GB = 4096.0
#: largest GPU peak, TFLOP/s, and memory bandwidth, TB/s.
MAX_TFLOPS = 100_000.0
MAX_HBM_TB_PER_S = 1000.0
#: highest price of one GPU, USD/h.
MAX_GPU_PRICE_USD_PER_H = 1000.0
#: most GPUs per node and nodes per pool.
MAX_GPUS_PER_NODE = 1024
MAX_POOL_NODES = 1_000_000
#: fastest link, Gbit/s (100 Tbit/s).
MAX_LINK_GBPS = 100_000.0
#: job ids: a letter or digit, then letters, digits, ``.``, ``_``, ``-``; at most 128 characters.
#: Such an id is one URL path segment as it is (no escaping, never ``.`` or ``..``).
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
JOB_ID_MAX_LEN = 128
#: priority class and tenant names: a letter, then letters, digits, ``.``, ``_``, ``-`` (<= 64)
CLASS_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"


class _Frozen(BaseModel):
    # allow_inf_nan=False: NaN / +-Infinity are refused ("Input should be a finite number") for
    # every float field; the numeric bounds below then hold for every accepted value.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class _Strict(_Frozen):
    """Request models: strict types (no "8" -> 8, true -> 1, 3.0 -> 3 coercion)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)


class GPUType(_Frozen):
    """One accelerator model and its rental price.

    Attributes:
        name: e.g. ``"H20"``, ``"H800"``.
        price_usd_per_h: hourly price of one GPU (> 0).
        bf16_tflops: dense bf16 peak, TFLOP/s (> 0).
        hbm_gb: device memory, GB (> 0).
        hbm_tb_per_s: device memory bandwidth, TB/s (> 0).

    Where the figures come from (datasheet, paper table) is a comment beside each entry of
    ``configs/gpus.yaml``.
    """

    name: str = Field(min_length=1, max_length=64)
    price_usd_per_h: float = Field(gt=0, le=MAX_GPU_PRICE_USD_PER_H)
    bf16_tflops: float = Field(gt=0, le=MAX_TFLOPS)
    hbm_gb: float = Field(gt=0, le=MAX_HBM_GB)
    hbm_tb_per_s: float = Field(gt=0, le=MAX_HBM_TB_PER_S)


class NodeSpec(_Frozen):
    """A machine of one pool: ``gpus_per_node`` GPUs of ``gpu`` and ``host_mem_gb`` of DRAM.

    Host memory bounds how many jobs' phase states can stay pinned on the node (warm start).
    """

    gpu: GPUType
    gpus_per_node: int = Field(default=8, gt=0, le=MAX_GPUS_PER_NODE)
    host_mem_gb: float = Field(gt=0, le=MAX_HOST_MEM_GB)

    @property
    def price_usd_per_h(self) -> float:
        """Hourly price of the whole node (all its GPUs), USD/h."""
        return self.gpu.price_usd_per_h * self.gpus_per_node


class PoolSpec(_Frozen):
    """One GPU pool (rollout or training) of identical nodes.

    Attributes:
        node: the node type of this pool.
        num_nodes: nodes available; ``None`` means unbounded (simulation measures the peak).
    """

    node: NodeSpec
    num_nodes: Optional[int] = Field(default=None, gt=0, le=MAX_POOL_NODES)


class ClusterSpec(_Frozen):
    """The disaggregated cluster: a rollout pool, a training pool and the links between them.

    ``cross_cluster_gbps`` is the slow link between the pools (paper: 20 Gbps Ethernet);
    ``intra_cluster_gbps`` the fabric inside a pool (paper: 400 Gbps InfiniBand).
    Source: RollMux §6.1 testbed.
    """

    name: str = Field(default="cluster", min_length=1, max_length=128)
    rollout_pool: PoolSpec
    train_pool: PoolSpec
    cross_cluster_gbps: float = Field(default=20.0, gt=0, le=MAX_LINK_GBPS)
    intra_cluster_gbps: float = Field(default=400.0, gt=0, le=MAX_LINK_GBPS)

    def pool(self, pool: PoolName) -> PoolSpec:
        return self.rollout_pool if pool == "rollout" else self.train_pool


class PhaseProfile(_Strict):
    """Phase times of one RL iteration, seconds (finite; each at most :data:`MAX_PHASE_S`).

    For admission these are *worst-case* times (every response at max tokens, RollMux §4.2
    "conservative planning"); measured times may be supplied instead.
    ``max_staleness``: how far the job's rollouts may run ahead of its training (the job's
    :attr:`JobSpec.max_staleness`, stamped by :func:`rollmux.profiler.estimate`; 0 = synchronous),
    which sets how the phases pipeline: ``t_solo_s = t_roll_s + t_train_s + t_sync_s`` for 0,
    ``max(t_roll_s, t_train_s + t_sync_s)`` above (:func:`rollmux.staleness.solo_iteration_s`).
    """

    t_roll_s: float = Field(gt=0, le=MAX_PHASE_S)
    t_train_s: float = Field(gt=0, le=MAX_PHASE_S)
    t_sync_s: float = Field(default=0.0, ge=0, le=MAX_PHASE_S)
    max_staleness: int = Field(default=0, ge=0, le=MAX_STALENESS)

    @property
    def t_solo_s(self) -> float:
        """Steady-state solo iteration time, s (:func:`rollmux.staleness.solo_iteration_s`)."""
        return solo_iteration_s(self.t_roll_s, self.t_train_s, self.t_sync_s, self.max_staleness)

    def with_staleness(self, max_staleness: int) -> "PhaseProfile":
        """This profile for a job of staleness bound ``max_staleness`` (itself when equal)."""
        if max_staleness == self.max_staleness:
            return self
        return PhaseProfile(t_roll_s=self.t_roll_s, t_train_s=self.t_train_s, t_sync_s=self.t_sync_s,
                            max_staleness=max_staleness)

    @property
    def t_train_node_s(self) -> float:
        """Seconds one iteration holds each of the job's training nodes: its training, then its
        sync (the sync holds the training slot, :data:`POOL_OF_PHASE`), ``t_train_s + t_sync_s``.
        The load the job puts on each of its training nodes per meta-iteration (the node-load
        rule, RollMux §4.2 (3)); the one home of that sum (admission's node loads, bounds and
        index, the optimum's layouts, the per-job baselines' busy training GPUs)."""
        return self.t_train_s + self.t_sync_s

    def time_of(self, phase: PhaseName) -> float:
        return {"rollout": self.t_roll_s, "train": self.t_train_s, "sync": self.t_sync_s}[phase]


class DeclaredProfile(PhaseProfile):
    """Phase times a job declares or its runtime reports (``JobSpec.measured``), seconds: a
    :class:`PhaseProfile` with a floor of :data:`MIN_PHASE_S` (1 ms) per phase (sync: 0 = no sync,
    else at least 1 ms). Below it a time is a measurement artefact that would steer admission
    (an internal estimate, e.g. the roofline of a tiny test model, may be shorter: it is a
    plain :class:`PhaseProfile`).

    Raises:
        pydantic.ValidationError: a time below the floor (the error names the field and the floor).
    """

    t_roll_s: float = Field(ge=MIN_PHASE_S, le=MAX_PHASE_S)
    t_train_s: float = Field(ge=MIN_PHASE_S, le=MAX_PHASE_S)
    t_sync_s: float = Field(default=0.0, ge=0, le=MAX_PHASE_S)

    @field_validator("t_sync_s")
    @classmethod
    def _sync_floor(cls, v: float) -> float:
        if 0.0 < v < MIN_PHASE_S:
            raise ValueError(f"t_sync_s = {v:.3g} s: must be 0 (no sync) or at least the floor of {MIN_PHASE_S} s (1 ms)")
        return v

    @field_validator("max_staleness")
    @classmethod
    def _staleness_on_job(cls, v: int) -> int:
        if v != 0:
            raise ValueError("a declared profile holds phase times only: declare the staleness bound on the job "
                             "(max_staleness)")
        return v


TrainPrecision = Literal["bf16_mixed", "fp32", "bf16"]


class JobSpec(_Strict):
    """An RL post-training job (PPO / GRPO / DAPO) as submitted.

    Attributes:
        job_id: unique id: a letter or digit, then letters, digits, ``-``, ``_``, ``.``; at most
            128 characters (:data:`JOB_ID_PATTERN`: usable as one URL path segment unescaped).
        model_params_b: policy model size, billions of parameters.
        num_prompts: prompts per iteration (rollout batch).
        responses_per_prompt: samples per prompt (GRPO group size).
        prompt_tokens: prompt length, tokens.
        max_response_tokens: generation cap, tokens (worst case plans with this).
        mean_response_tokens: mean generated length, tokens (<= max).
        multi_turn: agentic multi-turn rollout; ``turns`` rounds of generation per sample.
        num_rollout_gpus: NR, GPUs of the rollout pool the job asks for.
        num_train_gpus: NT, GPUs of the training pool the job asks for.
        slo: slowdown SLO, co-executed iteration time <= ``slo`` x solo time (>= 1).
        mem_roll_gb / mem_train_gb: host-memory state per node for the rollout / training phase,
            GB; ``None`` derives it from the model size (see :mod:`rollmux.profiler`).
        measured: measured phase times; used instead of the roofline estimate when given.
        train_precision: training numerics, for the training-GPU memory filter
            (:func:`rollmux.profiler.train_gpu_state_gb`): ``"bf16_mixed"`` (bf16 weights and
            gradients, fp32 master weights and AdamW moments: 16 B/param), ``"fp32"`` (16 B/param),
            ``"bf16"`` (pure bf16 incl. the AdamW moments: 8 B/param).
        zero_stage: ZeRO / FSDP sharding of that state over the job's training GPUs (0: none,
            1: optimizer state, 2: + gradients, 3: + weights = FSDP full shard; default 3).
        priority_class: one of the scheduler's ``priority_classes`` (``configs/scheduler.yaml``,
            highest first); ``None`` takes its ``default_priority_class``. Admission refuses an
            unknown name (naming the field).
        tenant: the team the job is charged to (its quota, ``tenants`` in the scheduler config);
            ``None`` takes the config's ``default_tenant``.
        preemptible: whether a job of a higher class (or a tenant reclaiming its quota) may stop
            this one at an iteration boundary and re-queue it (:mod:`rollmux.preemption`).
        max_staleness: ``k``, how many policy versions a rollout's weights may lag behind: 0 (the
            default) is the synchronous on-policy job (rollout ``i`` uses version ``i``); ``k >= 1``
            an asynchronous (off-policy) job whose rollout ``i`` may overlap its training ``i - 1``
            and uses a version ``>= i - k`` (:mod:`rollmux.staleness`).
        staleness_mode: for ``k >= 1``, ``"exact"`` (rollout ``i`` uses exactly version
            ``max(0, i - k)``: deterministic, a co-executed run is bit-identical to its solo
            run; the default) or ``"bounded"`` (the newest version published when it starts,
            ``>= i - k``). Ignored for ``k = 0``.

    Every number is finite and bounded (strict types: no string or boolean coercion):
    ``1e-6 <= model_params_b <= 2000`` (B params, :data:`MIN_MODEL_PARAMS_B`); ``num_prompts`` 1..1e6; ``responses_per_prompt``
    1..1024; ``prompt_tokens``, ``max_response_tokens``, ``mean_response_tokens`` 1..1,048,576
    tokens; ``turns`` 1..1000; GPU counts 1..65,536; ``1 <= slo <= 100``; ``mem_*_gb`` in
    (0, 65,536] GB; ``measured`` phase times in [0.001, 604,800] s (:data:`MIN_PHASE_S`; sync 0 or
    in [0.001, 604,800] s); ``zero_stage`` 0..3; ``max_staleness`` 0..16 (:data:`rollmux.staleness.MAX_STALENESS`).

    Raises:
        pydantic.ValidationError: a non-finite or out-of-range number, a wrong type, SLO < 1,
            mean > max tokens, ... (the error names the field).
    Source: RollMux §3.
    """

    job_id: str = Field(min_length=1, max_length=JOB_ID_MAX_LEN, pattern=JOB_ID_PATTERN)
    model_params_b: float = Field(ge=MIN_MODEL_PARAMS_B, le=MAX_MODEL_PARAMS_B)
    num_prompts: int = Field(default=256, gt=0, le=MAX_PROMPTS)
    responses_per_prompt: int = Field(default=8, gt=0, le=MAX_RESPONSES_PER_PROMPT)
    prompt_tokens: int = Field(default=512, gt=0, le=MAX_TOKENS)
    max_response_tokens: int = Field(default=8192, gt=0, le=MAX_TOKENS)
    mean_response_tokens: Optional[int] = Field(default=None, gt=0, le=MAX_TOKENS)
    multi_turn: bool = False
    turns: int = Field(default=1, gt=0, le=MAX_TURNS)
    num_rollout_gpus: int = Field(default=8, gt=0, le=MAX_JOB_GPUS)
    num_train_gpus: int = Field(default=8, gt=0, le=MAX_JOB_GPUS)
    slo: float = Field(default=1.5, ge=1.0, le=MAX_SLO)
    mem_roll_gb: Optional[float] = Field(default=None, gt=0, le=MAX_HOST_MEM_GB)
    mem_train_gb: Optional[float] = Field(default=None, gt=0, le=MAX_HOST_MEM_GB)
    measured: Optional[DeclaredProfile] = None
    train_precision: TrainPrecision = "bf16_mixed"
    zero_stage: int = Field(default=3, ge=0, le=3)
    priority_class: Optional[str] = Field(default=None, pattern=CLASS_NAME_PATTERN, max_length=64)
    tenant: Optional[str] = Field(default=None, pattern=CLASS_NAME_PATTERN, max_length=64)
    preemptible: bool = True
    max_staleness: int = Field(default=0, ge=0, le=MAX_STALENESS)
    staleness_mode: StalenessMode = "exact"

    @field_validator("measured", mode="before")
    @classmethod
    def _measured_as_declared(cls, v):
        # a PhaseProfile given in code is checked against the floors of a declared profile
        if isinstance(v, PhaseProfile) and not isinstance(v, DeclaredProfile):
            return DeclaredProfile(t_roll_s=v.t_roll_s, t_train_s=v.t_train_s, t_sync_s=v.t_sync_s)
        return v

    @field_validator("measured", mode="after")
    @classmethod
    def _measured_as_profile(cls, v):
        # once checked, the job carries a plain PhaseProfile (equal to the one given)
        return None if v is None else PhaseProfile(t_roll_s=v.t_roll_s, t_train_s=v.t_train_s, t_sync_s=v.t_sync_s)

    @model_validator(mode="after")
    def _check(self) -> "JobSpec":
        if self.mean_response_tokens is not None and self.mean_response_tokens > self.max_response_tokens:
            raise ValueError(
                f"mean_response_tokens ({self.mean_response_tokens}) exceeds max_response_tokens "
                f"({self.max_response_tokens})"
            )
        if not self.multi_turn and self.turns != 1:
            raise ValueError("turns > 1 requires multi_turn=true")
        return self

    @property
    def mean_tokens(self) -> int:
        """Mean response length, tokens (defaults to half the cap)."""
        return self.mean_response_tokens or max(1, self.max_response_tokens // 2)

    def nodes_needed(self, pool: PoolName, node: NodeSpec) -> int:
        """Whole nodes of ``node`` type needed for this job's GPUs in ``pool``."""
        gpus = self.num_rollout_gpus if pool == "rollout" else self.num_train_gpus
        return math.ceil(gpus / node.gpus_per_node)


class Placement(_Frozen):
    """Where one job's phases are pinned: exact rollout and training node ids.

    Pinning decides where the job's state is cached in host memory (RollMux §4.2).
    """

    job_id: str
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]

    @field_validator("rollout_nodes", "train_nodes")
    @classmethod
    def _non_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a placement needs at least one node per pool")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate node in placement: {v}")
        return v


class GroupMember(_Frozen):
    """A job inside a co-execution group: its spec, planning profile and placement.

    The profile pipelines as the job's contract says: a profile given with ``max_staleness`` 0
    takes the spec's :attr:`JobSpec.max_staleness`; any other value must equal it
    (ValidationError otherwise)."""

    spec: JobSpec
    profile: PhaseProfile
    placement: Placement

    @model_validator(mode="before")
    @classmethod
    def _profile_of_job(cls, data):
        if isinstance(data, dict):
            spec, prof = data.get("spec"), data.get("profile")
            if isinstance(spec, JobSpec) and isinstance(prof, PhaseProfile) and prof.max_staleness != spec.max_staleness:
                if prof.max_staleness != 0:
                    raise ValueError(f"profile max_staleness {prof.max_staleness} differs from the job's "
                                     f"{spec.max_staleness}")
                data = {**data, "profile": prof.with_staleness(spec.max_staleness)}
        return data


class CoExecutionGroup(_Frozen):
    """A co-execution group G = (jobs, rollout nodes R_G, training nodes T_G, placements).

    Cost(G) is the hourly price of every GPU of ``rollout_nodes`` and ``train_nodes``
    (RollMux §3). Members are kept in admission order, which is the round-robin order.
    """

    group_id: str
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    members: tuple[GroupMember, ...] = ()

    def cost_usd_per_h(self, cluster: ClusterSpec) -> float:
        return (
            len(self.rollout_nodes) * cluster.rollout_pool.node.price_usd_per_h
            + len(self.train_nodes) * cluster.train_pool.node.price_usd_per_h
        )

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(m.spec.job_id for m in self.members)
