"""Backends of the emulated accelerators: a rollout engine and a training engine whose compute is
a timed wait (the model is :mod:`rollmux.emulation`, i.e. :mod:`rollmux.profiler`).

They play the roles of :class:`actors.backends.RolloutBackend` / :class:`actors.backends.TrainBackend`
for a job that moves no tensors (those interfaces take torch tensors; these take response lengths
and token fractions, and import neither torch nor Ray, so a worker hosting only emulated jobs stays
a light process):

* :meth:`EmulatedRollout.generate` waits response by response until each one's modelled finish
  time (x the time factor) and calls ``progress(done, total)`` as they finish (at most once per
  ``progress_tick_ms``), so the GroupController's long-tail migration sees the same progress a
  real engine reports;
* :meth:`EmulatedTrain.step` waits the modelled training time of the batch;
  :meth:`EmulatedTrain.send_weights` waits the modelled sync time and returns the
  :func:`rollmux.emulation.virtual_weights` the counted sync plans with;
* both carry the host / GPU memory the profiler gives their state (``host_gb``, ``gpu_gb``).

Waits are against absolute deadlines from the phase's start (no drift from many short sleeps).
``clock`` / ``sleep`` are injectable (tests).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from rollmux import emulation, profiler
from rollmux.emulation import EmulationConfig
from rollmux.models import ClusterSpec, JobSpec

ProgressFn = Callable[[int, int], None]


class _Emulated:
    def __init__(self, job: JobSpec, cluster: ClusterSpec, cfg: EmulationConfig, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.job, self.cluster, self.cfg = job, cluster, cfg
        self.profile = profiler.estimate(job, cluster)  # worst-case phase times (job.measured wins)
        self.clock, self.sleep = clock, sleep
        self.waited_s = 0.0  # wall seconds waited in all (for the records)

    def __getstate__(self) -> dict:  # stored between phases: the clock and sleep are this process's
        return {k: v for k, v in self.__dict__.items() if k not in ("clock", "sleep")}

    def __setstate__(self, st: dict) -> None:
        self.__dict__.update(st)
        self.clock, self.sleep = time.monotonic, time.sleep

    def wait_until(self, deadline: float) -> None:
        """Sleep until ``clock() >= deadline`` (bounded: at most one sleep per remaining interval)."""
        for _ in range(1000):
            left = deadline - self.clock()
            if left <= 0:
                return
            self.sleep(left)

    def wait_model(self, model_s: float) -> float:
        """Wait ``model_s`` modelled seconds (x the time factor); returns the wall seconds waited."""
        t0 = self.clock()
        self.wait_until(t0 + emulation.wall_s(model_s, self.cfg))
        dt = self.clock() - t0
        self.waited_s += dt
        return dt


class EmulatedRollout(_Emulated):
    """Rollout engine of one job on emulated rollout GPUs (see the module docstring).

    ``host_gb``: host state per node (:func:`rollmux.profiler.state_gb`, rollout pool).
    """

    name = "emulated"

    def __init__(self, job: JobSpec, cluster: ClusterSpec, cfg: EmulationConfig, **kw):
        super().__init__(job, cluster, cfg, **kw)
        self.host_gb = profiler.state_gb(job, "rollout", cluster)
        self.gpu_gb = 2.0 * job.model_params_b  # bf16 weights (the KV cache takes the rest of the HBM)
        self.weights_version = 0
        self.weight_bytes = 0

    def plan(self, lengths: np.ndarray) -> emulation.RolloutPlan:
        """The modelled finish times of a rollout with these response lengths."""
        return emulation.plan_rollout(self.job, self.cluster, lengths, self.profile)

    def generate(self, lengths: np.ndarray, *, progress: Optional[ProgressFn] = None,
                 node: Optional[str] = None) -> dict:
        """Emulate one rollout whose responses have ``lengths`` (tokens, shape ``(n,)``): wait
        until each response's modelled finish time, reporting ``progress(done, n)`` as they finish.
        With ``node`` (the pool node this rank runs on), long-tail migration's effect is acted out
        with the other emulated rollouts on that node (:mod:`actors.worker.emulated_tail`: a migrated
        rollout's tail stretches, the next one runs on the freed GPUs' share).

        Returns ``{"t_roll_model_s", "token_fraction", "mean_tokens", "responses", "wall_s",
        "progress_reports", "migrated"}`` (modelled seconds and the wall seconds waited).
        """
        p = self.plan(lengths)
        n = len(p.finish_s)
        wall = p.finish_s * (self.cfg.wall_ms_per_model_s / 1000.0)
        tick = self.cfg.progress_tick_ms / 1000.0
        t0 = self.clock()
        done, reports = 0, 0
        if node is not None:
            return self._generate_on_node(p, node, progress, t0, tick)
        while done < n:  # bounded: each pass finishes >= 1 response
            # the next finish, or (reporting) the next tick when sooner ones finish in between; never
            # later than the last finish (the rollout ends on time)
            nxt = wall[done] if progress is None else max(wall[done], min(tick * (reports + 1), wall[-1]))
            self.wait_until(t0 + nxt)
            now = self.clock() - t0
            done = max(done + 1, int(np.searchsorted(wall, now, side="right")))
            done = min(done, n)
            if progress is not None:
                progress(done, n)
                reports += 1
        dt = self.clock() - t0
        self.waited_s += dt
        return {"t_roll_model_s": p.t_roll_s, "token_fraction": p.token_fraction, "mean_tokens": p.mean_tokens,
                "responses": n, "wall_s": dt, "progress_reports": reports}

    def _generate_on_node(self, p: emulation.RolloutPlan, node: str, progress: Optional[ProgressFn], t0: float,
                          tick: float) -> dict:
        from actors.worker import emulated_tail

        m = profiler.rollout_model(self.job, self.cluster.rollout_pool.node.gpu, self.job.num_rollout_gpus,
                                   self.job.max_response_tokens)
        e = emulated_tail.begin(self.job.job_id, node, p.finish_s, t0, self.cfg.wall_ms_per_model_s / 1000.0,
                                gpus=self.job.num_rollout_gpus, slots=m.replicas * m.concurrency,
                                slack_model_s=max(0.0, self.profile.t_roll_s - p.t_roll_s))
        try:
            reports = emulated_tail.wait_responses(e, self.clock, self.wait_until, tick, progress)
        finally:
            emulated_tail.end(e)
        dt = self.clock() - t0
        self.waited_s += dt
        return {"t_roll_model_s": p.t_roll_s, "token_fraction": p.token_fraction, "mean_tokens": p.mean_tokens,
                "responses": len(p.finish_s), "wall_s": dt, "progress_reports": reports,
                "migrated": bool(e.migrations)}

    def load_weights(self, weights: dict) -> None:
        """Apply synced (virtual) weights: counts their bytes, bumps the engine's version."""
        self.weight_bytes = sum(int(v.numel()) * int(v.element_size()) for v in weights.values())
        self.weights_version += 1

    def offload(self) -> None:
        """Nothing to move off the emulated GPUs (the model charges no switch time)."""

    def load(self) -> None:
        """Nothing to move onto the emulated GPUs."""


