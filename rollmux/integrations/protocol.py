"""The integration protocol: what a framework adapter gives RollMux and what it gets back.

A job whose phases run inside a framework's own code (TRL's ``GRPOTrainer``, verl's PPO trainers)
cannot hand RollMux phase functions to run on its workers. Instead the framework keeps its own
engines, optimizer and process layout, and tells RollMux when each phase starts and ends:

    with job.permit("rollout", offload=[engine]) as p:   # blocks for the group's round-robin turn
        ...generate on p.nodes / p.device...           # RollMux reloaded ``engine`` (wake_up)
    # on exit RollMux offloads ``engine`` (sleep) and releases the permit to the next job

This module is pure (no Ray, no framework imports): the pieces every adapter shares.

- :class:`SpecFieldMissing` / :func:`build_spec`: the job spec (model size, prompts, responses per
  prompt, token caps, GPUs) derived from a framework's config, with the fields that cannot be
  derived named in one error.
- :func:`offload_hooks`: the offload / reload callables of a framework object (DeepSpeed's
  ``offload_states`` / ``reload_states``, vLLM's ``sleep`` / ``wake_up``, RollMux backends'
  ``offload`` / ``load``), or an explicit ``(offload, reload)`` pair.
- :class:`Permit`: the grant a ``with job.permit(...)`` block gets: nodes, devices, iteration,
  waited time, and ``progress(done, total)`` for long-tail migration (RollMux §4.3).
- :class:`PermitBackend`: what a runtime implements to grant permits (plain mode: at once,
  :class:`rollmux.integrations.permits.PlainPermits`; scheduled mode: through the group's
  controller, ``actors.driver.permits.DriverPermits``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol

from rollmux.models import JobSpec

#: JobSpec fields admission needs that an adapter must derive or be given.
REQUIRED_FIELDS = ("job_id", "model_params_b", "num_prompts", "responses_per_prompt", "prompt_tokens",
                   "max_response_tokens", "num_rollout_gpus", "num_train_gpus")

#: Method names tried, in order, for a framework object's offload / reload hook.
OFFLOAD_NAMES = ("offload_states", "sleep", "offload")
RELOAD_NAMES = ("reload_states", "wake_up", "load", "wake")


@dataclass(frozen=True)
class Underivable:
    """A spec field the adapter could not read from the framework's config, and why."""

    reason: str


class SpecFieldMissing(ValueError):
    """The job spec cannot be derived: ``missing`` maps each field to why it is unknown.

    The message names every field and how to supply it (the adapter's ``spec`` overrides)."""

    def __init__(self, framework: str, missing: Mapping[str, str], how: str = "rollmux_spec"):
        self.framework = framework
        self.missing = dict(missing)
        parts = "; ".join(f"{k}: {why}" for k, why in self.missing.items())
        example = ", ".join(f"{k!r}: ..." for k in self.missing)
        super().__init__(f"cannot derive the RollMux job spec from the {framework} configuration: {parts}. "
                         f"Pass {how}={{{example}}}.")


def build_spec(framework: str, derived: Mapping[str, Any], overrides: Optional[Mapping[str, Any]] = None,
               how: str = "rollmux_spec") -> JobSpec:
    """The :class:`~rollmux.models.JobSpec` of a framework job.

    Args:
        framework: the framework's name (for the error message).
        derived: field -> value read from the framework's config, or :class:`Underivable`.
        overrides: fields the user gave (win over derived ones; any JobSpec field, e.g. ``slo``).
        how: the argument name the error tells the user to pass overrides with.
    Raises:
        SpecFieldMissing: a field of :data:`REQUIRED_FIELDS` is neither derived nor given (all
            such fields are named at once). pydantic.ValidationError: a value is out of range (the
            error names the field).
    """
    merged = {k: v for k, v in derived.items() if not isinstance(v, Underivable) and v is not None}
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    missing = {}
    for k in REQUIRED_FIELDS:
        if k not in merged:
            d = derived.get(k)
            missing[k] = d.reason if isinstance(d, Underivable) else f"the {framework} adapter does not know it"
    if missing:
        raise SpecFieldMissing(framework, missing, how)
    return JobSpec.model_validate(merged)


def _method(obj: Any, names: Iterable[str]) -> Optional[Callable[[], Any]]:
    for n in names:
        fn = getattr(obj, n, None)
        if callable(fn):
            return fn
    return None


