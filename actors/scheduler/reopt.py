"""The GlobalScheduler's re-optimisation part: departure re-packing and neighbourhood re-optimisation.

After a departure the scheduler calls the policy's re-packing (``InterGroupScheduler.repack``)
and neighbourhood re-optimisation (``reoptimise``) in the departure's own write; an admission is
re-optimised off the admission path: ``admit`` notes the job (:meth:`ReoptPart._note_admission`)
and the reconcile thread's next pass calls :meth:`ReoptPart.reoptimise_pending` (``fresh`` only
while the job's driver has not started: nothing to copy yet). Every committed move is appended
to the moved job's record (``JobStore.record_moves``), checkpointed with both groups *before*
the controllers hear of it, then pushed; the record keeps the move's drain off the job's old
nodes (:mod:`rollmux.drain`: other groups' members are fenced off them until it stopped there).
This part (:class:`ReoptPart`, mixed into ``GlobalSchedulerImpl``) owns the admissions waiting for
re-optimisation (``_reopt_pending``) and the set-partitioning solvers (their layout caches live as
long as the actor). The admissions' re-optimisation solves outside the scheduler's lock (plan, then
commit if the neighbourhood is unchanged), so no admission or read waits for a solve.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from rollmux.records import JobState, MoveRecord

log = logging.getLogger("rollmux.scheduler")

__all__ = ["ReoptPart"]


class ReoptPart:
    """The re-optimisation methods of the GlobalScheduler (see the module docstring)."""

    _opt = None  # the departures' OptimalPartition solver (built on first use; used under the lock)
    _reopt_planner = None  # where the admissions' solves run (actors.scheduler.reopt_worker; built on first use)
    reopt_worker = "thread"  # "thread" | "process" (the actor's default: a child process)
    reopt_planned = 0  # re-optimisation solves run off the lock
    reopt_applied = 0  # ... whose plan was committed
    reopt_stale = 0  # ... whose neighbourhood changed before the commit (dropped)
    plans_computed = 0  # global plans searched off the lock (rollmux.admission.global_plan)
    plan_migrations_applied = 0  # ... their migrations committed
    plan_migrations_stale = 0  # ... their migrations dropped: a group changed since the plan was captured
    admissions_during_plan = 0  # admissions answered while a global plan was being searched
    _planning = False  # a global plan's search is in flight (off the lock)

    def _note_admission(self, job_id: str, group_id: str) -> None:
        self._reopt_pending[job_id] = group_id  # re-optimised by the reconcile thread, off the admission path
        if self._planning:
            self.admissions_during_plan += 1  # answered beside the global plan's search, not behind it

    def _solver(self):
        """The set-partitioning solver of the policy's neighbourhood re-optimisation (its layout
        cache lives as long as this actor; departed jobs' layouts are dropped)."""
        if self._opt is None:
            from rollmux.baselines import OptimalPartition

            cfg = self.igs.config
            self._opt = OptimalPartition(self.cluster, max_group_size=cfg.max_group_size,
                                         exact_max_jobs=max(2, cfg.reopt_max_jobs), time_limit_s=2.0)
        return self._opt

    def _record_moves(self, moves: list[dict], trigger: str, now: float) -> list[MoveRecord]:
        """Append the policy's moves to the moved jobs' records (with the policy's predicted
        slowdown in the new group) and each move's drain off the job's old nodes
        (:mod:`rollmux.drain`; other groups' members are fenced off them until the job stopped
        there and its driver exported its state): complete at once when nothing of the job ran
        there (its old group never had a controller: no driver attached; or the job had not
        started, ``admitted``: no phase ran). ``now``: Unix time, s."""
        def settled(mv: dict) -> Optional[str]:
            if not self.reconciler.has_controller(mv["from_group"]):
                return "no driver"
            rec = self.job_store.get(mv["job_id"])
            return "not started" if rec is not None and rec.state == JobState.ADMITTED else None

        return self.job_store.record_moves(
            moves, trigger, now, lambda gid, jid: self.igs.group_stats(gid)["predicted_slowdowns"].get(jid), settled)

    def _policy_clock(self) -> None:
        """The policy's clock is Unix time here (its move cap counts moves per wall-clock hour)."""
        if self.igs.clock is None:
            self.igs.clock = time.time

    def _departure_moves(self, gid: str, job_id: str) -> list[dict]:
        """The policy's moves after ``job_id`` left ``gid`` (inside the departure's transaction:
        :meth:`~rollmux.admission.InterGroupScheduler.after_departure`, SLO repair, re-packing and
        re-optimisation); a failed attempt is rolled back by the policy: no job moves."""
        self._policy_clock()
        try:
            moves = list(self.igs.after_departure(gid, solver=self._solver()))
        except Exception:  # the policy rolls a failed attempt back; the departure itself stands
            log.exception("departure re-packing after %s failed; no job moved", job_id)
            moves = []
        return moves

    def _moved_metrics(self, touched: list[str], n_moves: int) -> None:
        self.metrics.job_moves(n_moves)
        for g in touched:
            if self.igs.group_snapshot(g) is None:
                self.metrics.group_dissolved(g)
            else:
                self._cost_metrics(g)

    def _forget(self, job_id: str) -> None:
        """A departed job's layouts leave both solvers' caches (the admissions' solver is the
        planner's: it forgets at the next solve, :meth:`reoptimise_pending`)."""
        self._solver().forget(job_id)
        self._reopt_forget.append(job_id)
        del self._reopt_forget[:-4096]  # bounded: the planner's cache is dropped with its process anyway

    def _planner(self):
        """Where the admissions' re-optimisation solves run (:mod:`actors.scheduler.reopt_worker`: this
        thread, or a child process with ``reopt_worker="process"``); built on first use."""
        if self._reopt_planner is None:
            from actors.scheduler.reopt_worker import make_planner

            self._reopt_planner = make_planner(self.reopt_worker, self.cluster, self.igs.config)
        return self._reopt_planner

    def reoptimise_pending(self) -> list[dict]:
        """Re-optimise the neighbourhoods of the admissions since the last call
        (:meth:`rollmux.admission.InterGroupScheduler.reoptimise`; the reconcile thread calls this
        every pass, so an admission's answer never waits for it). A newcomer whose driver has not
        started yet (state ``admitted``) has no state to copy. Moves are recorded, checkpointed and
        pushed as a departure's are. Returns the moves as :class:`MoveRecord` dicts.

        The scheduler's lock is held only to capture each neighbourhood (O(groups)) and to
        commit a plan; the solve (:meth:`~rollmux.admission.InterGroupScheduler.plan_reoptimise`)
        runs outside it, so admissions and reads are never queued behind it. A plan whose
        neighbourhood changed meanwhile is dropped (``reopt_stale`` counts them). Counters:
        ``reopt_planned`` (solves run off the lock), ``reopt_applied`` (plans committed)."""
        with self._lock:
            pending, self._reopt_pending = self._reopt_pending, {}
            self._policy_clock()
        out = []
        for jid in pending:
            with self._lock:  # short: which neighbourhood, captured as values
                rec = self.job_store.get(jid)
                if rec is None or not rec.state.is_active() or self.igs.group_of(jid) is None:
                    continue
                gid = self.igs.group_of(jid).group_id
                fresh = jid if rec.state == JobState.ADMITTED else None
                hood = self.igs.reopt_neighbourhood(gid)
                forget, self._reopt_forget = (self._reopt_forget, []) if hood is not None else ([], self._reopt_forget)
            if hood is None:
                continue
            try:  # the solve, off the lock: it reads only the captured neighbourhood
                plan = self._planner().plan(hood, fresh, forget)
            except Exception:
                log.exception("re-optimisation after admitting %s failed; no job moved", jid)
                continue
            self.reopt_planned += 1
            if plan is None:
                continue
            with self._lock:
                rec = self.job_store.get(jid)
                if fresh is not None and (rec is None or rec.state != JobState.ADMITTED):
                    self.reopt_stale += 1  # the newcomer started meanwhile: its copy was not planned for
                    continue
                try:
                    with self._transaction():  # one checkpoint write commits the moves; a failed write undoes them
                        moves = self.igs.apply_reoptimise(plan)
                        if not moves:
                            self.reopt_stale += 1  # the neighbourhood changed since it was captured
                            continue
                        done = self._record_moves(moves, jid, time.time())
                        touched = list(dict.fromkeys([gid] + [g for m in done for g in (m.from_group, m.to_group)]))
                        self._checkpoint(jobs=tuple(m.job_id for m in done), groups=tuple(touched))  # target state first
                except Exception:  # the write failed: rolled back, nothing moved (a later admission retries)
                    log.exception("checkpoint of the re-optimisation after admitting %s failed; no job moved", jid)
                    continue
                self.reopt_applied += 1
                self._push(touched)
                self._moved_metrics(touched, len(done))
                out += [m.model_dump(mode="json") for m in done]
        return out + self.global_plan_pending()

    def global_plan_pending(self) -> list[dict]:
        """The global plan (:mod:`rollmux.admission.global_plan`), when one is due: its request is
        captured under the lock (O(active jobs)), its search runs off the lock in the planner
        (:mod:`actors.scheduler.reopt_worker`: the child process by default), so admissions are
        answered meanwhile (``admissions_during_plan`` counts them), and its migrations are
        committed under the lock in one checkpoint write, each only if its groups are as planned on
        (a stale one is dropped: ``plan_migrations_stale``). Jobs whose driver has not started
        (state ``admitted``) copy nothing. Returns the moves as :class:`MoveRecord` dicts."""
        with self._lock:
            fresh = [r.job_id for r in self.jobs.values() if r.state == JobState.ADMITTED]
            req = self.igs.plan_request(fresh)
            if req is None:
                return []
            forget, self._reopt_forget = self._reopt_forget, []
            self._planning = True
        try:
            plan = self._planner().plan_global(req, forget)
        except Exception:
            log.exception("global plan failed; no job moved")
            plan = None
        finally:
            self._planning = False
        self.plans_computed += 1
        if plan is None:
            return []
        with self._lock:
            started = {j for j in req.fresh if (r := self.job_store.get(j)) is None or r.state != JobState.ADMITTED}
            before, applied = self.igs.plan_state.stale, self.igs.plan_state.applied
            try:
                with self._transaction():  # one checkpoint write commits the moves; a failed write undoes them
                    moves = self.igs.apply_global(plan, started=started)
                    if not moves:
                        self.plan_migrations_stale += self.igs.plan_state.stale - before
                        return []
                    done = self._record_moves(moves, "global-plan", time.time())
                    touched = list(dict.fromkeys(g for m in done for g in (m.from_group, m.to_group)))
                    self._checkpoint(jobs=tuple(m.job_id for m in done), groups=tuple(touched))
            except Exception:
                log.exception("checkpoint of the global plan failed; no job moved")
                return []
            self.plan_migrations_stale += self.igs.plan_state.stale - before
            self.plan_migrations_applied += self.igs.plan_state.applied - applied
            self._push(touched)
            self._moved_metrics(touched, len(done))
            return [m.model_dump(mode="json") for m in done]
