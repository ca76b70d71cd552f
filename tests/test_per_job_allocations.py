"""Per-job allocations (``per_job_allocations: simulator``): a job alone in its group runs on its
own scaled or colocated allocation when that is cheaper per iteration, so on a sparse trace (few
jobs active at once) RollMux is no dearer than Gavel+, every SLO kept, and the optimum and the
lower bound cover the wider problem (every instant still compared). The trace is
``tests/data/philly_sparse_1gpu.csv`` (``scripts/make_sparse_trace.py``: every 40th one-GPU job
of the repository's full Philly trace, the first 60)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rollmux.admission import SchedulerConfig, load_scheduler_config
from rollmux.baselines import cheaper_alone, gavel_choice
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.partition_bound import BoundBudget
from rollmux.sim.simulator import simulate
from rollmux.traces import TraceWindow, load_trace
from rollmux.workloads import draw_jobs

SPARSE = Path(__file__).parent / "data" / "philly_sparse_1gpu.csv"


@pytest.fixture(scope="module")
def sparse():
    cluster = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    tj = load_trace(SPARSE, TraceWindow(max_jobs=60, min_duration_s=3600.0, max_duration_s=3 * 86400.0))
    return cluster, draw_jobs(tj, cluster, mix="mixed", seed=0)


def test_a_job_alone_takes_its_own_allocation_only_when_cheaper_per_iteration(sparse):
    cluster, jobs = sparse
    j = jobs[0]
    g = gavel_choice(j.spec, cluster)
    solo_usd_per_h = (j.spec.nodes_needed("rollout", cluster.rollout_pool.node) * cluster.rollout_pool.node.price_usd_per_h
                      + j.spec.nodes_needed("train", cluster.train_pool.node) * cluster.train_pool.node.price_usd_per_h)
    alt = cheaper_alone(j.spec, j.profile, solo_usd_per_h, cluster)
    assert alt == g and alt.meets_slo
    assert alt.usd_per_iteration < solo_usd_per_h * j.profile.t_solo_s / 3600.0
    # a group this cheap per iteration keeps the job
    assert cheaper_alone(j.spec, j.profile, 0.9 * g.usd_per_iteration * 3600.0 / j.profile.t_solo_s, cluster) is None


def test_sparse_trace_rollmux_no_dearer_than_gavel_plus(sparse):
    cluster, jobs = sparse
    budget = BoundBudget(time_limit_s=math.inf, cut_rounds=2)
    res = simulate(jobs, cluster, ("rollmux", "gavel+"), seed=0, shadow_policies=("rollmux",), lower_bound=True,
                   config=SchedulerConfig(per_job_allocations="simulator"), bound_budget=budget)
    assert res.summary["meta"]["bound_budget"] == budget.to_json()
    on = res.summary["policies"]
    off = simulate(jobs, cluster, ("rollmux",), seed=0, shadow_policies=(),
                   config=SchedulerConfig(per_job_allocations="off")).summary["policies"]
    rm, gv = on["rollmux"], on["gavel+"]
    assert rm["slo_attainment"] == 1.0 and gv["slo_attainment"] == 1.0
    assert rm["jobs_on_own_allocations"] > 0
    assert rm["total_cost_usd"] <= gv["total_cost_usd"]
    assert off["rollmux"]["total_cost_usd"] > gv["total_cost_usd"]  # whole-node groups alone lose here
    # the wider problem is bounded at every instant, below RollMux's cost
    assert rm["lower_bound_time_fraction"] == pytest.approx(1.0)
    assert 1.0 <= rm["cost_vs_lower_bound"] <= rm["cost_vs_optimal_exact"] + 1e-9


def test_the_default_is_off_and_the_runtime_refuses_the_replay_only_setting(tmp_path):
    """The shipped default runs co-execution groups on whole nodes, what the runtime carries out;
    ``simulator`` (own allocations: sub-node, rescaled or colocated) is the replay's alone, so the
    GlobalScheduler refuses it at start-up, naming the key. ``off`` written unquoted, as YAML reads
    it (False), is ``off``."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV
    from factories import unit_kw
    from rollmux.config import ConfigError

    assert load_scheduler_config().per_job_allocations == "off" and SchedulerConfig().per_job_allocations == "off"
    assert load_scheduler_config().runtime_refusals() == []
    with pytest.raises(ValueError):
        SchedulerConfig(per_job_allocations="runtime")
    cfg = SchedulerConfig(per_job_allocations="simulator")
    assert "per_job_allocations" in cfg.runtime_refusals()[0]
    with pytest.raises(ConfigError, match="per_job_allocations"):
        GlobalSchedulerImpl(load_cluster(CONFIG_DIR / "cluster_sim.yaml"), kv=MemoryKV(), config=cfg, **unit_kw())
    src = (CONFIG_DIR / "scheduler.yaml").read_text().replace('per_job_allocations: "off"', "per_job_allocations: off")
    src = src.replace("saturation: slo", "saturation: off")
    (tmp_path / "s.yaml").write_text(src)
    got = load_scheduler_config(tmp_path / "s.yaml")
    assert got.per_job_allocations == "off" and got.saturation == "off"
