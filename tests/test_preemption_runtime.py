"""Preemption on the cluster runtime: a bounded cluster admits a higher-class job that does not fit
by preempting a lower-class job at its iteration boundary; the preempted job waits in the queue,
resumes from its state when room frees, and ends bit-identical to the same job run solo. Quota
refusals name the tenant. The scheduler-only checks run without Ray."""

from __future__ import annotations

import dataclasses
import threading
import uuid

import pytest

from actors.handles import SchedulerHandle, WorkerHandle
from factories import kill_scheduler_and_controllers, unit_kw, wait_until
from rollmux.messages import EventKind, RuntimeEvent
from rollmux.models import JobSpec

TEAM_Q = {"team-q": {"rollout_gpus": 1, "train_gpus": 1}}


def qspec(jid: str, cls=None, tenant=None, gpus: int = 1, preemptible: bool = True) -> dict:
    d = {"job_id": jid, "model_params_b": 0.001, "num_rollout_gpus": gpus, "num_train_gpus": gpus, "slo": 1.0,
         "mem_roll_gb": 0.5, "mem_train_gb": 0.5, "measured": {"t_roll_s": 5.0, "t_train_s": 5.0, "t_sync_s": 0.0},
         "preemptible": preemptible}
    return {**d, **({"priority_class": cls} if cls else {}), **({"tenant": tenant} if tenant else {})}


def test_scheduler_preempts_requeues_resumes_and_survives_restart(local_cluster_spec):
    """Without Ray: on the full local cluster (two node pairs, groups of one) a production job
    preempts the best-effort job (not the non-preemptible one), which is re-queued with its
    record saying when, by whom and what it lost; a restarted scheduler keeps both; the
    departure of the production job re-admits it with its history."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV

    kv = MemoryKV()

    def make():
        return GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=1,
                                   config={"attach_timeout_s": 0.0, "tenants": TEAM_Q})

    g = make()
    assert g.admit(qspec("be", "best-effort")).admitted
    assert g.admit(qspec("hold", "best-effort", preemptible=False)).admitted
    be_group = g.get_job("be").group_id
    out = g.admit(qspec("prod", "production"))
    assert out.admitted and out.preempted == ("be",) and out.placement.rollout_nodes == ["rollout-0"]
    rec = g.get_job("be")
    assert rec.state == "preempted" and rec.priority_class == "best-effort"
    (p,) = rec.preemptions
    assert p["by_job"] == "prod" and p["by_class"] == "production" and p["lost_gpu_h"] > 0 and p["resumed_at_s"] is None
    assert g.targets.target(be_group).gone == {"be": "preempted"}  # removed by its controller at its iteration boundary
    assert [(q.job_id, q.priority_class) for q in g.views.queue()] == [("be", "best-effort")]
    assert [j.job_id for j in g.list_jobs()] == ["be", "hold", "prod"]  # listed once, as its record
    assert g.admit(qspec("low", "research"), queue=True).code == "queued"  # nothing below research to preempt
    assert [q.job_id for q in g.queue.jobs()] == ["low", "be"]  # the higher class first
    assert g.depart("low").state == "cancelled"
    g2 = make()  # restarted from the checkpoint
    assert g2.get_job("be").state == "preempted" and [q.job_id for q in g2.queue.jobs()] == ["be"]
    dep = g2.depart("prod")
    assert dep.admitted_from_queue == ("be",)
    rec = g2.get_job("be")
    assert rec.state == "admitted" and rec.preemptions[0]["resumed_at_s"] >= p["at_s"]
    # a queued preempted job withdrawn ends cancelled
    assert g2.admit(qspec("prod2", "production")).preempted == ("be",)
    assert g2.depart("be").state == "cancelled" and g2.get_job("be").state == "cancelled"


def test_quota_refusals_name_the_tenant_and_an_unknown_class_the_field(local_cluster_spec):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0, "tenants": TEAM_Q})
    assert g.admit(qspec("q1", tenant="team-q")).admitted
    out = g.admit(qspec("q2", tenant="team-q"))
    assert out.code == "retry_later" and "tenant 'team-q'" in out.reason and "quota of 1" in out.reason
    out = g.admit(qspec("q2", tenant="team-q"), queue=True)
    assert out.code == "queued" and "tenant 'team-q'" in out.reason
    out = g.admit(qspec("q3", tenant="team-q", gpus=2))
    assert out.code == "never" and "whole quota" in out.reason
    assert g.admit(qspec("other")).admitted  # another tenant uses the free pair
    g.depart("other")
    assert g.get_job("q2") is not None and g.get_job("q2").state == "queued"  # the free pair is not its tenant's
    g.depart("q1")
    assert g.get_job("q2").state == "admitted" and g.get_job("q2").tenant == "team-q"
    out = g.admit(qspec("x", "gold"))
    assert out.code == "invalid" and "priority_class" in out.reason


def test_a_queued_higher_class_preempts_once_a_departure_makes_a_set_possible(local_cluster_spec):
    """A production job of both node pairs arrives while a non-preemptible research job holds one:
    no set exists, it queues. That job departs; the room it leaves is not enough (a best-effort job
    holds the other pair), but now the best-effort job alone is a set: it is preempted and the
    production job admitted, in the departure's write."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0})
    assert g.admit(qspec("be", "best-effort")).admitted
    assert g.admit(qspec("r1", "research", preemptible=False)).admitted
    out = g.admit(qspec("big", "production", gpus=2), queue=True)
    assert out.code == "queued" and not out.preempted
    dep = g.depart("r1")
    assert dep.admitted_from_queue == ("big",)
    assert g.get_job("big").state == "admitted" and g.get_job("be").state == "preempted"
    assert [q.job_id for q in g.queue.jobs()] == ["be"] and g.get_job("be").preemptions[0]["by_job"] == "big"


