"""Phase-state conventions shared by both modes of the phase API (RollMux §5, "phase API").

Pure (no Ray): the plain runtime (:mod:`rollmux.phase_api`) and the Ray pool workers
(:mod:`actors.worker.workers`) both follow these rules, so they live here, below both:

- a phase state is a ``dict``; values with a truthy ``rollmux_resident`` attribute (the job's
  control plane: engines, communicators) stay in the worker process, the rest is stored between
  phases (:func:`split_state`);
- around each phase ``offload()`` (else ``sleep()``) is called on suspend and ``load()`` (else
  ``wake_up()`` / ``wake()``) on resume (:func:`state_suspend`, :func:`state_resume`);
- a cold or moved start is the builder's fresh state plus the saved one (:func:`restore_state`);
- a user phase is called with the contract's signature (:func:`call_phase`); a rollout gets the
  :class:`RuntimeHook` whose ``progress(done, total)`` drives long-tail migration (RollMux §4.3);
- phases compute on one thread (:func:`one_thread`);
- the errors a driver sees: :class:`AdmissionRefused`, :class:`PhaseFailed`.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import threading
import time
from typing import Any, Callable, Optional

from rollmux.models import POOL_OF_PHASE, pool_of_phase  # noqa: F401  (re-exported)
PHASES = ("rollout", "train", "sync")


class AdmissionRefused(RuntimeError):
    """The scheduler refused the job. ``decision`` is ``AdmissionDecision.to_dict()`` (code, reason)."""

    def __init__(self, decision: dict):
        self.decision = decision
        super().__init__(
            f"job {decision.get('job_id')!r} refused ({decision.get('code')}): {decision.get('reason')}"
        )


class PhaseFailed(RuntimeError):
    """A phase could not run (job already finished/failed, permit lost, worker died)."""


def is_resident(value: Any) -> bool:
    """True for control-plane objects that stay in the worker process between phases.

    Only values carrying a truthy ``rollmux_resident`` attribute (e.g. a vLLM engine, a
    collectives endpoint, an environment handle) are resident; everything else is stored.
    """
    return bool(getattr(value, "rollmux_resident", False))


def split_state(state: dict) -> tuple[dict, dict]:
    """Split a phase-state dict into (storable, resident) parts. Raises TypeError if not a dict."""
    if not isinstance(state, dict):
        raise TypeError(f"a phase state must be a dict, got {type(state).__name__}")
    resident = {k: v for k, v in state.items() if is_resident(v)}
    return {k: v for k, v in state.items() if k not in resident}, resident


def _hook_of(value: Any, names: tuple[str, ...]) -> Optional[Callable[[], None]]:
    if isinstance(value, (dict, list, tuple, str, bytes)):
        return None
    for n in names:
        fn = getattr(value, n, None)
        if callable(fn):
            return fn
    return None


def state_suspend(state: dict) -> None:
    """End of a phase: call ``offload()`` (else ``sleep()``) on every state value that has one."""
    for v in state.values():
        fn = _hook_of(v, ("offload", "sleep"))
        if fn is not None:
            fn()


def state_resume(state: dict) -> None:
    """Start of a phase (warm start): call ``load()`` (else ``wake()``/``wake_up()``) on every value."""
    for v in state.values():
        fn = _hook_of(v, ("load", "wake_up", "wake"))
        if fn is not None:
            fn()


class RuntimeHook:
    """The runtime hook handed to a rollout phase (RollMux §5: progress drives long-tail migration).

    ``progress(done, total)``: ``done`` of ``total`` responses of this rollout have finished.
    Raises ValueError when ``0 <= done <= total`` and ``total > 0`` do not hold.
    """

    def __init__(self, job_id: str, phase: str, iteration: int, emit: Callable[[dict], None]):
        self.job_id, self.phase, self.iteration = job_id, phase, iteration
        self._emit = emit
        self.last_progress: Optional[tuple[int, int]] = None

    def progress(self, done: int, total: int) -> None:
        if total <= 0 or not 0 <= done <= total:
            raise ValueError(f"progress: need 0 <= done <= total and total > 0, got done={done}, total={total}")
        self.last_progress = (int(done), int(total))
        self._emit({"event": "progress", "job_id": self.job_id, "phase": self.phase,
                    "iteration": self.iteration, "done": int(done), "total": int(total), "t": time.time()})


def call_phase(fn: Callable, phase: str, state: dict, args: tuple, kwargs: dict, hook: Optional[RuntimeHook]):
    """Invoke a user phase function with the contract's signature (shared by both modes).

    rollout: ``fn(state, *args, hook=hook)`` if ``fn`` has a ``hook`` parameter, else ``fn(state, *args)``;
    train / sync: ``fn(state, *args, **kwargs)``.
    """
    if phase == "rollout" and hook is not None and _accepts_hook(fn):
        kwargs = {**kwargs, "hook": hook}
    return fn(state, *args, **kwargs)


def _accepts_hook(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "hook" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def one_thread():
    """Context manager: torch computes on one thread inside (no-op while this process has not
    loaded torch: it is never imported here). Re-entrant and
    thread-safe: the previous thread count is restored when the last concurrent user exits."""
    return _OneThread()


_THREADS_LOCK = threading.Lock()
_THREADS_STATE = {"users": 0, "prev": None}


class _OneThread:
    def __enter__(self):
        torch = sys.modules.get("torch")  # never imported here: a job that does not use torch stays light
        if torch is not None:  # loaded, or being loaded by another thread: wait for the whole module
            import torch
        self._torch = torch
        if torch is None:
            return self
        with _THREADS_LOCK:
            if _THREADS_STATE["users"] == 0:
                _THREADS_STATE["prev"] = torch.get_num_threads()
                torch.set_num_threads(1)
            _THREADS_STATE["users"] += 1
        return self

    def __exit__(self, *exc):
        torch = self._torch
        if torch is None:
            return False
        with _THREADS_LOCK:
            _THREADS_STATE["users"] -= 1
            if _THREADS_STATE["users"] == 0 and _THREADS_STATE["prev"] is not None:
                torch.set_num_threads(_THREADS_STATE["prev"])
        return False


def restore_state(fresh: dict, saved: dict) -> dict:
    """Cold (or moved) start: builder's fresh state + the saved state. Modules/optimizers load
    the saved ``state_dict``; other values are replaced by the saved ones. Returns ``fresh``
    updated."""
    for k, v in saved.items():
        cur = fresh.get(k)
        if hasattr(cur, "load_state_dict") and hasattr(v, "state_dict"):
            cur.load_state_dict(v.state_dict())
        else:
            fresh[k] = v
    return fresh


class ParallelContext:
    """Where this copy of a phase runs inside its job's SPMD step (RollMux §5.1, multi-node phases).

    A job placed on k rollout nodes and m training nodes runs each rollout phase on its k rollout
    workers and each training / sync phase on its m training workers at once: every worker runs
    the same phase function on its shard (rollout: its slice of the prompts; training: its slice
    of each minibatch, gradients averaged over the job's process group). In plain mode and on a
    single node, ``rank == 0`` and ``world_size == 1``.

    Attributes:
        pool: ``"rollout"`` or ``"train"``.
        rank / world_size: this worker's index among the job's workers of ``pool``, and their number.
        nodes: the job's nodes of ``pool`` in rank order (``()`` in plain mode).
    ``group`` and ``store`` are built on first use (by every rank at the same point of the SPMD
    step: construction is a rendezvous) and kept for the job's life in the worker process (the
    job's resident control plane): ``group`` is a gloo process group over the job's workers of
    ``pool`` (None when ``world_size == 1``); ``store`` the job's rendezvous key-value store
    (``torch.distributed.Store``; None in plain mode).
    """

    def __init__(self, pool: str, rank: int = 0, world_size: int = 1, nodes: tuple = (),
                 group_factory: Optional[Callable[[], Any]] = None,
                 store_factory: Optional[Callable[[], Any]] = None):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"parallel context: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.pool, self.rank, self.world_size, self.nodes = pool, int(rank), int(world_size), tuple(nodes)
        self._group_factory, self._store_factory = group_factory, store_factory

    @property
    def group(self) -> Any:
        if self.world_size == 1 or self._group_factory is None:
            return None
        return self._group_factory()

    @property
    def store(self) -> Any:
        return None if self._store_factory is None else self._store_factory()

    def shard(self, n: int) -> slice:
        """This rank's contiguous slice of ``n`` items (the first ``n % world_size`` ranks get one
        more); ranks in order cover ``0..n`` exactly once."""
        q, r = divmod(int(n), self.world_size)
        start = self.rank * q + min(self.rank, r)
        return slice(start, start + q + (1 if self.rank < r else 0))

    def __repr__(self) -> str:
        return f"ParallelContext(pool={self.pool!r}, rank={self.rank}, world_size={self.world_size})"


_PARALLEL: "contextvars.ContextVar[Optional[ParallelContext]]" = contextvars.ContextVar("rollmux_parallel", default=None)


def parallel(pool: str = "?") -> ParallelContext:
    """The :class:`ParallelContext` of the phase (or state builder) running in this thread; a
    single-rank context (``rank 0 of 1``) outside the runtime's SPMD steps (plain mode)."""
    ctx = _PARALLEL.get()
    return ctx if ctx is not None else ParallelContext(pool)


class parallel_scope:
    """Context manager: :func:`parallel` returns ``ctx`` inside (set by the runtime's workers
    around a builder or phase call; thread- and task-local)."""

    def __init__(self, ctx: Optional[ParallelContext]):
        self.ctx, self._token = ctx, None

    def __enter__(self) -> Optional[ParallelContext]:
        self._token = _PARALLEL.set(self.ctx)
        return self.ctx

    def __exit__(self, *exc) -> bool:
        _PARALLEL.reset(self._token)
        return False
