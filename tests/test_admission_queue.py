"""The admission queue of a bounded cluster (rollmux.admission_queue): order, backfill, bounds,
checkpoint, and the simulator's bounded replay through the same queue code. Pure: no Ray."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.admission_queue import AdmissionQueue, QueueFull, job_gpus
from rollmux.cli import app
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.models import ClusterSpec, JobSpec, PhaseProfile
from rollmux.sim.simulator import Realisation, make_policy, replay, simulate
from rollmux.workloads import SimJob

LOCAL = load_cluster(CONFIG_DIR / "cluster_local.yaml")  # 2 rollout + 2 training nodes of 1 GPU


def spec(jid: str, gpus: int = 1, slo: float = 1.0, t: float = 5.0) -> JobSpec:
    """A job of ``gpus`` rollout + ``gpus`` training GPUs (= nodes of the local cluster)."""
    return JobSpec(job_id=jid, model_params_b=0.001, num_rollout_gpus=gpus, num_train_gpus=gpus, slo=slo,
                   mem_roll_gb=0.5, mem_train_gb=0.5, measured=PhaseProfile(t_roll_s=t, t_train_s=t, t_sync_s=0.0))


def full_cluster() -> InterGroupScheduler:
    s = InterGroupScheduler(LOCAL, max_group_size=1)  # no sharing: each job holds its own nodes
    assert s.admit(spec("a")).admitted and s.admit(spec("b")).admitted
    assert s.decide(spec("x")).code == "retry_later"  # both node pairs are taken
    return s


def test_backfill_admits_a_smaller_job_behind_a_blocked_one_then_the_blocked_one():
    s, q = full_cluster(), AdmissionQueue(10)
    assert q.push(spec("big", gpus=2), now=10.0) == 1
    assert q.push(spec("small"), now=11.0) == 2
    assert q.positions() == {"big": 1, "small": 2} and job_gpus(spec("big", gpus=2)) == 4
    assert q.waits_s(now=20.0) == {"big": 10.0, "small": 9.0} and q.oldest_wait_s(20.0) == 10.0
    s.depart("a")  # one node pair free: big (2 + 2 nodes) still does not fit, small does
    res = q.drain(s, now=30.0)
    assert [j.job_id for j, _ in res.admitted] == ["small"] and res.tried == 2 and not res.dropped
    assert s.group_of("small") is not None and list(q.positions()) == ["big"]
    assert "capacity" in q.get("big").reason or "out of GPUs" in q.get("big").reason
    s.depart("b")
    assert q.drain(s, now=40.0).admitted == []  # small holds a pair: big waits on
    s.depart("small")
    res = q.drain(s, now=50.0)
    assert [j.job_id for j, _ in res.admitted] == ["big"] and len(q) == 0
    assert s.group_of("big").rollout_nodes == ("rollout-0", "rollout-1") or len(s.group_of("big").rollout_nodes) == 2


def test_strict_fifo_stops_at_the_first_blocked_job():
    s, q = full_cluster(), AdmissionQueue(10, backfill=False)
    q.push(spec("big", gpus=2), now=0.0)
    q.push(spec("small"), now=1.0)
    s.depart("a")
    res = q.drain(s, now=2.0)
    assert res.admitted == [] and res.tried == 1 and list(q.positions()) == ["big", "small"]
    assert not q.may_try_now(spec("tiny"))  # strict FIFO: a new arrival queues behind


def test_backfill_never_lets_a_larger_job_overtake_a_blocked_one():
    s, q = full_cluster(), AdmissionQueue(10)
    q.push(spec("mid"), now=0.0)  # 1 + 1: blocked while the cluster is full
    q.push(spec("big", gpus=2), now=1.0)
    res = q.drain(s, now=2.0)  # nothing left the cluster: mid blocked, big (larger) not even tried
    assert res.admitted == [] and res.tried == 1
    assert q.may_try_now(spec("tiny")) and not q.may_try_now(spec("huge", gpus=2))


def test_a_job_that_can_never_fit_leaves_the_queue_with_its_decision():
    s, q = full_cluster(), AdmissionQueue(10)
    q.push(spec("toolarge", gpus=3), now=0.0)  # 3 nodes per pool on a 2-node cluster
    res = q.drain(s, now=1.0)
    assert [(j.job_id, d.code) for j, d in res.dropped] == [("toolarge", "never")] and len(q) == 0


def test_bounds_duplicates_scan_limit_and_checkpoint_round_trip():
    q = AdmissionQueue(2, scan_limit=1)
    q.push(spec("p"), now=1.0)
    with pytest.raises(ValueError, match="queued already"):
        q.push(spec("p"), now=2.0)
    q.push(spec("r"), now=2.0)
    with pytest.raises(QueueFull, match="holds 2 jobs"):
        q.push(spec("s"), now=3.0)
    with pytest.raises(ValueError):
        AdmissionQueue(0)
    s = full_cluster()
    assert q.drain(s, now=4.0).tried == 1  # scan_limit bounds a pass
    q2 = AdmissionQueue(2)
    q2.restore(q.snapshot())
    assert [(j.job_id, j.enqueued_at, j.seq, j.attempts) for j in q2.jobs()] == [("p", 1.0, 1, 1), ("r", 2.0, 2, 0)]
    assert q2.remove("p").job_id == "p" and q2.remove("p") is None and q2.position("r") == 1
    q2.push(spec("t"), now=5.0)
    assert q2.get("t").seq == 3  # sequence numbers continue after a restore


def test_config_builds_the_queue_from_its_settings():
    q = AdmissionQueue.from_config(SchedulerConfig(queue_max_jobs=7, queue_backfill=False, queue_scan_limit=3))
    assert (q.max_jobs, q.backfill, q.scan_limit) == (7, False, 3)


# --- the simulator's bounded replay uses the same queue ------------------------------------------------
BOUNDED = ClusterSpec.model_validate({**LOCAL.model_dump(mode="json"), "name": "bounded-test"})


def sim(jid: str, arrival: float, duration: float, gpus: int = 1) -> SimJob:
    return SimJob(spec=spec(jid, gpus=gpus), job_type="hand", category="balanced", arrival_s=arrival, duration_s=duration)


def test_bounded_replay_queues_and_admits_on_departure_with_hand_computed_waits():
    # a, b fill both node pairs; c (1+1) waits for a's departure at t=100; d (2+2) waits for both
    # b (t=150) and c (t=100+100=200); e (1+1, arrives at 60) backfills nothing until a pair is free
    jobs = [sim("a", 0, 100), sim("b", 0, 150), sim("c", 10, 100), sim("d", 20, 50, gpus=2), sim("e", 60, 10)]
    real = Realisation(BOUNDED)
    pol = make_policy("rollmux", BOUNDED, real, queue=True, max_group_size=1)
    run = replay(jobs, pol, real)
    # c (arrived first) takes a's pair at 100; at 150 b's pair frees: d (2+2) does not fit, e backfills
    # (1+1, smaller); e runs 150-160; d waits for c (ends at 200) and runs 200-250
    starts = {k: o.start_s for k, o in run.outcomes.items()}
    assert starts == pytest.approx({"a": 0, "b": 0, "c": 100, "d": 200, "e": 150})
    assert {k: o.wait_s for k, o in run.outcomes.items()} == pytest.approx({"a": 0, "b": 0, "c": 90, "d": 180, "e": 90})
    for o in run.outcomes.values():
        assert o.slowdown == pytest.approx(1.0)  # running time excludes the wait
    m = run.metrics()
    assert m["queued_jobs"] == 3 and m["queue_wait_s_max"] == pytest.approx(180)
    assert m["queue_wait_s_mean"] == pytest.approx((90 + 180 + 90) / 5) and m["queue_peak_jobs"] == 3
    assert m["queue_refused_jobs"] == 0 and m["peak_rollout_gpus"] <= 2


def test_bounded_replay_without_the_queue_refuses_and_per_job_policies_but_solo_d_cannot_queue():
    jobs = [sim("a", 0, 100), sim("b", 0, 150), sim("c", 10, 100)]
    real = Realisation(BOUNDED)
    with pytest.raises(RuntimeError, match="admission queue"):
        replay(jobs, make_policy("rollmux", BOUNDED, real, max_group_size=1), real)
    with pytest.raises(ValueError, match="admission queue"):
        make_policy("colocated", BOUNDED, real, queue=True)
    with pytest.raises(ValueError, match="admission queue"):
        simulate(jobs, BOUNDED, ["rollmux", "gavel+"], queue=True)
    # Solo-D queues as a group of one: each job alone on whole nodes, the same queue
    solo = simulate(jobs, BOUNDED, ["solo-d"], queue=True).summary["policies"]["solo-d"]
    assert solo["queue_wait_s_max"] == pytest.approx(90) and solo["slo_attainment"] == 1.0
    res = simulate(jobs, BOUNDED, ["rollmux", "random"], queue=True, max_group_size=1)
    for name in ("rollmux", "random"):
        assert res.summary["policies"][name]["queue_wait_s_max"] == pytest.approx(90)
    assert res.summary["meta"]["admission_queue"] is True


def test_cli_queue_flag_refuses_per_job_policies(tmp_path):
    r = CliRunner().invoke(app, ["simulate", "--queue", "--policies", "rollmux,gavel+", "--jobs", "5",
                                 "--out", str(tmp_path), "--no-progress"])
    assert r.exit_code == 2 and "--queue" in r.output and "gavel+" in r.output
