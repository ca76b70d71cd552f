"""Group commit, the published snapshot and the admission queue of the GlobalScheduler (no Ray:
the actor class is driven directly, its async methods on an asyncio loop), and the HTTP face of
the queue (202 / position / 429) through the FastAPI app with that scheduler behind it."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from actors.scheduler.global_scheduler import GlobalSchedulerImpl
from actors.scheduler.kv import MemoryKV
from rollmux.config import CONFIG_DIR, load_cluster
from serve_app import AppSettings, _finite, _sha256, create_app
from factories import InProcessScheduler, unit_kw

LOCAL = load_cluster(CONFIG_DIR / "cluster_local.yaml")  # 2 rollout + 2 training nodes
TOKEN = "q" * 32
AUTH = {"Authorization": "Bearer " + TOKEN}


def sp(jid: str, gpus: int = 1) -> dict:
    return {"job_id": jid, "model_params_b": 0.001, "num_rollout_gpus": gpus, "num_train_gpus": gpus, "slo": 1.0,
            "mem_roll_gb": 0.5, "mem_train_gb": 0.5, "measured": {"t_roll_s": 5.0, "t_train_s": 5.0, "t_sync_s": 0.0}}


class CountingKV(MemoryKV):
    def __init__(self) -> None:
        super().__init__()
        self.puts = 0
        self.fail = False

    def put(self, key, value) -> None:
        if self.fail:
            raise OSError("disk full")
        self.puts += 1
        super().put(key, value)


def sched(kv=None, **kw) -> GlobalSchedulerImpl:
    return GlobalSchedulerImpl(LOCAL, kv=kv or MemoryKV(), **unit_kw(), metrics_flush_s=0,
                               max_group_size=1, **kw)


def test_a_queued_job_is_held_listed_with_its_position_and_admitted_after_a_departure():
    s = sched()
    assert s.admit(sp("a")).admitted and s.admit(sp("b")).admitted
    assert s.admit(sp("c")).code == "retry_later"  # without queue: refused as before
    q = s.admit(sp("c"), queue=True)
    assert (q.code, q.queue_position, q.admitted) == ("queued", 1, False)
    assert s.admit(sp("c"), queue=True).code == "duplicate"
    view = s.get_job("c")
    assert view.state == "queued" and view.queue_position == 1 and view.waited_s >= 0
    assert s.health().queued == 1
    out = s.depart("a")
    assert out.admitted_from_queue == ("c",)
    c = s.get_job("c")
    assert c.state == "admitted" and c.placement.rollout_nodes == ["rollout-0"] and c.waited_s >= 0
    assert s.metrics.totals["queue_jobs"]["admission"] == 0 and s.metrics.totals["queue_waits"] == 1
    # a queued job can be cancelled; the queue survives a restart
    assert s.admit(sp("d"), queue=True).queue_position == 1
    s2 = GlobalSchedulerImpl(LOCAL, kv=s.kv, **unit_kw(), metrics_flush_s=0)
    assert [q.job_id for q in s2.queue.jobs()] == ["d"]
    assert s2.depart("d").state == "cancelled" and s2.get_job("d") is None


def test_group_commit_writes_once_per_batch_and_publishes_one_version():
    kv = CountingKV()
    s = sched(kv)

    async def run():
        v0 = s.version
        before = kv.puts
        outs = await asyncio.gather(*(s.admit_batched(sp(f"j{i}")) for i in range(2)))
        assert all(o.admitted for o in outs)
        assert {o.snapshot_version for o in outs} == {v0 + 1}  # one commit for the batch
        # one batch, one write-ahead record (admitted one by one: one record each)
        assert kv.puts - before == 1
        full = await s.snapshot_since(None, 0, 0)
        assert full.full and sorted(full.jobs) == ["j0", "j1"] and len(full.groups) == 2
        waiter = asyncio.create_task(s.snapshot_since(full.epoch, full.version, 5))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # a long poll: waits for the next commit
        dep = await s.depart_batched("j0")
        delta = await waiter
        assert not delta.full and delta.version == dep.snapshot_version == full.version + 1
        # j0 never ran (no driver reported it running): its departure withdraws it
        assert delta.jobs["j0"].state == "cancelled" and list(delta.groups.values()) == [None]
        # a failed write undoes the whole batch: nothing of it happened
        kv.fail = True
        bad = await asyncio.gather(*(s.admit_batched(sp(f"k{i}")) for i in range(2)))
        assert [b.code for b in bad] == ["unavailable", "unavailable"]
        kv.fail = False
        assert s.get_job("k0") is None and s.get_job("k1") is None and s.health().jobs == 1
        stale = await s.snapshot_since(full.epoch, delta.version, 0)
        assert stale.full and sorted(stale.jobs) == ["j0", "j1"]  # replicas re-read everything

    asyncio.run(run())


def test_http_queue_202_position_admission_after_departure_and_429_when_full():
    s = sched(config={"max_group_size": 1, "queue_max_jobs": 1})

    with TestClient(create_app(AppSettings(token_sha256=_sha256(TOKEN)), client=InProcessScheduler(s))) as c:
        r = c.post("/v1/jobs", json=sp("a"), headers=AUTH)
        assert r.status_code == 201 and r.json()["explanation"]["candidates_listed"] == "chosen"
        assert [x["strategy"] for x in r.json()["explanation"]["candidates"]] == ["isolated"]
        b = c.post("/v1/jobs:dry-run", params={"explain": "chosen"}, json=sp("b"), headers=AUTH).json()["explanation"]
        assert b["pruned"] == [] and b["pruned_groups"] == 1  # counted, not listed
        full = c.post("/v1/jobs:dry-run", json=sp("b"), headers=AUTH).json()["explanation"]
        assert "candidates_listed" not in full and [p["plugin"] for p in full["pruned"]] == ["group_size"]
        assert c.post("/v1/jobs", params={"explain": "full"}, json=sp("b"), headers=AUTH).status_code == 201
        r = c.post("/v1/jobs", json=sp("c"), headers=AUTH)
        assert r.status_code == 409 and r.json()["error"] == "not_admitted:retry_later"
        r = c.post("/v1/jobs:dry-run", json={**sp("c"), "queue": True}, headers=AUTH)
        assert r.status_code == 409 and r.json()["would_queue"] is True
        r = c.post("/v1/jobs", json={**sp("c"), "queue": True}, headers=AUTH)
        assert r.status_code == 202 and r.json()["queued"] is True and r.json()["queue_position"] == 1
        r = c.post("/v1/jobs", json={**sp("d"), "queue": True}, headers=AUTH)
        assert r.status_code == 429 and r.json()["error"] == "queue_full" and int(r.headers["Retry-After"]) > 0
        jobs = {j["job_id"]: j for j in c.get("/v1/jobs").json()}
        assert jobs["c"]["state"] == "queued" and jobs["c"]["queue_position"] == 1 and jobs["c"]["waited_s"] >= 0
        assert c.get("/v1/jobs/c").json()["state"] == "queued"
        assert [j["job_id"] for j in c.get("/v1/jobs", params={"limit": 1, "offset": 1}).json()] == ["b"]
        r = c.delete("/v1/jobs/a", headers=AUTH)
        assert r.status_code == 200 and r.json()["admitted_from_queue"] == ["c"]
        c_now = c.get("/v1/jobs/c").json()
        assert c_now["state"] == "admitted" and c_now["group_id"] and c_now["waited_s"] >= 0
        assert {g["members"][0] for g in c.get("/v1/groups").json()} == {"b", "c"}


def test_dry_runs_are_answered_by_the_replica_from_its_snapshot_copy_like_the_scheduler():
    """After every change (admissions that share, scale out and open groups; departures that
    shrink and dissolve groups and re-pack), ``POST /v1/jobs:dry-run`` is answered by the
    replica's copy of the policy table (no scheduler call) with the decision the scheduler's own
    dry-run gives; a live id (replay / duplicate) is still asked of the scheduler."""
    import random

    from rollmux.models import JobSpec, PhaseProfile

    sim = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    s = GlobalSchedulerImpl(sim, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0)
    calls: list[str] = []
    follows: list[bool] = []  # the policy flag of each snapshot_since call

    class Client(InProcessScheduler):
        async def invoke(self, method, fn, *a):
            calls.append(method)
            if method == "snapshot_since":
                follows.append(bool(a[3:] and a[3]))
            return await super().invoke(method, fn, *a)

    rng = random.Random(7)

    def job(jid: str) -> dict:
        return JobSpec(job_id=jid, model_params_b=rng.choice([7.0, 14.0]), num_rollout_gpus=rng.choice([8, 16]),
                       num_train_gpus=8, slo=round(rng.uniform(1.2, 2.0), 2),
                       measured=PhaseProfile(t_roll_s=rng.uniform(50, 600), t_train_s=rng.uniform(50, 400),
                                             t_sync_s=5.0)).model_dump(mode="json")

    keys = ("admitted", "code", "group_id", "strategy", "placement", "delta_usd_per_h", "predicted_slowdowns")
    live: list[str] = []
    compared, seen, reordered = 0, set(), 0
    with TestClient(create_app(AppSettings(token_sha256=_sha256(TOKEN)), client=Client(s))) as c:
        for step in range(40):
            if live and rng.random() < 0.3:
                assert c.delete(f"/v1/jobs/{live.pop(rng.randrange(len(live)))}", headers=AUTH).status_code == 200
            else:
                r = c.post("/v1/jobs", json=job(f"j{step}"), headers=AUTH)
                assert r.status_code == 201
                live.append(f"j{step}")
            probe = job(f"probe{step}")
            if step == 0:  # a replica that has answered no dry-run does not follow the policy table
                assert follows and not any(follows)
            calls.clear()
            r = c.post("/v1/jobs:dry-run", json=probe, headers=AUTH)
            assert "admit_batched" not in calls  # the replica answered
            v = r.json().get("decision", r.json())
            got = {"admitted": v["admitted"], "code": v["explanation"]["code"], "group_id": v["group_id"],
                   "strategy": v["explanation"]["strategy"], "placement": v["placement"],
                   "delta_usd_per_h": v["marginal_cost_usd_per_h"], "predicted_slowdowns": v["predicted_slowdowns"]}
            want = _finite(s.admit(probe, dry_run=True).to_dict())
            assert json.dumps(got, sort_keys=True) == json.dumps({k: want.get(k) for k in keys}, sort_keys=True), step
            # the same candidates with the same verdicts, in the same order: the copy visits the open
            # groups in the order the scheduler last (re)opened them (InterGroupScheduler.open_seq)
            assert json.dumps(v["explanation"]["candidates"]) == json.dumps(want["candidates"]), step
            reordered += list(s.igs._open) != sorted(s.igs._open, key=lambda g: int(g.split("-")[1]))
            compared += 1
            seen.add(got["strategy"])
        assert follows[-1] is True  # since the first dry-run it does
        assert len(s.igs.groups) > 1 and compared == 40 and seen >= {"direct", "isolated"}, seen
        assert reordered, "a step where the opening order was not the table order (else the order is not tested)"
        calls.clear()
        again = c.post("/v1/jobs:dry-run", json={**job(live[0]), "job_id": live[0]}, headers=AUTH)
        assert "admit_batched" in calls and again.status_code == 409  # a live id with another spec: the scheduler's duplicate


def test_a_replica_sends_concurrent_admissions_in_batches_decided_in_arrival_order():
    """Concurrent ``POST /v1/jobs`` on one replica reach the scheduler as a few ``admit_many``
    calls (at most two in flight), each decided one at a time in the batch's order; every
    request gets its own answer."""
    import httpx

    sim = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    s = GlobalSchedulerImpl(sim, kv=CountingKV(), **unit_kw(), metrics_flush_s=0)
    batches: list[list[str]] = []

    class Client(InProcessScheduler):
        async def invoke(self, method, fn, *a):
            if method == "admit_many":
                batches.append([c.spec.job_id for c in a[0]])
            await asyncio.sleep(0.05)  # the actor call's round trip: more requests arrive meanwhile
            return await super().invoke(method, fn, *a)

    app = create_app(AppSettings(token_sha256=_sha256(TOKEN)), client=Client(s))

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as c:
            rs = await asyncio.gather(*(c.post("/v1/jobs", json={**sp(f"j{i:02d}"), "num_rollout_gpus": 8,
                                                                  "num_train_gpus": 8}, headers=AUTH)
                                        for i in range(24)))
        return rs

    rs = asyncio.run(run())
    assert [r.status_code for r in rs] == [201] * 24
    assert [r.json()["job_id"] for r in rs] == [f"j{i:02d}" for i in range(24)]
    sent = [j for b in batches for j in b]
    assert sorted(sent) == [f"j{i:02d}" for i in range(24)] and len(batches) < 24 and max(map(len, batches)) > 1
    # decided in the order sent: the scheduler's records are in admission order
    assert [j for j in s.jobs] == sent
