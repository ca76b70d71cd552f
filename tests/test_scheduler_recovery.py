"""GlobalScheduler fault tolerance: target state checkpointed before acting, restored on restart."""

from __future__ import annotations

import sys
import uuid

import pytest

from actors.scheduler.kv import FileKV, MemoryKV, RayInternalKV, make_kv
from actors.handles import ActorLost, CallTimeout, ControllerHandle, SchedulerHandle
from factories import wait_until, unit_kw
from rollmux.answers import Departure
from rollmux.messages import EventKind, ProgressReport, RuntimeEvent
from rollmux.records import JobState


def _uid() -> str:
    return uuid.uuid4().hex[:6]


def spec(job_id: str, kind: str = "small") -> dict:
    t = {"big": 5.0, "small": 2.0}[kind]
    return {"job_id": job_id, "model_params_b": 0.001, "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": 5.0,
            "mem_roll_gb": 0.5, "mem_train_gb": 0.5,
            "measured": {"t_roll_s": t, "t_train_s": t, "t_sync_s": 0.0}}


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_kv_roundtrip(kind, tmp_path):
    kv = MemoryKV() if kind == "memory" else FileKV(tmp_path / "ck")
    assert kv.get("a.state") is None
    kv.put("a.state", {"x": [1, 2], "y": None})
    kv.put("b.state", 3)
    assert kv.get("a.state") == {"x": [1, 2], "y": None}
    assert kv.keys("a") == ["a.state"] and kv.keys() == ["a.state", "b.state"]
    kv.delete("a.state")
    assert kv.get("a.state") is None
    with pytest.raises(ValueError, match="invalid KV key"):
        kv.put("../escape", 1)
    assert isinstance(make_kv(str(tmp_path / "x")), FileKV) and isinstance(make_kv(None), RayInternalKV)


