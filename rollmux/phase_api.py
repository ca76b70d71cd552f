"""The phase API: decorate an ordinary RL loop so RollMux can multiplex its phases.

A user writes one script; it runs *solo* (plain Python, in this process) or *scheduled* (attached to
the RollMux ``GlobalScheduler`` on a Ray cluster) without change::

    job = rollmux.Job(spec)                       # spec: rollmux.models.JobSpec (or a dict)

    @job.state("rollout")                         # zero-arg builder of the rollout-side state dict
    def build_rollout(): return {"policy": model, "gen": torch.Generator().manual_seed(0)}
    @job.state("train")
    def build_train(): return {"policy": model, "optimizer": opt}

    @job.phase("rollout")
    def rollout(state, iteration, hook): ...; hook.progress(done, total); return samples
    @job.phase("train")
    def train(state, samples): ...; return {"loss": ...}
    @job.phase("sync")
    def publish(train_state): return {name: tensor}
    @job.apply_weights
    def apply(rollout_state, weights): ...

    with job:
        for it in range(n):
            metrics = train(rollout(it)); publish()

Calling a decorated phase blocks for the phase permit of the job's co-execution group (scheduled
mode), warm-starts the phase state (Ray object store -> "device": the worker process heap),
runs the function, offloads the state back and releases the permit (RollMux §5 "phase API",
actors/worker/README.md "Runtime conventions"). In plain mode the state simply stays in this process.

State conventions (both modes):
- A builder returns a ``dict``; it runs once (the cold start) where the state lives.
- Between phases every state value is stored in the Ray object store, except values carrying a
  truthy ``rollmux_resident`` attribute (the job's *control plane*: a vLLM engine, a collectives
  endpoint, an environment handle), which stay alive in the worker process.
- Around each phase the runtime calls ``offload()`` (else ``sleep()``) on every value that has it
  when the phase ends, and ``load()`` (else ``wake_up()``/``wake()``) when a phase warm-starts.
- All randomness must live in the state (e.g. a ``torch.Generator``), never in global RNG, so a
  co-executed run is bit-identical to a solo run with the same seed. Phases compute on one thread
  (``torch.set_num_threads(1)``) in both modes for the same reason.

Asynchronous jobs (``spec.max_staleness`` k >= 1, :mod:`rollmux.staleness`): ``job.pipeline(rollout,
iterations)`` yields ``(it, samples)`` while it keeps up to k rollouts running ahead in a thread of
its own (rollout ``it + 1`` beside training ``it``); the rest of the loop is unchanged::

    for it, samples in job.pipeline(rollout, range(n)):
        train(samples); publish()

Each sync publishes policy version ``it + 1``; a rollout applies the version its mode prescribes
(``exact``: ``it - k``; ``bounded``: the newest published) and its record says which
(``policy_version``); a rollout whose version is not published yet is refused
(:class:`rollmux.staleness.StalenessError`). For k = 0 the pipeline is the plain loop.

Mode selection (``Job(spec, attach=None)``): scheduled when ``attach=True``, or when
``attach=None`` and env ``ROLLMUX_ATTACH=1`` or ``ROLLMUX_JOB_ID`` is set and a Ray cluster with
the GlobalScheduler is reachable; plain otherwise. ``ROLLMUX_JOB_ID`` attaches to an already
admitted job id instead of admitting the spec. This module imports no Ray; the scheduled mode
lives in :mod:`actors.driver.runtime_client`, imported lazily.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, Optional

from rollmux.models import JobSpec, PhaseName, PoolName
from rollmux.phase_core import PhaseCore
from rollmux.phase_state import (  # noqa: F401  (re-exported: the phase API's public names)
    PHASES, POOL_OF_PHASE, AdmissionRefused, ParallelContext, PhaseFailed, RuntimeHook, call_phase, is_resident,
    one_thread, parallel, restore_state, split_state, state_resume, state_suspend,
)
from rollmux.records import JobState
from rollmux.staleness import StalenessError, oldest_version, version_for
from rollmux.sync_plan import SYNC_BACKENDS

log = logging.getLogger("rollmux.phase_api")

SwitchKind = Literal["warm", "cold"]
_PHASES = PHASES

__all__ = [
    "Job",
    "JobProgram",
    "PhaseFailed",
    "AdmissionRefused",
    "RuntimeHook",
    "phase",
    "runtime_hook",
    "current_job",
    "parallel",
    "ParallelContext",
    "is_resident",
    "split_state",
    "state_suspend",
    "state_resume",
]


@dataclass
class JobProgram:
    """What a :class:`Job` runs: the one object the runtimes read (plain mode here, scheduled mode
    in :mod:`actors.driver.runtime_client`), filled by the job's decorators.

    ``builders``: pool (rollout | train) -> zero-arg state builder; ``phases``: phase (rollout |
    train | sync) -> function; ``apply``: ``apply_weights(rollout_state, weights)``; ``gathers``:
    phase -> ``fn(rank results) -> result``; ``hooks``: runtime hooks ``fn(event)``.
    """

    builders: dict[str, Callable[[], dict]] = field(default_factory=dict)
    phases: dict[str, Callable] = field(default_factory=dict)
    apply: Optional[Callable] = None
    gathers: dict[str, Callable[[list], Any]] = field(default_factory=dict)
    hooks: list[Callable[[dict], None]] = field(default_factory=list)

    @property
    def has_sync(self) -> bool:
        """Whether the job has a sync phase."""
        return "sync" in self.phases

    @property
    def last_phase(self) -> str:
        """The phase that ends an iteration: sync, or training for a job without sync."""
        return "sync" if self.has_sync else "train"

    def builder(self, pool: str, job_id: str = "") -> Callable[[], dict]:
        """The ``pool`` state builder. Raises PhaseFailed when none is registered."""
        b = self.builders.get(pool)
        if b is None:
            raise PhaseFailed(f"job {job_id!r}: no @job.state({pool!r}) builder registered")
        return b

    def phases_of(self, pool: str) -> dict[str, Callable]:
        """The phase functions that run on ``pool``'s workers (rollout; train and sync)."""
        return {k: v for k, v in self.phases.items() if POOL_OF_PHASE[k] == pool}

    def gather(self, phase: str, results: list) -> Any:
        """The ranks' results of ``phase`` combined by its gather function (the list without one)."""
        fn = self.gathers.get(phase)
        return fn(results) if fn is not None else results

    def callables(self) -> list[Callable]:
        """Every user callable of the program (what the workers must be able to unpickle)."""
        return [*self.builders.values(), *self.phases.values(), self.apply, *self.hooks]

    def emit(self, event: dict) -> None:
        """Call every runtime hook with ``event``; a hook that raises is logged, never fatal."""
        for h in list(self.hooks):
            try:
                h(event)
            except Exception:  # a user's hook must not break the job
                log.exception("runtime hook %r raised", h)


