"""Preemption on the cluster runtime: a bounded cluster admits a higher-class job that does not fit
by preempting a lower-class job at its iteration boundary; the preempted job waits in the queue,
resumes from its state when room frees, and ends bit-identical to the same job run solo. Quota
refusals name the tenant. The scheduler-only checks run without Ray."""

from __future__ import annotations

import threading
import uuid

import pytest

from factories import kill_scheduler_and_controllers, unit_kw, wait_until

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
    from actors.global_scheduler import GlobalSchedulerImpl
    from actors.kv import MemoryKV

    kv = MemoryKV()

    def make():
        return GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=1,
                                   config={"attach_timeout_s": 0.0, "tenants": TEAM_Q})

    g = make()
    assert g.admit(qspec("be", "best-effort"))["admitted"]
    assert g.admit(qspec("hold", "best-effort", preemptible=False))["admitted"]
    be_group = g.get_job("be")["group_id"]
    out = g.admit(qspec("prod", "production"))
    assert out["admitted"] and out["preempted"] == ["be"] and out["placement"]["rollout_nodes"] == ["rollout-0"]
    rec = g.get_job("be")
    assert rec["state"] == "preempted" and rec["priority_class"] == "best-effort"
    (p,) = rec["preemptions"]
    assert p["by_job"] == "prod" and p["by_class"] == "production" and p["lost_gpu_h"] > 0 and p["resumed_at_s"] is None
    assert g._target(be_group).gone == {"be": "preempted"}  # removed by its controller at its iteration boundary
    assert [(q["job_id"], q["priority_class"]) for q in g._queue_view()] == [("be", "best-effort")]
    assert [j["job_id"] for j in g.list_jobs()] == ["be", "hold", "prod"]  # listed once, as its record
    assert g.admit(qspec("low", "research"), queue=True)["code"] == "queued"  # nothing below research to preempt
    assert [q.job_id for q in g.queue.jobs()] == ["low", "be"]  # the higher class first
    assert g.depart("low")["state"] == "cancelled"
    g2 = make()  # restarted from the checkpoint
    assert g2.get_job("be")["state"] == "preempted" and [q.job_id for q in g2.queue.jobs()] == ["be"]
    dep = g2.depart("prod")
    assert dep["admitted_from_queue"] == ["be"]
    rec = g2.get_job("be")
    assert rec["state"] == "admitted" and rec["preemptions"][0]["resumed_at_s"] >= p["at_s"]
    # a queued preempted job withdrawn ends cancelled
    assert g2.admit(qspec("prod2", "production"))["preempted"] == ["be"]
    assert g2.depart("be")["state"] == "cancelled" and g2.get_job("be")["state"] == "cancelled"


def test_quota_refusals_name_the_tenant_and_an_unknown_class_the_field(local_cluster_spec):
    from actors.global_scheduler import GlobalSchedulerImpl
    from actors.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0, "tenants": TEAM_Q})
    assert g.admit(qspec("q1", tenant="team-q"))["admitted"]
    out = g.admit(qspec("q2", tenant="team-q"))
    assert out["code"] == "retry_later" and "tenant 'team-q'" in out["reason"] and "quota of 1" in out["reason"]
    out = g.admit(qspec("q2", tenant="team-q"), queue=True)
    assert out["code"] == "queued" and "tenant 'team-q'" in out["reason"]
    out = g.admit(qspec("q3", tenant="team-q", gpus=2))
    assert out["code"] == "never" and "whole quota" in out["reason"]
    assert g.admit(qspec("other"))["admitted"]  # another tenant uses the free pair
    g.depart("other")
    assert g.get_job("q2") is not None and g.get_job("q2")["state"] == "queued"  # the free pair is not its tenant's
    g.depart("q1")
    assert g.get_job("q2")["state"] == "admitted" and g.get_job("q2")["tenant"] == "team-q"
    out = g.admit(qspec("x", "gold"))
    assert out["code"] == "invalid" and "priority_class" in out["reason"]


