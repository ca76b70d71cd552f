"""RollmuxMetrics buffering and gauge refresh, without Ray (fake metric objects)."""

from __future__ import annotations

from actors.ops.metrics import RollmuxMetrics
from factories import unit_kw
from rollmux.messages import ProgressReport


class _Fake:
    def __init__(self):
        self.calls: list[tuple] = []

    def set(self, v, tags=None):
        self.calls.append(("set", v, tags))

    def inc(self, v=1.0, tags=None):
        self.calls.append(("inc", v, tags))

    def observe(self, v, tags=None):
        self.calls.append(("observe", v, tags))


def _metrics() -> tuple[RollmuxMetrics, dict]:
    m = RollmuxMetrics(flush_interval_s=0, enabled=True)
    fakes = {k: _Fake() for k in RollmuxMetrics.GAUGES + ("decisions", "latency", "switches", "moves")}
    m._m = fakes
    return m, fakes


def test_updates_apply_and_pool_seconds_accumulate():
    m, f = _metrics()
    m.pool_time("rollout", busy_s=2.0, bubble_s=1.0)
    m.pool_time("rollout", busy_s=3.0)
    m.admission("admitted", 1.5)
    assert m.totals["busy"]["rollout"] == 5.0 and m.totals["bubble"]["rollout"] == 1.0
    assert f["busy"].calls[-1] == ("set", 5.0, {"pool": "rollout"})
    assert f["decisions"].calls == [("inc", 1.0, {"outcome": "admitted"})]
    assert f["latency"].calls == [("observe", 1.5, None)]


def test_refresh_rerecords_every_gauge_at_its_last_value():
    m, f = _metrics()
    m.job("j1", slo=1.5, iterations=3)
    m.group_cost("g1", 2.0)
    m.phase_switch("warm", 0.01)
    for fake in f.values():
        fake.calls.clear()
    assert m.refresh() == 4  # slo, iters, cost, switch_s
    assert f["slo"].calls == [("set", 1.5, {"job_id": "j1"})]
    assert f["iters"].calls == [("set", 3.0, {"job_id": "j1"})]
    assert f["cost"].calls == [("set", 2.0, {"group_id": "g1"})]
    assert f["switch_s"].calls == [("set", 0.01, {"kind": "warm"})]
    assert f["switches"].calls == []  # counters are not re-incremented


def test_disabled_recorder_keeps_totals_only():
    m = RollmuxMetrics(flush_interval_s=0, enabled=False)
    m.group_cost("g", 1.0)
    assert m.totals["cost"]["g"] == 1.0 and m.refresh() == 0


def test_dissolved_group_reads_zero_then_stops_being_refreshed_and_moves_are_counted():
    m, f = _metrics()
    m.group_cost("g1", 2.0)
    m.group_cost("g2", 3.0)
    m.group_dissolved("g1")
    assert f["cost"].calls[-1] == ("set", 0.0, {"group_id": "g1"}) and m.totals["cost"] == {"g2": 3.0}
    f["cost"].calls.clear()
    assert m.refresh() == 1 and f["cost"].calls == [("set", 3.0, {"group_id": "g2"})]
    m.job_moves(0)
    m.job_moves(2)
    assert f["moves"].calls == [("inc", 2.0, None)] and m.totals["moves"] == 2


def test_per_job_series_are_dropped_when_the_job_ends_and_late_updates_are_ignored():
    m, f = _metrics()
    for i in range(50):
        m.job(f"j{i}", slo=1.5, iterations=0)
    for i in range(49):
        m.job(f"j{i}", iterations=3, slowdown=1.2)
        m.job_ended(f"j{i}")
    m.job("j0", iterations=4, slowdown=1.3)  # an iteration report crossing the end
    assert {k: sorted(m.totals[k]) for k in RollmuxMetrics.JOB_GAUGES} == {
        "slowdown": [], "slo": ["j49"], "iters": ["j49"]}
    for fake in f.values():
        fake.calls.clear()
    assert m.refresh() == 2  # only the active job's slo and iterations are re-recorded
    assert {c[2]["job_id"] for k in RollmuxMetrics.JOB_GAUGES for c in f[k].calls} == {"j49"}


def test_scheduler_keeps_series_of_active_jobs_only():
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV
    from rollmux.config import CONFIG_DIR, load_cluster

    g = GlobalSchedulerImpl(load_cluster(CONFIG_DIR / "cluster_paper.yaml"), kv=MemoryKV(), **unit_kw(),
                            metrics_flush_s=0)
    spec = {"model_params_b": 7, "measured": {"t_roll_s": 100.0, "t_train_s": 100.0, "t_sync_s": 1.0}}
    for i in range(30):
        assert g.admit({"job_id": f"j{i}", **spec}).admitted
        g.report(f"j{i}", ProgressReport(1, slowdown=1.1))
        if i < 29:
            g.depart(f"j{i}")
    g.report("j0", ProgressReport(2, slowdown=1.2))  # late, after the end
    assert {k: sorted(g.metrics.totals[k]) for k in RollmuxMetrics.JOB_GAUGES} == {
        "slowdown": ["j29"], "slo": ["j29"], "iters": ["j29"]}