class EmulatedTrain(_Emulated):
    """Training engine of one job on emulated training GPUs (see the module docstring).

    ``host_gb``: host state per node (:func:`rollmux.profiler.state_gb`, training pool);
    ``gpu_gb``: per training GPU (:func:`rollmux.profiler.train_gpu_state_gb`).
    """

    name = "emulated"

    def __init__(self, job: JobSpec, cluster: ClusterSpec, cfg: EmulationConfig, **kw):
        super().__init__(job, cluster, cfg, **kw)
        self.host_gb = profiler.state_gb(job, "train", cluster)
        self.gpu_gb = profiler.train_gpu_state_gb(job)
        self.steps = 0

    def step(self, token_fraction: float) -> dict:
        """Emulate one training step on a batch with ``token_fraction`` of the worst case's tokens.
        Returns ``{"t_train_model_s", "wall_s", "step"}``."""
        model_s = emulation.train_s(self.job, self.cluster, token_fraction, self.profile)
        dt = self.wait_model(model_s)
        self.steps += 1
        return {"t_train_model_s": model_s, "wall_s": dt, "step": self.steps}

    def send_weights(self) -> dict:
        """Emulate the weight sync's transfer time (the plan's predicted time over the cluster's
        links) and return the virtual weights the counted sync plans with."""
        self.wait_model(emulation.sync_s(self.job, self.cluster, self.profile))
        return emulation.virtual_weights(self.job)

    def offload(self) -> None:
        """Nothing to move off the emulated GPUs."""

    def load(self) -> None:
        """Nothing to move onto the emulated GPUs."""
