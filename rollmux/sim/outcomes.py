"""A replay's outcomes and the summary: per-job outcomes (:class:`JobOutcome`), one policy's run
(:class:`PolicyRun`: series, integrals, :meth:`PolicyRun.metrics`), the per priority-class view
(:func:`per_class`) and ``summary.json`` (:func:`summarise`, with the paper's reference ratios).

The replay that fills them is :func:`rollmux.sim.simulator.replay`, which re-exports these names;
the model (slowdown, cost over the common horizon, bubble ratios, decision latency) is described
there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from rollmux.models import CoExecutionGroup
from rollmux.sim.async_jobs import per_kind


#: Paper's reported cost ratios of Solo-D and colocated veRL to RollMux (RollMux §7.4, Fig. 13a).
PAPER_RATIOS = {"solo-d_over_rollmux": 1.84, "colocated_over_rollmux": 1.38}

__all__ = ["PAPER_RATIOS", "JobOutcome", "PolicyRun", "per_class", "summarise"]


@dataclass
class JobOutcome:
    """One job's life under a policy: arrival, departure, slowdown (lifetime / duration), SLO."""

    job_id: str
    arrival_s: float
    departure_s: float
    duration_s: float
    slo: float
    solo_real_over_planned: float = 1.0  # realised solo time / worst-case (planning) solo time
    start_s: Optional[float] = None  # admission (after the admission queue); None = at arrival
    priority_class: Optional[str] = None  # with priorities: the job's class and tenant
    tenant: Optional[str] = None
    preemptions: int = 0  # times it was preempted (stopped at an iteration boundary, re-queued)
    lost_gpu_h: float = 0.0  # GPU-hours those preemptions cost it (rollmux.preemption.lost_gpu_h)
    cost_usd: float = 0.0  # its share of its units' cost (by GPUs asked), $, with priorities or async jobs
    max_staleness: int = 0  # its staleness bound k (0: synchronous) and mode (rollmux.staleness)
    staleness_mode: str = "exact"
    staleness: dict = field(default_factory=dict)  # async: rollouts run at each staleness {s: rollouts}

    @property
    def wait_s(self) -> float:
        """Time in the admission queue, s (0 unless replayed with the queue)."""
        return 0.0 if self.start_s is None else self.start_s - self.arrival_s

    @property
    def slowdown(self) -> float:
        """Running time (from admission) over the solo duration; the queue wait is :attr:`wait_s`."""
        return (self.departure_s - (self.arrival_s if self.start_s is None else self.start_s)) / self.duration_s

    @property
    def slowdown_vs_planned_solo(self) -> float:
        """Lifetime-average iteration time over the *worst-case* solo time: what worst-case
        admission bounds (RollMux §4.2); equals :attr:`slowdown` in deterministic replays."""
        return self.slowdown * self.solo_real_over_planned

    @property
    def slo_met(self) -> bool:
        return self.slowdown <= self.slo * (1 + 1e-6)


