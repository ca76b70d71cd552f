"""Shared test factories: job specs, toy phase-API jobs, and :func:`wait_until`.

Every test that needs a toy job, a small job spec or a bounded wait imports it from here
instead of writing its own (tests/conftest.py puts this folder on ``sys.path``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, TypeVar

import torch

T = TypeVar("T")

#: Sleep seconds of a toy job's (rollout, training) phases.
SLEEP = {"big": (0.25, 0.25), "small": (0.08, 0.08)}


def wait_until(probe: Callable[[], T], *, timeout_s: float = 60.0, interval_s: float = 0.1,
               what: str = "condition", ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``probe()`` until it returns a truthy value; return that value.

    Bounded: raises ``TimeoutError`` naming ``what`` (and the last value or error) after
    ``timeout_s``. Exceptions in ``ignore`` (e.g. an actor restarting) count as "not yet".
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except ignore as e:  # noqa: PERF203  (a restarting actor: try again)
            last = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s:g} s (last: {last!r})")
        time.sleep(interval_s)


def toy_spec(job_id: str, kind: str, slo: float = 5.0) -> dict:
    """Measured profiles that Alg. 1 packs into one group on 1 rollout + 1 training node
    (``big``: 5 s rollout + 5 s training, ``small``: 2 s + 2 s; 0.5 GB per pool)."""
    t = {"big": (5.0, 5.0), "small": (2.0, 2.0)}[kind]
    return {"job_id": job_id, "model_params_b": 0.001, "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": slo,
            "mem_roll_gb": 0.5, "mem_train_gb": 0.5,
            "measured": {"t_roll_s": t[0], "t_train_s": t[1], "t_sync_s": 0.0}}


def small_spec(job_id: str, kind: str = "small") -> dict:
    """:func:`toy_spec` with an SLO of 5."""
    return toy_spec(job_id, kind, slo=5.0)


def make_toy(job, kind: str, seed: int, fail_at: Optional[int] = None):
    """Register a toy RL loop on ``job`` (a :class:`rollmux.Job`): 4-float weights, rollouts that
    report progress in 5 steps, training that can fail at iteration ``fail_at``. Returns the
    decorated ``(rollout, train, publish)``; all randomness lives in the states (seeded)."""
    roll_s, train_s = SLEEP[kind]

    @job.state("rollout")
    def build_rollout():
        return {"w": torch.zeros(4), "gen": torch.Generator().manual_seed(seed)}

    @job.state("train")
    def build_train():
        return {"w": torch.zeros(4), "gen": torch.Generator().manual_seed(seed + 1)}

    @job.phase("rollout")
    def rollout(state, iteration, hook):
        for i in range(1, 6):
            time.sleep(roll_s / 5)
            hook.progress(i, 5)
        return {"x": torch.randn(4, generator=state["gen"]) + state["w"], "it": iteration}

    @job.phase("train")
    def train(state, samples):
        time.sleep(train_s)
        if fail_at is not None and samples["it"] == fail_at:
            raise RuntimeError(f"injected failure in training, iteration {fail_at}")
        state["w"] = state["w"] * 0.5 + samples["x"] * torch.rand(4, generator=state["gen"])
        return {"w": state["w"].clone()}

    @job.phase("sync")
    def publish(state):
        return {"w": state["w"].clone()}

    @job.apply_weights
    def apply(state, weights):
        state["w"] = weights["w"].clone()

    return rollout, train, publish


def kill_scheduler_and_controllers(h, name: str, groups: tuple[str, ...] = ("group-0", "group-1")) -> None:
    """Kill a test's GlobalScheduler ``h`` (named ``name``) and its groups' controllers, no restart."""
    import ray

    for g in groups:
        try:
            ray.kill(ray.get_actor(f"{name}-{g}", namespace="rollmux"), no_restart=True)
        except ValueError:  # that group never had a controller (or it already exited)
            pass
    ray.kill(h, no_restart=True)
