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

PoolName = Literal["rollout", "train"]
PhaseName = Literal["rollout", "train", "sync"]
#: The pool each phase runs on: sync holds the training nodes (RollMux §4.3). The one copy of
#: this mapping; everything else calls :func:`pool_of_phase`.
POOL_OF_PHASE: dict[str, PoolName] = {"rollout": "rollout", "train": "train", "sync": "train"}


def pool_of_phase(phase: str) -> PoolName:
    """The pool of ``phase`` ("rollout" | "train" | "sync"). Raises KeyError for another name."""
    return POOL_OF_PHASE[phase]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPUType(_Frozen):
    """One accelerator model and its rental price.

    Attributes:
        name: e.g. ``"H20"``, ``"H800"``.
        price_usd_per_h: hourly price of one GPU (> 0).
        bf16_tflops: dense bf16 peak, TFLOP/s (> 0).
        hbm_gb: device memory, GB (> 0).
        hbm_tb_per_s: device memory bandwidth, TB/s (> 0).
        source: where the figures come from (datasheet, paper table).
    """

    name: str = Field(min_length=1)
    price_usd_per_h: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    hbm_gb: float = Field(gt=0)
    hbm_tb_per_s: float = Field(gt=0)
    source: str = ""


class NodeSpec(_Frozen):
    """A machine of one pool: ``gpus_per_node`` GPUs of ``gpu`` and ``host_mem_gb`` of DRAM.

    Host memory bounds how many jobs' phase states can stay pinned on the node (warm start).
    """

    gpu: GPUType
    gpus_per_node: int = Field(default=8, gt=0)
    host_mem_gb: float = Field(gt=0)

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
    num_nodes: Optional[int] = Field(default=None, gt=0)


class ClusterSpec(_Frozen):
    """The disaggregated cluster: a rollout pool, a training pool and the links between them.

    ``cross_cluster_gbps`` is the slow link between the pools (paper: 20 Gbps Ethernet);
    ``intra_cluster_gbps`` the fabric inside a pool (paper: 400 Gbps InfiniBand).
    Source: RollMux §6.1 testbed.
    """

    name: str = "cluster"
    rollout_pool: PoolSpec
    train_pool: PoolSpec
    cross_cluster_gbps: float = Field(default=20.0, gt=0)
    intra_cluster_gbps: float = Field(default=400.0, gt=0)

    def pool(self, pool: PoolName) -> PoolSpec:
        return self.rollout_pool if pool == "rollout" else self.train_pool


class PhaseProfile(_Frozen):
    """Phase times of one RL iteration, seconds.

    For admission these are *worst-case* times (every response at max tokens, RollMux §4.2
    "conservative planning"); measured times may be supplied instead.
    ``t_solo_s = t_roll_s + t_train_s + t_sync_s``.
    """

    t_roll_s: float = Field(gt=0)
    t_train_s: float = Field(gt=0)
    t_sync_s: float = Field(default=0.0, ge=0)

    @property
    def t_solo_s(self) -> float:
        return self.t_roll_s + self.t_train_s + self.t_sync_s

    def time_of(self, phase: PhaseName) -> float:
        return {"rollout": self.t_roll_s, "train": self.t_train_s, "sync": self.t_sync_s}[phase]


class JobSpec(_Frozen):
    """An RL post-training job (PPO / GRPO / DAPO) as submitted.

    Attributes:
        job_id: unique id (letters, digits, ``-``, ``_``, ``.``).
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

    Raises:
        pydantic.ValidationError: non-positive sizes, SLO < 1, mean > max tokens, ...
    Source: RollMux §3.
    """

    job_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    model_params_b: float = Field(gt=0, le=2000)
    num_prompts: int = Field(default=256, gt=0)
    responses_per_prompt: int = Field(default=8, gt=0)
    prompt_tokens: int = Field(default=512, gt=0)
    max_response_tokens: int = Field(default=8192, gt=0)
    mean_response_tokens: Optional[int] = Field(default=None, gt=0)
    multi_turn: bool = False
    turns: int = Field(default=1, gt=0)
    num_rollout_gpus: int = Field(default=8, gt=0)
    num_train_gpus: int = Field(default=8, gt=0)
    slo: float = Field(default=1.5, ge=1.0, le=100.0)
    mem_roll_gb: Optional[float] = Field(default=None, gt=0)
    mem_train_gb: Optional[float] = Field(default=None, gt=0)
    measured: Optional[PhaseProfile] = None

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
    """A job inside a co-execution group: its spec, planning profile and placement."""

    spec: JobSpec
    profile: PhaseProfile
    placement: Placement


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
