"""The Ray execution plane on the session's multi-node local cluster (RollMux §5).

Toy jobs (tiny tensors, short sleeps) run through the real GlobalScheduler, GroupController and
Rollout/Train workers. Every test uses its own scheduler name and job ids, so other tests' state
on the shared cluster does not matter.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import pytest
import torch

import rollmux
from actors.handles import ControllerHandle, SchedulerHandle, WorkerHandle
from factories import FIXED_GROUPS, SLEEP, make_toy, toy_spec, unit_kw, wait_until  # noqa: F401  (re-exported for other tests)
from rollmux.messages import RolloutProgress

pytestmark = [pytest.mark.timeout(240)]
ray_test = pytest.mark.ray

def _uid() -> str:
    return uuid.uuid4().hex[:6]


def loop(job, fns, n, out: dict, key: str):
    rollout, train, publish = fns
    try:
        with job:
            for it in range(n):
                m = train(rollout(it))
                publish()
                out.setdefault(key, []).append(m["w"])
    except BaseException as e:  # recorded for the assertions
        out[key + ":error"] = e


@pytest.fixture(scope="module")
def sched(ray_cluster, local_cluster_spec):
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    name = f"test-sched-{_uid()}"
    h = get_or_create_scheduler(local_cluster_spec, name=name, config=FIXED_GROUPS)  # the tests check turns in one group
    assert SchedulerHandle(h).health().ok
    yield name, h
    ray.kill(h, no_restart=True)


def run_group(name, kinds, n, *, fail=None, switch=None, sync_backend=None):
    ids = [f"{k}-{_uid()}" for k in kinds]
    jobs, fns = [], []
    for i, (jid, kind) in enumerate(zip(ids, kinds)):
        job = rollmux.Job(toy_spec(jid, kind), attach=True, scheduler_name=name,
                          switch=(switch or {}).get(i, "warm"), sync_backend=sync_backend)
        jobs.append(job)
        fns.append(make_toy(job, kind, seed=i, fail_at=(fail or {}).get(i)))
    out: dict = {}
    threads = [threading.Thread(target=loop, args=(j, f, n, out, j.job_id)) for j, f in zip(jobs, fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads)
    return ids, jobs, out


@ray_test
@pytest.mark.parametrize("sync_backend", ["object_store", "auto"])
def test_three_jobs_interleave_round_robin_in_one_group(sched, sync_backend):
    from actors.driver.runtime_client import group_timeline

    name, h = sched
    n = 3
    ids, jobs, out = run_group(name, ["big", "small", "small"], n, switch={2: "cold"}, sync_backend=sync_backend)
    assert not [k for k in out if k.endswith(":error")], out
    gids = {j.info["group_id"] for j in jobs}
    assert len(gids) == 1, "Alg. 1 should pack the three toy jobs into one co-execution group"
    tl = [r for r in group_timeline(jobs[0]) if r["job_id"] in ids]
    assert all(r["ok"] for r in tl)
    syncs = [r for r in tl if r["phase"] == "sync"]
    used = {"object_store": "object_store", "auto": "gloo"}[sync_backend]  # no CUDA device here: gloo
    assert {r["sync_backend"] for r in syncs} == {used}
    assert {r["sync_backend_requested"] for r in syncs} == {sync_backend}
    assert all(a["backend"] == used for r in syncs for a in r["sync_receivers"])
    if sync_backend == "auto":  # the record says why NCCL was not taken
        assert all("nccl not usable" in r["sync_note"] and "no CUDA device" in r["sync_note"] for r in syncs)
    # one model copy crosses the pool boundary per sync (one rollout worker), counted by the transport
    assert all(r["sync_cross_bytes"] == syncs[0]["sync_cross_bytes"] > 0 for r in syncs if r["job_id"] == syncs[0]["job_id"])
    for jid in ids:  # each job: exactly one rollout, one train, one sync per meta-iteration
        mine = [r for r in tl if r["job_id"] == jid]
        for ph in ("rollout", "train", "sync"):
            assert sorted(r["iteration"] for r in mine if r["phase"] == ph) == list(range(n))
    for pool in ("rollout", "train"):  # round robin on each node's FIFO queue: every job once per meta-iteration
        seq = [r["job_id"] for r in sorted(tl, key=lambda r: r["start"]) if r["phase"] == pool]
        # the first in the admission order; later ones in the planned order, which a re-plan on the
        # jobs' measured phase times (profile_source: measured, the default) may change between two
        assert seq[:len(ids)] == ids and len(seq) == len(ids) * n, (pool, seq)
        assert all(sorted(seq[i:i + len(ids)]) == sorted(ids) for i in range(0, len(seq), len(ids))), (pool, seq)
    # interleaving: some rollout overlaps another job's training (a bubble filled)
    rolls = [r for r in tl if r["phase"] == "rollout"]
    trains = [r for r in tl if r["phase"] == "train"]
    assert any(a["job_id"] != b["job_id"] and a["start"] < b["end"] and b["start"] < a["end"]
               for a in rolls for b in trains)
    # warm vs cold switches recorded: the cold job is cold every phase; warm jobs warm after the first
    kinds = {jid: [r["switch"] for r in tl if r["job_id"] == jid] for jid in ids}
    assert set(kinds[ids[2]]) == {"cold"}
    assert kinds[ids[0]][:2] == ["cold", "cold"] and set(kinds[ids[0]][2:]) == {"warm"}
    assert all(r["switch_s"] >= 0 for r in tl)
    status = ControllerHandle(name=jobs[0].info["controller"]).status()
    assert status.metrics["switches"]["warm"] >= 1 and status.metrics["switches"]["cold"] >= 3
    for j in ids:  # the exported counter (flushed periodically: whole syncs so far) adds the records' bytes
        per = [r["sync_cross_bytes"] for r in syncs if r["job_id"] == j]
        got = status.metrics.get("sync_cross_bytes", {}).get(j, 0)
        assert got in {per[0] * k for k in range(len(per) + 1)}, (j, got, per)
    assert any(m.job_id in ids for m in status.migrations)  # progress reached the tail trigger
    # lifecycle: all finished, group released
    for jid in ids:
        rec = SchedulerHandle(h).get_job(jid)
        assert rec.state == "finished" and rec.iterations_done == n, rec
    assert all(g.group_id not in gids for g in SchedulerHandle(h).list_groups())
    # on-policy: the co-executed job equals the same job run solo (same seed), bit for bit
    solo = rollmux.Job(toy_spec(f"solo-{_uid()}", "small"), attach=False)
    fns = make_toy(solo, "small", seed=1)
    so: dict = {}
    loop(solo, fns, n, so, "s")
    assert all(torch.equal(a, b) for a, b in zip(so["s"], out[ids[1]]))


@ray_test
def test_sync_fails_fast_when_a_training_rank_fails_mid_sync(sched):
    """A job on two training nodes whose rank 1 fails in its second sync (its process stays up,
    so no socket closes): the leader sees rank 1's task fail and aborts every sync endpoint of
    the job, so the sync phase fails within seconds (not the collectives' 120 s timeout) and
    names the failed rank and its error."""
    name, h = sched
    jid = f"ff-{_uid()}"
    job = rollmux.Job(dict(toy_spec(jid, "small"), num_train_gpus=2), attach=True, scheduler_name=name)

    @job.state("rollout")
    def build_rollout():
        return {"w": torch.zeros(4)}

    @job.state("train")
    def build_train():
        return {"w": torch.zeros(4), "syncs": 0}

    @job.phase("rollout")
    def rollout(state, iteration, hook):
        return {"it": iteration}

    @job.phase("train")
    def train(state, samples):
        state["w"] = state["w"] + 1
        return {}

    @job.phase("sync")
    def publish(state):
        state["syncs"] += 1
        if rollmux.parallel("train").rank == 1 and state["syncs"] == 2:
            raise RuntimeError("rank 1 lost its device")
        return {"w": state["w"].clone()}

    @job.apply_weights
    def apply(state, weights):
        state["w"] = weights["w"].clone()

    with pytest.raises(Exception, match="rank 1 lost its device"):
        with job:
            for it in range(3):
                train(rollout(it))
                publish()
    assert len(job.info["placement"]["train_nodes"]) == 2
    tl = [e.to_dict() for e in SchedulerHandle(h).group_timeline(job.info["group_id"])]
    syncs = [r for r in tl if r["job_id"] == jid and r["phase"] == "sync"]
    assert [r["ok"] for r in syncs] == [True, False], syncs
    assert syncs[0]["sync_backend"] == "gloo" and syncs[0]["sync_backend_requested"] == "auto"
    bad = syncs[1]
    assert "SyncAbortedError" in bad["error"] and "rank 1 lost its device" in bad["error"], bad["error"]
    assert job.info["placement"]["train_nodes"][1] in bad["error"] and "rollout weights unchanged" in bad["error"]
    assert bad["end"] - bad["start"] < 15.0, bad  # the gloo timeout is 120 s


@ray_test
def test_failing_job_is_isolated_and_released(sched):
    from actors.worker.workers import get_or_create_worker

    name, h = sched
    n = 3
    ids, jobs, out = run_group(name, ["big", "small", "small"], n, fail={1: 1})
    err = out.get(ids[1] + ":error")
    assert isinstance(err, RuntimeError) and "injected failure" in str(err)
    assert len(out[ids[1]]) == 1  # failed during iteration 1
    for jid in (ids[0], ids[2]):  # group-mates keep iterating to the end
        assert len(out[jid]) == n and jid + ":error" not in out
        assert SchedulerHandle(h).get_job(jid).state == "finished"
    rec = SchedulerHandle(h).get_job(ids[1])
    assert rec.state == "failed" and "injected failure" in rec.error
    tl = [e.to_dict() for e in SchedulerHandle(h).group_timeline(jobs[0].info["group_id"])]
    failed = [r for r in tl if r["job_id"] == ids[1] and not r["ok"]]
    assert len(failed) == 1 and failed[0]["phase"] == "train" and failed[0]["iteration"] == 1
    assert not [r for r in tl if r["job_id"] == ids[1] and r["start"] > failed[0]["end"]]
    for node in jobs[1].info["placement"]["rollout_nodes"] + jobs[1].info["placement"]["train_nodes"]:
        hosted = WorkerHandle(get_or_create_worker(node)).hosted()
        assert ids[1] not in {v.job_id for v in hosted}  # its state was dropped


@ray_test
def test_worker_pinned_to_policy_node(ray_cluster):
    import ray

    from actors.worker.workers import get_or_create_worker

    for node in ("rollout-1", "train-0"):
        where = WorkerHandle(get_or_create_worker(node)).where()
        carrying = [n["NodeID"] for n in ray.nodes() if n["Alive"] and f"rollmux_node:{node}" in n["Resources"]]
        assert carrying == [where.ray_node_id]
        assert where.node == node and where.torch_threads == 1
    assert where.pool == "train"


@ray_test
def test_admission_and_refusals_through_the_actor(sched):
    name, h = sched
    jid = f"adm-{_uid()}"
    dry = SchedulerHandle(h).admit(toy_spec(jid, "small"), True)
    assert dry.admitted and SchedulerHandle(h).get_job(jid) is None  # dry run changes nothing
    d = SchedulerHandle(h).admit(toy_spec(jid, "small"))
    assert d.admitted and d.placement.rollout_nodes and d.group_id
    rec = SchedulerHandle(h).get_job(jid)
    assert rec.state == "admitted" and rec.predicted["t_solo_s"] == pytest.approx(4.0)
    again = SchedulerHandle(h).admit(toy_spec(jid, "small"))  # a retry: the original decision
    assert again.admitted and again.replayed and again.group_id == d.group_id
    assert SchedulerHandle(h).admit(toy_spec(jid, "small", slo=6.0)).code == "duplicate"  # another spec
    bad = SchedulerHandle(h).admit({**toy_spec(f"bad-{_uid()}", "small"), "slo": 0.2})
    assert bad.code == "invalid" and "slo" in bad.reason
    huge = SchedulerHandle(h).admit({**toy_spec(f"huge-{_uid()}", "small"), "num_rollout_gpus": 64})
    assert not huge.admitted and huge.code == "never"
    grp = [g for g in SchedulerHandle(h).list_groups() if jid in g.members][0]
    assert grp.cost_usd_per_h > 0 and grp.slack_s == pytest.approx(grp.t_cycle_s - grp.t_load_s)
    dep = SchedulerHandle(h).depart(jid)  # no driver ever ran it: withdrawn
    assert dep.job_id == jid and dep.state == "cancelled" and SchedulerHandle(h).get_job(jid).state == "cancelled"
    assert SchedulerHandle(h).depart(f"nope-{_uid()}") is None


@ray_test
def test_lost_driver_is_evicted_and_mates_continue(ray_cluster, local_cluster_spec):
    """A driver that dies between phases (no heartbeat) must not stall its group-mates."""
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    name = f"test-lease-{_uid()}"
    h = get_or_create_scheduler(local_cluster_spec, name=name, controller_kw={"lease_s": 5.0})  # > 2 heartbeats
    try:
        lost = rollmux.Job(toy_spec(f"lost-{_uid()}", "big"), attach=True, scheduler_name=name)
        r, t, p = make_toy(lost, "big", seed=0)
        mate = rollmux.Job(toy_spec(f"mate-{_uid()}", "small"), attach=True, scheduler_name=name)
        fns = make_toy(mate, "small", seed=1)
        t(r(0))
        p()
        lost._runtime._stop.set()  # the driver "dies": no more heartbeats, no more phases
        out: dict = {}
        loop(mate, fns, 3, out, "m")
        assert len(out["m"]) == 3 and "m:error" not in out
        rec = SchedulerHandle(h).get_job(lost.job_id)
        assert rec.state == "failed" and "driver lost" in rec.error_detail
        assert "driver stopped reporting" in rec.error and "step 1" in rec.error
        assert SchedulerHandle(h).get_job(mate.job_id).state == "finished"
    finally:
        ray.kill(h, no_restart=True)


# ---- GroupController logic without Ray (the actor's class driven directly on an event loop)
def _ctrl(**kw):
    from actors.scheduler.group_controller import GroupControllerImpl

    return GroupControllerImpl("group-u", None, metrics_flush_s=0, metrics_enabled=False, **kw)


def _rec(node, t0, t1, ok=True, switch="warm"):
    from rollmux.messages import PhaseRecord

    return PhaseRecord(node=node, start=t0, end=t1, switch=switch, switch_s=0.01, ok=ok,
                       error=None if ok else "RuntimeError: boom")


def test_controller_grants_round_robin_and_removes_failed_jobs():
    import asyncio

    from actors.scheduler.group_controller import PermitError

    async def scenario():
        c = _ctrl(lease_s=0)
        for j in ("a", "b", "c"):
            await c.add_job(j, ["rollout-0"], ["train-0"])
        assert (await c.status()).pending == ("a", "b", "c")  # no driver yet: nobody blocked
        for j in ("a", "b", "c"):
            await c.attach(j)
        order = []

        async def job(j, fail_train_at=None):
            for it in range(2):
                for ph in ("rollout", "train", "sync"):
                    g = await c.acquire(j, ph, timeout_s=10)
                    assert g.iteration == it
                    order.append((j, ph, it))
                    await asyncio.sleep(0.001)
                    ok = not (ph == "train" and it == fail_train_at)
                    await c.release(g, _rec("rollout-0" if ph == "rollout" else "train-0", 0, 0, ok))
                    if not ok:
                        return

        t = [asyncio.create_task(job("a")), asyncio.create_task(job("b", fail_train_at=0)),
             asyncio.create_task(job("c"))]
        await asyncio.wait_for(asyncio.gather(*t), 20)
        rolls = [j for j, ph, _ in order if ph == "rollout"]
        assert rolls == ["a", "b", "c", "a", "c"]  # round-robin; b left after its failed training
        st = await c.status()
        assert set(st.jobs) == {"a", "c"} and st.gone["b"].startswith("failed")
        assert st.jobs["a"].iterations_done == 2 and st.queues["rollout-0"] == ("a", "c")
        with pytest.raises(PermitError, match="failed"):
            await c.acquire("b", "rollout", timeout_s=1)
        with pytest.raises(PermitError, match="next phase is rollout"):
            await c.acquire("a", "train", timeout_s=1)
        assert st.metrics["switches"]["warm"] == 14  # a, c: 6 phases each; b: rollout + failed train
        return c

    c = asyncio.run(scenario())
    failed = [r for r in c.timeline if not r.record.ok]
    assert [(r.job_id, r.phase, r.iteration) for r in failed] == [("b", "train", 0)]


def test_controller_job_without_sync_iterates_on_training():
    import asyncio

    async def scenario():
        c = _ctrl(lease_s=0)
        for j in ("a", "b"):
            await c.add_job(j, ["rollout-0"], ["train-0"])
            await c.attach(j)  # attached before its phases are known: has_sync defaults to True
        assert await c.configure_job("a", has_sync=False)  # a registers no sync phase
        for it in range(2):
            for j, phases in (("a", ("rollout", "train")), ("b", ("rollout", "train", "sync"))):
                for ph in phases:
                    g = await c.acquire(j, ph, timeout_s=5)
                    assert g.iteration == it
                    await c.release(g, _rec("rollout-0" if ph == "rollout" else "train-0", 0, 0))
        st = await c.status()
        assert st.jobs["a"].iterations_done == 2 and st.jobs["b"].iterations_done == 2
        assert not [r for r in c.timeline if r.job_id == "a" and r.phase == "sync"]

    asyncio.run(scenario())


def test_controller_long_tail_decision_and_migration():
    import asyncio

    async def scenario(migrate):
        c = _ctrl(lease_s=0, migrate=migrate)
        for j in ("a", "b"):
            await c.add_job(j, ["rollout-0"], ["train-0"])
            await c.attach(j)
        await c.acquire("a", "rollout", timeout_s=1)
        assert await c.progress(RolloutProgress("a", 3, 5)) is None  # 60% < 80% trigger
        d = await c.progress(RolloutProgress("a", 4, 5))
        assert d.next_rollout == "b" and d.acted is migrate and d.tail_workers == ("rollout-0",)
        assert await c.progress(RolloutProgress("a", 5, 5)) is None  # one decision per rollout
        got = None
        try:
            got = await c.acquire("b", "rollout", timeout_s=0.3)
        except TimeoutError:
            pass
        return got

    assert asyncio.run(scenario(False)) is None  # decision recorded only: b still waits for a
    assert asyncio.run(scenario(True)).job_id == "b"  # migrated: b's rollout starts beside a's tail


def test_controller_evicts_silent_driver():
    import asyncio

    async def scenario():
        c = _ctrl(lease_s=0.3)
        for j in ("a", "b"):
            await c.add_job(j, ["rollout-0"], ["train-0"])
            await c.attach(j)
        async def beat():  # b's driver is alive (its heartbeat thread runs while it waits)
            for _ in range(100):
                await c.heartbeat("b")
                await asyncio.sleep(0.05)

        hb = asyncio.create_task(beat())
        await c.acquire("a", "rollout", timeout_s=1)  # granted, then a's driver dies before using it
        g = await c.acquire("b", "rollout", timeout_s=5)  # a is evicted (lease), then b runs
        hb.cancel()
        st = await c.status()
        c.closed = True
        return g, st

    g, st = asyncio.run(scenario())
    assert g.job_id == "b" and "driver lost" in st.gone["a"]


def test_long_tail_settings_reach_controllers_and_simulator():
    """``configs/scheduler.yaml``'s long-tail settings (trigger fraction, tail GPUs, overhead,
    whether migration acts) reach every new GroupController and the simulator's default."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from actors.scheduler.group_controller import GroupControllerImpl
    from actors.scheduler.kv import MemoryKV
    from rollmux.admission import load_scheduler_config
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.intra_group import LongTailPolicy
    from rollmux.sim.simulator import Realisation

    sim = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    g = GlobalSchedulerImpl(sim, kv=MemoryKV(), **unit_kw(),
                            config={"tail_trigger_fraction": 0.5, "tail_gpus": 2, "migration_overhead_s": 3.0,
                                    "driver_lease_s": 7.0})
    c = GroupControllerImpl("group-0", None, **g.controller_kw, metrics_enabled=False)
    assert c.long_tail == LongTailPolicy(0.5, 2, 3.0) and c.migrate is True
    assert c.ledger.lease_s == 7.0  # the driver lease comes from configs/scheduler.yaml too
    off = GlobalSchedulerImpl(sim, kv=MemoryKV(), **unit_kw(), config={"tail_migration": False})
    assert GroupControllerImpl("group-1", None, **off.controller_kw, metrics_enabled=False).migrate is False
    # an explicit controller_kw still wins
    g2 = GlobalSchedulerImpl(sim, kv=MemoryKV(), **unit_kw(), controller_kw={"migrate": False})
    assert g2.controller_kw["migrate"] is False and g2.controller_kw["tail_trigger_fraction"] == 0.8
    cfg = load_scheduler_config()
    real = Realisation(sim, stochastic=True)
    assert real.long_tail == cfg.long_tail_policy() and real.migrate is cfg.tail_migration


