"""Emulated accelerators: the cost model's phase times as timed waits (no hardware).

An emulated job (:mod:`examples.emulated.job`) runs on the real runtime (Ray actors, the
GlobalScheduler, GroupControllers, permits, moves, commits, sync plans), but its phases compute
nothing: each one waits the time the profiler's model gives for it on the cluster's modelled
hardware, scaled by a time factor (:attr:`EmulationConfig.wall_ms_per_model_s`: one modelled
second = that many wall milliseconds). This module is the model side (pure, no Ray, no sleeping):
which lengths a rollout draws and when each response finishes; :mod:`actors.worker.emulated` holds the
backends that wait.

Every time comes from :mod:`rollmux.profiler` (one copy of the model, the same the simulator
replays):

* **Rollout**: per-response lengths, seeded (``(seed, crc32(job_id))``, the simulator's
  :class:`rollmux.sim.realisation.Realisation` stream), log-normal with shape
  :attr:`EmulationConfig.length_sigma` and mean ``job.mean_tokens``, clipped to
  ``[1, max_response_tokens]`` (:func:`rollmux.profiler.sample_response_lengths`; RollMux Fig. 11
  long tail), or all at the cap (``response_lengths: worst_case``, the simulator's deterministic
  realisation). Response ``k`` finishes at :func:`rollmux.profiler.response_finish_times` (fluid
  continuous batching, scaled so all-max lengths take the job's worst-case ``t_roll_s``); the last
  finish is the rollout's time, the ``trigger_fraction`` quantile its ``t_trigger_s``, exactly as
  :func:`rollmux.profiler.sample_iteration`.
* **Training**: ``t_train_s`` (worst case) x :func:`rollmux.profiler.token_fraction` of the batch.
* **Sync**: ``t_sync_s`` of :func:`rollmux.profiler.estimate` (the §5.2 plan's predicted time over
  the cluster's links, :func:`rollmux.profiler.sync_time`); the runtime's sync runs the real plan
  with the bytes counted, not moved (sync backend ``"counted"``), over :func:`virtual_weights`.
* **Memory**: host state per node :func:`rollmux.profiler.state_gb`, training-GPU state
  :func:`rollmux.profiler.train_gpu_state_gb`; a move copies the host state at
  ``intra_cluster_gbps`` (:func:`move_copy_s`, the two halves of
  :func:`rollmux.profiler.move_time_s`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rollmux import profiler
from rollmux.models import ClusterSpec, JobSpec, PhaseProfile, PoolName
from rollmux.sync_plan import TensorMeta

__all__ = ["EmulationConfig", "RolloutPlan", "VirtualTensor", "draw_lengths", "job_rng", "load_emulation_config",
           "move_copy_s", "plan_rollout", "scheduler_config", "sync_s", "train_s", "virtual_weights", "wall_s"]


class EmulationConfig(BaseModel):
    """Settings of the emulated accelerators (``configs/emulation.yaml``).

    Attributes:
        wall_ms_per_model_s: the time factor: wall milliseconds per modelled second (10: a 400 s
            modelled rollout waits 4 s).
        response_lengths: ``sampled`` (seeded log-normal lengths, the long tail) or
            ``worst_case`` (every response at ``max_response_tokens``).
        length_sigma: shape of the log-normal lengths.
        cycle_samples: 0 = a fresh draw of lengths every iteration; ``k`` = iteration ``i`` uses
            the ``(i mod k)``-th of ``k`` draws made when the state is built (the simulator's
            stochastic realisation keeps ``k`` samples per job and cycles them).
        seed: seeds every job's lengths together with its id.
        progress_tick_ms: a rollout reports progress at most once per this many wall ms (the
            responses finished meanwhile are reported together).
        emulate_moves: a moved job's first phase on its new nodes waits the copy of its host
            state at ``intra_cluster_gbps`` (what the simulator charges a move).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_ms_per_model_s: float = Field(default=10.0, gt=0.0, le=1000.0)
    response_lengths: Literal["sampled", "worst_case"] = "sampled"
    length_sigma: float = Field(default=profiler.RESPONSE_LENGTH_SIGMA, ge=0.0, le=4.0)
    cycle_samples: int = Field(default=0, ge=0, le=10_000)
    seed: int = Field(default=0, ge=0)
    progress_tick_ms: float = Field(default=2.0, gt=0.0, le=1000.0)
    emulate_moves: bool = True


def load_emulation_config(path: Union[str, Path, None] = None) -> EmulationConfig:
    """``configs/emulation.yaml`` (or ``path``) as an :class:`EmulationConfig`.
    Raises :class:`rollmux.config.ConfigError` naming the field."""
    from rollmux.config import CONFIG_DIR, load_model

    return load_model(path or CONFIG_DIR / "emulation.yaml", EmulationConfig)


def scheduler_config(config, cfg: "EmulationConfig"):
    """The scheduler settings (:class:`rollmux.admission.SchedulerConfig`) of a cluster on emulated
    accelerators: its bounds in the cluster's own time (``drain_grace_s``, ``drain_max_s``: how
    long a drain waits for a report before it counts as done) are modelled seconds there, waited
    at the time factor like every phase (60 s of grace = 2.4 wall s at 40 ms per modelled s), so
    that the emulated cluster waits what a real one would; and the time factor itself
    (``wall_s_per_model_s``), by which the jobs' measured phase times (wall seconds) are divided
    before the SLO watch compares them with configured profiles (modelled seconds)."""
    f = cfg.wall_ms_per_model_s / 1000.0
    return config.overridden(drain_grace_s=config.drain_grace_s * f, drain_max_s=config.drain_max_s * f,
                             wall_s_per_model_s=f)


