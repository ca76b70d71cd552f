"""Long-tail migration's effect on emulated rollout nodes: the simulator's model, acted out.

On real GPUs a migrated rollout's stragglers are consolidated onto a few tail GPUs and the freed
GPUs run the next job's rollout (RollMux §4.3, Fig. 7). Emulated rollouts only wait, so without
this module a migrated rollout would end as if nothing happened and the next one would run at
full speed beside it. Here, per process (a pool node's worker hosts every job's phases on its
node), the running emulated rollouts are registered by node. A rollout that **starts on a node
while another job's rollout there is still running** means that the GroupController released the
first one's queue slots: long-tail migration acted (permits are otherwise exclusive per node).
Then, exactly as :func:`rollmux.intra_group.simulate_group` models it, with the same
:class:`rollmux.intra_group.LongTailPolicy` (``tail_gpus``, ``migration_overhead_s`` from
``configs/scheduler.yaml``):

* the migrated rollout's unfinished responses finish ``migration_overhead_s`` later and stretched
  by ``plan_tail`` (stragglers packed onto ``k`` tail GPUs; ``k`` grows until the stretch fits the
  slack admission planned, worst case - realised length);
* the new rollout starts after ``migration_overhead_s`` and progresses at ``1 - k / GPUs`` of full
  speed until the tail ends (:func:`rollmux.intra_group._finish`).

When ``plan_tail`` finds nothing to free (the tail would need every GPU), the tail keeps the
whole node and the new rollout crawls at the model's floor rate until it ends.
Times are wall seconds (``time.monotonic``) unless named ``_model_s``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

_LOCK = threading.Lock()
_RUNNING: dict[str, dict[str, "Running"]] = {}  # node -> job id -> its running rollout
_POLICY = None


def policy():
    """The :class:`LongTailPolicy` of ``configs/scheduler.yaml`` (tail GPUs, overhead), loaded once."""
    global _POLICY
    if _POLICY is None:
        from rollmux.admission import load_scheduler_config
        from rollmux.intra_group import LongTailPolicy

        c = load_scheduler_config()
        _POLICY = LongTailPolicy(c.tail_trigger_fraction, c.tail_gpus, c.migration_overhead_s)
    return _POLICY


@dataclass
class Running:
    """One emulated rollout in flight on a node: absolute wall deadlines of its responses."""

    job_id: str
    node: str
    finish: np.ndarray  # wall deadlines, ascending (a migration pushes the unfinished ones later)
    gpus: int  # the job's rollout GPUs
    slots: int  # concurrent sequences of the job's engine (the tail load's unit)
    slack_model_s: float  # worst-case rollout - this rollout's modelled length
    scale: float  # wall seconds per modelled second
    tail: Optional[tuple[float, float]] = None  # (tail end, held fraction) once migrated
    migrations: list = field(default_factory=list)

    def migrate(self, now: float) -> tuple[float, float]:
        """Consolidate the unfinished responses (once): returns ``(tail end wall, held fraction)``."""
        if self.tail is not None:
            return self.tail
        lt = policy()
        left = self.finish > now
        remaining = float(self.finish[-1] - now)
        if not left.any() or remaining <= 0:
            self.tail = (now, 0.0)
            return self.tail
        tail_load = float(left.sum()) / max(1, self.slots)
        plan = lt.plan_tail(self.gpus, remaining / self.scale, self.slack_model_s, tail_load)
        if plan is None:  # nothing to free: the tail keeps the node
            self.tail = (float(self.finish[-1]), 1.0)
        else:
            k, stretch = plan
            ov = lt.migration_overhead_s * self.scale
            self.finish = np.where(left, now + ov + (self.finish - now) * stretch, self.finish)
            self.tail = (float(self.finish[-1]), min(1.0, k / max(1, self.gpus)))
        self.migrations.append({"at": now, "tail_end": self.tail[0], "held": self.tail[1]})
        return self.tail


def begin(job_id: str, node: str, finish_model_s: np.ndarray, t0: float, scale: float, *, gpus: int, slots: int,
          slack_model_s: float) -> Running:
    """Register a rollout starting at wall ``t0`` on ``node`` whose responses finish at
    ``finish_model_s`` (modelled s from its start, ascending) at full speed. Another job's
    rollout still running on the node was migrated: it is consolidated and this rollout starts
    after the overhead at the freed speed (see the module docstring). Returns the entry whose
    ``finish`` (wall deadlines) the caller waits for."""
    from rollmux.intra_group import _finish

    with _LOCK:
        here = _RUNNING.setdefault(node, {})
        others = [r for j, r in here.items() if j != job_id and float(r.finish[-1]) > t0]
        full = t0 + np.asarray(finish_model_s, dtype=float) * scale
        if others:
            tails = [r.migrate(t0) for r in others]
            start = t0 + policy().migration_overhead_s * scale
            dur = np.asarray(finish_model_s, dtype=float) * scale
            fin = np.array([_finish(start, float(d), tails) for d in dur])
        else:
            fin = full
        e = Running(job_id, node, fin, gpus, slots, slack_model_s, scale)
        here[job_id] = e
        return e


def end(e: Running) -> None:
    """The rollout is over: unregister it."""
    with _LOCK:
        here = _RUNNING.get(e.node, {})
        if here.get(e.job_id) is e:
            del here[e.job_id]


def wait_responses(e: Running, clock: Callable[[], float], wait_until: Callable[[float], None], tick_s: float,
                   progress: Optional[Callable[[int, int], None]] = None) -> int:
    """Wait until every response of ``e`` is done, reporting ``progress(done, n)`` at most once per
    ``tick_s``. Deadlines only ever move later (a migration, once), so a pass that wakes before
    its response is done just waits again: at most ``n`` + reports + 2 passes (bounded by
    ``10 n + 1000``). Returns the progress reports made."""
    n = len(e.finish)
    done, reports, last = 0, 0, -float("inf")
    for _ in range(10 * n + 1000):
        if done >= n:
            break
        nxt = float(e.finish[done]) if progress is None else max(float(e.finish[done]), last + tick_s)
        wait_until(nxt)
        with _LOCK:
            done = min(n, int(np.searchsorted(e.finish, clock(), side="right")))
        if progress is not None:
            progress(done, n)
            reports += 1
            last = clock()
    return reports
