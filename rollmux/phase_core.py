"""One phase of a driver, the same for ``@job.phase`` and for ``with job.permit(phase)``.

A :class:`rollmux.Job` runs its phases one of two ways: a ``@job.phase`` function RollMux runs
(:meth:`rollmux.Job.run_phase`, on this process in plain mode, on the job's node workers in
scheduled mode) or a block of a framework's own code under a permit
(:class:`rollmux.integrations.permits.PermitScope`). Both are one phase of the job's cycle
(rollout -> training -> sync, RollMux §5 "phase API"), and the bookkeeping around it lives here,
once: :class:`PhaseCore` is the one writer of the driver's lifecycle (the scheduler's
:class:`rollmux.records.JobState`: admitted until its first phase, running, then finished |
failed) and of its iteration count (the job's last phase of an iteration, sync or training for a
job without sync, adds one), and emits the runtime events (``granted``, ``done``, ``failed``) the
job's hooks see.

A phase goes ``begin`` -> ``granted`` -> ``end``:

- :meth:`PhaseCore.begin` refuses a job that has ended or a phase it never declared
  (:class:`rollmux.phase_state.PhaseFailed`) and marks the job running;
- :meth:`PhaseCore.granted` emits the grant (iteration, nodes, wait) once the permit is held;
- :meth:`PhaseCore.end` counts the phase done (and the iteration, after the last phase), or, given
  the error, reports the job failed (:meth:`PhaseCore.fail`; its group-mates go on).

:meth:`PhaseCore.phase` is the three as one ``with`` block (``@job.phase``); a permit's enter and
exit call them apart. Pure: no Ray.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

from rollmux.phase_state import PhaseFailed
from rollmux.records import JobState


class PhaseCore:
    """The phase bookkeeping of one driver (see the module docstring).

    Args:
        job_id: the job's id (for messages and events).
        declared: phase name -> anything; the phases the job declared (``JobProgram.phases``).
        last_phase: the phase that ends an iteration (``"sync"``, or ``"train"`` without sync).
        emit: called with every runtime event dict (the job's hooks).
        on_end: ``on_end(ok, error)`` once when the job ends: the runtime reports the departure.

    Attributes:
        lifecycle: the driver's view of its :class:`~rollmux.records.JobState`.
        iteration: iterations done (the index of the iteration under way); grants and records
            carry copies.
        rollouts: rollouts done (an asynchronous job's rollout stream runs up to its staleness
            bound ahead of ``iteration``, :mod:`rollmux.staleness`; equal to it at an iteration's start
            for a synchronous job).
        version: the newest policy version the job published (its last sync's index + 1).
        error: ``"<Type>: <message>"`` of the failure, None unless failed.
    """

    def __init__(self, job_id: Callable[[], str], declared: Callable[[], dict], last_phase: Callable[[], str],
                 emit: Callable[[dict], None], on_end: Callable[[bool, Optional[str]], None]):
        self._job_id, self._declared, self._last = job_id, declared, last_phase
        self._emit, self._on_end = emit, on_end
        self.lifecycle: JobState = JobState.ADMITTED
        self.iteration = 0
        self.rollouts = 0
        self.version = 0
        self.error: Optional[str] = None

    @property
    def job_id(self) -> str:
        return self._job_id()

    def check(self, phase: str) -> None:
        """Raise PhaseFailed when the job has ended or ``phase`` is not declared."""
        if self.lifecycle.is_ended():
            raise PhaseFailed(f"job {self.job_id!r} is {self.lifecycle.value}; no more phases")
        if phase not in self._declared():
            raise PhaseFailed(f"job {self.job_id!r}: phase {phase!r} is not declared (no @job.phase({phase!r}) "
                              f"registered, nor job.driver_phases({phase!r}) before the first permit)")

    def begin(self, phase: str) -> None:
        """The job starts ``phase`` (:meth:`check`, then ``running``). Raises PhaseFailed."""
        self.check(phase)
        self.lifecycle = self.lifecycle.advance(JobState.RUNNING)

    def granted(self, phase: str, iteration: int, **fields) -> None:
        """Emit the ``granted`` event of ``phase`` (``fields``: nodes, waited_s, driver_side)."""
        self._emit({"event": "granted", "job_id": self.job_id, "phase": phase, "iteration": iteration, **fields})

    def end(self, phase: str, error: Optional[BaseException] = None, index: Optional[int] = None) -> None:
        """``phase`` ended: done (after the job's last phase of an iteration the count goes up; a
        rollout adds to the rollouts, a sync publishes version ``index + 1``), or failed with
        ``error`` (the job fails). ``index``: the phase's iteration index (a rollout's own; default
        the iteration under way)."""
        if error is not None:
            self.fail(error)
            return
        idx = self.iteration if index is None else index
        self._emit({"event": "done", "job_id": self.job_id, "phase": phase, "iteration": idx})
        if phase == "rollout":
            self.rollouts += 1
        elif phase == "sync":
            self.version = idx + 1
        if phase == self._last():
            self.iteration += 1

    @contextlib.contextmanager
    def phase(self, phase: str, index: Optional[int] = None) -> Iterator[None]:
        """``with core.phase(name):`` :meth:`begin`, the block, :meth:`end` (an exception in the
        block fails the job and propagates; ``index``: as :meth:`end`)."""
        self.begin(phase)
        try:
            yield
        except BaseException as e:
            self.end(phase, e)
            raise
        self.end(phase, index=index)

    def fail(self, error: BaseException | str) -> None:
        """The job failed (idempotent once ended): the ``failed`` event, then ``on_end(False, error)``."""
        if self.lifecycle.is_ended():
            return
        self.lifecycle = self.lifecycle.to(JobState.FAILED)
        self.error = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        self._emit({"event": "failed", "job_id": self.job_id, "error": self.error})
        self._on_end(False, self.error)

    def finish(self) -> None:
        """The job finished (idempotent once ended): ``on_end(True, None)``."""
        if self.lifecycle.is_ended():
            return
        self.lifecycle = self.lifecycle.to(JobState.FINISHED)
        self._on_end(True, None)