def wall_s(model_s: float, cfg: EmulationConfig) -> float:
    """Wall seconds of ``model_s`` modelled seconds under the time factor."""
    return float(model_s) * cfg.wall_ms_per_model_s / 1000.0


def job_rng(job_id: str, seed: int) -> np.random.Generator:
    """The job's length stream: ``default_rng([seed, crc32(job_id)])`` (the simulator's
    :class:`rollmux.sim.realisation.Realisation` seeds each job the same way)."""
    return np.random.default_rng([int(seed), zlib.crc32(job_id.encode())])


def draw_lengths(job: JobSpec, rng: np.random.Generator, cfg: EmulationConfig) -> np.ndarray:
    """One iteration's response lengths (tokens), shape ``(num_prompts * responses_per_prompt,)``:
    :func:`rollmux.profiler.sample_response_lengths` (``sampled``; one draw from ``rng``) or all
    at the cap (``worst_case``; ``rng`` untouched)."""
    n = job.num_prompts * job.responses_per_prompt
    if cfg.response_lengths == "worst_case":
        return np.full(n, float(job.max_response_tokens))
    return profiler.sample_response_lengths(job, rng, sigma=cfg.length_sigma)


@dataclass(frozen=True)
class RolloutPlan:
    """One emulated rollout: ``finish_s[k]`` = modelled seconds (from the start) at which the
    ``k+1`` shortest responses are done (ascending); ``t_roll_s`` = the last; ``token_fraction``:
    the batch's tokens over the worst case (training scales with it)."""

    finish_s: np.ndarray
    t_roll_s: float
    token_fraction: float
    mean_tokens: float


def _profile(job: JobSpec, cluster: ClusterSpec, profile: Optional[PhaseProfile]) -> PhaseProfile:
    return profile or profiler.estimate(job, cluster)


def plan_rollout(job: JobSpec, cluster: ClusterSpec, lengths: np.ndarray,
                 profile: Optional[PhaseProfile] = None) -> RolloutPlan:
    """The finish times of a rollout with response ``lengths`` (see the module docstring)."""
    fin = profiler.response_finish_times(job, cluster, lengths, _profile(job, cluster, profile))
    return RolloutPlan(finish_s=fin, t_roll_s=float(fin[-1]), token_fraction=profiler.token_fraction(job, lengths),
                       mean_tokens=float(np.mean(lengths)))


def train_s(job: JobSpec, cluster: ClusterSpec, token_fraction: float, profile: Optional[PhaseProfile] = None) -> float:
    """Modelled training seconds of a batch with ``token_fraction`` of the worst case's tokens."""
    return _profile(job, cluster, profile).t_train_s * float(token_fraction)


def sync_s(job: JobSpec, cluster: ClusterSpec, profile: Optional[PhaseProfile] = None) -> float:
    """Modelled weight-sync seconds (the §5.2 plan's predicted time, :func:`rollmux.profiler.sync_time`)."""
    return _profile(job, cluster, profile).t_sync_s


def move_copy_s(job: JobSpec, pool: PoolName, cluster: ClusterSpec) -> float:
    """Modelled seconds to copy the job's host state of ``pool`` to a new node at
    ``intra_cluster_gbps`` (the ``pool`` half of :func:`rollmux.profiler.move_time_s`)."""
    return profiler.state_gb(job, pool, cluster) * 8.0 / cluster.intra_cluster_gbps


class VirtualTensor:
    """A weight tensor of ``nbytes`` bytes that holds no data (duck-typed for
    :meth:`rollmux.sync_plan.TensorMeta.of`: ``shape``, ``dtype``, ``numel()``, ``element_size()``)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, nbytes: int) -> None:
        self.shape = (int(nbytes),)
        self.dtype = "uint8"

    def numel(self) -> int:
        return self.shape[0]

    def element_size(self) -> int:
        return 1

    def __getstate__(self):
        return self.shape[0]

    def __setstate__(self, n) -> None:
        self.shape, self.dtype = (int(n),), "uint8"

    def __repr__(self) -> str:
        return f"VirtualTensor({self.shape[0]} B)"


def virtual_weights(job: JobSpec) -> dict[str, VirtualTensor]:
    """One bf16 copy of the job's model as :data:`rollmux.profiler.SYNC_PLAN_TENSORS` equal
    virtual tensors (the tensors :func:`rollmux.profiler.sync_time` plans with)."""
    total = int(round(2.0 * job.model_params_b * 1e9))
    k = profiler.SYNC_PLAN_TENSORS
    return {f"layer{i}": VirtualTensor(total // k + (1 if i < total % k else 0)) for i in range(k)}


def weight_metas(weights: dict) -> tuple[TensorMeta, ...]:
    """Metadata of (virtual) weights, as the sync plan reads them."""
    return tuple(TensorMeta.of(k, v) for k, v in weights.items())
