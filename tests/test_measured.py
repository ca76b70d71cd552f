"""Measured profiles (rollmux.measured) and the SLO watch (rollmux.admission.slo_watch): pure units."""

from __future__ import annotations

import pydantic
import pytest

from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.admission.slo_watch import at_risk, predict_slowdowns, watch
from rollmux.measured import MeasuredPhases, kind_of, planning_profile, ratio_prior, ratios_of
from rollmux.models import ClusterSpec, GPUType, JobSpec, NodeSpec, PhaseProfile, PoolSpec

WORST = PhaseProfile(t_roll_s=10.0, t_train_s=4.0, t_sync_s=1.0)


def _window(rolls, train=2.0, sync=0.5, window=16) -> MeasuredPhases:
    m = MeasuredPhases(window=window)
    for r in rolls:
        m = m.add(r, train, sync)
    return m


def test_the_window_slides_and_counts_every_report():
    m = _window([1, 2, 3, 4, 5], window=3)
    assert [s.t_roll_s for s in m.samples] == [3, 4, 5] and m.reports == 5 and m.n == 3


def test_the_high_quantile_is_an_order_statistic_never_a_single_outlier():
    m = _window([4.0] * 7 + [1000.0])  # one corrupt report among 8
    assert m.high(0.9).t_roll_s == 4.0 and m.high(1.0).t_roll_s == 4.0
    two = m.add(1000.0, 2.0, 0.5)  # a second one in the window does move it
    assert two.high(0.9).t_roll_s == 1000.0
    assert _window([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).high(0.5).t_roll_s == 5.0


def test_mean_floors_and_rollout_distribution():
    m = _window([1.0, 3.0], train=1e-6, sync=0.0)
    p = m.mean()
    assert p.t_roll_s == 2.0 and p.t_train_s == 1e-3 and p.t_sync_s == 0.0  # floored at 1 ms, sync 0 stays 0
    d = m.rollout_distribution()
    assert d["n"] == 2 and d["mean_s"] == 2.0 and d["max_s"] == 3.0 and d["p50_s"] == 2.0
    assert MeasuredPhases().rollout_distribution() == {"n": 0}
    with pytest.raises(ValueError, match="no measured"):
        MeasuredPhases().high()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 1e9])
def test_a_report_outside_the_bounds_is_refused(bad):
    with pytest.raises(pydantic.ValidationError):
        MeasuredPhases().add(bad, 1.0)


def test_the_window_round_trips_through_json():
    m = _window([1.0, 2.0]).add(3.0, 1.0, 0.0, t_trigger_s=2.0)
    assert MeasuredPhases.model_validate_json(m.model_dump_json()) == m
    assert m.iterations()[-1].t_trigger_s == 2.0


def test_planning_profile_per_source():
    m = _window([2.0, 2.0, 2.0, 2.0])
    assert planning_profile("worst_case", WORST, m) == WORST
    meas = planning_profile("measured", WORST, m, margin=0.5)
    assert (meas.t_roll_s, meas.t_train_s, meas.t_sync_s) == (1.0, 1.0, 0.25)
    # before min_iterations: the prior of its kind, else the worst case
    prior = PhaseProfile(t_roll_s=5.0, t_train_s=2.0)
    assert planning_profile("measured", WORST, _window([2.0]), min_iterations=3, prior=prior) == prior
    assert planning_profile("measured", WORST, None) == WORST
    b = planning_profile("blended", WORST, m, prior_iterations=4)  # w = 4 / 8
    assert b.t_roll_s == pytest.approx(0.5 * 2.0 + 0.5 * 10.0) and b.t_train_s == pytest.approx(3.0)
    with pytest.raises(ValueError, match="profile_source"):
        planning_profile("optimistic", WORST, m)


def test_the_prior_of_a_kind_is_a_robust_quantile_of_ratios():
    r = [ratios_of(WORST, PhaseProfile(t_roll_s=x, t_train_s=4.0, t_sync_s=1.0)) for x in (4.0, 4.0, 5.0, 100.0)]
    p = ratio_prior(WORST, r, q=1.0)
    assert p.t_roll_s == pytest.approx(5.0) and p.t_train_s == pytest.approx(4.0)  # the outlier 100 never decides
    assert ratio_prior(WORST, []) is None
    a = JobSpec(job_id="a", model_params_b=7.0, num_prompts=64)
    assert kind_of(a) == kind_of(a.model_copy(update={"num_prompts": 128, "job_id": "b"}))
    assert kind_of(a) != kind_of(a.model_copy(update={"model_params_b": 14.0}))


