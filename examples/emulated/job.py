"""The emulated job: state builders and phase functions on the phase API (rollout -> training -> sync),
whose compute is a timed wait (see docs/EMULATION.md).

* rollout state: ``{"engine": EmulatedRollout, "rng": numpy Generator, "draws": list of length
  arrays | None, "version": int, "nodes": the nodes it last ran on}``; training state:
  ``{"trainer": EmulatedTrain, "nodes": ...}``. All of it is stored between phases like any
  job's state (object store, commits), so moves and recoveries carry it.
* rollout: one iteration's response lengths (the job's seeded stream, :func:`rollmux.emulation.draw_lengths`;
  with ``cycle_samples = k`` the ``(i mod k)``-th of ``k`` draws made at build time), then the
  engine waits response by response, reporting progress (long-tail migration sees it).
* training: waits the batch's modelled training time; sync: waits the modelled sync time and
  hands the virtual weights to the runtime's counted sync (``sync_backend="counted"``: the §5.2
  plan between the job's workers, bytes counted, not moved).
* a phase whose state last ran on other nodes (the job was moved) first waits the copy of the
  pool's host state (:func:`rollmux.emulation.move_copy_s`), when ``emulate_moves``.

Multi-node jobs: every rank waits the same time (the phase spans the job's nodes); rank 0's
result is the job's. Imports neither torch nor Ray (the drivers and workers stay light).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollmux import emulation
from rollmux.emulation import EmulationConfig
from rollmux.models import ClusterSpec, JobSpec
from rollmux.phase_state import parallel

DEFAULT_SYNC_BACKEND = "counted"


class EmulatedJobConfig(BaseModel):
    """One emulated job: its spec (admission and the model's times), the cluster whose modelled
    hardware times it (the scheduler's), the emulation settings and how many iterations it runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: JobSpec
    cluster: ClusterSpec
    emulation: EmulationConfig = EmulationConfig()
    iterations: int = Field(default=10, ge=1, le=100_000)


def build_rollout_state(cfg: EmulatedJobConfig) -> dict:
    """Rollout-side state (cold start): the emulated engine and the job's length stream."""
    from actors.worker.emulated import EmulatedRollout

    em = cfg.emulation
    rng = emulation.job_rng(cfg.spec.job_id, em.seed)
    draws = [emulation.draw_lengths(cfg.spec, rng, em) for _ in range(em.cycle_samples)] or None
    return {"engine": EmulatedRollout(cfg.spec, cfg.cluster, em), "rng": rng, "draws": draws, "version": 0,
            "nodes": None}


def build_train_state(cfg: EmulatedJobConfig) -> dict:
    """Training-side state (cold start): the emulated training engine."""
    from actors.worker.emulated import EmulatedTrain

    return {"trainer": EmulatedTrain(cfg.spec, cfg.cluster, cfg.emulation), "nodes": None}


def _moved_wait(cfg: EmulatedJobConfig, state: dict, pool: str, engine) -> float:
    """Wait the host-state copy when this phase runs on other nodes than the state's last phase
    (the job was moved); returns the modelled seconds waited (0 when not moved)."""
    nodes = tuple(parallel(pool).nodes)
    last, state["nodes"] = state.get("nodes"), nodes
    if not cfg.emulation.emulate_moves or last is None or last == nodes:
        return 0.0
    model_s = emulation.move_copy_s(cfg.spec, pool, cfg.cluster)  # type: ignore[arg-type]
    engine.wait_model(model_s)
    return model_s


def rollout_phase(cfg: EmulatedJobConfig, state: dict, iteration: int, hook: Any = None) -> dict:
    """Rollout: draw the iteration's lengths, wait response by response (progress reported).
    Returns ``{"iteration", "policy_version", "t_roll_model_s", "token_fraction", "mean_tokens",
    "responses", "wall_s", "progress_reports", "move_model_s"}``."""
    eng = state["engine"]
    moved = _moved_wait(cfg, state, "rollout", eng)
    draws = state["draws"]
    lengths = draws[iteration % len(draws)] if draws else emulation.draw_lengths(cfg.spec, state["rng"], cfg.emulation)
    ctx = parallel("rollout")
    node = ctx.nodes[ctx.rank] if len(ctx.nodes) > ctx.rank else None  # the runtime's rank: migration acted out there
    out = eng.generate(lengths, progress=getattr(hook, "progress", None), node=node)
    return {"iteration": iteration, "policy_version": state["version"], "move_model_s": moved, **out}


def train_phase(cfg: EmulatedJobConfig, state: dict, samples: dict) -> dict:
    """Training: wait the batch's modelled training time. Returns ``{"iteration", "step",
    "t_train_model_s", "wall_s", "t_roll_model_s", "move_model_s"}``."""
    tr = state["trainer"]
    moved = _moved_wait(cfg, state, "train", tr)
    out = tr.step(samples["token_fraction"])
    return {"iteration": samples["iteration"], "t_roll_model_s": samples["t_roll_model_s"],
            "move_model_s": moved + samples.get("move_model_s", 0.0), **out}


def publish_weights(cfg: EmulatedJobConfig, state: dict) -> dict:
    """Sync (send side): wait the modelled transfer time; the virtual weights for the counted plan."""
    return state["trainer"].send_weights()


def apply_weights(cfg: EmulatedJobConfig, state: dict, weights: dict) -> None:
    """Sync (receive side): the rollout engine takes the (virtual) weights; policy version + 1."""
    state["engine"].load_weights(weights)
    state["version"] += 1


def gather_first(results: list[dict]) -> dict:
    """The ranks' results (rank order) of a multi-node phase: rank 0's (every rank waited the same
    time). Raises ValueError when the rollout ranks hold different policy versions."""
    if len({r.get("policy_version") for r in results}) > 1:
        raise ValueError(f"rollout ranks hold different policy versions: {[r.get('policy_version') for r in results]}")
    return results[0]


def make_job(cfg: EmulatedJobConfig, *, attach: Optional[bool] = None, **job_kw):
    """Register the emulated phases on a ``rollmux.Job``; returns ``(job, rollout, train, publish)``.
    ``job_kw`` go to :class:`rollmux.Job` (``scheduler_name``, ``checkpoint_dir``, ...);
    ``sync_backend`` defaults to ``"counted"``."""
    import rollmux
    from examples.grpo.bind import register_phases

    job_kw.setdefault("sync_backend", DEFAULT_SYNC_BACKEND)
    job = rollmux.Job(cfg.spec, attach=attach, **job_kw)
    rollout, train, publish = register_phases(job, sys.modules[__name__], cfg, gather_rollout=gather_first,
                                              gather_train=gather_first)
    return job, rollout, train, publish


def run_job(cfg: EmulatedJobConfig, *, attach: Optional[bool] = None, ready: Optional[Callable[[], None]] = None,
            **job_kw) -> dict:
    """The emulated RL loop (rollout -> training -> sync, ``cfg.iterations`` times; an asynchronous
    job's next rollout beside this training, :meth:`rollmux.Job.pipeline`).

    Returns ``{"job_id", "iterations", "history", "submitted_at", "admitted_at", "finished_at"
    (epoch s), "wall_s", "mode", "timeline", "info", "moves"}``. Raises what the phase API raises
    (AdmissionRefused, PhaseFailed, a phase's own exception).
    """
    submitted = time.time()
    job, rollout, train, publish = make_job(cfg, attach=attach, **job_kw)
    admitted = time.time()
    if ready is not None:
        try:
            ready()
        except BaseException as e:
            job.fail(e)
            raise
    history: list[dict] = []
    with job:  # an asynchronous job (spec.max_staleness k >= 1) runs up to k rollouts ahead
        for it, samples in job.pipeline(rollout, range(cfg.iterations)):
            history.append(train(samples))
            publish()
    return {"job_id": cfg.spec.job_id, "iterations": len(history), "history": history, "submitted_at": submitted,
            "admitted_at": admitted, "finished_at": time.time(), "wall_s": time.time() - submitted, "mode": job.mode,
            "timeline": job.timeline, "info": job.info, "moves": list(getattr(job.runtime, "moves", []))}


def run_arrivals(cfgs: Sequence[EmulatedJobConfig], arrivals_s: Sequence[float], *, timeout_s: float,
                 **job_kw) -> dict[str, Any]:
    """Run emulated jobs as threads of this process (light drivers: one thread each), job ``k``
    submitted ``arrivals_s[k]`` wall seconds after the call (attached to the scheduler named by
    ``job_kw["scheduler_name"]`` or env). Returns ``{job_id: run_job result or the exception}``.
    Raises TimeoutError when they do not all finish within ``timeout_s``; ValueError on
    mismatched lengths."""
    if len(cfgs) != len(arrivals_s):
        raise ValueError(f"{len(cfgs)} jobs but {len(arrivals_s)} arrival times")
    results: dict[str, Any] = {}
    stop = threading.Event()
    t0 = time.monotonic()

    def go(cfg: EmulatedJobConfig, at: float) -> None:
        if stop.wait(max(0.0, t0 + at - time.monotonic())):
            return
        try:
            results[cfg.spec.job_id] = run_job(cfg, attach=True, **job_kw)
        except BaseException as e:  # returned to the caller
            results[cfg.spec.job_id] = e

    threads = [threading.Thread(target=go, args=(c, float(a)), name=f"emulated-{c.spec.job_id}", daemon=True)
               for c, a in zip(cfgs, arrivals_s)]
    for t in threads:
        t.start()
    deadline = t0 + timeout_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        stop.set()
        raise TimeoutError(f"emulated jobs did not finish within {timeout_s:g} s "
                           f"({sum(t.is_alive() for t in threads)} still running)")
    return results