@dataclass
class PolicyRun:
    """Result of replaying a trace through one policy.

    Attributes:
        times_s / cost_usd_per_h / rollout_gpus / train_gpus: step series (value from ``times_s[i]``).
        cost_usd: integral of cost over the replay, $.
        rollout_gpu_s / train_gpu_s: provisioned GPU-seconds; ``*_busy_gpu_s`` busy ones.
        end_s: last departure.
        decision_ms: one latency per arrival.
        outcomes: per job.
        gantt_group / gantt_timeline: the largest group seen and its realised timeline (for plots).
        extra: policy-specific facts (optimum exactness).
    """

    policy: str
    times_s: list[float] = field(default_factory=list)
    cost_usd_per_h: list[float] = field(default_factory=list)
    rollout_gpus: list[int] = field(default_factory=list)
    train_gpus: list[int] = field(default_factory=list)
    cost_usd: float = 0.0
    rollout_gpu_s: float = 0.0
    train_gpu_s: float = 0.0
    rollout_busy_gpu_s: float = 0.0
    train_busy_gpu_s: float = 0.0
    end_s: float = 0.0
    decision_ms: list[float] = field(default_factory=list)
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    gantt_group: Optional[CoExecutionGroup] = None
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)
    shadow_s: float = 0.0
    shadow_policy_usd: float = 0.0
    shadow_optimal_usd: float = 0.0
    shadow_outside: int = 0
    shadow_instants: list = field(default_factory=list)  # (t_s, policy $/h, exact optimum $/h) where compared
    # the policy's excess over the exact optimum ($, where compared) by the event that opened the
    # interval ("arrival" | "departure"), and time-weighted jobs per group of both (s * jobs/group)
    shadow_gap_usd_by_event: dict = field(default_factory=dict)
    shadow_jobs_per_group_s: list = field(default_factory=lambda: [0.0, 0.0])
    # the proven lower bound at every instant (the exact optimum where exact, else the LP bound of
    # rollmux.partition_bound): covered seconds, the policy's $ and the bound's $ over them, the
    # instants by the bound's kind, and (LP bound, exact optimum) $/h pairs where both were computed
    bound_s: float = 0.0
    bound_policy_usd: float = 0.0
    bound_usd: float = 0.0
    bound_kinds: dict = field(default_factory=dict)
    bound_vs_exact: list = field(default_factory=list)
    # with ``bound_incumbent``: the cheapest known partition's $ over the bounded seconds (the exact
    # optimum where exact, else the best partition of the LP master's columns), and its seconds
    best_known_s: float = 0.0
    best_known_usd: float = 0.0
    best_known_policy_usd: float = 0.0
    best_known_bound_usd: float = 0.0

    def metrics(self, horizon_s: Optional[float] = None) -> dict:
        """The summary.json entry of this policy (its keys are a stable interface)."""
        h = horizon_s if horizon_s is not None else self.end_s
        lat = np.asarray(self.decision_ms or [0.0])
        outs = list(self.outcomes.values())
        return {
            "avg_cost_usd_per_h": self.cost_usd / (h / 3600.0) if h > 0 else 0.0,
            "peak_cost_usd_per_h": max(self.cost_usd_per_h, default=0.0),
            "slo_attainment": sum(o.slo_met for o in outs) / len(outs) if outs else 1.0,
            # iteration time within slo x the worst-case solo time (the bound admission guarantees)
            "slo_attainment_vs_planned_solo": (sum(o.slowdown_vs_planned_solo <= o.slo * (1 + 1e-6) for o in outs) / len(outs)
                                               if outs else 1.0),
            "max_slowdown_over_slo": float(max((o.slowdown / o.slo for o in outs), default=0.0)),
            "peak_rollout_gpus": int(max(self.rollout_gpus, default=0)),
            "peak_train_gpus": int(max(self.train_gpus, default=0)),
            "rollout_bubble_ratio": 1.0 - self.rollout_busy_gpu_s / self.rollout_gpu_s if self.rollout_gpu_s > 0 else 0.0,
            "train_bubble_ratio": 1.0 - self.train_busy_gpu_s / self.train_gpu_s if self.train_gpu_s > 0 else 0.0,
            # one decision per arrival: a p99 of fewer than 1,000 would be about their maximum
            "decision_latency_samples": len(self.decision_ms),
            "decision_latency_ms_p50": float(np.percentile(lat, 50)),
            "decision_latency_ms_p99": float(np.percentile(lat, 99)) if len(self.decision_ms) >= 1000 else None,
            "decision_latency_ms_max": float(lat.max()),
            "total_cost_usd": self.cost_usd,
            "mean_slowdown": float(np.mean([o.slowdown for o in outs])) if outs else 1.0,
            "max_slowdown": float(max((o.slowdown for o in outs), default=1.0)),
            "jobs": len(outs),
            "makespan_h": self.end_s / 3600.0,
            **self.extra,
        } | ({
            # admission-queue waits (a bounded cluster replayed with the queue), over replayed jobs
            "queue_wait_s_mean": float(np.mean(waits)),
            "queue_wait_s_p50": float(np.percentile(waits, 50)),
            "queue_wait_s_p90": float(np.percentile(waits, 90)),
            "queue_wait_s_max": float(waits.max()),
            "queued_jobs": int((waits > 0).sum()),
        } if (waits := np.asarray([o.wait_s for o in outs])).size and "queue_peak_jobs" in self.extra else {}) | ({
            "cost_vs_optimal_exact": self.shadow_policy_usd / self.shadow_optimal_usd if self.shadow_optimal_usd > 0 else None,
            "optimal_exact_time_fraction": self.shadow_s / self.end_s if self.end_s > 0 else 0.0,
            "optimal_exact_spend_fraction": self.shadow_policy_usd / self.cost_usd if self.cost_usd > 0 else 0.0,
            "optimal_exact_events_outside_layouts": self.shadow_outside,
        } if self.shadow_s > 0 else {}) | ({
            "cost_vs_lower_bound": self.bound_policy_usd / self.bound_usd if self.bound_usd > 0 else None,
            "lower_bound_time_fraction": self.bound_s / self.end_s if self.end_s > 0 else 0.0,
            "lower_bound_spend_fraction": self.bound_policy_usd / self.cost_usd if self.cost_usd > 0 else 0.0,
            "lower_bound_instants_by_kind": dict(sorted(self.bound_kinds.items())),
            "lower_bound_gap_to_exact_max": max((1.0 - b / e for b, e in self.bound_vs_exact if e > 0), default=None),
            "lower_bound_gap_to_exact_mean": (sum(1.0 - b / e for b, e in self.bound_vs_exact if e > 0) / len(self.bound_vs_exact)
                                              if self.bound_vs_exact else None),
            "lower_bound_gap_samples": len(self.bound_vs_exact),
            **({"cost_vs_best_known_partition": self.best_known_policy_usd / self.best_known_usd
                if self.best_known_usd > 0 else None,
                "best_known_partition_vs_lower_bound": self.best_known_usd / self.best_known_bound_usd
                if self.best_known_bound_usd > 0 else None,
                "best_known_partition_time_fraction": self.best_known_s / self.end_s if self.end_s > 0 else 0.0}
               if self.best_known_s > 0 else {}),
        } if self.bound_s > 0 else {}) | ({"by_class": per_class(outs, self.extra.get("priority_classes", ()))} if any(o.priority_class for o in outs) else {}) | (
            {"by_kind": per_kind(outs)} if any(o.max_staleness for o in outs) else {})