def test_controller_migrates_only_when_another_rollout_waits():
    """A lone job's tail-bound rollout is recorded but nothing moves (nobody waits for its node)."""
    import asyncio

    async def scenario():
        c = _ctrl(lease_s=0, migrate=True)
        await c.add_job("a", ["rollout-0"], ["train-0"])
        await c.attach("a")
        await c.acquire("a", "rollout", timeout_s=1)
        d = await c.progress(RolloutProgress("a", 4, 5))
        assert d.next_rollout is None and d.acted is False

    asyncio.run(scenario())


def test_cpu_pinning_gives_each_node_its_cpu(local_cluster_spec):
    import json
    import subprocess
    import sys

    from actors.ops.local_cluster import cpu_pinning

    pin = cpu_pinning(local_cluster_spec, cpus=[0, 1])
    assert pin == {"rollout-0": [0], "train-0": [1], "rollout-1": [0], "train-1": [1]}
    assert cpu_pinning(local_cluster_spec, cpus=[0, 1, 2, 3])["train-1"] == [3]
    # a worker process pins itself from the environment the cluster passes down
    code = "from actors.worker.workers import pin_to_cpus; import os; print(pin_to_cpus('train-0'), sorted(os.sched_getaffinity(0)))"
    env = {**__import__("os").environ, "ROLLMUX_CPU_PIN": json.dumps({"train-0": [0]})}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["[0]", "[0]"]