def test_the_floors_hold_at_the_boundary():
    with pytest.raises(pydantic.ValidationError, match="model_params_b"):
        JobSpec(job_id="a", model_params_b=5e-324)
    with pytest.raises(pydantic.ValidationError, match=r"measured.t_roll_s[\s\S]*0.001"):
        JobSpec(job_id="a", model_params_b=1.0, measured={"t_roll_s": 5e-324, "t_train_s": 1.0})
    with pytest.raises(pydantic.ValidationError, match="no sync"):
        JobSpec(job_id="a", model_params_b=1.0, measured={"t_roll_s": 1.0, "t_train_s": 1.0, "t_sync_s": 1e-9})
    j = JobSpec(job_id="a", model_params_b=1e-6, measured=PhaseProfile(t_roll_s=1e-3, t_train_s=1.0))
    assert type(j.measured) is PhaseProfile and j.measured == PhaseProfile(t_roll_s=1e-3, t_train_s=1.0)


# --------------------------------------------------------------------------- the SLO watch
def _cluster(nodes=None) -> ClusterSpec:
    node = NodeSpec(gpu=GPUType(name="T", price_usd_per_h=1.0, bf16_tflops=100.0, hbm_gb=80.0, hbm_tb_per_s=2.0),
                    gpus_per_node=1, host_mem_gb=64.0)
    return ClusterSpec(rollout_pool=PoolSpec(node=node, num_nodes=nodes), train_pool=PoolSpec(node=node, num_nodes=nodes))


def _job(jid: str, slo: float, t: float = 5.0) -> JobSpec:
    return JobSpec(job_id=jid, model_params_b=0.001, num_rollout_gpus=1, num_train_gpus=1, slo=slo, mem_roll_gb=0.5,
                   mem_train_gb=0.5, measured=PhaseProfile(t_roll_s=t, t_train_s=t))


def _setup(nodes=None):
    s = InterGroupScheduler(_cluster(nodes), config=SchedulerConfig(repack_on_departure=False))
    for j in (_job("a", 1.5), _job("b", 1.5)):
        assert s.admit(j).admitted
    assert s.group_of("a").group_id == s.group_of("b").group_id  # worst case: 5+5 each interleave, slowdown 1
    measured = {"a": _window([1.0] * 4, train=1.0, sync=0.0).iterations(),  # a runs far below its declared profile
                "b": _window([5.0] * 4, train=5.0, sync=0.0).iterations()}
    return s, measured


def test_predicted_slowdown_is_against_the_realised_solo_time():
    s, measured = _setup()
    g = s.group_of("a")
    pred = predict_slowdowns(g, measured)
    assert pred["a"] > 4.0 and pred["b"] == pytest.approx(1.0, abs=0.05)  # a waits for b's 5 s phases; alone it takes 2 s
    assert at_risk(g, pred)[0][1] == "a" and not at_risk(g, predict_slowdowns(g, {}))  # worst case: no risk


def test_watch_moves_the_job_at_risk_to_the_cheapest_group_where_everyone_keeps_its_slo():
    s, measured = _setup()
    assert s.admit(_job("c", 1.0, t=1.0)).admitted and s.group_of("c").group_id != s.group_of("a").group_id
    measured["c"] = _window([1.0] * 4, train=1.0, sync=0.0).iterations()
    for j in "abc":  # the caller plans every job on its measured profile first
        s.update_profile(j, _window([it.t_roll_s for it in measured[j]], train=measured[j][0].t_train_s, sync=0.0).mean())
    gid = s.group_of("a").group_id
    before = s.cost_usd_per_h()
    act = watch(s, gid, lambda g: predict_slowdowns(g, measured))
    assert act is not None and act.action == "move" and act.mover == "a" and act.job_id == "a"
    assert s.group_of("a").group_id == s.group_of("c").group_id == act.to_group and s.cost_usd_per_h() == before
    assert "predicted slowdown" in act.reason and act.moves[0]["move_s"] > 0
    for g in s.groups:  # afterwards every member keeps its SLO on measured times
        assert not at_risk(g, predict_slowdowns(g, measured))
    assert watch(s, s.group_of("a").group_id, lambda g: predict_slowdowns(g, measured)) is None


def test_watch_isolates_when_no_group_fits_and_says_slo_at_risk_when_nothing_can_be_done():
    s, measured = _setup()
    act = watch(s, s.group_of("a").group_id, lambda g: predict_slowdowns(g, measured))
    assert act.action == "isolate" and act.mover == "a" and act.cost_usd_per_h_after == act.cost_usd_per_h_before + 2.0
    assert s.group_of("a").group_id != s.group_of("b").group_id
    full, measured = _setup(nodes=1)  # a bounded cluster: no room for a new group
    snap = full.snapshot()
    act = watch(full, full.group_of("a").group_id, lambda g: predict_slowdowns(g, measured))
    assert act.action == "slo_at_risk" and "SLO at risk" in act.reason and act.mover is None
    assert full.snapshot() == snap  # nothing changed


def test_update_profile_replaces_the_planning_profile_only():
    s, _ = _setup()
    p = PhaseProfile(t_roll_s=1.0, t_train_s=1.0)
    assert s.update_profile("a", p) and s.member("a").profile == p and not s.update_profile("a", p)
    assert s.group_of("a").job_ids == ("a", "b")


