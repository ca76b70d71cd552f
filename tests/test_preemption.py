"""Priority classes, tenant quotas and preemption (rollmux.preemption): who may preempt whom, which
set is chosen, quota refusals, the priority-ordered admission queue, and the simulator's replay of
both. Pure: no Ray."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.admission_queue import AdmissionQueue
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.models import JobSpec, PhaseProfile
from rollmux.preemption import (
    PriorityBook, Running, choose_victims, fits_after, lost_gpu_h, may_preempt, quota_verdict, rank_of,
)
from rollmux.profiler import move_time_s
from rollmux.sim.simulator import simulate
from rollmux.workloads import SimJob, assign_priorities, parse_class_shares

LOCAL = load_cluster(CONFIG_DIR / "cluster_local.yaml")  # 2 rollout + 2 training nodes of 1 GPU


def spec(jid: str, cls: str | None = None, tenant: str | None = None, gpus: int = 1, preemptible: bool = True,
         t: float = 5.0, mem_gb: float = 0.5) -> JobSpec:
    return JobSpec(job_id=jid, model_params_b=0.001, num_rollout_gpus=gpus, num_train_gpus=gpus, slo=1.0,
                   mem_roll_gb=mem_gb, mem_train_gb=mem_gb, measured=PhaseProfile(t_roll_s=t, t_train_s=t, t_sync_s=0.0),
                   priority_class=cls, tenant=tenant, preemptible=preemptible)


def run(jid: str, rank: int, *, tenant: str = "default", lost: float = 1.0, started: float = 0.0,
        borrowed: bool = False, preemptible: bool = True) -> Running:
    return Running(job_id=jid, rank=rank, tenant=tenant, preemptible=preemptible, rollout_gpus=1, train_gpus=1,
                   borrowed=borrowed, started_s=started, lost_gpu_h=lost)


def test_job_spec_fields_and_config_validation():
    s = spec("a", "production", "team-a", preemptible=False)
    assert (s.priority_class, s.tenant, s.preemptible) == ("production", "team-a", False)
    assert spec("b").preemptible is True and spec("b").priority_class is None
    with pytest.raises(ValidationError, match="priority_class"):
        JobSpec(job_id="x", model_params_b=1.0, priority_class="no spaces")
    with pytest.raises(ValidationError, match="preemptible"):
        JobSpec(job_id="x", model_params_b=1.0, preemptible="yes")
    cfg = SchedulerConfig()
    assert cfg.priority_classes == ("production", "research", "best-effort") and cfg.default_priority_class == "research"
    assert [rank_of(cfg, spec("p", c)) for c in ("production", None, "best-effort", "unknown")] == [0, 1, 2, 3]
    with pytest.raises(ValidationError, match="default_priority_class"):
        SchedulerConfig(default_priority_class="gold")
    with pytest.raises(ValidationError, match="repeat"):
        SchedulerConfig(priority_classes=("a", "a"))


def test_victims_fewest_lost_gpu_hours_then_newest_and_only_what_is_needed():
    # each candidate frees one unit; the newcomer needs two units
    need = 2
    fits = lambda ids: len(ids) >= need  # noqa: E731
    cands = [run("old-cheap", 2, lost=1.0, started=0.0), run("new-cheap", 2, lost=1.0, started=50.0),
             run("dear", 2, lost=5.0, started=99.0), run("mid", 2, lost=2.0, started=10.0)]
    vs = choose_victims(cands, fits)
    assert [v.job_id for v in vs] == ["new-cheap", "old-cheap"]
    need = 1  # one is enough: the cheapest, and of the two equally cheap ones the newest
    assert [v.job_id for v in choose_victims(cands, fits)] == ["new-cheap"]
    need = 5
    assert choose_victims(cands, fits) is None
    # a set freeing enough at less lost work beats a single dearer job that alone would do
    big_fits = lambda ids: "dear" in ids or len(ids) >= 2  # noqa: E731
    assert sorted(v.job_id for v in choose_victims(cands, big_fits)) == ["new-cheap", "old-cheap"]
    # beyond the exact limit: greedy in the same order, then pruned to what is needed
    many = [run(f"j{i:02d}", 2, lost=float(i), started=float(i)) for i in range(20)]
    assert [v.job_id for v in choose_victims(many, lambda ids: len(ids) >= 3)] == ["j00", "j01", "j02"]


def test_borrowed_capacity_is_preempted_first():
    cfg = SchedulerConfig(tenants={"a": {"rollout_gpus": 2, "train_gpus": 2}, "b": {"rollout_gpus": 2, "train_gpus": 2,
                                                                                  "may_borrow": True}})
    cands = [run("b-own", 2, tenant="b", lost=0.1, started=9.0), run("b-borrowed", 2, tenant="b", lost=3.0, borrowed=True)]
    vs = choose_victims(cands, lambda ids: len(ids) >= 1)
    assert [v.job_id for v in vs] == ["b-borrowed"]  # though it loses more work
    # who may be preempted: a newcomer of tenant a within its quota reclaims b's borrowed job of any class,
    # but never b's job within b's quota, not even of a lower class
    assert may_preempt(cfg, 1, "a", True, run("x", 0, tenant="b", borrowed=True))
    assert not may_preempt(cfg, 0, "a", True, run("x", 2, tenant="b"))
    assert not may_preempt(cfg, 1, "a", False, run("x", 0, tenant="b", borrowed=True))  # a borrows itself
    assert may_preempt(cfg, 0, "a", False, run("x", 2, tenant="a"))  # its own lower class
    assert not may_preempt(cfg, 2, "a", True, run("x", 2, tenant="a"))  # same class: never
    assert not may_preempt(cfg, 0, "a", True, run("x", 2, tenant="a", preemptible=False))
    assert may_preempt(cfg, 0, "c", False, run("x", 1, tenant="d"))  # tenants without a quota: by class only


def test_quota_refusals_name_the_tenant_and_the_quota():
    cfg = SchedulerConfig(tenants={"team-a": {"rollout_gpus": 2, "train_gpus": 1}, "team-b": {"rollout_gpus": 1,
                                                                                            "train_gpus": 1, "may_borrow": True}})
    running = [run("a1", 1, tenant="team-a")]
    v = quota_verdict(cfg, spec("a2", tenant="team-a"), running)
    assert not v.ok and not v.never and "'team-a'" in v.reason and "train_gpus" in v.reason and "quota of 1" in v.reason
    v = quota_verdict(cfg, spec("a3", tenant="team-a", gpus=3), [])
    assert not v.ok and v.never and "'team-a'" in v.reason and "whole quota" in v.reason
    assert quota_verdict(cfg, spec("a4", tenant="team-a"), []).ok
    v = quota_verdict(cfg, spec("b2", tenant="team-b"), [run("b1", 1, tenant="team-b")])
    assert v.ok and v.borrowing and not v.within and "'team-b'" in v.reason
    assert quota_verdict(cfg, spec("z", tenant="unlisted", gpus=2), running).ok  # no quota
    book = PriorityBook(cfg, LOCAL)
    assert "priority_class" in book.check(spec("q", "gold")).reason


def test_plan_preempts_the_lower_class_on_a_full_cluster_and_fits_after():
    cfg = SchedulerConfig(max_group_size=1)
    s = InterGroupScheduler(LOCAL, config=cfg)
    book = PriorityBook(cfg, LOCAL)
    for i, (jid, c) in enumerate((("low", "best-effort"), ("mid", "research"))):
        assert s.admit(spec(jid, c)).admitted
        book.admitted(spec(jid, c), now_s=float(i))
    hi = spec("hi", "production")
    assert s.decide(hi).code == "retry_later" and not fits_after(s, hi, []) and fits_after(s, hi, ["mid"])
    plan = book.plan(hi, s)
    assert plan.victim_ids == ["low"]  # equal lost work: the lowest class goes
    assert plan.lost_gpu_h == pytest.approx(lost_gpu_h(spec("low"), LOCAL)) and plan.lost_gpu_h > 0
    assert book.plan(spec("same", "best-effort"), s) is None  # no lower class to preempt
    assert book.plan(hi, s, exclude=["low", "mid"]) is None
    s2 = InterGroupScheduler(LOCAL, config=cfg)
    b2 = PriorityBook(cfg, LOCAL)
    for jid in ("p1", "p2"):
        s2.admit(spec(jid, "research", preemptible=False))
        b2.admitted(spec(jid, "research", preemptible=False), 0.0)
    assert b2.plan(hi, s2) is None  # non-preemptible jobs stay
    assert SchedulerConfig(preemption=False).preemption is False
    off = PriorityBook(SchedulerConfig(max_group_size=1, preemption=False), LOCAL)
    off.running = dict(book.running)
    assert off.plan(hi, s) is None


def test_queue_holds_higher_classes_first_and_they_are_not_blocked_by_lower_ones():
    cfg = SchedulerConfig()
    q = AdmissionQueue.from_config(cfg)
    q.push(spec("be1", "best-effort", gpus=2), 0.0)
    q.push(spec("r1", "research"), 1.0)
    q.push(spec("be2", "best-effort"), 2.0)
    assert q.push(spec("p1", "production"), 3.0) == 1
    assert list(q.positions()) == ["p1", "r1", "be1", "be2"]
    assert not q.may_try_now(spec("r2", "research", gpus=2))  # larger than r1 ahead in its class
    assert q.may_try_now(spec("p2", "production", gpus=1))  # no larger production job ahead
    snap = q.snapshot()
    q2 = AdmissionQueue.from_config(cfg)
    q2.restore(snap)
    assert list(q2.positions()) == ["p1", "r1", "be1", "be2"] and q2.get("p1").rank == 0


def sim(jid: str, at: float, dur: float, cls: str, tenant: str | None = None, t: float = 5.0) -> SimJob:
    return SimJob(spec=spec(jid, cls, tenant, t=t), job_type="t", category="balanced", arrival_s=at, duration_s=dur)


def test_replay_preempts_at_the_iteration_boundary_and_resumes():
    """Two best-effort jobs fill the local cluster (max group size 1); a production job arrives at
    t=12 s, inside an iteration of 10 s: the newest best-effort job stops at its boundary t=20 s,
    the production job runs 100 s, then the victim resumes with the 80 s of work it had left."""
    jobs = [sim("be-a", 0, 200, "best-effort"), sim("be-b", 0.5, 200, "best-effort"), sim("prod", 12, 100, "production")]
    res = simulate(jobs, LOCAL, ["rollmux"], queue=True, priorities=True, max_group_size=1)
    m = res.summary["policies"]["rollmux"]
    out = res.runs["rollmux"].outcomes
    assert out["prod"].start_s == pytest.approx(20.5) and out["prod"].departure_s == pytest.approx(120.5)
    assert out["be-b"].preemptions == 1 and out["be-a"].preemptions == 0 and out["prod"].preemptions == 0
    restore = (0.5 + 0.5) * 8 / LOCAL.intra_cluster_gbps  # both pools' host state (0.5 GB each), re-loaded
    assert restore == pytest.approx(move_time_s(jobs[1].spec, LOCAL)) and restore > 0
    # be-b ran 20 s (2 iterations) before, resumes at 120.5 s with 180 s left, plus the state re-load
    assert out["be-b"].departure_s == pytest.approx(120.5 + 180 + restore, rel=1e-9)
    assert out["be-a"].departure_s == pytest.approx(200.0)
    by = m["by_class"]
    assert list(by) == ["production", "best-effort"] and by["best-effort"]["preemptions"] == 1
    assert by["best-effort"]["lost_gpu_h"] == pytest.approx(lost_gpu_h(jobs[1].spec, LOCAL))
    assert by["production"]["slo_attainment"] == 1.0 and by["production"]["queue_wait_s_p50"] == pytest.approx(8.5)
    assert by["best-effort"]["cost_usd"] > by["production"]["cost_usd"] > 0
    assert m["preemptions"] == 1


def test_replay_retries_preemption_for_a_queued_job_after_a_departure():
    """As the scheduler test of the same name: the production job (both pairs) queues while a
    non-preemptible research job runs; when that one departs (t=100 s) the best-effort job is
    preempted at its next boundary (t=100.5 s: it started at 0.5 s, iterations of 10 s) and the
    production job starts then."""
    jobs = [sim("be", 0.5, 400, "best-effort"), sim("r1", 0, 100, "research"), sim("big", 1, 100, "production")]
    jobs = [jobs[1], jobs[0], jobs[2]]
    jobs[0] = SimJob(spec=jobs[0].spec.model_copy(update={"preemptible": False}), job_type="t", category="balanced",
                     arrival_s=0, duration_s=100)
    jobs[2] = SimJob(spec=spec("big", "production", gpus=2), job_type="t", category="balanced", arrival_s=1,
                     duration_s=100)
    res = simulate(jobs, LOCAL, ["rollmux"], queue=True, priorities=True, max_group_size=1)
    out = res.runs["rollmux"].outcomes
    assert out["big"].start_s == pytest.approx(100.5) and out["be"].preemptions == 1
    assert out["be"].departure_s == pytest.approx(200.5 + 300 + move_time_s(jobs[1].spec, LOCAL), rel=1e-9)


def test_replay_quota_queues_a_tenant_beyond_its_quota():
    cfg = SchedulerConfig(max_group_size=1, tenants={"a": {"rollout_gpus": 1, "train_gpus": 1}})
    jobs = [sim("a1", 0, 100, "research", "a"), sim("a2", 1, 100, "research", "a"), sim("b1", 2, 100, "research", "b")]
    res = simulate(jobs, LOCAL, ["rollmux", "solo-d"], queue=True, priorities=True, config=cfg)
    for name in ("rollmux", "solo-d"):
        out = res.runs[name].outcomes
        assert out["a2"].start_s == pytest.approx(100.0)  # waits for a1 though a node pair is free
        assert out["b1"].start_s == pytest.approx(2.0)


def test_class_shares_parse_and_draws():
    assert parse_class_shares("production=0.2,research=0.5,best-effort=0.3", ("production", "research", "best-effort")) \
        == {"production": 0.2, "research": 0.5, "best-effort": 0.3}
    for bad, msg in (("gold=1", "not a priority class"), ("production=0.5", "sum to 1"), ("production", "class=share"),
                     ("production=x", "number")):
        with pytest.raises(ValueError, match=msg):
            parse_class_shares(bad, ("production", "research"))
    jobs = [sim(f"j{i}", i, 10, "research") for i in range(400)]
    got = assign_priorities(jobs, {"production": 0.25, "best-effort": 0.75}, seed=1)
    n = sum(j.spec.priority_class == "production" for j in got)
    assert 70 <= n <= 130 and got == assign_priorities(jobs, {"production": 0.25, "best-effort": 0.75}, seed=1)


def test_room_inside_a_shared_group_is_found_on_a_copy_of_the_table():
    """Groups of two share each node pair: removing a best-effort job frees no node (its research
    group-mate stays), but the production job then packs into its place; the plan is found by the
    admission decision on a copy (the table itself is unchanged)."""
    cfg = SchedulerConfig(max_group_size=2)
    s = InterGroupScheduler(LOCAL, config=cfg)
    book = PriorityBook(cfg, LOCAL)
    loose = dict(t=1.0)
    for i, (jid, c, pre) in enumerate((("r1", "research", False), ("be1", "best-effort", True),
                                       ("r2", "research", False), ("be2", "best-effort", True))):
        sp = spec(jid, c, preemptible=pre, **loose).model_copy(update={"slo": 5.0})
        assert s.admit(sp).admitted
        book.admitted(sp, float(i))
    assert len(s.groups) == 2 and all(len(g.members) == 2 for g in s.groups)
    hi = spec("hi", "production", **loose).model_copy(update={"slo": 5.0})
    assert s.decide(hi).code == "retry_later" and not fits_after(s, hi, ["be1", "be2"])
    before = s.snapshot()
    plan = book.plan(hi, s)
    assert plan.victim_ids == ["be2"]  # one is enough: the newest of the equally cheap ones
    assert s.snapshot() == before
    s.depart("be2")
    assert s.admit(hi).admitted and s.group_of("hi").group_id == s.group_of("r2").group_id


def test_committed_priorities_replay_is_the_documented_run():
    """results/sim_priorities/summary.json (docs/RESULTS.md's per-class table) is the documented
    full-trace run, and holds what the docs claim of it: nothing outranks production, so it is
    never preempted; co-execution preempts every lower class less often than Solo-D."""
    import json

    from rollmux.config import REPO_ROOT

    s = json.loads((REPO_ROOT / "results" / "sim_priorities" / "summary.json").read_text())
    assert s["meta"]["priority_shares"] == "production=0.2,research=0.5,best-effort=0.3"
    assert s["meta"]["cluster"] == "sim-bounded-full" and s["meta"]["jobs"] == 18645  # the full trace
    classes = ("production", "research", "best-effort")
    for pol in ("rollmux", "solo-d"):
        by = s["policies"][pol]["by_class"]
        assert sum(by[c]["jobs"] for c in classes) == 18645
        assert by["production"]["preemptions"] == 0 and by["production"]["lost_gpu_h"] == 0
        for c in classes:
            assert 0 <= by[c]["queue_wait_s_p50"] <= by[c]["queue_wait_s_p99"]
            assert by[c]["preempted_jobs"] <= by[c]["preemptions"]
    for c in ("research", "best-effort"):
        assert s["policies"]["rollmux"]["by_class"][c]["preemptions"] < s["policies"]["solo-d"]["by_class"][c]["preemptions"]
