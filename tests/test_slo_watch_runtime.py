"""The SLO watch in the runtime (``profile_source: measured``): the GlobalScheduler records each
job's reported phase times, re-checks its group on them and acts at an iteration boundary.

Scenario (local 2+2-node cluster, ``max_group_size=2``): V (slo 1.2) and N (slo 5) both declare
0.1 s rollouts and 0.1 s training, so admission packs them into group-0 (worst case: they
interleave, slowdown 1). N's measured phases then exceed its declared profile (0.25 s each) while V
runs 0.08 s phases: V waits for N's phases, its slowdown against its realised solo time would be
about 3x, above its SLO. The scheduler isolates V (group-1, the cheapest option keeping every SLO)
and says so in V's record, the HTTP API and ``rollmux_slo_actions_total``.
"""

from __future__ import annotations

import sys
import threading
import uuid

import pytest
import torch
from fastapi.testclient import TestClient

import rollmux
from actors.scheduler.kv import MemoryKV
from actors.handles import SchedulerHandle
from factories import InProcessScheduler, kill_scheduler_and_controllers, make_toy, unit_kw, wait_until
from rollmux.messages import ProgressReport
from serve_app import AppSettings, _sha256, create_app
from test_runtime_actors import loop

pytestmark = [pytest.mark.timeout(180)]
CONFIG = {"max_group_size": 2}  # every other setting the default (measured profiles, the SLO watch)
TOKEN = "s" * 32


def _spec(jid: str, slo: float) -> dict:
    return {"job_id": jid, "model_params_b": 0.001, "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": slo,
            "mem_roll_gb": 0.5, "mem_train_gb": 0.5, "measured": {"t_roll_s": 0.1, "t_train_s": 0.1, "t_sync_s": 0.0}}


def _admit_two(admit, tag: str) -> tuple[str, str]:
    v, n = f"V-{tag}", f"N-{tag}"
    got = [admit(_spec(v, 1.2)), admit(_spec(n, 5.0))]
    assert [(d.group_id, d.strategy) for d in got] == [("group-0", "isolated"), ("group-0", "direct")], got
    return v, n


