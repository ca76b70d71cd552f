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
ids the solver's cache drops first) and ``close()``. A child that dies is started again on the
next call; that call's solve is lost (None: nothing moves, like a solve that found nothing).
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import time
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

    def close(self) -> None:
        pass


# ---- the child process: ``python -m actors.reopt_worker``, length-prefixed pickles on stdin / stdout
def _write_frame(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = struct.pack("!Q", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int, deadline: Optional[float]) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer from the re-optimisation child within {PLAN_TIMEOUT_S:g} s")
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("the re-optimisation child exited")
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int, deadline: Optional[float] = None):
    (n,) = struct.unpack("!Q", _read_exact(fd, 8, deadline))
    return pickle.loads(_read_exact(fd, n, deadline))


def _child_main() -> None:  # pragma: no cover - runs in the child (covered by the process planner's test)
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    try:
        os.nice(CHILD_NICE)
    except OSError:
        pass
    cluster, config = _read_frame(0)
    planner = ThreadPlanner(ClusterSpec.model_validate(cluster), SchedulerConfig.model_validate(config))
    while True:
        try:
            hood, fresh, forget = _read_frame(0)
        except EOFError:
            return
        try:
            _write_frame(out_fd, ("ok", planner.plan(hood, fresh, forget)))
        except Exception as e:  # a failed solve: the parent logs it, nothing moves
            _write_frame(out_fd, ("error", f"{type(e).__name__}: {e}"))


class ProcessPlanner:
    """Solves in one child process (``python -m actors.reopt_worker``: a fresh interpreter that
    shares no threads, locks or interpreter lock with the actor)."""

    def __init__(self, cluster: ClusterSpec, config: SchedulerConfig):
        self._args = (cluster.model_dump(mode="json"), config.model_dump(mode="json"))
        self._proc: Optional[subprocess.Popen] = None
        self.restarts = 0
        self.closed = False

    def _child(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            self._proc = subprocess.Popen([sys.executable, "-m", "actors.reopt_worker"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=env, close_fds=True)
            _write_frame(self._proc.stdin.fileno(), self._args)
        return self._proc

    def plan(self, hood, fresh: Optional[str], forget: list[str]):
        if self.closed:
            return None
        try:
            p = self._child()
            _write_frame(p.stdin.fileno(), (hood, fresh, forget))
            kind, value = _read_frame(p.stdout.fileno(), time.monotonic() + PLAN_TIMEOUT_S)
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
