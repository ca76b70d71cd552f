"""The measured-profile loop of a replayed scheduler policy (``profile_source: measured | blended``):
what the cluster's GlobalScheduler does with its jobs' iteration reports, on the realised
(stochastic) iterations of the replay.

* An arriving job is planned on :meth:`SchedulerConfig.planning_profile`: a prior of its kind
  (the measured/worst-case ratios of jobs of the same model size and task that have run,
  :func:`rollmux.measured.ratio_prior`) when one exists, else its worst case.
* When it has run ``measured_min_iterations`` iterations, and again when it has run every sampled
  iteration of the realisation, its window (:class:`rollmux.measured.MeasuredPhases`) holds the
  iterations it ran; its planning profile becomes the measured one
  (:meth:`InterGroupScheduler.update_profile`).
* After every event, each group that changed is re-checked by :func:`rollmux.admission.slo_watch.watch`
  on the measured iterations (the ratio a user reads); its moves stall the moved job for its
  host-state copy, as re-packing's do.

Source: extension of RollMux §4.2 Alg. 1; the simulator model is RollMux §7.4-§7.5.
"""

from __future__ import annotations

from typing import Optional

from rollmux.admission.slo_watch import SloAction, at_risk, measured_predictor, watch
from rollmux.measured import MeasuredPhases, differs, kind_of, ratio_prior, ratios_of
from rollmux.models import CoExecutionGroup, JobSpec, PhaseProfile

#: measured/worst-case ratios kept per kind (the most recent)
_PRIOR_JOBS = 32


class MeasuredLoop:
    """The loop above for one :class:`rollmux.sim.policies.SchedulerPolicy` (``sched``, ``real``)."""

    def __init__(self, sched, real) -> None:
        self.sched, self.real = sched, real
        self.cfg = sched.config
        self.declared: dict[str, PhaseProfile] = {}
        self.specs: dict[str, JobSpec] = {}
        self.measured: dict[str, MeasuredPhases] = {}
        self.points: dict[str, list[int]] = {}
        self.ratios: dict[tuple, list[dict]] = {}
        self.actions: list[SloAction] = []
        self._checked: dict[str, int] = {}  # group id -> id() of the group record last checked
        self._all_checked = None  # the scheduler's groups (tuple) when every one of them was last found checked
        self._pred: dict[tuple, dict] = {}
        # the GlobalScheduler's predictor (one function): the same windows and long-tail policy
        self._predict = measured_predictor(self.cfg, lambda: self.measured)
        sched.slo_guard = lambda g: not at_risk(g, self.predict(g), self.cfg.slo_watch_headroom)

    def profile_for(self, spec: JobSpec, declared: PhaseProfile) -> PhaseProfile:
        """The planning profile of an arriving job (its kind's prior, else its worst case)."""
        self.declared[spec.job_id], self.specs[spec.job_id] = declared, spec
        prior = ratio_prior(declared, self.ratios.get(kind_of(spec), []), self.cfg.measured_quantile)
        return self.cfg.planning_profile(declared, None, prior=prior)

    def started(self, job_id: str) -> None:
        self.points[job_id] = sorted({self.cfg.measured_min_iterations, max(self.cfg.measured_min_iterations,
                                                                             self.real.samples)})

    def learn_points(self) -> dict[str, int]:
        return {j: p[0] for j, p in self.points.items() if p}

    def learn(self, job_id: str, iterations: int) -> list[dict]:
        """The job ran ``iterations`` iterations: its window, its planning profile, the re-checks."""
        pts = self.points.get(job_id)
        if pts:
            pts.pop(0)
        spec = self.specs[job_id]
        its = self.real.iterations_of(spec)
        m = MeasuredPhases(window=self.cfg.measured_window).extend(its[i % len(its)] for i in range(iterations))
        self.measured[job_id] = m
        prof = self.cfg.planning_profile(self.declared[job_id], m)
        if m.n >= self.cfg.measured_min_iterations:
            rs = self.ratios.setdefault(kind_of(spec), [])
            rs.append(ratios_of(self.declared[job_id], m.high(self.cfg.measured_quantile)))
            del rs[:-_PRIOR_JOBS]
        g = self.sched.group_of(job_id)
        if g is not None:
            if differs(self.sched.member(job_id).profile, prof):  # the GlobalScheduler's rule (measured.differs)
                self.sched.update_profile(job_id, prof)
            self._checked.pop(g.group_id, None)  # a new window: its group is re-checked, as on every report
            self._all_checked = None
        return self.check()

    def departed(self, job_id: str) -> None:
        for d in (self.declared, self.specs, self.measured, self.points):
            d.pop(job_id, None)

    def predict(self, g: CoExecutionGroup) -> dict[str, float]:
        """Predicted slowdowns of ``g`` on its members' measured iterations (cached;
        :func:`rollmux.admission.slo_watch.measured_predictor`)."""
        key = self.real._group_key(g) + tuple((self.measured[m.spec.job_id].reports if m.spec.job_id in self.measured
                                                else 0) for m in g.members)
        out = self._pred.get(key)
        if out is None:
            if len(self._pred) > 50_000:
                self._pred.clear()
            out = self._pred[key] = self._predict(g)
        return out

    def check(self) -> list[dict]:
        """Re-check every group that changed since its last check; the moves of the actions taken."""
        moves: list[dict] = []
        groups = self.sched.groups
        if groups is self._all_checked:  # the same table (a change replaces it) and no new window since
            return moves
        todo: list = []
        for _ in range(4 * max(1, len(groups))):  # bounded: each action changes a group
            # the first group (in table order) not checked as it is now; a check that changed
            # nothing leaves the others as they were, so the list is rebuilt only after an action
            todo = [g for g in todo if self._checked.get(g.group_id) != id(g)] if todo else \
                [g for g in groups if g.members and self._checked.get(g.group_id) != id(g)]
            if not todo:
                self._all_checked = groups
                break
            g = todo[0]
            act = watch(self.sched, g.group_id, self.predict, headroom=self.cfg.slo_watch_headroom)
            cur = self.sched.group_of(g.job_ids[0]) if act is None or act.action == "slo_at_risk" else None
            if cur is not None and cur.group_id == g.group_id:
                self._checked[g.group_id] = id(cur)
            if act is not None:
                self.actions.append(act)
                moves += act.moves
                groups, todo = self.sched.groups, []
        live = {g.group_id for g in groups}
        for gid in [x for x in self._checked if x not in live]:
            del self._checked[gid]
        return moves

    def extra(self) -> dict:
        by: dict[str, int] = {}
        for a in self.actions:
            by[a.action] = by.get(a.action, 0) + 1
        return {"profile_source": self.cfg.profile_source, "slo_actions": by,
                "slo_watch_moves": sum(len(a.moves) for a in self.actions)}
