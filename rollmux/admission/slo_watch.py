"""The SLO watch: re-check a co-execution group on measured phase times and, when a member is
predicted to miss its SLO, choose what to do at the next iteration boundary.

The slowdown checked is the one a user reads: a job's co-executed iteration time over its
*realised* solo iteration time. :func:`predict_slowdowns` samples it through the same round-robin
simulation admission uses (:func:`rollmux.intra_group.simulate_group`; where no rollout can migrate,
its recurrence :func:`rollmux.intra_group.cycled_coexec_times`, the same figures bit for bit), on each
member's measured iterations (cycled; long-tail migration as configured), divided by the mean of the same
iterations; a member that has not run yet contributes its planning profile as one deterministic
iteration (then its ratio is the worst-case one admission checked). :func:`measured_predictor` is
the one predictor the cluster's GlobalScheduler and the simulator both call: the same windows
(:func:`measured_windows`), the same long-tail policy (:func:`long_tail_of`; the iteration
reports carry the trigger time and tail load it needs, :func:`rollmux.measured.reported_sample`).

:func:`watch` acts when a member ``k`` has ``slowdown_k > slo_k x (1 - headroom)``. Options, each
tried on the scheduler's state and rolled back exactly (``_save`` / ``_load`` of
:class:`rollmux.admission.repack.RepackMixin`):

* ``move`` / ``move_neighbour``: take the at-risk job (or a neighbour) out of the group, check every
  remaining member keeps its SLO, and re-admit the mover through the same Alg. 1 decision as an
  arrival (minimum marginal cost) into another group where every member keeps its SLO;
* ``scale_out``: as a move, when the decision adds rollout nodes to the target group;
* ``isolate``: the mover alone in a new group (always within its SLO).

The option with the lowest total $/h afterwards wins (ties: the at-risk job moves first, then the
members in round-robin order); nothing feasible (a bounded cluster without room) gives the action
``slo_at_risk`` and nothing changes. The policy is pure: the cluster's GlobalScheduler calls
:func:`watch` after each iteration report and applies the moves at the job's next iteration
boundary, the simulator calls it at its events. Source: extension of RollMux §4.2 Alg. 1 (the paper
checks SLOs at admission only, on worst-case profiles).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

from rollmux import profiler
from rollmux.admission.decisions import AdmissionDecision, placement_dict
from rollmux.intra_group import (IterationTimes, LongTailPolicy, cycled_coexec_times, realised_solo_s, sampled_meta_iterations,
                                 simulate_group)
from rollmux.models import CoExecutionGroup, PhaseProfile

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rollmux.measured import MeasuredPhases

#: predicted slowdown per member of a group: co-executed iteration over realised solo iteration
PredictFn = Callable[[CoExecutionGroup], Mapping[str, float]]

ACTIONS = ("move", "move_neighbour", "scale_out", "isolate", "slo_at_risk")


def long_tail_of(config) -> Optional[LongTailPolicy]:
    """The long-tail migration a prediction models: the configured policy
    (:meth:`rollmux.admission.SchedulerConfig.long_tail_policy`) where migration acts
    (``tail_migration``), else None. An iteration without ``t_trigger_s`` never migrates in the
    prediction (a deterministic replay's, or a report without progress)."""
    return config.long_tail_policy() if config.tail_migration else None


def measured_windows(config, windows: Mapping[str, "Optional[MeasuredPhases]"],
                     job_ids: Sequence[str]) -> dict[str, list[IterationTimes]]:
    """The members' measured iterations a prediction samples: each of ``job_ids`` whose window
    (``windows[job_id]``, :class:`rollmux.measured.MeasuredPhases`) holds at least
    ``config.measured_min_iterations`` reports; a shorter window is no profile yet (the member's
    planning profile stands in, :func:`predict_slowdowns`)."""
    out = {}
    for j in job_ids:
        w = windows.get(j)
        if w is not None and w.n >= max(1, config.measured_min_iterations):
            out[j] = w.iterations()
    return out


def measured_predictor(config, windows: Callable[[], Mapping[str, "Optional[MeasuredPhases]"]]) -> PredictFn:
    """The one predictor of the SLO watch, for the cluster's GlobalScheduler and the simulator
    alike: per member of a group, :func:`predict_slowdowns` on the members' measured windows
    (:func:`measured_windows`; ``windows()`` returns job id -> window) with the configured
    long-tail policy (:func:`long_tail_of`)."""
    lt = long_tail_of(config)

    def predict(group: CoExecutionGroup) -> dict[str, float]:
        return predict_slowdowns(group, measured_windows(config, windows(), group.job_ids), long_tail=lt)

    return predict


def predict_slowdowns(group: CoExecutionGroup, samples: Mapping[str, Sequence[IterationTimes | PhaseProfile]], *,
                      long_tail: Optional[LongTailPolicy] = None, meta_iterations: Optional[int] = None) -> dict[str, float]:
    """Per member of ``group``: mean co-executed iteration time on ``samples`` (job id -> its
    iterations, cycled; a member without samples runs its planning profile) over the realised solo
    time of the same iterations (:func:`rollmux.intra_group.realised_solo_s`). Shapes: one float per member, dimensionless (>= about 1).
    ``meta_iterations`` default :func:`rollmux.intra_group.sampled_meta_iterations` of the longest
    sample list. Raises ValueError on an empty group."""
    times = {m.spec.job_id: list(samples.get(m.spec.job_id) or [m.profile]) for m in group.members}
    k = meta_iterations or sampled_meta_iterations(group, max(len(v) for v in times.values()))
    if (all(m.profile.max_staleness == 0 for m in group.members)
            and (long_tail is None or all(getattr(it, "t_trigger_s", None) is None for v in times.values() for it in v))):
        # nothing can migrate: the event simulation is the round-robin recurrence (the same figures)
        t_co = cycled_coexec_times(group, times, k)
    else:
        t_co = simulate_group(group, meta_iterations=k, phase_times=times, long_tail=long_tail,
                              record_timeline=False).t_coexec_s
    out = {}
    for m in group.members:  # an asynchronous member's solo time pipelines its iterations (realised_solo_s)
        jid = m.spec.job_id
        out[jid] = t_co[jid] / realised_solo_s(m, times[jid])
    return out


@dataclass
class SloAction:
    """What the watch decided for a group with a member at risk.

    Attributes:
        job_id: the member predicted to miss its SLO (the largest ``slowdown / slo``).
        action: one of :data:`ACTIONS`.
        reason: human-readable (the figures that decided).
        group_id: the group checked; ``to_group``: where the mover went (None: nothing moved).
        mover: the job moved (the at-risk job or a neighbour; None for ``slo_at_risk``).
        predicted_slowdown / slo: of ``job_id`` before acting.
        cost_usd_per_h_before / cost_usd_per_h_after: the cluster's $/h around the action.
        moves: as :meth:`rollmux.admission.InterGroupScheduler.repack` returns them.
    """

    job_id: str
    action: str
    reason: str
    group_id: str
    predicted_slowdown: float
    slo: float
    cost_usd_per_h_before: float
    cost_usd_per_h_after: float
    mover: Optional[str] = None
    to_group: Optional[str] = None
    moves: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def at_risk(group: CoExecutionGroup, pred: Mapping[str, float], headroom: float = 0.0) -> list[tuple[float, str]]:
    """Members with ``slowdown > slo x (1 - headroom)``, as ``(slowdown / slo, job_id)``, worst first."""
    out = [(pred[m.spec.job_id] / m.spec.slo, m.spec.job_id) for m in group.members
           if not pred[m.spec.job_id] <= m.spec.slo * (1.0 - headroom) * (1 + 1e-9)]
    return sorted(out, reverse=True)


def _keeps(sched, gid: str, predict: PredictFn, headroom: float) -> bool:
    g = sched.group(gid)
    return not g.members or not at_risk(g, predict(g), headroom)


def _isolated(d: AdmissionDecision) -> Optional[AdmissionDecision]:
    if d.strategy == "isolated":
        return d
    c = next((c for c in d.candidates if c.group_id is None), None)
    if c is None or not c.ok:
        return None
    return dataclasses.replace(d, group_id=None, strategy="isolated", placement=c.placement,
                               delta_usd_per_h=c.delta_usd_per_h, predicted_slowdowns=dict(c.predicted_slowdowns),
                               _chosen=c, reason="isolated in a new group")


def _try(sched, mover, gid: str, predict: PredictFn, headroom: float) -> Optional[tuple[str, Optional[str]]]:
    """Move ``mover`` out of ``gid`` (state changed; the caller rolls back): ``(strategy, to_group)``
    or None when the remaining group or every target would still miss an SLO."""
    jid = mover.spec.job_id
    alone = len(sched.group(gid).members) == 1
    sched.depart(jid)
    if not alone and not _keeps(sched, gid, predict, headroom):
        return None
    d = sched.decide(mover.spec, mover.profile)
    if d.admitted and d.strategy != "isolated" and d.group_id != gid:
        saved = sched._save()
        sched.commit(d)
        if _keeps(sched, d.group_id, predict, headroom):
            return d.strategy, d.group_id
        sched._load(saved)
        d = sched.decide(mover.spec, mover.profile)
    iso = _isolated(d) if d.code.value != "never" else None
    if iso is None or alone:  # a job alone in its group gains nothing from a new group of its own
        return None
    grp = sched.commit(iso)
    return "isolated", grp.group_id


def watch(sched, group_id: str, predict: PredictFn, *, headroom: float = 0.0) -> Optional[SloAction]:
    """Re-check ``group_id`` of ``sched`` (:class:`rollmux.admission.InterGroupScheduler`) with
    ``predict`` and act when a member is at risk (module docstring). Returns None when every member
    keeps its SLO, else the :class:`SloAction` (applied to ``sched`` unless ``slo_at_risk``).
    Raises KeyError for an unknown group."""
    g = sched.group(group_id)
    if not g.members:
        return None
    pred = predict(g)
    risky = at_risk(g, pred, headroom)
    if not risky:
        return None
    ratio, jid = risky[0]
    slo = next(m.spec.slo for m in g.members if m.spec.job_id == jid)
    before = sched.cost_usd_per_h()
    movers = sorted(g.members, key=lambda m: m.spec.job_id != jid)  # the at-risk job first
    best = None
    for i, m in enumerate(movers):
        saved = sched._save()
        try:
            r = _try(sched, m, group_id, predict, headroom)
            if r is not None:
                key = (round(sched.cost_usd_per_h(), 9), i)
                if best is None or key < best[0]:
                    best = (key, m, r)
        finally:
            sched._load(saved)
    base = dict(job_id=jid, group_id=group_id, predicted_slowdown=pred[jid], slo=slo, cost_usd_per_h_before=before)
    if best is None:
        return SloAction(action="slo_at_risk", cost_usd_per_h_after=before,
                         reason=(f"SLO at risk: predicted slowdown {pred[jid]:.3f} vs SLO {slo:.3f} ({ratio:.2f}x) on measured "
                                 "phase times, and no move, scale-out or new group keeps every member within its SLO"), **base)
    _, m, _ = best
    r = _try(sched, m, group_id, predict, headroom)
    assert r is not None  # the same state as the trial: the same outcome
    strategy, to = r
    action = ("isolate" if strategy == "isolated" else "scale_out" if strategy == "scale_out"
              else "move" if m.spec.job_id == jid else "move_neighbour")
    after = sched.cost_usd_per_h()
    mv = profiler.move_time_s(m.spec, sched.cluster)
    newm = sched.member(m.spec.job_id)
    who = "it" if m.spec.job_id == jid else f"its neighbour {m.spec.job_id}"
    reason = (f"predicted slowdown {pred[jid]:.3f} vs SLO {slo:.3f} ({ratio:.2f}x) on measured phase times: "
              f"{action.replace('_', ' ')} {who} from {group_id} to {to} (cost {before:.2f} -> {after:.2f} USD/h)")
    if not math.isfinite(after):  # pragma: no cover - defensive
        raise RuntimeError("non-finite cost after an SLO action")
    return SloAction(action=action, reason=reason, cost_usd_per_h_after=after, mover=m.spec.job_id, to_group=to,
                     moves=[{"job_id": m.spec.job_id, "from_group": group_id, "to_group": to,
                             "placement": placement_dict(newm.placement),
                             "from_placement": placement_dict(m.placement), "move_s": mv,
                             "saved_usd_per_h": before - after}], **base)