def test_only_the_global_scheduler_records_per_job_series():
    """A GroupController reports each finished iteration (iterations done, measured iteration and
    solo time, slowdown) to the GlobalScheduler and records no per-job (``job_id``) series itself:
    two processes exporting the same job's series would make a ``sum()`` count it twice. Its own
    series (pool busy time, phase switches) it does record."""
    import asyncio

    from actors.scheduler.group_controller import GroupControllerImpl
    from rollmux.messages import MembershipPush, PhaseRecord, ProgressReport

    now = [100.0]  # seconds on the controller's clock
    c = GroupControllerImpl("group-m", None, metrics_flush_s=0, metrics_enabled=False, lease_s=0, clock=lambda: now[0])
    reports: list[tuple[str, object]] = []

    class Scheduler:  # the controller's scheduler handle: what goes to the GlobalScheduler
        def report_nowait(self, job_id, message):
            reports.append((job_id, message))

    c._sched = Scheduler()

    async def two_iterations():
        await c.sync_members(MembershipPush.of("group-m", [{"job_id": "a", "rollout_nodes": ["rollout-0"],
                                                             "train_nodes": ["train-0"], "slo": 2.0}], {}, seq=1))
        await c.attach("a")
        for it in range(2):
            for ph in ("rollout", "train", "sync"):
                g = await c.acquire("a", ph, iteration=it)
                t = now[0]
                now[0] = t + 1.0
                await c.release(g, PhaseRecord(ok=True, node=g.nodes[0], start=t, end=t + 1.0, switch="warm",
                                               switch_s=0.01, sync_cross_bytes=1024 if ph == "sync" else None))

    asyncio.run(two_iterations())
    iters = [(j, e.iterations_done, e.t_iter_s, e.t_solo_s, e.slowdown) for j, e in reports
             if isinstance(e, ProgressReport)]
    assert iters == [("a", 1, 3.0, 3.0, 1.0), ("a", 2, 3.0, 3.0, 1.0)]
    totals = c.metrics.totals
    assert {k: dict(totals[k]) for k in RollmuxMetrics.JOB_GAUGES} == {"slowdown": {}, "slo": {}, "iters": {}}
    assert totals["busy"]["rollout"] > 0 and totals["busy"]["train"] > 0 and totals["switch_s"]["warm"] == 0.01


def test_group_timeline_busy_and_bubble_from_occupancy():
    m, f = _metrics()
    recs = [{"pool": "rollout", "node": "r0", "start_s": 0.0, "end_s": 6.0},
            {"pool": "rollout", "node": "r0", "start_s": 4.0, "end_s": 8.0},  # overlaps: union 8 s, not 10 s
            {"pool": "train", "node": "t0", "start_s": 6.0, "end_s": 10.0, "gpus": 4}]  # 4 of 8 GPUs
    m.group_timeline("g1", recs, {"rollout": {"r0": 8}, "train": {"t0": 8}}, (0.0, 10.0))
    assert m.totals["busy"]["rollout"] == 8 * 8.0 and m.totals["bubble"]["rollout"] == 8 * 2.0
    assert m.totals["bubble_ratio"]["train"] == 1 - 4 * 4.0 / 80
    m.group_timeline("g2", recs[:1], {"rollout": {"r0": 1}}, (0.0, 10.0))  # a second group adds up
    assert m.totals["busy"]["rollout"] == 64 + 6 and m.totals["bubble_ratio"]["rollout"] == (16 + 4) / 90
    assert ("set", (16 + 4) / 90, {"pool": "rollout"}) in f["bubble_ratio"].calls


def test_sync_cross_bytes_accumulate_per_job():
    from actors.ops.metrics import RollmuxMetrics

    m = RollmuxMetrics(flush_interval_s=0, enabled=False)
    for nb in (1000, 1000, 1500):
        m.sync_cross_bytes("a", nb)
    m.sync_cross_bytes("b", 7)
    assert m.totals["sync_cross_bytes"] == {"a": 3500, "b": 7}
    assert m.totals["sync_cross_last"] == {"a": 1500, "b": 7}


def test_a_controller_forgets_a_departed_jobs_sync_totals_but_takes_it_back():
    m, f = _metrics()
    m.sync_cross_bytes("a", 100)
    m.job_ended("a", ignore_late=False)  # the job left this controller's group
    assert "a" not in m.totals["sync_cross_bytes"] and "a" not in m.totals["sync_cross_last"]
    m.job("a", iterations=1)  # moved back later: recorded again
    assert m.totals["iters"]["a"] == 1

