"""Where the GlobalScheduler's admission re-optimisation solves run: this process, or a child process.

The solve of a neighbourhood (:meth:`rollmux.admission.InterGroupScheduler.plan_reoptimise`: the
set partitioning's bound and CP-SAT, tens of milliseconds to seconds of CPU) reads only the
neighbourhood captured as values (:class:`rollmux.admission.repack.ReoptHood`), the cluster spec
and the scheduler config. Run on a thread of the scheduler's own process it competes with the
actor's event loop for the interpreter lock, so admissions answered meanwhile wait on it; in a
child process (:class:`ProcessPlanner`, the actor's default) they do not. The child keeps its
own solver (its layout cache lives as long as the child) and runs at a lower CPU priority
(``nice`` +:data:`CHILD_NICE`), so the reply path keeps the CPU it needs.

Both planners have ``plan(hood, fresh, forget) -> ReoptPlan | None`` (``forget``: departed job
ids the solver's cache drops first), ``plan_global(request, forget) -> GlobalPlan | None`` (the
global plan's search, :meth:`rollmux.admission.InterGroupScheduler.plan_global`: the LP columns
and the integer master, bounded by counts and CP-SAT's deterministic time; the child keeps the LP
column pool across plans) and ``close()``. A child that dies is started again on the next call;
that call's solve is lost (None: nothing moves, like a solve that found nothing).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Optional

from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.models import ClusterSpec

log = logging.getLogger("rollmux.scheduler")

__all__ = ["ThreadPlanner", "ProcessPlanner", "make_planner", "PLAN_TIMEOUT_S", "CHILD_NICE"]

PLAN_TIMEOUT_S = 60.0  # one solve in the child at most, s (the solver's own limit is 2 s of deterministic time)
CHILD_NICE = 10  # the child's CPU priority below the scheduler's


def _solver_for(cluster: ClusterSpec, config: SchedulerConfig):
    from rollmux.baselines import OptimalPartition

    return OptimalPartition(cluster, max_group_size=config.max_group_size,
                            exact_max_jobs=max(2, config.reopt_max_jobs), time_limit_s=2.0)


class ThreadPlanner:
    """Solves in the calling thread (unit tests; a scheduler without a child process)."""

    def __init__(self, cluster: ClusterSpec, config: SchedulerConfig):
        self.igs = InterGroupScheduler(cluster, config=config)  # an empty table: plan reads cluster and config only
        self.solver = _solver_for(cluster, config)

    def plan(self, hood, fresh: Optional[str], forget: list[str]):
        for j in forget:
            self.solver.forget(j)
        return self.igs.plan_reoptimise(hood, fresh, solver=self.solver)

    def plan_global(self, request, forget: list[str]):
        for j in forget:
            self.solver.forget(j)
        return self.igs.plan_global(request, solver=self.solver)

    def close(self) -> None:
        pass


# ---- the child process: ``python -m actors.scheduler.reopt_worker``, pickles framed by multiprocessing's
# Connection (length-prefixed) on stdin / stdout
def _conn(fd: int, *, read: bool) -> Connection:
    """A one-way :class:`multiprocessing.connection.Connection` on its own copy of ``fd``."""
    return Connection(os.dup(fd), readable=read, writable=not read)


def _answer(conn: Connection, deadline: float):
    if not conn.poll(max(0.0, deadline - time.monotonic())):
        raise TimeoutError(f"no answer from the re-optimisation child within {PLAN_TIMEOUT_S:g} s")
    return conn.recv()  # EOFError when the child exited


def _child_main() -> None:  # pragma: no cover - runs in the child (covered by the process planner's test)
    out = _conn(1, read=False)
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    try:
        os.nice(CHILD_NICE)
    except OSError:
        pass
    inp = _conn(0, read=True)
    cluster, config = inp.recv()
    planner = ThreadPlanner(ClusterSpec.model_validate(cluster), SchedulerConfig.model_validate(config))
    while True:
        try:
            kind, args = inp.recv()
        except EOFError:
            return
        try:
            out.send(("ok", planner.plan(*args) if kind == "reopt" else planner.plan_global(*args)))
        except Exception as e:  # a failed solve: the parent logs it, nothing moves
            out.send(("error", f"{type(e).__name__}: {e}"))


class ProcessPlanner:
    """Solves in one child process (``python -m actors.scheduler.reopt_worker``: a fresh interpreter that
    shares no threads, locks or interpreter lock with the actor)."""

    def __init__(self, cluster: ClusterSpec, config: SchedulerConfig):
        self._args = (cluster.model_dump(mode="json"), config.model_dump(mode="json"))
        self._proc: Optional[subprocess.Popen] = None
        self._send: Optional[Connection] = None
        self._recv: Optional[Connection] = None
        self.restarts = 0
        self.closed = False

    def _child(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._kill()
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            self._proc = subprocess.Popen([sys.executable, "-m", "actors.scheduler.reopt_worker"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=env, close_fds=True)
            self._send = _conn(self._proc.stdin.fileno(), read=False)
            self._recv = _conn(self._proc.stdout.fileno(), read=True)
            self._send.send(self._args)
        return self._proc

    def plan(self, hood, fresh: Optional[str], forget: list[str]):
        return self._ask("reopt", (hood, fresh, forget))

    def plan_global(self, request, forget: list[str]):
        return self._ask("plan", (request, forget))

    def _ask(self, what: str, args: tuple):
        if self.closed:
            return None
        try:
            self._child()
            self._send.send((what, args))
            kind, value = _answer(self._recv, time.monotonic() + PLAN_TIMEOUT_S)
        except Exception as e:  # the child died or hung: a new one next time; nothing moves now
            if self.closed:
                return None
            log.warning("re-optimisation child process failed (%s: %s); it is started again", type(e).__name__, e)
            self._kill()
            self.restarts += 1
            return None
        if kind != "ok":
            log.warning("re-optimisation solve failed in the child: %s; no job moved", value)
            return None
        return value

    def close(self) -> None:
        """Stop the child (for good: the scheduler is closing)."""
        self.closed = True
        self._kill()

    def _kill(self) -> None:
        for c in (self._send, self._recv):
            if c is not None:
                c.close()
        self._send = self._recv = None
        p, self._proc = self._proc, None
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def make_planner(kind: str, cluster: ClusterSpec, config: SchedulerConfig):
    """``"thread"`` -> :class:`ThreadPlanner`, ``"process"`` -> :class:`ProcessPlanner`."""
    if kind == "thread":
        return ThreadPlanner(cluster, config)
    if kind == "process":
        return ProcessPlanner(cluster, config)
    raise ValueError(f"reopt_worker must be 'thread' or 'process', not {kind!r}")


if __name__ == "__main__":  # pragma: no cover
    _child_main()
