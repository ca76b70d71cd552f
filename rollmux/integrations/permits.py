"""Driver-side permits: ``with job.permit(phase)`` and the phase sequencer adapters drive.

:class:`PermitScope` is what :meth:`rollmux.Job.permit` returns. Entering it acquires the phase's
permit from the job's runtime (:class:`PlainPermits` in plain mode: granted at once;
``actors.driver.permits.DriverPermits`` in scheduled mode: the co-execution group's controller,
in round-robin order, the same ledger path as phases run on RollMux's workers), then calls the
reload hook of every offload target (``reload_states`` / ``wake_up`` / ``load``); leaving it calls
their offload hooks (``offload_states`` / ``sleep`` / ``offload``) and releases the permit with a
timeline record (``switch_s``: reload, ``run_s``: the block, ``offload_s``). The driver that
acquired releases. An exception in the block releases the permit as failed and fails the job
(its group-mates go on). The job's lifecycle, its iteration count (up by one after the job's last
phase of an iteration: sync, or training for a job without sync) and the ``granted`` / ``done`` /
``failed`` events are the phase core's (:class:`rollmux.phase_core.PhaseCore`), the same as for
phases run through ``@job.phase``.

:class:`PhaseSequencer` serves frameworks whose phase boundaries are implicit (a hook that says
"generation starts" but nothing that says "training ended"): ``enter(phase)`` ends the open
permit and opens the requested one, running an empty permit for every phase the framework
skipped on the way (e.g. no sync in a step), so the job keeps its round-robin turns.

Pure: imports no Ray (the scheduled backend lives in ``actors/``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable, Optional

from rollmux.integrations.protocol import Permit, offload_hooks
from rollmux.messages import Grant
from rollmux.models import pool_of_phase
from rollmux.phase_state import PHASES, PhaseFailed
from rollmux.staleness import phase_version

log = logging.getLogger("rollmux.integrations")


class PlainPermits:
    """Plain mode (no cluster): every permit is granted at once, on node ``"local"``; the
    records go to the job's own timeline (the same fields as its ``@job.phase`` records)."""

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.open_phase: Optional[str] = None

    def acquire(self, phase: str) -> Grant:
        job = self.runtime.job
        return Grant(job_id=job.job_id, group_id="", phase=phase, pool=pool_of_phase(phase),
                     nodes=("local",), iteration=job.iteration, granted_at=time.time(), waited_s=0.0,
                     version=phase_version(phase, job.iteration, job.spec.max_staleness))

    def release(self, phase: str, grant: Grant, record: dict) -> dict:
        t0 = getattr(self.runtime, "_t0", grant.granted_at)
        rec = {"job_id": grant.job_id, "phase": phase, "pool": grant.pool, "node": "local",
               "iteration": grant.iteration, **record,
               "start_s": record["start"] - t0, "end_s": record["end"] - t0}
        self.runtime.timeline.append(rec)
        return rec

    def devices(self, nodes: list[str]) -> list[int]:
        return []

    def progress(self, grant: Grant, done: int, total: int) -> Optional[dict]:
        return None


def _backend(job) -> Any:
    rt = job._runtime
    be = getattr(rt, "_permit_backend", None)
    if be is None:
        be = rt.permit_backend()
        rt._permit_backend = be
    return be


class PermitScope:
    """``with job.permit(phase, offload=[...]) as permit:`` (see the module docstring).

    Args:
        job: the :class:`rollmux.Job` (its phase must be declared with :meth:`rollmux.Job.driver_phases`).
        phase: ``"rollout"`` | ``"train"`` | ``"sync"``.
        offload: offload targets (:func:`rollmux.integrations.protocol.offload_hooks`): reloaded
            after the grant, offloaded before the release.
        empty: the framework skipped this phase (the permit is taken to keep the job's turn; the
            record says ``empty: true``).
    Raises (on enter): PhaseFailed when the job is finished / failed, the phase is not declared,
    another permit of the job is open, or the permit cannot be granted; ValueError for an unknown
    phase; TypeError for an offload target without hooks.
    """

    def __init__(self, job, phase: str, *, offload: Iterable[Any] = (), empty: bool = False):
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        self.job, self.phase, self.empty = job, phase, bool(empty)
        self.hooks = [offload_hooks(t) for t in offload]
        self.permit: Optional[Permit] = None
        self.record: Optional[dict] = None
        self._t: dict[str, float] = {}

    def __enter__(self) -> Permit:
        job, core = self.job, self.job.core
        core.check(self.phase)
        be = _backend(job)
        if be.open_phase is not None:
            raise PhaseFailed(f"job {job.job_id!r}: a {be.open_phase} permit is still open; a job holds one permit at a time")
        core.begin(self.phase)
        t0 = time.time()
        try:
            grant = be.acquire(self.phase)
        except BaseException as e:  # as for a @job.phase: a permit that cannot be granted fails the job
            core.end(self.phase, e)
            raise
        be.open_phase = self.phase
        core.granted(self.phase, grant.iteration, nodes=list(grant.nodes), waited_s=grant.waited_s, driver_side=True)
        t1 = time.time()
        try:
            for _off, rel in self.hooks:
                if rel is not None:
                    rel()
            devices = tuple(be.devices(list(grant.nodes)))
        except BaseException as e:  # a reload hook failed: the permit goes back, the job fails
            self._end(be, grant, t0, t1, time.time(), e)
            raise
        self._t = {"acquire": t0, "granted": t1, "started": time.time()}
        self.permit = Permit(job_id=job.job_id, phase=self.phase, pool=pool_of_phase(self.phase),
                             nodes=tuple(grant.nodes), devices=devices, iteration=int(grant.iteration),
                             granted_at=float(grant.granted_at or t1), waited_s=float(grant.waited_s or 0.0),
                             group_id=grant.group_id or None, grant=grant, _backend=be, _emit=job.program.emit)
        self._grant = grant
        return self.permit

    def __exit__(self, exc_type, exc, tb) -> bool:
        be = _backend(self.job)
        self._end(be, self._grant, self._t["acquire"], self._t["granted"], self._t["started"], exc)
        return False

    def _end(self, be, grant: Grant, t0: float, t1: float, t2: float, exc: Optional[BaseException]) -> None:
        job = self.job
        t3 = time.time()
        err: Optional[BaseException] = exc
        for off, _rel in self.hooks:
            if off is None:
                continue
            try:
                off()
            except BaseException as e:  # an offload failure fails the phase (never silent)
                log.exception("job %s: offload hook of %s failed", job.job_id, self.phase)
                err = err or e
        t4 = time.time()
        ok = err is None
        record = {"start": t1, "end": t4, "switch": "warm" if self.hooks else "resident", "switch_s": t2 - t1,
                  "run_s": t3 - t2, "offload_s": t4 - t3, "ok": ok, "driver_side": True, "empty": self.empty,
                  "error": None if ok else f"{type(err).__name__}: {err}", "nodes": list(grant.nodes)}
        be.open_phase = None
        try:
            self.record = be.release(self.phase, grant, record)
        finally:
            job.core.end(self.phase, err)