@ray_test
def test_killing_the_group_controller_twice_fails_no_job(sched):
    """A three-job run whose GroupController is killed twice (Ray restarts it): the restarted
    controller re-reads the membership from the scheduler and takes each job's position in its
    meta-iteration from the driver's next permit request; every job finishes all iterations."""
    import ray

    from actors.naming import NAMESPACE

    name, h = sched
    n = 4
    kinds = ["big", "small", "small"]
    ids = [f"{k}-{_uid()}" for k in kinds]
    jobs = [rollmux.Job(toy_spec(jid, kind), attach=True, scheduler_name=name) for jid, kind in zip(ids, kinds)]
    fns = [make_toy(job, kind, seed=i) for i, (job, kind) in enumerate(zip(jobs, kinds))]
    out: dict = {}
    threads = [threading.Thread(target=loop, args=(j, f, n, out, j.job_id)) for j, f in zip(jobs, fns)]
    for t in threads:
        t.start()
    ctl = wait_until(lambda: (getattr(jobs[0], "info", None) or {}).get("controller"), timeout_s=60, interval_s=0.1,
                     what="controller attached")
    done_at_kill = []  # iterations job 0 had finished when its controller was killed
    for at_iter in (1, 2):  # kill while jobs are mid-iteration
        wait_until(lambda: len(out.get(ids[0], [])) >= at_iter or out.get(ids[0] + ":error"), timeout_s=120,
                   interval_s=0.05, what=f"iteration {at_iter}")
        time.sleep(0.1)  # inside the next iteration's phases
        done_at_kill.append(len(out.get(ids[0], [])))
        ray.kill(ray.get_actor(ctl, namespace=NAMESPACE), no_restart=False)
    for t in threads:
        t.join(timeout=180)
    assert done_at_kill[0] < n, done_at_kill  # the first kill landed while the run was in progress
    assert not any(t.is_alive() for t in threads)
    assert not [k for k in out if k.endswith(":error")], {k: v for k, v in out.items() if k.endswith(":error")}
    for jid in ids:
        rec = SchedulerHandle(h).get_job(jid)
        assert rec.state == "finished" and rec.iterations_done == n, rec