def test_a_queued_higher_class_preempts_once_a_departure_makes_a_set_possible(local_cluster_spec):
    """A production job of both node pairs arrives while a non-preemptible research job holds one:
    no set exists, it queues. That job departs; the room it leaves is not enough (a best-effort job
    holds the other pair), but now the best-effort job alone is a set: it is preempted and the
    production job admitted, in the departure's write."""
    from actors.global_scheduler import GlobalSchedulerImpl
    from actors.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0})
    assert g.admit(qspec("be", "best-effort"))["admitted"]
    assert g.admit(qspec("r1", "research", preemptible=False))["admitted"]
    out = g.admit(qspec("big", "production", gpus=2), queue=True)
    assert out["code"] == "queued" and not out.get("preempted")
    dep = g.depart("r1")
    assert dep["admitted_from_queue"] == ["big"]
    assert g.get_job("big")["state"] == "admitted" and g.get_job("be")["state"] == "preempted"
    assert [q.job_id for q in g.queue.jobs()] == ["be"] and g.get_job("be")["preemptions"][0]["by_job"] == "big"


def test_a_tenant_within_its_quota_reclaims_borrowed_capacity_first(local_cluster_spec):
    """Tenant b borrows the second node pair beyond its quota; tenant a, within its quota, arrives
    at the same class: b's borrowed job is preempted (reclaim), b's job within its quota is not."""
    from actors.global_scheduler import GlobalSchedulerImpl
    from actors.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0, "tenants": {
                                "a": {"rollout_gpus": 1, "train_gpus": 1},
                                "b": {"rollout_gpus": 1, "train_gpus": 1, "may_borrow": True}}})
    assert g.admit(qspec("b-own", "research", "b"))["admitted"]
    assert g.admit(qspec("b-more", "research", "b"))["admitted"]
    assert g.get_job("b-more")["borrowed"] is True and "borrowed" not in g.get_job("b-own")
    out = g.admit(qspec("a1", "research", "a"))
    assert out["admitted"] and out["preempted"] == ["b-more"]
    assert g.get_job("b-more")["state"] == "preempted" and g.get_job("b-own")["state"] == "admitted"
    # jobs within their tenants' quotas are guaranteed against other tenants, even of a higher class
    out = g.admit(qspec("c1", "production", "c"))
    assert out["code"] == "retry_later" and not out.get("preempted")
    assert {j: g.get_job(j)["state"] for j in ("b-own", "a1")} == {"b-own": "admitted", "a1": "admitted"}
    out = g.admit(qspec("a2", "production", "a"))  # and a's own quota is full
    assert not out["admitted"] and "tenant 'a'" in out["reason"]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_preempted_grpo_job_resumes_bit_identical_to_solo(ray_cluster, local_cluster_spec, tmp_path):
    """A best-effort GRPO job runs on one node pair, a non-preemptible job holds the other; a
    production job admitted during its run preempts it: its controller removes it at its
    iteration boundary, its driver exports its state (its workers no longer host it) and waits;
    when the production job departs the queue re-admits it and it resumes. It runs every
    iteration once and its trainer weights equal the solo run's bit for bit (SHA-256)."""
    import ray

    from actors.global_scheduler import get_or_create_scheduler
    from actors.naming import NAMESPACE, hosted_key, worker_name
    from examples.grpo.config import ModelConfig, load_job_config
    from examples.grpo.job import run_job
    from rollmux.admission import load_scheduler_config
    from rollmux.config import CONFIG_DIR

    uid = uuid.uuid4().hex[:6]
    name, jid = f"test-preempt-{uid}", f"be-{uid}"
    cfg = load_job_config(CONFIG_DIR / "jobs" / "grpo_train_heavy.yaml", iterations=4)
    cfg = cfg.model_copy(update={
        "job": cfg.job.model_copy(update={"job_id": jid, "slo": 8.0, "priority_class": "best-effort"}),
        "run": cfg.run.model_copy(update={"max_new_tokens": 12, "min_new_tokens": 6, "num_prompts": 4,
                                          "group_size": 4, "ppo_epochs": 1, "minibatch_size": 8}),
        "model": ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                             max_position_embeddings=48)})
    solo = run_job(cfg, attach=False)
    h = get_or_create_scheduler(local_cluster_spec, name=name, max_group_size=1,
                                config={**load_scheduler_config().model_dump(), "attach_timeout_s": 0.0,
                                        "tenants": TEAM_Q})
    prod = f"prod-{uid}"
    seen: dict = {}

    def preempt_then_free() -> None:
        try:
            out = ray.get(h.admit.remote({**qspec(prod, "production"), "mem_roll_gb": 0.05, "mem_train_gb": 0.1}))
            seen["admit"] = out
            wait_until(lambda: ray.get(h.get_job.remote(jid))["state"] == "preempted", timeout_s=30, interval_s=0.05,
                       what="the job preempted")
            node = ray.get(h.get_job.remote(jid))["placement"]["rollout_nodes"][0]
            w = ray.get_actor(worker_name(node), namespace=NAMESPACE)
            wait_until(lambda: hosted_key(jid, name) not in ray.get(w.hosted.remote()), timeout_s=60, interval_s=0.05,
                       what="its state exported from its workers")
            seen["freed"] = node
            seen["dep"] = ray.get(h.depart.remote(prod))
        except BaseException as e:  # pragma: no cover - reported by the assertions below
            seen["error"] = e

    t = threading.Thread(target=preempt_then_free)

    def on_iteration(m: dict) -> None:
        if m["iteration"] == 1 and not t.is_alive() and "admit" not in seen:
            t.start()  # lands during iteration 2 (or just before it): either way at a boundary

    try:
        assert ray.get(h.admit.remote({**qspec(f"hold-{uid}", "research", "team-q", preemptible=False),
                                       "mem_roll_gb": 0.05, "mem_train_gb": 0.1}))["admitted"]
        res = run_job(cfg, attach=True, scheduler_name=name, checkpoint_dir=str(tmp_path / "ckpt"),
                      on_iteration=on_iteration)
        t.join(timeout=60)
        assert "error" not in seen, seen.get("error")
        assert seen["admit"]["admitted"] and seen["admit"]["preempted"] == [jid]
        assert jid in seen["dep"]["admitted_from_queue"] and seen["freed"]
        assert [m["step"] for m in res["history"]] == [1, 2, 3, 4]
        assert res["weights_sha256"] == solo["weights_sha256"]
        assert [m["reward_mean"] for m in res["history"]] == [m["reward_mean"] for m in solo["history"]]
        rec = ray.get(h.get_job.remote(jid))
        assert rec["state"] == "finished" and rec["iterations_done"] == 4 and rec["priority_class"] == "best-effort"
        (p,) = rec["preemptions"]
        assert p["by_job"] == prod and p["by_class"] == "production" and p["lost_gpu_h"] > 0
        assert p["resumed_at_s"] >= p["at_s"] and p["iteration"] in (1, 2, 3)
        # each (phase, iteration) ran once: never half an iteration before the stop
        tl = [(r["phase"], r["iteration"]) for r in res["timeline"] if r.get("job_id", jid) == jid]
        assert len(tl) == len(set(tl)), tl
        # quota: the tenant holding its whole quota is refused another job, naming it
        out = ray.get(h.admit.remote(qspec(f"q2-{uid}", tenant="team-q")))
        assert out["code"] == "retry_later" and "tenant 'team-q'" in out["reason"]
    finally:
        kill_scheduler_and_controllers(h, name)


def test_a_preemption_is_counted_by_the_victims_class(local_cluster_spec):
    from actors.global_scheduler import GlobalSchedulerImpl
    from actors.kv import MemoryKV

    g = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0, max_group_size=1,
                            config={"attach_timeout_s": 0.0})
    assert g.admit(qspec("be", "best-effort"))["admitted"] and g.admit(qspec("r", "research"))["admitted"]
    assert g.admit(qspec("p", "production"))["preempted"] == ["be"]
    g.metrics.flush()
    assert g.metrics.totals["preemptions"] == {"best-effort": 1}