CYCLE = ("rollout", "train", "sync")


class PhaseSequencer:
    """Drives a job's permits from a framework's implicit phase boundaries.

    ``enter(phase)`` keeps the open permit when it is already ``phase``; otherwise it ends the
    open one and walks the cycle rollout -> train -> sync (the job's declared phases only),
    running an empty permit for every phase in between, then opens ``phase``. ``close()`` ends the
    open permit; ``finish()`` closes it and reports the job finished.

    Args:
        job: a :class:`rollmux.Job` with driver-side phases declared.
        offload: phase or pool -> offload targets of its permits (``"rollout"``, ``"train"``,
            ``"sync"``; a sync permit without its own entry uses the training pool's targets).
    """

    def __init__(self, job, offload: Optional[dict[str, list]] = None):
        self.job = job
        self.offload = {k: list(v) for k, v in (offload or {}).items()}
        self.phases = tuple(p for p in CYCLE if p in job.program.phases)
        if not {"rollout", "train"} <= set(self.phases):
            raise PhaseFailed(f"job {job.job_id!r}: declare at least rollout and train (job.driver_phases)")
        self.scope: Optional[PermitScope] = None
        self.current: Optional[str] = None
        self.last_done: Optional[str] = None  # the last phase whose permit ended
        self.empty_permits = 0

    @property
    def permit(self) -> Optional[Permit]:
        """The open permit (None between permits)."""
        return self.scope.permit if self.scope is not None else None

    def _next(self, after: Optional[str]) -> str:
        if after is None:
            return self.phases[0]
        return self.phases[(self.phases.index(after) + 1) % len(self.phases)]

    def _open(self, phase: str, empty: bool = False) -> PermitScope:
        targets = self.offload.get(phase, self.offload.get(pool_of_phase(phase), ()))
        scope = PermitScope(self.job, phase, offload=targets, empty=empty)
        scope.__enter__()
        return scope

    def enter(self, phase: str) -> Permit:
        """Hold ``phase``'s permit (see the class docstring). Raises PhaseFailed for a phase the
        job did not declare, and whatever acquiring raises."""
        if phase not in self.phases:
            raise PhaseFailed(f"job {self.job.job_id!r}: phase {phase!r} is not declared (declared: {self.phases})")
        if self.current == phase:
            return self.scope.permit
        self.close()
        nxt = self._next(self.last_done)
        while nxt != phase:  # the framework skipped this phase: keep the job's turn with an empty permit
            s = self._open(nxt, empty=True)
            s.__exit__(None, None, None)
            self.empty_permits += 1
            self.last_done = nxt
            nxt = self._next(nxt)
        self.scope, self.current = self._open(phase), phase
        return self.scope.permit

    def close(self, exc: Optional[BaseException] = None) -> None:
        """End the open permit (``exc``: the phase failed with it)."""
        if self.scope is None:
            return
        scope, self.scope = self.scope, None
        done, self.current = self.current, None
        scope.__exit__(type(exc) if exc else None, exc, None)
        self.last_done = done

    def finish(self, exc: Optional[BaseException] = None) -> None:
        """End the job: close the open permit and report the job finished (or failed with
        ``exc``). A begun iteration is not completed: the departure takes the job out of its
        group's queues, so its group-mates' turns go on."""
        try:
            self.close(exc)
        finally:
            if exc is not None:
                self.job.fail(exc)
            else:
                self.job.finish()
