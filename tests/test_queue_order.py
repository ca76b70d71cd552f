"""A work-conserving admission queue that keeps its order (the GlobalScheduler, without Ray).

Every change that frees room (a departure, a preemption, a move, a withdrawn queued job) drains the
queue in class order before the next arrival is decided; a newcomer goes ahead of a queued job of
its class or higher only where that job is blocked now. "Blocked" is the line's own rule
(docs/PRIORITIES.md): Alg. 1 does not place the job now, or it waits behind a smaller job ahead of
it that Alg. 1 does not place (backfill never lets a larger job overtake a blocked one), or its
tenant's quota holds it. The oracle below decides every queued job on a copy of the policy's table.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from factories import unit_kw
from rollmux.admission import InterGroupScheduler
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.models import ClusterSpec
from rollmux.preemption import rank_of

LOCAL = load_cluster(CONFIG_DIR / "cluster_local.yaml")  # 2 rollout + 2 training nodes of 1 GPU
FOUR = ClusterSpec.model_validate({**LOCAL.model_dump(mode="json"), "name": "bounded-4x4",
                                   "rollout_pool": {**LOCAL.rollout_pool.model_dump(mode="json"), "num_nodes": 4},
                                   "train_pool": {**LOCAL.train_pool.model_dump(mode="json"), "num_nodes": 4}})
CLASSES = ("production", "research", "best-effort")
TEAM_Q = {"team-q": {"rollout_gpus": 2, "train_gpus": 2}}


def spec(jid: str, cls: str, r: int = 1, t: int = 1, *, slo: float = 1.0, preemptible: bool = True,
         tenant: str | None = None) -> dict:
    d = {"job_id": jid, "model_params_b": 0.001, "num_rollout_gpus": r, "num_train_gpus": t, "slo": slo,
         "mem_roll_gb": 0.5, "mem_train_gb": 0.5, "measured": {"t_roll_s": 5.0, "t_train_s": 4.0, "t_sync_s": 0.0},
         "priority_class": cls, "preemptible": preemptible}
    return {**d, **({"tenant": tenant} if tenant else {})}


def scheduler(cluster: ClusterSpec, **config):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.kv import MemoryKV

    return GlobalSchedulerImpl(cluster, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0,
                               config={"attach_timeout_s": 0.0, **config})


def fitting_queued(s) -> list[tuple[str, int]]:
    """``(job id, class rank)`` of each queued job the line's order lets be tried now (not held by
    its tenant's quota, not behind a smaller blocked job) that Alg. 1 places on the table as it
    is (decided on a copy: nothing changes)."""
    copy = InterGroupScheduler.restore(s.cluster, s.igs.snapshot())
    blocked = math.inf  # smallest GPU demand of a blocked job ahead
    out = []
    for q in s.queue.jobs():
        if s.rules.gate(q.spec):  # its tenant's quota holds it: it blocks no one
            continue
        if blocked < math.inf and (not s.queue.backfill or q.gpus > blocked):
            continue  # waits behind a smaller blocked job (the backfill rule)
        if copy.decide(q.spec).admitted:
            out.append((q.job_id, q.rank))
        else:
            blocked = min(blocked, q.gpus)
    return out


def test_the_operators_scenario_freed_nodes_go_to_the_queue_in_class_order():
    """2 + 2 nodes: research res-a (2+2) runs; best-effort be-1 and research res-b (1+1) are
    queued; production prod-1 (1+1) preempts res-a. The pair prod-1 does not need goes to res-b at
    once (the higher class, queued before res-a went back); be-1 keeps waiting; a later
    best-effort arrival of another tenant queues behind it instead of taking a freed node."""
    s = scheduler(LOCAL)
    assert s.admit(spec("res-a", "research", 2, 2)).admitted
    assert s.admit(spec("be-1", "best-effort"), queue=True).code == "queued"
    assert s.admit(spec("res-b", "research"), queue=True).code == "queued"
    out = s.admit(spec("prod-1", "production"))
    assert out.admitted and out.preempted == ("res-a",) and out.admitted_from_queue == ("res-b",)
    assert s.get_job("res-b").state == "admitted" and fitting_queued(s) == []
    assert [q.job_id for q in s.queue.jobs()] == ["res-a", "be-1"]  # research before best-effort
    late = s.admit(spec("be-2", "best-effort", tenant="other"), queue=True)
    assert late.code == "queued" and late.queue_position == 3
    assert s.get_job("be-2").state == "queued"
    # the preempted job says so: its place in the line, since when, and no group or nodes of its own
    rec = s.get_job("res-a")
    assert rec.state == "preempted" and rec.queue_position == 1 and rec.waited_s >= 0
    assert rec.queued_at == rec.preemptions[-1]["at_s"] and rec.preemptions[-1]["nodes"]
    assert (rec.group_id, rec.placement, rec.controller) == (None, None, None)
    places = {j.job_id: j.queue_position for j in s.list_jobs() if j.queue_position}
    assert places == {"res-a": 1, "be-1": 2, "be-2": 3}  # one line, numbered without gaps
    from actors.ops.cli_ops import status_rows

    placed, waiting = status_rows([j.public() for j in s.list_jobs()])  # `rollmux status` (GET /v1/jobs): the preempted job under the queue
    assert [r[0] for r in placed] == ["prod-1", "res-b"]
    assert [r[:4] for r in waiting] == [("#1", "res-a", "preempted by prod-1, waiting to resume", "research"),
                                        ("#2", "be-1", "queued", "best-effort"), ("#3", "be-2", "queued", "best-effort")]
    # res-b leaving frees its pair: be-1 (first of its class) takes it, be-2 keeps waiting
    assert s.depart("res-b").admitted_from_queue == ("be-1",)
    assert [q.job_id for q in s.queue.jobs()] == ["res-a", "be-2"]


def test_the_operators_scenario_over_http():
    """The same steps over the HTTP API (the app in-process, answering reads from its snapshot copy):
    the preemption's 201 lists the victim and what the queue took, the preempted job's record says
    where it waits, and GET /v1/jobs numbers one line without gaps."""
    from fastapi.testclient import TestClient

    from factories import InProcessScheduler
    from serve_app import AppSettings, _sha256, create_app

    token = "t" * 32
    auth = {"Authorization": "Bearer " + token}
    s = scheduler(LOCAL)
    with TestClient(create_app(AppSettings(token_sha256=_sha256(token)), client=InProcessScheduler(s))) as c:
        assert c.post("/v1/jobs", headers=auth, json=spec("res-a", "research", 2, 2)).status_code == 201
        for jid, cls in (("be-1", "best-effort"), ("res-b", "research")):
            assert c.post("/v1/jobs", headers=auth, json={**spec(jid, cls), "queue": True}).status_code == 202
        r = c.post("/v1/jobs", headers=auth, json=spec("prod-1", "production"))
        assert r.status_code == 201 and r.json()["preempted"] == ["res-a"], r.text
        assert r.json()["admitted_from_queue"] == ["res-b"]
        late = c.post("/v1/jobs", headers=auth, json={**spec("be-2", "best-effort", tenant="other"), "queue": True})
        assert late.status_code == 202 and late.json()["queue_position"] == 3
        rec = c.get("/v1/jobs/res-a").json()
        assert (rec["state"], rec["queue_position"], rec["group_id"], rec["placement"]) == ("preempted", 1, None, None)
        assert rec["queued_at"] == rec["preemptions"][-1]["at_s"]
        jobs = {j["job_id"]: j for j in c.get("/v1/jobs").json()}
        assert jobs["res-b"]["state"] == "admitted"
        assert {j: v["queue_position"] for j, v in jobs.items() if v.get("queue_position")} == \
            {"res-a": 1, "be-1": 2, "be-2": 3}


def test_a_withdrawn_blocked_job_lets_the_larger_one_behind_it_in():
    """Backfill keeps a larger job behind a smaller blocked one, also when the larger one would fit;
    when the blocked one is withdrawn the larger one is admitted at once (only the line changed)."""
    s = scheduler(FOUR, max_group_size=1)
    assert s.admit(spec("a", "research", 1, 3)).admitted  # 3 rollout + 1 training node stay free
    assert s.admit(spec("b", "research", 1, 2), queue=True).code == "queued"  # 2 training nodes: blocked
    out = s.admit(spec("l", "research", 3, 1), queue=True)  # fits, but is larger than b: waits behind it
    assert out.code == "queued" and "queued jobs are ahead" in out.reason
    assert fitting_queued(s) == []  # l waits by the line's order, not for room
    dep = s.depart("b")
    assert dep.state == "cancelled" and dep.admitted_from_queue == ("l",)
    assert s.get_job("l").state == "admitted" and len(s.queue) == 0


def test_a_job_held_by_its_quota_blocks_no_other_tenant():
    """A queued job its tenant's quota holds does not make a larger arrival of another tenant wait
    (the drain never lets it block anyone either)."""
    s = scheduler(FOUR, max_group_size=1, tenants=TEAM_Q)
    assert s.admit(spec("q1", "research", 2, 2, tenant="team-q")).admitted  # team-q's whole quota
    held = s.admit(spec("q2", "production", 1, 1, tenant="team-q"), queue=True)
    assert held.code == "queued" and "tenant 'team-q'" in held.reason
    assert s.admit(spec("n", "production", 2, 2, tenant="other"), queue=True).admitted  # larger than q2
    assert [q.job_id for q in s.queue.jobs()] == ["q2"] and fitting_queued(s) == []


ARRIVAL = st.tuples(st.just("arrive"), st.sampled_from(CLASSES), st.integers(1, 3), st.integers(1, 3),
                    st.sampled_from([1.0, 3.0]), st.booleans(), st.sampled_from([None, None, "team-q"]))
DEPARTURE = st.tuples(st.just("depart"), st.integers(0, 1000))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(st.one_of(ARRIVAL, ARRIVAL, DEPARTURE), min_size=1, max_size=24))
# a production job preempts a research one whose room it did not all need (the policy scales its
# group out): the research job fits again at once and must not wait for the next departure
@example(events=[("arrive", "research", 1, 2, 1.0, True, None), ("arrive", "production", 1, 3, 1.0, False, None)])
def test_no_queued_job_that_fits_stays_queued_and_no_arrival_jumps_one(events):
    """Random arrivals (every class: production ones preempt), departures and withdrawals on a
    bounded 4 + 4 cluster with a tenant quota: after every event no queued job that the line's
    order lets be tried fits, and no arrival is admitted while a queued job of its class or
    higher that the order lets be tried fits."""
    s = scheduler(FOUR, max_group_size=2, tenants=TEAM_Q)
    cfg = s.igs.config
    for i, ev in enumerate(events):
        if ev[0] == "arrive":
            _, cls, r, t, slo, pre, tenant = ev
            sp = spec(f"j{i}", cls, r, t, slo=slo, preemptible=pre, tenant=tenant)
            ahead = fitting_queued(s)
            out = s.admit(sp, queue=True)
            if out.admitted:
                mine = rank_of(cfg, s.igs.member(sp["job_id"]).spec)
                assert not [j for j, rk in ahead if rk <= mine], (sp["job_id"], ahead)
        else:
            live = sorted(j for j, r in s.jobs.items() if r.state.is_active()) + [q.job_id for q in s.queue.jobs()]
            if not live:
                continue
            s.depart(live[ev[1] % len(live)])
        assert fitting_queued(s) == [], (i, ev)