# --------------------------------------------------------------------------- the simulator runs the same loop
def test_the_default_keeps_the_slo_users_read_under_long_tailed_phase_times():
    """40 jobs of the bundled extract with long-tailed phase times (seed 3), replayed as a user
    would (every setting the default): each job's slowdown against its *realised* solo time. Worst-case
    admission (``profile_source: worst_case``) leaves 17 jobs over their SLO, up to 1.54x: a member
    whose realised phases are far below its worst case still runs at its partners' cadence. The
    default (measured profiles, the SLO watch acting after each job's first iteration) leaves none
    over, for less (8.72 against 8.88 k$; on the previous plan budget 8.95 against 8.91 with 19 over,
    up to 1.43x; before the global plan 8.61 against 8.75: the plan packs worst-case admission
    tighter, at the price of more SLOs missed, and costs the default 0.7% here, 8.72 against 8.66 k$
    with ``plan_max_jobs: 0``)."""
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.sim.simulator import Realisation, make_policy, replay
    from rollmux.traces import EXTRACT_TRACE, TraceWindow, load_trace
    from rollmux.workloads import draw_jobs

    sim = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    jobs = draw_jobs(load_trace(EXTRACT_TRACE, TraceWindow(max_jobs=40, min_duration_s=3600, max_duration_s=3 * 86400)),
                     sim, mix="mixed", seed=3)
    slo = {j.spec.job_id: j.spec.slo for j in jobs}
    got = {}
    for name, cfg in (("default", SchedulerConfig()), ("worst_case", SchedulerConfig(profile_source="worst_case"))):
        real = Realisation(sim, stochastic=True, seed=3)
        pol = make_policy("rollmux", sim, real, repack=True, config=cfg)
        run = replay(jobs, pol, real)
        got[name] = (sorted(o.slowdown / slo[k] for k, o in run.outcomes.items() if o.slowdown > slo[k] + 1e-9),
                     run.metrics()["total_cost_usd"], pol.extra())
    (over, cost, extra), (wc_over, wc_cost, wc_extra) = got["default"], got["worst_case"]
    assert len(wc_over) == 17 and 1.5 < wc_over[-1] < 1.6 and "slo_actions" not in wc_extra
    assert over == [], over
    assert cost < 1.01 * wc_cost and extra["profile_source"] == "measured"
    assert sum(extra["slo_actions"].values()) > 0 and set(extra["slo_actions"]) <= {
        "move", "move_neighbour", "scale_out", "isolate", "slo_at_risk"}


def test_a_reported_iteration_is_taken_in_the_simulators_terms():
    """rollmux.measured.reported_sample: the tail load over the job's decode slots (as
    profiler.iteration_times), and a migrated rollout's solo length with its stretched tail taken
    out (the policy's tail_stretch); no trigger, no tail fields."""
    from rollmux import profiler
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.intra_group import LongTailPolicy
    from rollmux.measured import reported_sample

    cl = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    spec = JobSpec(job_id="r", model_params_b=7.0, num_rollout_gpus=8, num_train_gpus=8, slo=1.5)
    m = profiler.rollout_model(spec, cl.rollout_pool.node.gpu, 8, spec.max_response_tokens)
    slots = m.replicas * m.concurrency
    lt = LongTailPolicy(0.8, 1, 2.0)
    plain = reported_sample(spec, cl, lt, t_roll_s=100.0, t_train_s=50.0)
    assert plain == {"t_roll_s": 100.0, "t_train_s": 50.0, "t_sync_s": 0.0}
    tail = slots  # a full GPU's share x 8 GPUs on 1 tail GPU: the rest ran 8x stretched
    got = reported_sample(spec, cl, lt, t_roll_s=60.0 + 2.0 + 8 * 5.0, t_train_s=50.0, t_trigger_s=60.0,
                          tail_responses=tail, tail_migrated=True)
    assert got["tail_load"] == pytest.approx(1.0) and got["t_trigger_s"] == 60.0
    assert got["t_roll_s"] == pytest.approx(65.0)  # 60 s to the trigger + the 5 s its tail takes alone
    kept = reported_sample(spec, cl, lt, t_roll_s=70.0, t_train_s=50.0, t_trigger_s=60.0, tail_responses=tail,
                           tail_migrated=False)
    assert kept["t_roll_s"] == 70.0 and kept["tail_load"] == pytest.approx(1.0)
    it = MeasuredPhases().add(**got).iterations()[0]
    assert (it.t_trigger_s, it.tail_load) == (60.0, pytest.approx(1.0))


def test_a_planning_profile_is_replaced_only_when_a_phase_moves_by_5pct_of_the_iteration():
    from rollmux.measured import differs

    a = PhaseProfile(t_roll_s=400.0, t_train_s=180.0, t_sync_s=10.0)
    assert not differs(a, PhaseProfile(t_roll_s=396.0, t_train_s=178.2, t_sync_s=13.0))  # sync +30%: 0.5% of 590 s
    assert differs(a, PhaseProfile(t_roll_s=360.0, t_train_s=180.0, t_sync_s=10.0))  # rollout -40 s: 6.8% of it
    assert not differs(a, a)