def test_a_tenant_within_its_quota_reclaims_borrowed_capacity_first(local_cluster_spec):
    """Tenant b borrows the second node pair beyond its quota; tenant a, within its quota, arrives
    at the same class: b's borrowed job is preempted (reclaim), b's job within its quota is not."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0, "tenants": {
                                "a": {"rollout_gpus": 1, "train_gpus": 1},
                                "b": {"rollout_gpus": 1, "train_gpus": 1, "may_borrow": True}}})
    assert g.admit(qspec("b-own", "research", "b")).admitted
    assert g.admit(qspec("b-more", "research", "b")).admitted
    assert g.get_job("b-more").borrowed is True and not g.get_job("b-own").borrowed
    out = g.admit(qspec("a1", "research", "a"))
    assert out.admitted and out.preempted == ("b-more",)
    assert g.get_job("b-more").state == "preempted" and g.get_job("b-own").state == "admitted"
    # jobs within their tenants' quotas are guaranteed against other tenants, even of a higher class
    out = g.admit(qspec("c1", "production", "c"))
    assert out.code == "retry_later" and not out.preempted
    assert {j: g.get_job(j).state for j in ("b-own", "a1")} == {"b-own": "admitted", "a1": "admitted"}
    out = g.admit(qspec("a2", "production", "a"))  # and a's own quota is full
    assert not out.admitted and "tenant 'a'" in out.reason


def test_fenced_nodes_and_drain_overdue_rule():
    """The pure waiting rule (rollmux.drain), one for preemptions and moves: a member is fenced
    off the nodes of a drain still in progress that left another group (never its own group's,
    never its own job's, nor a complete one's); records written before drains were kept wait for
    nothing; the drain is overdue only after the job stopped and the grace passed, or when no
    stop came within the bound after the decision."""
    from rollmux.drain import DRAIN_GRACE_S, DRAIN_MAX_S, drain_overdue, drains_of, fenced_nodes, step
    from rollmux.preemption import PreemptionRecord
    from rollmux.records import JobRecord, MoveRecord

    def prec(**kw) -> dict:
        return PreemptionRecord(at_s=100.0, by_job="n", by_class="production", lost_gpu_h=0.1, reason="r",
                                **kw).to_dict()

    rec = JobRecord(job_id="v", state="preempted",
                    preemptions=[prec(group_id="group-0", nodes=("rollout-0", "train-0"))],
                    moves=[MoveRecord(job_id="v", from_group="group-1", to_group="group-0", at=50.0,
                                      from_nodes=["rollout-1", "train-1"])])
    pre, mv = drains_of(rec)
    assert (pre.kind, pre.job_id, pre.group_id, pre.nodes, pre.at_s) == ("preempted", "v", "group-0",
                                                                          ("rollout-0", "train-0"), 100.0)
    assert (mv.kind, mv.group_id, mv.nodes, mv.at_s) == ("moved", "group-1", ("rollout-1", "train-1"), 50.0)
    assert pre.draining and mv.draining
    assert fenced_nodes([pre, mv], "group-2", ["train-0", "rollout-1", "rollout-0"], "n") == (
        "train-0", "rollout-1", "rollout-0")
    assert fenced_nodes([pre], "group-0", ["rollout-0", "train-0"], "n") == ()  # its own group's queues serialise
    # the moved job keeps rollout-1 in its new group: its own drain never fences it, others' do
    assert fenced_nodes([mv], "group-0", ["rollout-1", "train-0"], "v") == ()
    assert fenced_nodes([mv], "group-0", ["rollout-1", "train-0"], "w") == ("rollout-1",)
    assert step(pre, 130.0, stopped=True) == {"stopped_at_s": 130.0}
    assert step(pre, 130.0, drained="exported") == {"stopped_at_s": 130.0, "drained_at_s": 130.0,
                                                     "drained": "exported"}
    done = dataclasses.replace(pre, stopped_at_s=110.0, drained_at_s=120.0, drained="exported")
    assert not done.draining and fenced_nodes([done], "group-2", ["rollout-0"]) == ()
    assert step(done, 130.0, drained="again") == {} and step(dataclasses.replace(pre, stopped_at_s=110.0), 130.0,
                                                               stopped=True) == {}
    # a checkpoint written before drains were kept: no group / nodes, no from_nodes: nothing to wait for
    old = JobRecord.model_validate({"job_id": "o", "state": "running",
                                    "preemptions": [{k: x for k, x in prec().items() if k not in (
                                        "group_id", "nodes", "stopped_at_s", "drained_at_s", "drained")}],
                                    "moves": [{"job_id": "o", "from_group": "group-1", "to_group": "group-2"}]})
    assert [d.draining for d in drains_of(old)] == [False, False]
    assert drain_overdue(pre, 100.0 + DRAIN_MAX_S) is None  # not stopped yet: its last phase may still run
    assert drain_overdue(pre, 100.0 + DRAIN_MAX_S + 1).startswith("overdue: no stop")  # the bound on a lost report
    stopped = dataclasses.replace(mv, stopped_at_s=200.0)
    assert drain_overdue(stopped, 200.0 + DRAIN_GRACE_S) is None
    assert drain_overdue(stopped, 200.0 + DRAIN_GRACE_S + 0.5).startswith("overdue: its driver")
    assert drain_overdue(done, 1e9) is None


def test_ledger_grants_no_phase_on_a_fenced_node_and_reports_a_preempted_job_stopped():
    """A member fenced off its nodes is not granted (it keeps its place); lifting the fence
    grants it. A preempted member mid-iteration stays until its boundary and is reported
    ``stopped`` only when it actually leaves; one between iterations leaves and is reported at once."""
    from rollmux.group_ledger import GroupLedger, Report
    from rollmux.messages import EventKind, PhaseRecord

    led = GroupLedger("group-9", lease_s=0)
    led.add("n", ["rollout-0"], ["train-0"])
    led.activate("n")
    assert led.set_fenced("n", ["rollout-0"]) and not led.set_fenced("n", ["rollout-0"])
    assert led.try_grant("n", "rollout", 0, 0.0) is None and led.status()["jobs"]["n"]["fenced"] == ["rollout-0"]
    assert led.set_fenced("n", ())
    assert led.try_grant("n", "rollout", 0, 0.0).nodes == ("rollout-0",)

    def stopped(effects) -> list[str]:
        return [e.job_id for e in effects if isinstance(e, Report) and getattr(e.message, "kind", None) == EventKind.STOPPED]

    v = GroupLedger("group-0", lease_s=0)
    for j in ("v", "w"):
        v.add(j, [f"rollout-{j}"], [f"train-{j}"])
        v.activate(j)
    g = v.try_grant("v", "rollout", 3, 0.0)
    assert v.remove("v", "preempted") and v.moving == {"v": "preempted"} and stopped(v.take_effects()) == []
    assert v.remove("w", "preempted") and stopped(v.take_effects()) == ["w"]  # idle: leaves now
    effects = []
    for ph in ("rollout", "train", "sync"):  # the rest of v's iteration runs, then it leaves
        g = g if ph == "rollout" else v.try_grant("v", ph, 3, 0.0)
        _, eff = v.release(g, PhaseRecord(node="x", start=1.0, end=2.0, ok=True))
        effects += eff + v.take_effects()
        assert stopped(effects) == ([] if ph != "sync" else ["v"])
    assert v.gone["v"] == "preempted" and not v.is_queued("v")


def test_newcomer_is_fenced_off_the_victims_nodes_until_it_drained(local_cluster_spec):
    """Without Ray: the production job is admitted at once onto the best-effort job's node pair,
    but its target state fences it off those nodes while the victim drains (the fence survives a
    scheduler restart); ``stopped`` alone does not lift it, ``drained`` (its driver exported its
    state) does, as does the grace after the stop (a driver that never exports), or a failure
    report (its controller evicted it: its driver was lost). A victim whose group never had a
    controller (no driver attached) is drained at once."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV
    from rollmux.drain import DRAIN_GRACE_S

    kv = MemoryKV()

    def make():
        return GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=1,
                                   config={"attach_timeout_s": 0.0})

    def fence(g, job: str) -> tuple:
        gid = g.get_job(job).group_id
        return next(m.fenced for m in g.targets.target(gid).members if m.job_id == job)

    g = make()
    assert g.admit(qspec("be", "best-effort")).admitted and g.admit(qspec("r", "research")).admitted
    be_group = g.get_job("be").group_id
    pl = g.get_job("be").placement
    be_nodes = (*pl.rollout_nodes, *pl.train_nodes)
    g.ensure_controller(be_group)  # its driver attached: its last phase may be running
    out = g.admit(qspec("p", "production"))
    assert out.admitted and out.preempted == ("be",)
    assert out.group_id != be_group and fence(g, "p") == be_nodes
    (e,) = g.get_job("be").preemptions
    assert (e["group_id"], tuple(e["nodes"]), e["stopped_at_s"], e["drained_at_s"]) == (be_group, be_nodes, None, None)
    g2 = make()  # restarted from the checkpoint: still fenced
    assert fence(g2, "p") == be_nodes
    g2.report("be", RuntimeEvent(EventKind.STOPPED))
    (e,) = g2.get_job("be").preemptions
    assert e["stopped_at_s"] >= e["at_s"] and fence(g2, "p") == be_nodes
    assert g2.drain_overdue_pending(now=e["stopped_at_s"] + DRAIN_GRACE_S - 1) == []
    g2.report("be", RuntimeEvent(EventKind.DRAINED))
    (e,) = g2.get_job("be").preemptions
    assert e["drained"] == "exported" and e["drained_at_s"] >= e["stopped_at_s"] and fence(g2, "p") == ()
    assert g2.get_job("be").state == "preempted" and [q.job_id for q in g2.queue.jobs()] == ["be"]

    # a driver that never exports: drained once overdue after its stop
    g2.depart("p")  # be resumes on its pair
    assert g2.get_job("be").state == "admitted"
    g2.ensure_controller(g2.get_job("be").group_id)
    assert g2.admit(qspec("p2", "production")).preempted == ("be",) and fence(g2, "p2")
    g2.report("be", RuntimeEvent(EventKind.STOPPED))
    t_stop = g2.get_job("be").preemptions[-1]["stopped_at_s"]
    assert g2.drain_overdue_pending(now=t_stop + DRAIN_GRACE_S + 1) == ["be"]
    assert g2.get_job("be").preemptions[-1]["drained"].startswith("overdue") and fence(g2, "p2") == ()

    # its controller evicted it (its driver was lost): the failure report drains it, it stays queued
    g2.depart("p2")
    g2.ensure_controller(g2.get_job("be").group_id)
    assert g2.admit(qspec("p3", "production")).preempted == ("be",) and fence(g2, "p3")
    g2.report("be", RuntimeEvent(EventKind.FAILED, error="driver lost: no heartbeat for 31.0s"))
    assert g2.get_job("be").preemptions[-1]["drained"].startswith("driver lost") and fence(g2, "p3") == ()
    assert g2.get_job("be").state == "preempted" and "be" in g2.queue

    # no controller ever existed for the victim's group: nothing of it ran, drained at once
    g3 = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                             config={"attach_timeout_s": 0.0})
    assert g3.admit(qspec("be", "best-effort")).admitted and g3.admit(qspec("r", "research")).admitted
    assert g3.admit(qspec("p", "production")).preempted == ("be",)
    assert g3.get_job("be").preemptions[0]["drained"] == "no driver" and fence(g3, "p") == ()


