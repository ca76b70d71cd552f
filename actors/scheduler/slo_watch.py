"""The GlobalScheduler's SLO watch: act on measured phase times (``profile_source: measured`` (the default) ``| blended``).

Each iteration report carries the job's own phase times; the job store folds them into the job's
record (``measured_phases``, a sliding window, :class:`rollmux.measured.MeasuredPhases`; the
record's one writer) and ``report`` notes the job (:meth:`SloWatch.note`). The reconcile
thread's next pass (:meth:`SloWatch.pending_pass`) plans the job on its measured
profile (:meth:`rollmux.admission.InterGroupScheduler.update_profile`) and runs the policy's
:func:`rollmux.admission.slo_watch.watch` on its group, predicting every member's slowdown against
its realised solo time from the members' measured windows with the simulator's predictor
(:func:`rollmux.admission.slo_watch.measured_predictor`). A decision goes into the at-risk job's
record (``slo_action``: action, reason, ...), the metric ``rollmux_slo_actions_total{action}`` and
so the HTTP API (``GET /v1/jobs/{id}``); its moves are recorded, checkpointed and pushed as
re-optimisation's are, and the controllers carry them out at the moved job's next iteration
boundary (a job mid-iteration finishes it on its old group). "SLO at risk" (nothing can be done)
is recorded and counted once per change of reason, never silently dropped. ``worst_case`` does none
of this (the paper's admission-only checks).
"""

from __future__ import annotations

import logging
import time

from actors.scheduler.commit import Commit
from actors.scheduler.job_store import JobStore
from actors.scheduler.policy_ref import PolicyRef
from actors.scheduler.reopt import Reoptimiser, touched_groups
from rollmux import profiler
from rollmux.admission.slo_watch import at_risk, measured_predictor, watch
from rollmux.measured import differs

log = logging.getLogger("rollmux.scheduler")

__all__ = ["SloWatch"]


class SloWatch:
    """The SLO watch of one scheduler (see the module docstring).

    Args:
        policy / jobs / commit: the table, the records and the unit of work a decision is written with.
        reopt: records, checkpoints and counts the moves a decision makes.
        metrics: the metrics recorder.
        lock: the scheduler's lock (taken by :meth:`pending_pass`, which the reconcile thread calls).
    """

    def __init__(self, policy: PolicyRef, jobs: JobStore, commit: Commit, reopt: Reoptimiser, metrics, lock):
        self.policy, self.jobs, self.commit, self.reopt, self.metrics, self.lock = policy, jobs, commit, reopt, metrics, lock
        self.pending: dict[str, None] = {}  # jobs that reported since the last pass
        self.memo: dict | None = None  # predictions of the pass in progress (None outside a pass)

    def note(self, job_id: str) -> None:
        igs = self.policy.igs
        cfg = igs.config
        if cfg.profile_source != "worst_case":
            self.pending[job_id] = None
            if igs.slo_guard is None:  # (again after a restore or a rolled-back transaction)
                # re-packing and re-optimisation never form a group the watch would refuse (no oscillation)
                igs.slo_guard = lambda g: not at_risk(g, self.predict(g), cfg.slo_watch_headroom)

    def predict(self, group) -> dict:
        """Predicted slowdown of every member of ``group`` on the members' measured windows: the
        simulator's predictor (:func:`rollmux.admission.slo_watch.measured_predictor`, the same
        long-tail policy). Within one pass a group's prediction is computed once (its members
        report together; the lock is held, so no report changes a window)."""
        windows = {j: rec.measured_phases for j in group.job_ids if (rec := self.jobs.get(j)) is not None}
        memo = self.memo
        key = None
        if memo is not None:
            key = tuple((m.spec.job_id, m.profile, m.placement.rollout_nodes, m.placement.train_nodes,
                         windows[m.spec.job_id].reports if windows.get(m.spec.job_id) is not None else 0)
                        for m in group.members)
            if key in memo:
                return memo[key]
        out = measured_predictor(self.policy.config, lambda: windows)(group)
        if memo is not None:
            memo[key] = out
        return out

    def pending_pass(self) -> list[dict]:
        """Re-check the groups of the jobs that reported since the last call; returns the
        decisions taken (``slo_action`` dicts). Called by the reconcile thread every pass."""
        out = []
        with self.lock:
            pending, self.pending = self.pending, {}
            self.memo = {}  # a group's prediction is computed once per pass (its members report together)
            cfg = self.policy.config
            for jid in pending:
                igs = self.policy.igs  # (replaced when a decision's write failed and was rolled back)
                rec = self.jobs.get(jid)
                member = igs.member(jid)
                if rec is None or not rec.state.is_active() or member is None:
                    continue
                gid = igs.group_of(jid).group_id
                predict = self.predict
                prof = cfg.planning_profile(profiler.estimate(member.spec, self.policy.cluster), rec.measured_phases)
                if not differs(member.profile, prof) and not at_risk(igs.group(gid), predict(igs.group(gid)),
                                                                     cfg.slo_watch_headroom):
                    continue  # nothing changed, nobody at risk: no write
                try:
                    with self.commit.transaction():  # one write: the new planning profile, the moves, the record
                        changed = differs(member.profile, prof) and igs.update_profile(jid, prof)
                        act = watch(igs, gid, predict, headroom=cfg.slo_watch_headroom)
                        target = self.jobs.get(act.job_id) if act is not None else None
                        prev = target.slo_action if target is not None else None
                        new = act is not None and not (prev and prev.get("action") == act.action == "slo_at_risk"
                                                       and prev.get("group_id") == act.group_id)
                        touched = [gid]
                        done = []
                        if act is not None and new:
                            d = {k: v for k, v in act.to_dict().items() if k != "moves"} | {"at": time.time()}
                            self.jobs.note_slo_action(target, d)
                            if act.moves:
                                done = self.reopt.record_moves(act.moves, act.job_id, d["at"])
                                touched = touched_groups(gid, done)
                            out.append(d)
                        if changed or (act is not None and new):
                            jobs = tuple(dict.fromkeys([jid] + ([act.job_id] if act is not None else [])
                                                       + [m.job_id for m in done]))
                            self.commit.mark(jobs=jobs, groups=tuple(touched))
                except Exception:  # rolled back by the transaction: nothing moved (the next report retries)
                    log.exception("SLO watch of %s failed; no job moved", jid)
                    continue
                if act is not None and new:
                    self.metrics.slo_action(act.action)
                    if done:
                        self.commit.push(touched)
                        self.reopt.moved_metrics(touched, len(done))
                        self.reopt.after_moves()
            self.memo = None  # outside a pass (re-packing's guard) windows may have changed
        return out