def offload_hooks(target: Any) -> tuple[Optional[Callable[[], Any]], Optional[Callable[[], Any]]]:
    """``(offload, reload)`` of one offload target.

    ``target`` is an ``(offload, reload)`` pair of callables (either may be None), or an object
    whose first method among :data:`OFFLOAD_NAMES` / :data:`RELOAD_NAMES` is used (DeepSpeed
    engine: ``offload_states`` / ``reload_states``; vLLM ``LLM``: ``sleep`` / ``wake_up``).
    Raises TypeError for an object with neither hook (it would be silently ignored)."""
    if isinstance(target, tuple) and len(target) == 2 and all(t is None or callable(t) for t in target):
        return target[0], target[1]
    off, rel = _method(target, OFFLOAD_NAMES), _method(target, RELOAD_NAMES)
    if off is None and rel is None:
        raise TypeError(f"offload target {type(target).__name__} has none of {OFFLOAD_NAMES + RELOAD_NAMES}; "
                        "pass an (offload, reload) pair of callables instead")
    return off, rel


class PermitBackend(Protocol):
    """How a runtime grants driver-side permits (one backend per :class:`rollmux.Job`)."""

    def acquire(self, phase: str) -> Any:
        """Block until the job may run ``phase``; returns the :class:`rollmux.messages.Grant`.
        Raises PhaseFailed when it cannot be granted."""

    def release(self, phase: str, grant: Any, record: dict) -> dict:
        """The phase ended (``record``: start, end, switch_s, run_s, offload_s, ok, error, ...);
        returns the stored timeline record."""

    def devices(self, nodes: list[str]) -> list[int]:
        """GPU ids of ``nodes`` (empty on CPU hosts and in plain mode)."""

    def progress(self, grant: Any, done: int, total: int) -> Optional[dict]:
        """Rollout progress; the controller's long-tail migration decision, if any."""


@dataclass
class Permit:
    """A granted phase (what ``with job.permit(phase) as p`` binds).

    Attributes:
        job_id / phase / pool: whose phase, which one, on which pool (``rollout`` | ``train``).
        nodes: the pool nodes to run on (``("local",)`` in plain mode).
        devices: GPU ids of those nodes as Ray assigned them to RollMux's node workers (empty on
            CPU hosts and in plain mode).
        iteration: the job's iteration index (RollMux counts it after the job's last phase).
        granted_at: epoch seconds of the grant; waited_s: seconds the driver waited for it.
        group_id: the co-execution group (None in plain mode).
        migration: the long-tail decision returned by the last :meth:`progress` call, if any.
    """

    job_id: str
    phase: str
    pool: str
    nodes: tuple = ()
    devices: tuple = ()
    iteration: int = 0
    granted_at: float = 0.0
    waited_s: float = 0.0
    group_id: Optional[str] = None
    grant: Any = field(default=None, repr=False)  # the runtime's rollmux.messages.Grant
    migration: Optional[dict] = None
    _backend: Any = field(default=None, repr=False)
    _emit: Any = field(default=None, repr=False)
    progress_calls: int = 0

    @property
    def device(self) -> Optional[str]:
        """``"cuda:<first device>"`` when the permit names devices, else None (keep your own)."""
        return f"cuda:{self.devices[0]}" if self.devices else None

    def progress(self, done: int, total: int) -> Optional[dict]:
        """``done`` of ``total`` responses of this rollout finished (RollMux §4.3): the controller
        may decide long-tail migration (``acted``: the next job's rollout may start on the freed
        nodes; the framework should move its stragglers to ``tail_workers``). Raises ValueError
        unless ``0 <= done <= total`` and ``total > 0``, and outside a rollout permit."""
        if total <= 0 or not 0 <= done <= total:
            raise ValueError(f"progress: need 0 <= done <= total and total > 0, got done={done}, total={total}")
        if self.phase != "rollout":
            raise ValueError(f"progress: only a rollout reports progress, this permit is for {self.phase}")
        self.progress_calls += 1
        if self._emit is not None:
            self._emit({"event": "progress", "job_id": self.job_id, "phase": self.phase,
                        "iteration": self.iteration, "done": int(done), "total": int(total)})
        decision = self._backend.progress(self.grant, int(done), int(total)) if self._backend is not None else None
        if decision is not None:
            self.migration = decision
        return decision