def per_class(outs: Sequence[JobOutcome], order: Sequence[str] = ()) -> dict:
    """Per priority class: jobs, queue wait (first admission - arrival) p50 / p99, preemptions,
    preempted jobs, lost GPU-hours, SLO attainment (slowdown from first admission, so the time a
    preempted job waits to resume counts) and cost (each job's share of its units by GPUs); the
    classes in ``order`` first (highest first), then any other in first-seen order."""
    out: dict = {}
    seen = {o.priority_class for o in outs}
    for c in [c for c in order if c in seen] + [c for c in dict.fromkeys(o.priority_class for o in outs) if c not in order]:
        os_ = [o for o in outs if o.priority_class == c]
        w = np.asarray([o.wait_s for o in os_])
        out[str(c)] = {
            "jobs": len(os_),
            "queue_wait_s_p50": float(np.percentile(w, 50)),
            "queue_wait_s_p99": float(np.percentile(w, 99)),
            "preemptions": int(sum(o.preemptions for o in os_)),
            "preempted_jobs": int(sum(o.preemptions > 0 for o in os_)),
            "lost_gpu_h": float(sum(o.lost_gpu_h for o in os_)),
            "slo_attainment": sum(o.slo_met for o in os_) / len(os_),
            "cost_usd": float(sum(o.cost_usd for o in os_)),
        }
    return out


def summarise(runs: dict[str, PolicyRun], meta: Optional[dict] = None) -> dict:
    """summary.json: per-policy metrics over the common horizon, ratios to the optimum and the
    paper's reference ratios (RollMux §7.4: Solo-D 1.84x and colocated 1.38x RollMux's cost)."""
    horizon = max((r.end_s for r in runs.values()), default=0.0)
    pol = {name: r.metrics(horizon) for name, r in runs.items()}
    if "optimal" in pol and pol["optimal"]["avg_cost_usd_per_h"] > 0:
        o = pol["optimal"]["avg_cost_usd_per_h"]
        for m in pol.values():
            m["cost_vs_optimal"] = m["avg_cost_usd_per_h"] / o
    ratios = {}
    if "rollmux" in pol and pol["rollmux"]["avg_cost_usd_per_h"] > 0:
        rm = pol["rollmux"]["avg_cost_usd_per_h"]
        for other, paper_key in (("solo-d", "solo-d_over_rollmux"), ("colocated", "colocated_over_rollmux")):
            if other in pol:
                ratios[paper_key] = {"measured": pol[other]["avg_cost_usd_per_h"] / rm, "paper": PAPER_RATIOS[paper_key]}
        if "solo-d" in pol:  # RollMux §7.4: bubbles -24.4% (rollout) and -43.1% (training) vs Solo-D
            for pool, paper in (("rollout", 0.244), ("train", 0.431)):
                sd = pol["solo-d"][f"{pool}_bubble_ratio"]
                if sd > 0:
                    ratios[f"{pool}_bubble_reduction_vs_solo-d"] = {
                        "measured": 1.0 - pol["rollmux"][f"{pool}_bubble_ratio"] / sd, "paper": paper}
    return {"meta": dict(meta or {}, horizon_h=horizon / 3600.0), "policies": pol, "rollmux_cost_ratios": ratios}