def _victim_cfg(jid: str, iterations: int = 4):
    """The best-effort GRPO job the Ray tests preempt: a tiny model, a few seconds per iteration."""
    from examples.grpo.config import ModelConfig, load_job_config
    from rollmux.config import CONFIG_DIR

    cfg = load_job_config(CONFIG_DIR / "jobs" / "grpo_train_heavy.yaml", iterations=iterations)
    return cfg.model_copy(update={
        "job": cfg.job.model_copy(update={"job_id": jid, "slo": 8.0, "priority_class": "best-effort"}),
        "run": cfg.run.model_copy(update={"max_new_tokens": 12, "min_new_tokens": 6, "num_prompts": 4,
                                          "group_size": 4, "ppo_epochs": 1, "minibatch_size": 8}),
        "model": ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                             max_position_embeddings=48)})


def _bounded_scheduler(cluster, name: str):
    """A GlobalScheduler on the local cluster (two node pairs) with groups of one and team-q's quota."""
    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from rollmux.admission import load_scheduler_config

    return get_or_create_scheduler(cluster, name=name, max_group_size=1,
                                   config={**load_scheduler_config().model_dump(), "attach_timeout_s": 0.0,
                                           "tenants": TEAM_Q})


def _hold_other_pair(h, uid: str) -> None:
    """A non-preemptible research job holds one node pair (no driver), so a newcomer must preempt."""
    assert SchedulerHandle(h).admit({**qspec(f"hold-{uid}", "research", "team-q", preemptible=False),
                                   "mem_roll_gb": 0.05, "mem_train_gb": 0.1}).admitted


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_preempted_grpo_job_resumes_bit_identical_to_solo(ray_cluster, local_cluster_spec, tmp_path, caplog):
    """A best-effort GRPO job runs on one node pair, a non-preemptible job holds the other; a
    production job admitted during its run preempts it: its controller removes it at its
    iteration boundary, its driver exports its state (its workers no longer host it) and waits,
    its log saying so (not that heartbeats fail); when the production job departs the queue
    re-admits it and it resumes. It runs every iteration once and its trainer weights equal the
    solo run's bit for bit (SHA-256)."""
    import logging

    import ray

    from actors.naming import NAMESPACE, hosted_key, worker_name
    from examples.grpo.job import run_job

    uid = uuid.uuid4().hex[:6]
    name, jid = f"test-preempt-{uid}", f"be-{uid}"
    cfg = _victim_cfg(jid)
    solo = run_job(cfg, attach=False)
    h = _bounded_scheduler(local_cluster_spec, name)
    prod = f"prod-{uid}"
    seen: dict = {}

    def preempt_then_free() -> None:
        try:
            out = SchedulerHandle(h).admit(JobSpec(**{**qspec(prod, "production"), "mem_roll_gb": 0.05, "mem_train_gb": 0.1}))
            seen["admit"] = out
            wait_until(lambda: SchedulerHandle(h).get_job(jid).state == "preempted", timeout_s=30, interval_s=0.05,
                       what="the job preempted")
            waiting = SchedulerHandle(h).get_job(jid)  # it says where it waits, not where it ran
            assert waiting.queue_position == 1 and waiting.queued_at and waiting.placement is None
            node = waiting.preemptions[-1]["nodes"][0]
            w = ray.get_actor(worker_name(node), namespace=NAMESPACE)
            wait_until(lambda: hosted_key(jid, name) not in {x.key for x in WorkerHandle(w).hosted()}, timeout_s=60, interval_s=0.05,
                       what="its state exported from its workers")
            seen["freed"] = node
            seen["dep"] = SchedulerHandle(h).depart(prod)
        except BaseException as e:  # pragma: no cover - reported by the assertions below
            seen["error"] = e

    t = threading.Thread(target=preempt_then_free)

    def on_iteration(m: dict) -> None:
        if m["iteration"] == 1 and not t.is_alive() and "admit" not in seen:
            t.start()  # lands during iteration 2 (or just before it): either way at a boundary

    try:
        _hold_other_pair(h, uid)
        caplog.set_level(logging.INFO, logger="rollmux.runtime")
        res = run_job(cfg, attach=True, scheduler_name=name, checkpoint_dir=str(tmp_path / "ckpt"),
                      on_iteration=on_iteration)
        t.join(timeout=60)
        assert "error" not in seen, seen.get("error")
        said = [r.getMessage() for r in caplog.records if r.name == "rollmux.runtime" and r.levelno >= logging.WARNING]
        told = [m for m in said if m.startswith(f"job {jid} preempted by {prod} at iteration ")]
        assert len(told) == 1 and told[0].endswith("; waiting to resume"), said
        assert any(m.startswith(f"job {jid} resumed on ") for m in said), said
        assert not any("heartbeat to its controller failed" in m for m in said), said
        assert seen["admit"].admitted and seen["admit"].preempted == (jid,)
        assert jid in seen["dep"].admitted_from_queue and seen["freed"]
        assert [m["step"] for m in res["history"]] == [1, 2, 3, 4]
        assert res["weights_sha256"] == solo["weights_sha256"]
        assert [m["reward_mean"] for m in res["history"]] == [m["reward_mean"] for m in solo["history"]]
        rec = SchedulerHandle(h).get_job(jid)
        assert rec.state == "finished" and rec.iterations_done == 4 and rec.priority_class == "best-effort"
        (p,) = rec.preemptions
        assert p["by_job"] == prod and p["by_class"] == "production" and p["lost_gpu_h"] > 0
        assert p["resumed_at_s"] >= p["at_s"] and p["iteration"] in (1, 2, 3)
        # each (phase, iteration) ran once: never half an iteration before the stop
        tl = [(r["phase"], r["iteration"]) for r in res["timeline"] if r.get("job_id", jid) == jid]
        assert len(tl) == len(set(tl)), tl
        # quota: the tenant holding its whole quota is refused another job, naming it
        out = SchedulerHandle(h).admit(qspec(f"q2-{uid}", tenant="team-q"))
        assert out.code == "retry_later" and "tenant 'team-q'" in out.reason
    finally:
        kill_scheduler_and_controllers(h, name)