class _PlainRuntime:
    """Solo mode: every phase runs in this process; states stay resident; a timeline is kept."""

    mode = "plain"

    def __init__(self, job: "Job"):
        self.job = job
        self.states: dict[str, dict] = {}
        self.timeline: list[dict] = []
        self._t0 = time.time()
        # an asynchronous job's published versions not applied yet (version -> weights) and the
        # version its rollout state holds (rollmux.staleness); a synchronous one applies at its sync
        self.held: dict[int, Any] = {}
        self.applied = 0
        self._held_lock = threading.Lock()

    def _state(self, pool: PoolName) -> tuple[dict, str]:
        if pool not in self.states:
            builder = self.job.program.builder(pool, self.job.job_id)
            with one_thread():
                st = builder()
            split_state(st)  # validates the dict shape
            self.states[pool] = st
            return st, "cold"
        return self.states[pool], "resident"

    def run(self, phase: PhaseName, args: tuple, kwargs: dict, index: Optional[int] = None) -> Any:
        """Run ``phase`` here; ``index``: its iteration index (a rollout's own; default the job's)."""
        job, prog = self.job, self.job.program
        it = job.iteration if index is None else index
        k = job.spec.max_staleness
        job.core.granted(phase, it)
        t0 = time.time()
        extra: dict = {}
        if phase == "sync":
            tstate, k1 = self._state("train")
            rstate, k2 = self._state("rollout")
            t1 = time.time()
            with one_thread():
                weights = call_phase(prog.phases["sync"], "sync", tstate, args, kwargs, None)
                if k > 0:  # published: the rollout that is due applies it (its own thread may run now)
                    with self._held_lock:
                        if job.spec.staleness_mode != "exact":  # bounded: only the newest is ever used
                            self.held.clear()
                        self.held[it + 1] = weights
                elif prog.apply is not None:
                    prog.apply(rstate, weights)
            result, kind = None, ("cold" if "cold" in (k1, k2) else "resident")
            extra["policy_version"] = it + 1
        else:
            pool = POOL_OF_PHASE[phase]
            state, kind = self._state(pool)
            t1 = time.time()
            if phase == "rollout":
                extra["policy_version"] = self._apply_due(state, it) if k > 0 else (job.version if prog.has_sync else it)
            hook = RuntimeHook(job.job_id, phase, it, prog.emit)
            with one_thread():
                result = call_phase(prog.phases[phase], phase, state, args, kwargs, hook)
        t2 = time.time()
        self.timeline.append({
            "job_id": job.job_id, "phase": phase, "pool": POOL_OF_PHASE[phase], "node": "local",
            "iteration": it, "start_s": t0 - self._t0, "end_s": t2 - self._t0, "start": t0, "end": t2,
            "switch": kind, "switch_s": t1 - t0, "ok": True, **extra,
        })
        return result

    def _apply_due(self, rstate: dict, rollout: int) -> int:
        """An asynchronous job's rollout ``rollout``: apply the version its mode prescribes
        (:func:`rollmux.staleness.version_for`) and drop the versions no later rollout needs.
        Returns that version. Raises StalenessError when it is not published yet."""
        job, prog = self.job, self.job.program
        k, mode = job.spec.max_staleness, job.spec.staleness_mode
        with self._held_lock:
            published = max([self.applied, *self.held])
            v = version_for(rollout, k, mode, published)
            weights = self.held.get(v) if v != self.applied else None
            for old in [x for x in self.held if x <= v]:
                del self.held[old]
        if weights is not None and prog.apply is not None:
            with one_thread():
                prog.apply(rstate, weights)
        self.applied = v
        return v

    def finish(self, ok: bool, error: Optional[str]) -> None:
        """The job ended: its resident values (engines) are closed, as a worker closes them when a
        scheduled job leaves it (a vLLM engine's processes would otherwise outlive the job)."""
        from rollmux.phase_state import is_resident

        for st in list(self.states.values()):
            for v in (st.values() if isinstance(st, dict) else ()):
                close = getattr(v, "close", None)
                if is_resident(v) and callable(close):
                    try:
                        close()
                    except Exception:  # closing is best effort; the job's result stands
                        log.debug("closing a resident value failed", exc_info=True)
        self.states.clear()

    def permit_backend(self):
        """Driver-side permits in plain mode: granted at once (:mod:`rollmux.integrations.permits`)."""
        from rollmux.integrations.permits import PlainPermits

        return PlainPermits(self)