def test_restore_from_checkpoint_without_ray(local_cluster_spec):
    """Unit level: a second scheduler on the same KV has the same jobs and group table."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    kv = MemoryKV()
    a = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0)
    d1, d2 = a.admit(spec("r1", "big")), a.admit(spec("r2"))
    assert d1.admitted and d2.admitted and d2.group_id == d1.group_id and d2.strategy == "direct"
    a.report("r1", RuntimeEvent(EventKind.RUNNING))
    a.report("r1", ProgressReport(2, t_iter_s=3.0, t_solo_s=2.0, slowdown=1.5))
    b = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0)
    # progress is written with the event that changes it: the restored records are equal, counters included
    assert b.restored and b.list_jobs() == a.list_jobs() and b.list_groups() == a.list_groups()
    assert b.get_job("r1").state == "running" and b.get_job("r1").iterations_done == 2
    assert b.get_job("r1").slowdown == 1.5
    again = b.admit(spec("r2"))  # a retry of the same spec: the original decision, replayed
    assert again.admitted and again.replayed and again.group_id == d2.group_id
    assert again.delta_usd_per_h == d2.delta_usd_per_h
    assert b.admit({**spec("r2"), "slo": 9.0}).code == "duplicate"  # another spec under a live id
    d3 = b.admit(spec("r3"))
    assert d3.group_id == d1.group_id and d3.strategy == "direct"  # the restored table is used
    dep = b.report("r2", RuntimeEvent(EventKind.FAILED, error="boom"))
    assert dep.state == "failed" and dep.error_detail == "boom" and "boom" in dep.error
    assert "r2" not in b.list_groups()[0].members
    out = b.depart("r1")
    assert out == Departure("r1", JobState.FINISHED)  # it ran
    out = b.depart("r3")  # admitted, never ran: withdrawn (``cancelled``)
    assert out.group_dissolved and sorted(out.released_nodes) == ["rollout-0", "train-0"]
    assert b.list_groups() == [] and b.health().jobs == 0
    assert b.metrics.totals["decisions"]["duplicate"] == 1
    c = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0)
    assert c.list_groups() == [] and c.get_job("r3").state == "cancelled" and c.list_jobs() == b.list_jobs()


def test_scheduler_settings_come_from_configs_scheduler_yaml_and_survive_restore(local_cluster_spec):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from rollmux.admission import load_scheduler_config

    d = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0)
    assert d.igs.config == load_scheduler_config() and d.igs.config.repack_on_departure
    kv = MemoryKV()
    a = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=2,
                            config={"tie_break": "best_fit", "repack_max_groups": 1}, repack_on_departure=False)
    cfg = a.igs.config
    assert (cfg.tie_break, cfg.repack_max_groups, cfg.repack_on_departure, cfg.max_group_size) == ("best_fit", 1, False, 2)
    assert a.igs.max_group_size == 2
    b = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0)  # restored
    assert b.restored and b.igs.config == cfg
    with pytest.raises(ValueError, match="tie_break"):
        GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), config={"tie_break": "worst"})


@pytest.mark.ray
@pytest.mark.timeout(180)
@pytest.mark.parametrize("store", ["gcs", "file"])
def test_scheduler_actor_restart_restores_state(ray_cluster, local_cluster_spec, store, tmp_path):
    import ray

    import rollmux
    from actors.scheduler.global_scheduler import get_or_create_scheduler

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    name = f"test-recover-{_uid()}"
    ck = str(tmp_path / "ck") if store == "file" else None
    h = get_or_create_scheduler(local_cluster_spec, name=name, checkpoint_path=ck)
    ids = [f"rec-{_uid()}", f"rec-{_uid()}"]
    d = [SchedulerHandle(h).admit(spec(ids[0], "big")), SchedulerHandle(h).admit(spec(ids[1]))]
    assert all(x.admitted for x in d)
    # job B's driver attaches (this creates the group's controller) and runs one iteration
    job = rollmux.Job(spec(ids[1]), attach=True, scheduler_name=name, job_id=ids[1])
    job.state("rollout")(lambda: {"n": 0})
    job.state("train")(lambda: {"n": 0})

    @job.phase("rollout")
    def rollout(state, it):
        state["n"] += 1
        return state["n"]

    @job.phase("train")
    def train(state, x):
        state["n"] += x
        return state["n"]

    assert train(rollout(0)) == 1
    jobs_before, groups_before = SchedulerHandle(h).list_jobs(), SchedulerHandle(h).list_groups()
    ctrl = ray.get_actor(jobs_before[0].controller, namespace="rollmux")

    ray.kill(h, no_restart=False)  # both actors die; Ray restarts them (max_restarts=-1)
    ray.kill(ctrl, no_restart=False)
    # ray.kill is asynchronous: the old instance may answer first
    health = wait_until(lambda: (lambda x: x if x.restored else None)(SchedulerHandle(h).health(timeout_s=10)),
                        timeout_s=120, interval_s=0.5, what="scheduler restored",
                        ignore=(ActorLost, CallTimeout))
    assert health is not None and health.restored and health.jobs == 2
    soft = ("iterations_done", "measured", "slowdown", "measured_phases")  # progress: reports may land after the read
    hard = lambda js: [x.model_dump(exclude=set(soft)) for x in js]  # noqa: E731
    assert hard(SchedulerHandle(h).list_jobs()) == hard(jobs_before)
    assert SchedulerHandle(h).list_groups() == groups_before
    assert SchedulerHandle(h).admit(spec(ids[1])).replayed  # a retry of the same spec: its decision
    assert SchedulerHandle(h).admit({**spec(ids[1]), "slo": 6.0}).code == "duplicate"

    # B keeps iterating after both restarts; A (admitted, no driver) does not block it
    assert [train(rollout(i)) for i in (1, 2)] == [3, 6]
    st = ControllerHandle(ctrl).status()
    assert list(st.jobs) == [ids[1]] and st.pending == (ids[0],)
    job.finish()
    rec = SchedulerHandle(h).get_job(ids[1])
    assert rec.state == "finished" and rec.iterations_done == 3
    ray.kill(h, no_restart=True)
