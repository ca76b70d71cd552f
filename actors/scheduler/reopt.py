"""The GlobalScheduler's re-optimiser: departure re-packing and neighbourhood re-optimisation.

After a departure the scheduler calls the policy's re-packing (``InterGroupScheduler.repack``)
and neighbourhood re-optimisation (``reoptimise``) in the departure's own write
(:meth:`Reoptimiser.departure_moves`); an admission is re-optimised off the admission path: the
admission pipeline notes the job (:meth:`Reoptimiser.note_admission`) and the reconcile thread's
next pass calls :meth:`Reoptimiser.reoptimise_pending` (``fresh`` only while the job's driver has
not started: nothing to copy yet). Every committed move is appended to the moved job's record
(:meth:`Reoptimiser.record_moves`, ``JobStore.record_moves``), checkpointed with both groups
*before* the controllers hear of it, then pushed; the record keeps the move's drain off the job's
old nodes (:mod:`actors.scheduler.drains`: other groups' members are fenced off them until it
stopped there). :class:`Reoptimiser` owns the admissions waiting for re-optimisation and the
set-partitioning solvers (their layout caches live as long as the actor). The admissions'
re-optimisation solves outside the scheduler's lock (plan, then commit if the neighbourhood is
unchanged), so no admission or read waits for a solve.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from actors.scheduler.commit import Commit
from actors.scheduler.job_store import JobStore
from actors.scheduler.policy_ref import PolicyRef
from rollmux.records import JobState, MoveRecord

log = logging.getLogger("rollmux.scheduler")

__all__ = ["Reoptimiser", "touched_groups"]


def touched_groups(gid: str, done: list[MoveRecord]) -> list[str]:
    """``gid`` and every group the moves ``done`` left or joined, in order, once each."""
    return list(dict.fromkeys([gid] + [g for m in done for g in (m.from_group, m.to_group)]))


class Reoptimiser:
    """Re-packing and re-optimisation of one scheduler (see the module docstring).

    Args:
        policy / jobs / commit: the table, the records and the unit of work moves are written with.
        has_controller: ``has_controller(group_id)``: the group's controller exists (a driver attached).
        metrics: the metrics recorder.
        lock: the scheduler's lock (held by :meth:`reoptimise_pending` only to capture and to commit).
        worker: where the admissions' solves run (:mod:`actors.scheduler.reopt_worker`): ``"thread"``
            or ``"process"``.
    Raises:
        ValueError: an unknown ``worker``.
    """

    def __init__(self, policy: PolicyRef, jobs: JobStore, commit: Commit, has_controller: Callable[[str], bool],
                 metrics, lock, worker: str = "thread"):
        if worker not in ("thread", "process"):
            raise ValueError(f"reopt_worker must be 'thread' or 'process', not {worker!r}")
        self.policy, self.jobs, self.commit, self.has_controller = policy, jobs, commit, has_controller
        self.metrics, self.lock, self.worker = metrics, lock, worker
        self.pending: dict[str, str] = {}  # admitted job -> its group, to re-optimise (reconcile thread)
        self.forgotten: list[str] = []  # departed jobs the admissions' solver forgets at its next pass
        self._opt = None  # the departures' OptimalPartition solver (built on first use; used under the lock)
        self.planner_impl = None  # where the admissions' solves run (built on first use)
        self.planned = 0  # re-optimisation solves run off the lock
        self.applied = 0  # ... whose plan was committed
        self.stale = 0  # ... whose neighbourhood changed before the commit (dropped)
        self.plans = 0  # global plans searched off the lock (rollmux.admission.global_plan)
        self.plan_applied = 0  # ... their migrations committed
        self.plan_stale = 0  # ... their migrations dropped: a group changed since the plan was captured
        self.admitted_during_plan = 0  # admissions answered while a global plan was being searched
        self.planning = False  # a global plan's search is in flight (off the lock)
        #: called (under the lock) after moves of the reconcile thread committed: a move may free room,
        #: which goes to the admission queue before any arrival is decided (the scheduler sets it)
        self.after_moves: Callable[[], object] = lambda: None

    def note_admission(self, job_id: str, group_id: str) -> None:
        self.pending[job_id] = group_id  # re-optimised by the reconcile thread, off the admission path
        if self.planning:
            self.admitted_during_plan += 1  # answered beside the global plan's search, not behind it

    def policy_clock(self) -> None:
        """The policy's clock is Unix time here (its move cap counts moves per wall-clock hour)."""
        if self.policy.igs.clock is None:
            self.policy.igs.clock = time.time

    def solver(self):
        """The set-partitioning solver of the policy's neighbourhood re-optimisation (its layout
        cache lives as long as this actor; departed jobs' layouts are dropped)."""
        if self._opt is None:
            from rollmux.baselines import OptimalPartition

            cfg = self.policy.config
            self._opt = OptimalPartition(self.policy.cluster, max_group_size=cfg.max_group_size,
                                         exact_max_jobs=max(2, cfg.reopt_max_jobs), time_limit_s=2.0)
        return self._opt

    def record_moves(self, moves: list[dict], trigger: str, now: float) -> list[MoveRecord]:
        """Append the policy's moves to the moved jobs' records (with the policy's predicted
        slowdown in the new group) and each move's drain off the job's old nodes
        (:mod:`rollmux.drain`; other groups' members are fenced off them until the job stopped
        there and its driver exported its state): complete at once when nothing of the job ran
        there (its old group never had a controller: no driver attached; or the job had not
        started, ``admitted``: no phase ran). ``now``: Unix time, s."""
        def settled(mv: dict) -> Optional[str]:
            if not self.has_controller(mv["from_group"]):
                return "no driver"
            rec = self.jobs.get(mv["job_id"])
            return "not started" if rec is not None and rec.state == JobState.ADMITTED else None

        igs = self.policy.igs
        return self.jobs.record_moves(
            moves, trigger, now, lambda gid, jid: igs.group_stats(gid)["predicted_slowdowns"].get(jid), settled)

    def departure_moves(self, gid: str, job_id: str) -> list[dict]:
        """The policy's moves after ``job_id`` left ``gid`` (inside the departure's transaction:
        :meth:`~rollmux.admission.InterGroupScheduler.after_departure`, SLO repair, re-packing and
        re-optimisation); a failed attempt is rolled back by the policy: no job moves."""
        self.policy_clock()
        try:
            moves = list(self.policy.igs.after_departure(gid, solver=self.solver()))
        except Exception:  # the policy rolls a failed attempt back; the departure itself stands
            log.exception("departure re-packing after %s failed; no job moved", job_id)
            moves = []
        return moves

    def moved_metrics(self, touched: list[str], n_moves: int) -> None:
        self.metrics.job_moves(n_moves)
        for g in touched:
            cost = self.policy.group_cost(g)
            if cost is None:
                self.metrics.group_dissolved(g)
            else:
                self.metrics.group_cost(g, cost)

    def forget(self, job_id: str) -> None:
        """A departed job's layouts leave both solvers' caches (the admissions' solver is the
        planner's: it forgets at the next solve, :meth:`reoptimise_pending`)."""
        self.solver().forget(job_id)
        self.forgotten.append(job_id)
        del self.forgotten[:-4096]  # bounded: the planner's cache is dropped with its process anyway

    def planner(self):
        """Where the admissions' re-optimisation solves run (:mod:`actors.scheduler.reopt_worker`: this
        thread, or a child process with ``worker="process"``); built on first use."""
        if self.planner_impl is None:
            from actors.scheduler.reopt_worker import make_planner

            self.planner_impl = make_planner(self.worker, self.policy.cluster, self.policy.config)
        return self.planner_impl

    def close(self) -> None:
        if self.planner_impl is not None:
            self.planner_impl.close()

    def reoptimise_pending(self) -> list[dict]:
        """Re-optimise the neighbourhoods of the admissions since the last call
        (:meth:`rollmux.admission.InterGroupScheduler.reoptimise`; the reconcile thread calls this
        every pass, so an admission's answer never waits for it). A newcomer whose driver has not
        started yet (state ``admitted``) has no state to copy. Moves are recorded, checkpointed and
        pushed as a departure's are. Returns the moves as :class:`MoveRecord` dicts.

        The scheduler's lock is held only to capture each neighbourhood (O(groups)) and to
        commit a plan; the solve (:meth:`~rollmux.admission.InterGroupScheduler.plan_reoptimise`)
        runs outside it, so admissions and reads are never queued behind it. A plan whose
        neighbourhood changed meanwhile is dropped (``stale`` counts them). Counters:
        ``planned`` (solves run off the lock), ``applied`` (plans committed)."""
        with self.lock:
            pending, self.pending = self.pending, {}
            self.policy_clock()
        out = []
        for jid in pending:
            with self.lock:  # short: which neighbourhood, captured as values
                rec = self.jobs.get(jid)
                igs = self.policy.igs
                if rec is None or not rec.state.is_active() or igs.group_of(jid) is None:
                    continue
                gid = igs.group_of(jid).group_id
                fresh = jid if rec.state == JobState.ADMITTED else None
                hood = igs.reopt_neighbourhood(gid)
                forget, self.forgotten = (self.forgotten, []) if hood is not None else ([], self.forgotten)
            if hood is None:
                continue
            try:  # the solve, off the lock: it reads only the captured neighbourhood
                plan = self.planner().plan(hood, fresh, forget)
            except Exception:
                log.exception("re-optimisation after admitting %s failed; no job moved", jid)
                continue
            self.planned += 1
            if plan is None:
                continue
            with self.lock:
                rec = self.jobs.get(jid)
                if fresh is not None and (rec is None or rec.state != JobState.ADMITTED):
                    self.stale += 1  # the newcomer started meanwhile: its copy was not planned for
                    continue
                try:
                    with self.commit.transaction():  # one checkpoint write commits the moves; a failed write undoes them
                        moves = self.policy.igs.apply_reoptimise(plan)
                        if not moves:
                            self.stale += 1  # the neighbourhood changed since it was captured
                            continue
                        done = self.record_moves(moves, jid, time.time())
                        touched = touched_groups(gid, done)
                        self.commit.mark(jobs=tuple(m.job_id for m in done), groups=tuple(touched))  # target state first
                except Exception:  # the write failed: rolled back, nothing moved (a later admission retries)
                    log.exception("checkpoint of the re-optimisation after admitting %s failed; no job moved", jid)
                    continue
                self.applied += 1
                self.commit.push(touched)
                self.moved_metrics(touched, len(done))
                self.after_moves()
                out += [m.model_dump(mode="json") for m in done]
        return out + self.global_plan_pending()

    def global_plan_pending(self) -> list[dict]:
        """The global plan (:mod:`rollmux.admission.global_plan`), when one is due: its request is
        captured under the lock (O(active jobs)), its search runs off the lock in the planner
        (:mod:`actors.scheduler.reopt_worker`: the child process by default), so admissions are
        answered meanwhile (``admitted_during_plan`` counts them), and its migrations are committed
        under the lock in one checkpoint write, each only if its groups are as planned on (a stale
        one is dropped: ``plan_stale``). Jobs whose driver has not started (state ``admitted``)
        copy nothing. Returns the moves as :class:`MoveRecord` dicts."""
        with self.lock:
            igs = self.policy.igs
            fresh = [r.job_id for r in self.jobs.records.values() if r.state == JobState.ADMITTED]
            req = igs.plan_request(fresh)
            if req is None:
                return []
            forget, self.forgotten = self.forgotten, []
            self.planning = True
        try:
            plan = self.planner().plan_global(req, forget)
        except Exception:
            log.exception("global plan failed; no job moved")
            plan = None
        finally:
            self.planning = False
        self.plans += 1
        if plan is None:
            return []
        with self.lock:
            igs = self.policy.igs
            started = {j for j in req.fresh if (r := self.jobs.get(j)) is None or r.state != JobState.ADMITTED}
            stale, applied = igs.plan_state.stale, igs.plan_state.applied
            try:
                with self.commit.transaction():  # one checkpoint write commits the moves; a failed write undoes them
                    moves = igs.apply_global(plan, started=started)
                    done = self.record_moves(moves, "global-plan", time.time()) if moves else []
                    touched = list(dict.fromkeys(g for m in done for g in (m.from_group, m.to_group)))
                    if done:
                        self.commit.mark(jobs=tuple(m.job_id for m in done), groups=tuple(touched))
            except Exception:
                log.exception("checkpoint of the global plan failed; no job moved")
                return []
            self.plan_stale += igs.plan_state.stale - stale
            self.plan_applied += igs.plan_state.applied - applied
            if done:
                self.commit.push(touched)
                self.moved_metrics(touched, len(done))
                self.after_moves()
            return [m.model_dump(mode="json") for m in done]
