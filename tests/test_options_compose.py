"""Options compose: every pair of the scheduler's options runs together in the replay, each one
doing its part (none silently dropped), with the SLO promises that hold for the pair.

The options (each turned on alone over a base of worst-case planning, whole-node groups, an
unbounded cluster, no re-packing, no re-optimisation): ``blended`` profiles, per-job allocations
(``per_job_allocations: simulator``), the admission queue (a bounded cluster of 6 + 6 nodes),
priority classes with preemption (the same bounded cluster), the SLO watch (``measured`` profiles,
``slo_watch_headroom``), departure re-packing and neighbourhood re-optimisation. 16 jobs of the
bundled extract with long-tailed (stochastic) phase times; 21 replays, about 40 s on a loaded
2-core host.
"""

from __future__ import annotations

import itertools

import pytest

from rollmux.admission import SchedulerConfig
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.models import ClusterSpec
from rollmux.sim.simulator import simulate
from rollmux.traces import EXTRACT_TRACE, TraceWindow, load_trace
from rollmux.workloads import assign_priorities, draw_jobs

OPTIONS = ("blended", "per_job", "queue", "priorities", "watch", "repack", "reopt")
SIM = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
_b = SIM.model_dump(mode="json")
_b["name"] = "tiny-bounded"
_b["rollout_pool"]["num_nodes"] = _b["train_pool"]["num_nodes"] = 6
BOUNDED = ClusterSpec.model_validate(_b)


def _config(on: set) -> SchedulerConfig:
    kw = dict(profile_source="worst_case", per_job_allocations="off", repack_on_departure=False, reopt_max_jobs=0)
    if "blended" in on:
        kw["profile_source"] = "blended"
    if "watch" in on:
        kw["profile_source"] = "blended" if "blended" in on else "measured"
        kw["slo_watch_headroom"] = 0.02
    if "per_job" in on:
        kw["per_job_allocations"] = "simulator"
    if "repack" in on or "reopt" in on:
        kw["repack_on_departure"] = True
    if "reopt" in on:
        kw["reopt_max_jobs"] = 6
    return SchedulerConfig(**kw)


@pytest.fixture(scope="module")
def trace():
    return load_trace(EXTRACT_TRACE, TraceWindow(max_jobs=16, min_duration_s=3600, max_duration_s=86400))


@pytest.mark.parametrize("pair", list(itertools.combinations(OPTIONS, 2)), ids="+".join)
def test_each_pair_of_options_works_together(trace, pair):
    on = set(pair)
    bounded = bool({"queue", "priorities"} & on)
    cluster = BOUNDED if bounded else SIM
    jobs = draw_jobs(trace, cluster, mix="mixed", seed=1)
    if "priorities" in on:
        jobs = assign_priorities(jobs, {"production": 0.3, "research": 0.4, "best-effort": 0.3}, seed=1,
                                 tenants_from_trace=trace)
    res = simulate(jobs, cluster, ["rollmux"], stochastic=True, seed=1, shadow_policies=(), config=_config(on),
                   queue=bounded, priorities="priorities" in on)
    m = res.summary["policies"]["rollmux"]
    assert m["jobs"] == len(jobs) == 16  # every job ran to its end
    # each option did its part
    if "per_job" in on:
        assert m["jobs_on_own_allocations"] > 0
    if "queue" in on:
        assert m["queued_jobs"] > 0 and m["queue_refused_jobs"] == 0
    if "priorities" in on:
        assert m["preemptions"] > 0 and set(m["by_class"]) == {"production", "research", "best-effort"}
    if {"blended", "watch"} & on:
        assert m["profile_source"] == ("blended" if "blended" in on else "measured")
        assert sum(m["slo_actions"].values()) > 0
    else:
        assert "slo_actions" not in m
    if "repack" in on or "reopt" in on:
        assert m["repack_on_departure"] is True and m["jobs_moved"] >= 0
    if "reopt" in on:
        assert m["reopt_latency_ms_p50"] > 0.05  # the exact re-partitioning ran (off: a table lookup)
    # the promises that hold for the pair: worst-case admission's bound always (a preempted job's
    # wait to be resumed counts against it, so not with priorities); on an unbounded cluster the SLO
    # watch keeps every SLO against the realised solo time
    if "priorities" not in on:
        assert m["slo_attainment_vs_planned_solo"] == 1.0
    if {"blended", "watch"} & on and not bounded:
        assert m["slo_attainment"] == 1.0
