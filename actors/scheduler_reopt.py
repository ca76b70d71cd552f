"""The GlobalScheduler's re-optimisation part: departure re-packing and neighbourhood re-optimisation.

After a departure the scheduler calls the policy's re-packing (``InterGroupScheduler.repack``)
and neighbourhood re-optimisation (``reoptimise``) in the departure's own write; an admission is
re-optimised off the admission path: ``admit`` notes the job (:meth:`ReoptPart._note_admission`)
and the reconcile thread's next pass calls :meth:`ReoptPart.reoptimise_pending` (``fresh`` only
while the job's driver has not started: nothing to copy yet). Every committed move is appended
to the moved job's record (``JobStore.record_moves``), checkpointed with both groups *before*
the controllers hear of it, then pushed. This part (:class:`ReoptPart`, mixed into
``GlobalSchedulerImpl``) owns the admissions waiting for re-optimisation (``_reopt_pending``)
and the set-partitioning solver (its layout cache lives as long as the actor).
"""

from __future__ import annotations

import logging
import time

from rollmux.records import JobState, MoveRecord

log = logging.getLogger("rollmux.scheduler")

__all__ = ["ReoptPart"]


class ReoptPart:
    """The re-optimisation methods of the GlobalScheduler (see the module docstring)."""

    _opt = None  # the OptimalPartition solver (built on first use)

    def _note_admission(self, job_id: str, group_id: str) -> None:
        self._reopt_pending[job_id] = group_id  # re-optimised by the reconcile thread, off the admission path

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
        slowdown in the new group)."""
        return self.job_store.record_moves(
            moves, trigger, now, lambda gid, jid: self.igs.group_stats(gid)["predicted_slowdowns"].get(jid))

    def _departure_moves(self, gid: str, job_id: str) -> list[dict]:
        """Re-pack and re-optimise the neighbourhood of the group ``job_id`` left (inside the
        departure's transaction); a failed attempt is rolled back by the policy: no job moves."""
        try:
            moves = list(self.igs.repack(gid))
            moves += self.igs.reoptimise(gid, solver=self._solver())
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

    def reoptimise_pending(self) -> list[dict]:
        """Re-optimise the neighbourhoods of the admissions since the last call
        (:meth:`rollmux.admission.InterGroupScheduler.reoptimise`; the reconcile thread calls this
        every pass, so an admission's answer never waits for it). A newcomer whose driver has not
        started yet (state ``admitted``) has no state to copy. Moves are recorded, checkpointed and
        pushed as a departure's are. Returns the moves as :class:`MoveRecord` dicts."""
        with self._lock:
            pending, self._reopt_pending = self._reopt_pending, {}
            out = []
            for jid, gid in pending.items():
                rec = self.job_store.get(jid)
                if rec is None or not rec.state.is_active() or self.igs.group_of(jid) is None:
                    continue
                gid = self.igs.group_of(jid).group_id
                try:
                    with self._transaction():  # one checkpoint write commits the moves; a failed write undoes them
                        try:
                            moves = list(self.igs.reoptimise(gid, fresh=jid if rec.state == JobState.ADMITTED else None,
                                                             solver=self._solver()))
                        except Exception:  # the policy rolls a failed attempt back; nothing moved
                            log.exception("re-optimisation after admitting %s failed; no job moved", jid)
                            moves = []
                        if not moves:
                            continue
                        done = self._record_moves(moves, jid, time.time())
                        touched = list(dict.fromkeys([gid] + [g for m in done for g in (m.from_group, m.to_group)]))
                        self._checkpoint(jobs=tuple(m.job_id for m in done), groups=tuple(touched))  # target state first
                except Exception:  # the write failed: rolled back, nothing moved (a later admission retries)
                    log.exception("checkpoint of the re-optimisation after admitting %s failed; no job moved", jid)
                    continue
                self._push(touched)
                self._moved_metrics(touched, len(done))
                out += [m.model_dump(mode="json") for m in done]
            return out