def test_a_preemption_is_counted_by_the_victims_class(local_cluster_spec):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0})
    assert g.admit(qspec("be", "best-effort")).admitted and g.admit(qspec("r", "research")).admitted
    assert g.admit(qspec("p", "production")).preempted == ("be",)
    g.metrics.flush()
    assert g.metrics.totals["preemptions"] == {"best-effort": 1}


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_newcomer_runs_on_the_victims_nodes_only_after_the_victim_drained(ray_cluster, local_cluster_spec, tmp_path):
    """The production job is admitted (and answered ``preempted``) while the best-effort GRPO job
    is mid-iteration (its rollout done, training and sync to come), and its driver asks for its
    first permit at once. The controllers' phase records show: the victim completes that
    iteration (never half of one), and the newcomer's first phase on each node they share starts
    no earlier than the victim's last phase there ended, and after the victim's drain (its
    state exported by its driver) was recorded. The newcomer departs; the victim resumes and
    ends bit-identical to its solo run."""
    import rollmux
    from examples.grpo.job import make_job, run_job
    from factories import make_toy, toy_spec

    uid = uuid.uuid4().hex[:6]
    name, jid, prod = f"test-drain-{uid}", f"be-{uid}", f"prod-{uid}"
    cfg = _victim_cfg(jid)
    solo = run_job(cfg, attach=False)
    h = _bounded_scheduler(local_cluster_spec, name)
    seen: dict = {}
    asking = threading.Event()  # the newcomer's driver is about to ask for its first permit

    def newcomer() -> None:
        try:
            seen["admit"] = SchedulerHandle(h).admit(JobSpec(**toy_spec(prod, "small"), priority_class="production"))
            job = rollmux.Job(toy_spec(prod, "small"), attach=True, scheduler_name=name, job_id=prod,
                              sync_backend="object_store")
            r, t, p = make_toy(job, "small", seed=7)
            asking.set()
            for it in range(2):
                t(r(it))
                p()
            job.finish()
        except BaseException as e:  # pragma: no cover - reported by the assertions below
            seen["error"] = e
            asking.set()

    th = threading.Thread(target=newcomer)
    stop_at = 1  # the iteration during which the newcomer arrives
    try:
        _hold_other_pair(h, uid)
        g = make_job(cfg, attach=True, scheduler_name=name, checkpoint_dir=str(tmp_path / "ckpt"))
        history = []
        with g.job:
            for it in range(cfg.run.iterations):
                samples = g.rollout(it)
                if it == stop_at:  # mid-iteration: training and sync of this iteration are still to run
                    th.start()
                    assert asking.wait(120) and "error" not in seen, seen.get("error")
                history.append(g.train(samples))
                g.publish()
        th.join(timeout=120)
        assert not th.is_alive() and "error" not in seen, seen.get("error")
        assert seen["admit"].admitted and seen["admit"].preempted == (jid,)

        rec = SchedulerHandle(h).get_job(jid)
        assert rec.state == "finished" and rec.iterations_done == cfg.run.iterations
        (p,) = rec.preemptions
        assert p["by_job"] == prod and p["iteration"] == stop_at and p["drained"] == "exported"
        assert p["at_s"] <= p["stopped_at_s"] <= p["drained_at_s"] <= p["resumed_at_s"]
        # the runtime's own phase records: the victim's old group (before the stop), the newcomer's group
        old = [r for e in SchedulerHandle(h).group_timeline(p["group_id"]) if (r := e.to_dict())["job_id"] == jid
               and r["start"] < p["resumed_at_s"]]
        new = [e.to_dict() for e in SchedulerHandle(h).group_timeline(seen["admit"].group_id) if e.job_id == prod]
        assert new and all(r["ok"] for r in old + new)
        # the victim ran whole iterations only, up to and including the one it was preempted in
        assert sorted((r["iteration"], r["phase"]) for r in old) == \
            [(i, ph) for i in range(stop_at + 1) for ph in ("rollout", "sync", "train")]
        shared = set(p["nodes"]) & {r["node"] for r in new}
        assert shared, (p["nodes"], new)
        for node in shared:
            last_end = max(r["end"] for r in old if r["node"] == node)
            first_start = min(r["start"] for r in new if r["node"] == node)
            assert first_start >= last_end, (node, first_start, last_end)
        assert min(r["start"] for r in new) >= max(r["end"] for r in old)  # no phase of both at once anywhere
        assert min(r["start"] for r in new) >= p["drained_at_s"]  # only after its state left the workers
        # resumed after the newcomer departed, bit-identical to the uninterrupted solo run
        assert [m["step"] for m in history] == [m["step"] for m in solo["history"]]
        assert history[-1]["weights_sha256"] == solo["weights_sha256"]
        assert [m["reward_mean"] for m in history] == [m["reward_mean"] for m in solo["history"]]
    finally:
        kill_scheduler_and_controllers(h, name)