class Job:
    """One RL job using the phase API (RollMux §5). See the module docstring for the contract.

    Args:
        spec: the job's :class:`~rollmux.models.JobSpec` (or a dict validated into one).
        attach: ``True`` scheduled (raise if no scheduler reachable), ``False`` plain,
            ``None`` decided from env ``ROLLMUX_ATTACH`` / ``ROLLMUX_JOB_ID``.
        switch: ``"warm"`` keeps phase states in the object store between phases; ``"cold"``
            rebuilds each phase's state from a checkpoint on disk (builder + saved state).
        checkpoint_dir: where cold-start checkpoints go (default env ``ROLLMUX_CKPT_DIR`` or a
            temp dir); must be on a path every node sees for multi-machine clusters.
        scheduler_name: the GlobalScheduler actor name (default the contract's fixed name).
        job_id: attach to this already admitted job id instead of admitting ``spec``.
        sync_backend: scheduled-mode weight transport (env ``ROLLMUX_SYNC_BACKEND``): ``"auto"``
            (default: the RollMux §5.2 plan between the job's training and rollout workers over
            cupy-NCCL when every one of them holds its own CUDA device and cupy-NCCL loads, else
            over gloo; the Ray object store only when those endpoints cannot be built, which the
            sync phase's record says), ``"nccl"`` / ``"gloo"`` (that executor, or the sync fails),
            ``"object_store"`` (the fallback, asked for: every rollout worker pulls a full copy),
            ``"counted"`` (emulated accelerators, docs/EMULATION.md: the same plan, its bytes
            counted and not moved; the weights are metadata only).
        durable: scheduled mode: commit the state each phase leaves (and its result) to a file
            in ``checkpoint_dir`` before the phase counts as done, so the job survives the loss
            of one of its workers (the interrupted phase is redone from the commit before it).
            False skips the writes; a lost worker then fails the job.
        rebuild_resident: scheduled mode, ``switch="cold"``: rebuild the resident values (rollout
            engines, communicators) with the builder at every cold start. False (default) keeps
            them alive across cold switches (only the stored state is read back from disk); they
            are closed (``close()``) when the job leaves the worker.
    Raises:
        pydantic.ValidationError: invalid spec. AdmissionRefused: the scheduler refused the job.
        ValueError: unknown ``switch``.
    """

    def __init__(self, spec: JobSpec | dict, *, attach: Optional[bool] = None, switch: SwitchKind = "warm",
                 checkpoint_dir: Optional[str] = None, scheduler_name: Optional[str] = None,
                 job_id: Optional[str] = None, sync_backend: Optional[str] = None, durable: bool = True,
                 rebuild_resident: bool = False):
        global _CURRENT
        self.spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
        if switch not in ("warm", "cold"):
            raise ValueError(f"switch must be 'warm' or 'cold', got {switch!r}")
        self.switch: SwitchKind = switch
        self.sync_backend = sync_backend or os.environ.get("ROLLMUX_SYNC_BACKEND") or "auto"
        if self.sync_backend not in SYNC_BACKENDS:
            raise ValueError(f"sync_backend must be one of {', '.join(map(repr, SYNC_BACKENDS))}, "
                             f"got {self.sync_backend!r}")
        self.checkpoint_dir = checkpoint_dir or os.environ.get("ROLLMUX_CKPT_DIR")
        self.durable = bool(durable)
        self.rebuild_resident = bool(rebuild_resident)
        self.scheduler_name = scheduler_name or os.environ.get("ROLLMUX_SCHEDULER_NAME")
        self.attach_job_id = job_id or os.environ.get("ROLLMUX_JOB_ID") or None
        self.program = JobProgram(hooks=list(_PENDING_HOOKS))  # what the runtimes read
        _PENDING_HOOKS.clear()
        # the one writer of the driver's lifecycle, iteration count, rollout count and published
        # policy version, for @job.phase and permits alike
        self.core = PhaseCore(lambda: self.job_id, lambda: self.program.phases, lambda: self.program.last_phase,
                              self.program.emit, lambda ok, error: self._runtime.finish(ok, error))
        self._lock = threading.Lock()
        # an asynchronous job's rollout stream runs beside its training stream: one lock each
        self._locks = {"rollout": threading.Lock() if self.spec.max_staleness else self._lock, "train": self._lock}
        self._runtime = self._select_runtime(attach)
        _CURRENT = self

    # ---- identity / mode
    @property
    def job_id(self) -> str:
        return self.attach_job_id or self.spec.job_id

    @property
    def lifecycle(self) -> JobState:
        """The driver's view of its lifecycle (the scheduler's :class:`JobState`): admitted ->
        running -> finished | failed (written by :attr:`core` only)."""
        return self.core.lifecycle

    @property
    def iteration(self) -> int:
        """Iterations done (written by :attr:`core` only; grants and records carry copies)."""
        return self.core.iteration

    @property
    def rollouts(self) -> int:
        """Rollouts done (an asynchronous job runs them up to its staleness bound ahead; :attr:`core`)."""
        return self.core.rollouts

    @property
    def version(self) -> int:
        """The newest policy version the job published (syncs done; :attr:`core`, rollmux.staleness)."""
        return self.core.version

    @property
    def error(self) -> Optional[str]:
        """``"<Type>: <message>"`` of the job's failure; None unless it failed."""
        return self.core.error

    @property
    def mode(self) -> str:
        """``"plain"`` (solo, in process) or ``"scheduled"`` (RollMux on Ray)."""
        return self._runtime.mode

    @property
    def timeline(self) -> list[dict]:
        """This job's phase records (job_id, phase, pool, node, iteration, start, end, switch, ...)."""
        return list(self._runtime.timeline)

    @property
    def runtime(self):
        """The runtime the job runs on: plain (this process) or scheduled (:mod:`actors.driver.runtime_client`)."""
        return self._runtime

    @property
    def info(self) -> dict:
        """Scheduler-side placement / group (scheduled mode), ``{}`` in plain mode."""
        return dict(getattr(self._runtime, "info", {}) or {})

    def _select_runtime(self, attach: Optional[bool]):
        want = attach
        if want is None:
            want = os.environ.get("ROLLMUX_ATTACH", "") in ("1", "true", "yes") or bool(self.attach_job_id)
            if not want:
                return _PlainRuntime(self)
            try:
                from actors.driver.runtime_client import scheduler_reachable

                if not scheduler_reachable(self.scheduler_name):
                    warnings.warn("ROLLMUX_ATTACH set but no RollMux scheduler is reachable: running solo",
                                  RuntimeWarning, stacklevel=3)
                    return _PlainRuntime(self)
            except ImportError:
                return _PlainRuntime(self)
        if not want:
            return _PlainRuntime(self)
        from actors.driver.runtime_client import ScheduledRuntime

        return ScheduledRuntime(self)

    # ---- decorators
    def state(self, pool: PoolName) -> Callable[[Callable[[], dict]], Callable[[], dict]]:
        """Register the zero-arg builder of the ``pool`` ("rollout" | "train") state dict."""
        if pool not in ("rollout", "train"):
            raise ValueError(f"state pool must be 'rollout' or 'train', got {pool!r}")

        def deco(fn):
            self.program.builders[pool] = fn
            return fn

        return deco

    def phase(self, name: PhaseName) -> Callable[[Callable], Callable]:
        """Decorate a phase function; the returned callable runs the phase under RollMux.

        rollout ``fn(state, iteration, hook)``; train ``fn(state, samples) -> metrics``;
        sync ``fn(train_state) -> {name: tensor}`` then ``apply_weights(rollout_state, weights)``.
        Calling it: ``rollout(it)``, ``train(samples)``, ``publish()``.
        Raises ValueError on an unknown phase name.
        """
        if name not in _PHASES:
            raise ValueError(f"phase must be one of {_PHASES}, got {name!r}")

        def deco(fn):
            self.program.phases[name] = fn

            @functools.wraps(fn)
            def run(*args, **kwargs):
                return self.run_phase(name, *args, **kwargs)

            run.rollmux_phase = name  # type: ignore[attr-defined]
            run.rollmux_job = self  # type: ignore[attr-defined]
            return run

        return deco

    def apply_weights(self, fn: Callable[[dict, dict], None]) -> Callable[[dict, dict], None]:
        """Register ``fn(rollout_state, weights)`` applying synced weights on the rollout side."""
        self.program.apply = fn
        return fn

    def gather(self, name: PhaseName) -> Callable[[Callable[[list], Any]], Callable[[list], Any]]:
        """Register ``fn(results) -> result`` combining the per-rank results of phase ``name``
        when the job runs it on several nodes (``results`` in rank order, see
        :func:`rollmux.phase_state.parallel`). Without one, a multi-node phase returns the list.
        Raises ValueError on an unknown phase name."""
        if name not in _PHASES:
            raise ValueError(f"phase must be one of {_PHASES}, got {name!r}")

        def deco(fn):
            self.program.gathers[name] = fn
            return fn

        return deco

    def runtime_hook(self, fn: Callable[[dict], None]) -> Callable[[dict], None]:
        """Register a callback for runtime events (``event``: granted | done | progress | failed)."""
        self.program.hooks.append(fn)
        return fn

    # ---- driver-side phases (framework integrations: rollmux.integrations, docs/INTEGRATIONS.md)
    def driver_phases(self, *names: PhaseName) -> "Job":
        """Declare phases that run in this (driver) process inside a framework's own code,
        entered with :meth:`permit` instead of a ``@job.phase`` function (default: rollout,
        train, sync). A job declaring sync iterates after its sync permit, else after training.
        Raises ValueError on an unknown phase name."""
        for name in names or _PHASES:
            if name not in _PHASES:
                raise ValueError(f"phase must be one of {_PHASES}, got {name!r}")
            self.program.phases.setdefault(name, _driver_side)
        return self

    def permit(self, phase: PhaseName, *, offload=(), empty: bool = False):
        """``with job.permit(phase, offload=[engine]) as p:`` holds the phase's permit for the
        block (scheduled: the group's round-robin turn; plain: at once), reloading ``offload``
        targets after the grant and offloading them before the release; ``p.nodes`` /
        ``p.devices`` say where to run. See :class:`rollmux.integrations.permits.PermitScope`."""
        from rollmux.integrations.permits import PermitScope

        return PermitScope(self, phase, offload=offload, empty=empty)

    # ---- running
    def run_phase(self, name: PhaseName, *args, **kwargs) -> Any:
        """Run one phase now (blocking): permit, warm start, run, offload, release
        (:meth:`rollmux.phase_core.PhaseCore.phase` around the runtime's run).

        Raises: PhaseFailed if the job is finished/failed or the phase was never registered;
        any exception raised by the phase function itself (the job is then reported failed).
        """
        k = self.spec.max_staleness
        with self._locks[POOL_OF_PHASE[name]]:
            core = self.core
            index = core.rollouts if (name == "rollout" and k > 0) else core.iteration
            if name == "rollout" and k > 0 and self.program.has_sync and core.version < oldest_version(index, k):
                err = StalenessError(f"job {self.job_id!r}: rollout {index} needs policy version >= "
                                     f"{oldest_version(index, k)} (staleness bound {k}); published: {core.version}")
                core.check(name)
                core.fail(err)
                raise err  # refused before its permit: it would break the job's bound
            with core.phase(name, index):
                return self._runtime.run(name, args, kwargs, index)

    def pipeline(self, rollout: Callable, iterations: Iterable[int]) -> Iterator[tuple[int, Any]]:
        """``for it, samples in job.pipeline(rollout, range(n)):`` yields each iteration's index
        and its rollout's result. A synchronous job runs ``rollout(it)`` there and then; an
        asynchronous one (``spec.max_staleness`` k >= 1) keeps up to k rollouts ahead running in
        a thread of its own, in order (rollout ``it + j`` is submitted once the loop body of
        ``it - 1`` returned, i.e. after its sync published version ``it``, the one it needs), so
        rollout ``it + 1`` runs beside the training of ``it``. ``rollout``: a ``@job.phase("rollout")``
        function; ``iterations``: consecutive indices starting at the job's next rollout. A
        rollout's exception is raised here. Raises ValueError on non-consecutive indices."""
        its = list(iterations)
        if any(b != a + 1 for a, b in zip(its, its[1:])) or (its and its[0] != self.rollouts):
            raise ValueError(f"job {self.job_id!r}: pipeline iterations must be consecutive from the next rollout "
                             f"({self.rollouts}), got {its[:3]}...")
        k = self.spec.max_staleness
        if k == 0:
            for it in its:
                yield it, rollout(it)
            return
        with ThreadPoolExecutor(1, thread_name_prefix=f"rollmux-rollouts-{self.job_id}") as ex:
            ahead: deque = deque()
            nxt = 0
            try:
                for n, it in enumerate(its):
                    while nxt < len(its) and nxt <= n + k:
                        ahead.append(ex.submit(rollout, its[nxt]))
                        nxt += 1
                    samples = ahead.popleft().result()
                    yield it, samples
            finally:  # a rollout failed, or the loop ended early: the rollouts not started never run
                for f in ahead:
                    f.cancel()

    def fail(self, error: BaseException | str) -> None:
        """Report the job failed: resources are released; group-mates keep iterating."""
        self.core.fail(error)

    def finish(self) -> None:
        """Report the job finished (departure: its nodes are released). Idempotent."""
        self.core.finish()

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None:
            self.fail(exc)
        else:
            self.finish()
        return False


def _driver_side(*args, **kwargs):
    """Placeholder of a phase declared with :meth:`Job.driver_phases`: it runs in the driver,
    inside the framework's code, under :meth:`Job.permit`; calling it through the runtime is an error."""
    raise PhaseFailed("this phase runs in the driver under job.permit(...), not through @job.phase")


_CURRENT: Optional[Job] = None
_PENDING_HOOKS: list[Callable[[dict], None]] = []


def current_job() -> Job:
    """The most recently created :class:`Job`. Raises RuntimeError when none exists."""
    if _CURRENT is None:
        raise RuntimeError("no rollmux.Job created yet: create one before using rollmux.phase")
    return _CURRENT


def phase(name: PhaseName) -> Callable[[Callable], Callable]:
    """``@rollmux.phase(name)``: :meth:`Job.phase` on the current job (RollMux §5)."""
    return current_job().phase(name)


def runtime_hook(fn: Callable[[dict], None]) -> Callable[[dict], None]:
    """``@rollmux.runtime_hook``: register ``fn(event)`` on the current job (or the next one created)."""
    if _CURRENT is not None and not _CURRENT.lifecycle.is_ended():
        return _CURRENT.runtime_hook(fn)
    _PENDING_HOOKS.append(fn)
    return fn