def test_measured_phases_over_the_declared_profile_make_the_scheduler_isolate_the_job_at_risk(local_cluster_spec):
    """No Ray: reports in, the decision in the record (checkpointed), the API and the metric."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    kv = MemoryKV()
    kw = unit_kw()
    s = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **kw, metrics_flush_s=0, config=CONFIG)
    v, n = _admit_two(s.admit, "u")
    s.report(v, ProgressReport(1, t_iter_s=0.2, t_solo_s=0.16, t_roll_s=0.08, t_train_s=0.08, t_sync_s=0.0))
    # one report is a profile (measured_min_iterations: 1): V's 0.08 s phases beside N's declared 0.1 s
    # ones give 0.2 s per iteration against V's realised solo 0.16 s, 1.25x > its SLO of 1.2
    out = s.slo_watch_pending()
    assert [(d["job_id"], d["action"], d["mover"], d["group_id"], d["to_group"]) for d in out] == \
        [(v, "isolate", v, "group-0", "group-1")]
    for it in range(1, 4):
        if it > 1:
            s.report(v, ProgressReport(it, t_iter_s=0.16, t_solo_s=0.16, t_roll_s=0.08, t_train_s=0.08, t_sync_s=0.0))
        s.report(n, ProgressReport(it, t_iter_s=0.6, t_solo_s=0.5, t_roll_s=0.25, t_train_s=0.25, t_sync_s=0.0))
    rec = s.get_job(v)
    assert [x.t_roll_s for x in rec.measured_phases.samples] == [0.08] * 3
    act = rec.slo_action
    assert act["action"] == "isolate" and act["predicted_slowdown"] == pytest.approx(1.25) and act["slo"] == 1.2
    assert "predicted slowdown" in act["reason"] and "measured phase times" in act["reason"]
    assert rec.group_id == "group-1" and [(m.from_group, m.to_group) for m in rec.moves] == [("group-0", "group-1")]
    assert s.igs.member(v).profile.t_roll_s == pytest.approx(0.08 * 0.99)  # planned on its measured profile now
    assert kw["metrics"].totals["slo_actions"] == {"isolate": 1}
    assert s.slo_watch_pending() == []  # nothing at risk any more; nothing to do again
    with TestClient(create_app(AppSettings(token_sha256=_sha256(TOKEN)), client=InProcessScheduler(s))) as c:
        got = c.get(f"/v1/jobs/{v}", headers={"Authorization": "Bearer " + TOKEN})
        assert got.status_code == 200 and got.json()["slo_action"]["action"] == "isolate"
        assert got.json()["slo_action"]["reason"] == act["reason"]
    r = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0)  # restored from the checkpoint
    assert r.get_job(v) == rec and r.get_job(v).measured_phases.reports == 3
    assert r.igs.member(v).profile == s.igs.member(v).profile


def test_worst_case_source_records_phases_and_never_acts(local_cluster_spec):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    s = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0,
                            config={"max_group_size": 2, "profile_source": "worst_case"})
    v, n = _admit_two(s.admit, "w")
    for it in range(1, 5):
        s.report(v, ProgressReport(it, t_roll_s=0.08, t_train_s=0.08, t_sync_s=0.0))
        s.report(n, ProgressReport(it, t_roll_s=0.25, t_train_s=0.25, t_sync_s=0.0))
    assert s.slo_watch_pending() == [] and s.get_job(v).slo_action is None and s.get_job(v).group_id == "group-0"
    assert s.get_job(n).measured_phases.reports == 4


def _uid() -> str:
    return uuid.uuid4().hex[:6]


@pytest.mark.ray
def test_the_runtime_moves_the_job_at_risk_at_an_iteration_boundary_and_it_stays_bit_identical(ray_cluster,
                                                                                               local_cluster_spec):
    """Real drivers: N runs 0.25 s phases against its declared 0.1 s; the scheduler isolates V at
    an iteration boundary; V's weights equal a solo run's bit for bit."""
    import ray

    import test_runtime_actors
    from actors.scheduler.global_scheduler import get_or_create_scheduler

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(test_runtime_actors)
    name = f"test-slo-watch-{_uid()}"
    h = get_or_create_scheduler(local_cluster_spec, name=name, config=CONFIG)
    iters_v, iters_n = 8, 6
    try:
        v, n = _admit_two(lambda sp: SchedulerHandle(h).admit(sp), _uid())
        out: dict = {}
        jv = rollmux.Job(_spec(v, 1.2), attach=True, scheduler_name=name, job_id=v)
        fv = make_toy(jv, "small", seed=7)
        jn = rollmux.Job(_spec(n, 5.0), attach=True, scheduler_name=name, job_id=n)
        fn = make_toy(jn, "big", seed=9)
        ts = [threading.Thread(target=loop, args=(jv, fv, iters_v, out, "v")),
              threading.Thread(target=loop, args=(jn, fn, iters_n, out, "n"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=150)
        assert not any(t.is_alive() for t in ts) and "v:error" not in out and "n:error" not in out, out
        rec = SchedulerHandle(h).get_job(v)
        assert rec.state == "finished" and rec.iterations_done == iters_v
        assert rec.slo_action["action"] == "isolate" and rec.slo_action["to_group"] == "group-1", rec.slo_action
        assert [(m.from_group, m.to_group) for m in rec.moves] == [("group-0", "group-1")]
        assert rec.measured_phases.reports >= 3
        # moved at an iteration boundary: every iteration whole on one group, the later ones on group-1
        rt = jv._runtime
        assert [(m["from_group"], m["to_group"]) for m in rt.moves] == [("group-0", "group-1")]
        moved_at = rt.moves[0]["iteration"]
        assert 2 <= moved_at < iters_v
        tl0 = [r for r in SchedulerHandle(h).group_timeline("group-0") if r.job_id == v]
        tl1 = [r for r in SchedulerHandle(h).group_timeline("group-1") if r.job_id == v]
        assert {r.iteration for r in tl0} == set(range(moved_at)) and {r.iteration for r in tl1} == set(range(moved_at, iters_v))
        # on-policy: the moved job equals a solo run with the same seed, bit for bit
        solo = rollmux.Job(_spec(f"solo-{_uid()}", 1.2), attach=False)
        so: dict = {}
        loop(solo, make_toy(solo, "small", seed=7), iters_v, so, "s")
        assert len(out["v"]) == iters_v and all(torch.equal(a, b) for a, b in zip(so["s"], out["v"]))
    finally:
        kill_scheduler_and_controllers(h, name)


def test_a_cold_start_iteration_is_not_folded_into_the_measured_profile(local_cluster_spec):
    """No Ray: a report marked ``cold_start`` (the job's first iteration in its group: engine
    start-up, first load) leaves the measured window and the planning profile alone, so a slow
    first iteration cannot move a job; the next (warm) report is folded and acted on as usual."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    s = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, config=CONFIG)
    v, n = _admit_two(s.admit, "c")
    s.report(v, ProgressReport(1, t_iter_s=9.0, t_solo_s=8.0, t_roll_s=4.0, t_train_s=4.0, t_sync_s=0.0, cold_start=True))
    assert s.slo_watch_pending() == [] and s.get_job(v).measured_phases is None
    s.report(v, ProgressReport(2, t_iter_s=0.2, t_solo_s=0.16, t_roll_s=0.08, t_train_s=0.08, t_sync_s=0.0))
    assert [x.t_roll_s for x in s.get_job(v).measured_phases.samples] == [0.08]
    assert [d["action"] for d in s.slo_watch_pending()] == ["isolate"]

