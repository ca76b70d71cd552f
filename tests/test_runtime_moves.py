"""Departure re-packing carried out by the Ray runtime: job moves (GlobalScheduler, GroupController,
workers, ScheduledRuntime).

Scenario (deterministic, ``max_group_size=2`` on the local 2+2-node cluster): A (big) and B
(small) share group-0 on rollout-0/train-0; C (small) finds group-0 full and opens group-1 on
rollout-1/train-1. When A departs, the policy dissolves group-0 by moving B into group-1
(cost drops by one node pair; B's and C's SLOs hold).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid

import pytest
import torch

import rollmux
from actors.scheduler.kv import MemoryKV
from actors.handles import ActorLost, CallTimeout, ControllerHandle, SchedulerHandle, WorkerHandle
from factories import kill_scheduler_and_controllers, make_toy, toy_spec, unit_kw, wait_until
from rollmux.answers import Departure
from rollmux.messages import EventKind, MembershipAck, MembershipPush, RuntimeEvent
from rollmux.records import JobState
from test_runtime_actors import loop

pytestmark = [pytest.mark.timeout(180)]


def _uid() -> str:
    return uuid.uuid4().hex[:6]


def _admit_three(admit, tag: str) -> tuple[str, str, str]:
    a, b, c = (f"{x}-{tag}" for x in ("A", "B", "C"))
    got = [admit(toy_spec(a, "big")), admit(toy_spec(b, "small")), admit(toy_spec(c, "small"))]
    assert [(d.group_id, d.strategy) for d in got] == [("group-0", "isolated"), ("group-0", "direct"),
                                                             ("group-1", "isolated")], got
    return a, b, c


def test_departure_moves_job_record_and_checkpoint_without_ray(local_cluster_spec):
    """Unit level (no Ray): the move is in the departure's result, the moved job's record, the
    group table and the checkpoint a restarted scheduler restores."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    kv = MemoryKV()
    s = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=2)
    a, b, c = _admit_three(s.admit, "u")
    assert s.get_job(b).predicted_slowdown == pytest.approx(2.5)  # B waits on big A's 10 s cycle
    out = s.depart(a)  # A never ran (no driver reported it running): withdrawn, ``cancelled``
    assert out.group_dissolved and out.released_nodes == ("rollout-0", "train-0")
    assert out.state == "cancelled" and out.dissolved_groups == ("group-0",)
    assert [m.model_dump(mode="json") for m in out.moves] == [{"job_id": b, "from_group": "group-0", "to_group": "group-1",
                             "placement": {"rollout_nodes": ["rollout-1"], "train_nodes": ["train-1"]},
                             "move_s": pytest.approx(0.4), "at": pytest.approx(time.time(), abs=60),
                             "trigger": a, "from_nodes": ["rollout-0", "train-0"],
                             # no controller of group-0 ever ran (no driver attached): nothing to wait for
                             "stopped_at_s": out.moves[0].at, "drained_at_s": out.moves[0].at,
                             "drained": "no driver"}]  # (0.5 + 0.5) GB * 8 / 20 Gb/s
    rec = s.get_job(b)
    assert rec.group_id == "group-1" and rec.controller == "rollmux-group-1"
    assert rec.placement.model_dump() == {"rollout_nodes": ["rollout-1"], "train_nodes": ["train-1"]}
    assert [(m.from_group, m.to_group, m.trigger) for m in rec.moves] == [("group-0", "group-1", a)]
    assert rec.state == "admitted" and rec.predicted_slowdown == pytest.approx(1.0)  # B, C interleave
    assert [(g.group_id, sorted(g.members)) for g in s.list_groups()] == [("group-1", sorted([b, c]))]
    assert [m.job_id for m in s.group_members("group-1")] == [c, b]  # planned round-robin order: b joined last
    # a restarted scheduler (same KV) has the moved record and the new table
    r = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=2)
    assert r.restored and r.get_job(b) == rec and r.list_groups() == s.list_groups()
    assert r.igs.group_of(b).group_id == "group-1"
    # the moved job departs normally from its new group; nothing left to re-pack
    out = r.depart(b)
    assert out == Departure(b, JobState.CANCELLED)  # (it never ran)
    assert r.depart(b) == Departure(b, JobState.CANCELLED, already_ended=True)
    assert r.depart(c).released_nodes == ("rollout-1", "train-1") and r.list_groups() == []
    # switched off: plain Alg. 1, B stays where it was admitted (also after a restore)
    kv = MemoryKV()
    off = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0,
                              max_group_size=2, repack_on_departure=False)
    a, b, c = _admit_three(off.admit, "off")
    off = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0)
    assert off.depart(a) == Departure(a, JobState.CANCELLED)
    assert off.get_job(b).group_id == "group-0" and not off.get_job(b).moves



def test_a_move_fences_its_old_nodes_for_other_groups_until_it_drained(local_cluster_spec):
    """Without Ray: B (running, its group's controller up) moves from group-0 to group-1 when A
    departs; D is then admitted onto B's old node pair. D is fenced off those nodes (B may still
    run its last iteration's phases there), B and C are not; the fence survives a restart;
    ``stopped`` from another group or ``drained`` of another group change nothing, ``stopped``
    from group-0 starts the bound but keeps the fence, ``drained`` (B's driver exported its state
    from group-0's workers) lifts it. Each other way a drain completes lifts it too: overdue after
    the stop, a failure report, no stop at all within the bound; a move of a job that had not
    started waits for nothing."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from rollmux.drain import DRAIN_GRACE_S, DRAIN_MAX_S

    def scenario(tag: str, kv, *, running: bool = True):
        s = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=2)
        a, b, c = _admit_three(s.admit, tag)
        s.ensure_controller("group-0")
        if running:
            s.report(b, RuntimeEvent(EventKind.RUNNING))
        (mv,) = s.depart(a).moves
        d = f"D-{tag}"
        assert s.admit(toy_spec(d, "small")).group_id == "group-2"
        assert s.get_job(d).placement.model_dump() == {"rollout_nodes": ["rollout-0"], "train_nodes": ["train-0"]}
        return s, b, c, d, mv

    def fences(s) -> dict:
        return {m.job_id: m.fenced for g in ("group-1", "group-2") for m in s.targets.target(g).members}

    kv = MemoryKV()
    s, b, c, d, mv = scenario("f", kv)
    assert (mv.from_nodes, mv.stopped_at_s, mv.drained) == (["rollout-0", "train-0"], None, None)
    assert fences(s) == {c: (), b: (), d: ("rollout-0", "train-0")}
    s = GlobalSchedulerImpl(local_cluster_spec, kv=kv, **unit_kw(), metrics_flush_s=0, max_group_size=2)
    assert fences(s)[d] == ("rollout-0", "train-0")  # restarted from the checkpoint: still fenced
    s.report(b, RuntimeEvent(EventKind.STOPPED, group_id="group-1"))  # not the group it left: nothing changes
    s.report(b, RuntimeEvent(EventKind.DRAINED, group_id="group-1"))
    assert s.get_job(b).moves[-1].stopped_at_s is None and fences(s)[d] == ("rollout-0", "train-0")
    s.report(b, RuntimeEvent(EventKind.STOPPED, group_id="group-0"))  # left group-0 at its boundary
    t_stop = s.get_job(b).moves[-1].stopped_at_s
    assert t_stop >= mv.at and fences(s)[d] == ("rollout-0", "train-0")
    assert s.drain_overdue_pending(now=t_stop + DRAIN_GRACE_S - 1) == []
    s.report(b, RuntimeEvent(EventKind.DRAINED, group_id="group-0"))  # its driver exported its state from there
    m = s.get_job(b).moves[-1]
    assert (m.drained, m.stopped_at_s) == ("exported", t_stop) and m.drained_at_s >= t_stop
    assert fences(s) == {c: (), b: (), d: ()}
    assert s.get_job(b).state == "running" and s.get_job(b).group_id == "group-1"

    # a driver that never reports its export: drained once overdue after the stop
    s, b, c, d, mv = scenario("o", MemoryKV())
    s.report(b, RuntimeEvent(EventKind.STOPPED, group_id="group-0"))
    t_stop = s.get_job(b).moves[-1].stopped_at_s
    assert s.drain_overdue_pending(now=t_stop + DRAIN_GRACE_S + 1) == [b]
    assert s.get_job(b).moves[-1].drained.startswith("overdue: its driver") and fences(s)[d] == ()
    # no stop reported at all (lost with a restart, its driver dead too): drained at the bound
    s, b, c, d, mv = scenario("m", MemoryKV())
    assert s.drain_overdue_pending(now=mv.at + DRAIN_MAX_S - 1) == [] and fences(s)[d]
    assert s.drain_overdue_pending(now=mv.at + DRAIN_MAX_S + 1) == [b] and fences(s)[d] == ()
    # its controller evicted it (its driver was lost): the failure report drains it
    s, b, c, d, mv = scenario("x", MemoryKV())
    s.report(b, RuntimeEvent(EventKind.FAILED, error="driver lost: no heartbeat for 31.0s"))
    assert s.get_job(b).moves[-1].drained.startswith("driver lost") and fences(s)[d] == ()
    # B had not started (admitted, no driver registered it): nothing of it ran on its old nodes
    s, b, c, d, mv = scenario("n", MemoryKV(), running=False)
    assert (mv.drained, mv.drained_at_s) == ("not started", mv.at) and fences(s)[d] == ()


def _ctrl():
    from actors.scheduler.group_controller import GroupControllerImpl

    return GroupControllerImpl("group-m", None, metrics_flush_s=0, metrics_enabled=False, lease_s=0)


def _rec(node):
    from rollmux.messages import PhaseRecord

    return PhaseRecord(node=node, start=time.time(), end=time.time(), switch="warm", switch_s=0.0, ok=True)


def test_controller_moved_removal_waits_for_the_iteration_boundary():
    """A "moved" removal mid-iteration lets the job finish its iteration (its grants and
    releases are honoured), then drops it; a job between iterations leaves at once; later
    permits say the job moved."""
    from actors.scheduler.group_controller import PermitError

    async def scenario():
        c = _ctrl()
        for j in ("a", "b"):
            await c.add_job(j, ["rollout-0"], ["train-0"])
            await c.attach(j)
        for j in ("a", "b"):  # iteration 0 of both
            for ph in ("rollout", "train", "sync"):
                g = await c.acquire(j, ph, timeout_s=5)
                await c.release(g, _rec("rollout-0" if ph == "rollout" else "train-0"))
        held = await c.acquire("a", "rollout", timeout_s=5)  # a holds a grant now
        assert await c.remove_job("a", "moved to group-9")
        assert await c.remove_job("b", "moved to group-9")  # b is between iterations: leaves now
        st = await c.status()
        assert list(st.jobs) == ["a"] and st.moving == {"a": "moved to group-9"}
        assert st.gone == {"b": "moved to group-9"}
        assert not await c.remove_job("b", "moved to group-9")  # idempotent
        await c.release(held, _rec("rollout-0"))  # the running phase completes normally
        for ph in ("train", "sync"):  # ... and so does the rest of a's iteration
            g = await c.acquire("a", ph, timeout_s=5)
            assert g.iteration == 1 and c.ledger.grants[("a", "train")].turn == 1
            await c.release(g, _rec("train-0"))
        st = await c.status()
        assert st.jobs == {} and st.moving == {} and st.gone["a"] == "moved to group-9"
        assert [(r.job_id, r.phase, r.iteration) for r in c.timeline if r.job_id == "a"][-3:] == \
            [("a", "rollout", 1), ("a", "train", 1), ("a", "sync", 1)]
        for j in ("a", "b"):
            with pytest.raises(PermitError, match="moved to another group"):
                await c.acquire(j, "rollout", timeout_s=1)
        assert not await c.heartbeat("a")
        # moved back before it left: the deferred removal is cancelled
        await c.add_job("x", ["rollout-0"], ["train-0"])
        await c.attach("x")
        await c.acquire("x", "rollout", timeout_s=5)
        await c.remove_job("x", "moved to group-9")
        assert await c.add_job("x", ["rollout-0"], ["train-0"]) and (await c.status()).moving == {}

    asyncio.run(scenario())


def test_controller_takes_the_newest_push_when_pushes_arrive_out_of_order():
    """Ray does not run an async actor's calls in submission order: a new controller can get the
    departure's push (B moved, A departed) before the older push that added A and B. The newest
    push is the whole target state: the controller records both as gone (B: moved), ignores the
    older push as stale, and B's driver is told it moved, not "not a member"."""
    from actors.scheduler.group_controller import PermitError

    async def scenario():
        c = _ctrl()
        newer = await c.sync_members(MembershipPush.of("group-m", [], {"a": "departed", "b": "moved to group-1"}, seq=11))
        assert newer == MembershipAck(removed=("a", "b"))
        older = await c.sync_members(MembershipPush.of("group-m", [
            {"job_id": j, "rollout_nodes": ["rollout-0"], "train_nodes": ["train-0"], "slo": 2.0} for j in ("a", "b")],
            {}, seq=10))
        assert older == MembershipAck(stale=True)
        st = await c.status()
        assert st.gone == {"a": "departed", "b": "moved to group-1"} and st.pending == () and st.jobs == {}
        with pytest.raises(PermitError, match="moved to another group"):
            await c.acquire("b", "rollout", timeout_s=1)
        # a newer push adding an id it recorded as gone (re-admitted) makes it a member again
        again = await c.sync_members(MembershipPush.of("group-m", [
            {"job_id": "a", "rollout_nodes": ["rollout-0"], "train_nodes": ["train-0"], "slo": 2.0}],
            {"b": "moved to group-1"}, seq=12))
        assert again == MembershipAck(added=("a",))
        st = await c.status()
        assert st.pending == ("a",) and st.gone == {"b": "moved to group-1"}

    asyncio.run(scenario())


def _gone(actor: str) -> bool:
    import ray

    try:
        ray.get_actor(actor, namespace="rollmux")
        return False
    except ValueError:
        return True


@pytest.mark.ray
def test_move_updates_controllers_and_survives_scheduler_restart(ray_cluster, local_cluster_spec, tmp_path):
    """Ray actors, no drivers: the old controller drops the moved job, the new one learns it
    (pending); a restarted scheduler restores the record and replays the move idempotently."""
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler

    name = f"test-moves-{_uid()}"
    h = get_or_create_scheduler(local_cluster_spec, name=name, checkpoint_path=str(tmp_path / "ck"), max_group_size=2)
    try:
        a, b, c = _admit_three(lambda sp: SchedulerHandle(h).admit(sp), _uid())
        ctrl = {g: ControllerHandle(name=SchedulerHandle(h).ensure_controller(g)) for g in ("group-0", "group-1")}
        out = SchedulerHandle(h).depart(a)
        assert [(m.job_id, m.from_group, m.to_group) for m in out.moves] == [(b, "group-0", "group-1")]

        seen_old: list = []

        def pushed():  # the scheduler pushes to controllers asynchronously (never waits on them)
            try:  # group-0 is dissolved: its controller exits a moment after its final push
                old = ctrl["group-0"].status()
                if len(old.gone) == 2:
                    seen_old.append(old)
            except ActorLost:
                seen_old.append("exited")
            new = ctrl["group-1"].status()
            return (seen_old[-1], new) if seen_old and len(new.pending) == 2 else None

        old, new = wait_until(pushed, timeout_s=90, what="controllers converged")
        assert old == "exited" or (old.gone == {a: "departed", b: "moved to group-1"} and old.pending == ())
        assert sorted(new.pending) == sorted([b, c]) and new.gone == {}
        # no leaked actor: the dissolved group's controller ends itself (its moved job was pending)
        wait_until(lambda: _gone(f"{name}-group-0"), timeout_s=60, what="group-0's controller exited")
        assert new.order == (c, b)  # the planned round-robin order reached the controller
        rec = SchedulerHandle(h).get_job(b)
        assert rec.group_id == "group-1" and rec.controller == f"{name}-group-1"
        assert [g.group_id for g in SchedulerHandle(h).list_groups()] == ["group-1"]

        ray.kill(h, no_restart=False)  # Ray restarts it; it restores from the file checkpoint
        health = wait_until(lambda: (lambda x: x if x.restored else None)(SchedulerHandle(h).health(timeout_s=10)),
                            timeout_s=120, interval_s=0.5, what="scheduler restored",
                            ignore=(ActorLost, CallTimeout))
        assert health is not None and health.restored and health.jobs == 2
        assert SchedulerHandle(h).get_job(b) == rec
        assert [m.job_id for m in SchedulerHandle(h).group_members("group-1")] == [c, b]
        new = ctrl["group-1"].status()
        assert sorted(new.pending) == sorted([b, c]) and _gone(f"{name}-group-0")
        for j in (b, c):
            SchedulerHandle(h).depart(j)
    finally:
        kill_scheduler_and_controllers(h, name)


@pytest.mark.ray
@pytest.mark.parametrize("switch,sync_backend", [("warm", "object_store"), ("cold", "gloo")])
def test_job_moved_mid_run_finishes_on_policy(ray_cluster, local_cluster_spec, switch, sync_backend):
    """End to end with real drivers: B is moved while its iteration 1 is half done (after its
    rollout). It finishes iteration 1 on the old group (iteration-boundary rule), re-homes on its
    next permit, carries its state and pending weights to the new nodes and runs iterations 2-3
    beside C; its weights equal a solo run's bit for bit, as do C's."""
    import ray

    import test_runtime_actors
    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.worker.workers import get_or_create_worker

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(test_runtime_actors)
    name = f"test-move-e2e-{_uid()}"
    # the move under test is departure re-packing's: worst-case planning, so that the SLO watch (the
    # default's, which acts on the toy jobs' measured phases after their first iteration) moves nothing
    # first (its moves take the same path: tests/test_slo_watch_runtime.py)
    h = get_or_create_scheduler(local_cluster_spec, name=name, max_group_size=2, config={"profile_source": "worst_case"})
    n = 4
    try:
        a, b, c = _admit_three(lambda sp: SchedulerHandle(h).admit(sp), _uid())
        jb = rollmux.Job(toy_spec(b, "small"), attach=True, scheduler_name=name, job_id=b, switch=switch,
                         sync_backend=sync_backend)
        rb, tb, pb = make_toy(jb, "small", seed=3)
        jc = rollmux.Job(toy_spec(c, "small"), attach=True, scheduler_name=name, job_id=c,
                         sync_backend=sync_backend)
        fc = make_toy(jc, "small", seed=5)
        out: dict = {}
        c_first = threading.Event()  # C's iteration 0 is done
        ctrl1 = ControllerHandle(name=SchedulerHandle(h).ensure_controller("group-1"))

        def run_c():  # one iteration, then wait until B has joined group-1's queues, then the rest
            r, t, p = fc
            try:
                t(r(0))
                p()
                out.setdefault("c", []).append(None)
                c_first.set()
                try:
                    wait_until(lambda: b in ctrl1.status().jobs, timeout_s=60, interval_s=0.05,
                               what="B in group-1's queues")
                except TimeoutError:
                    pass  # C goes on; the assertions below tell what happened
                for it in range(1, n):
                    out["c"].append(t(r(it))["w"])
                    p()
                jc.finish()
            except BaseException as e:
                out["c:error"] = e
                c_first.set()
                jc.fail(e)

        tc = threading.Thread(target=run_c)
        tc.start()
        # C's first iteration (its first sync opens its gloo endpoints) completes before B starts, so no
        # two first syncs race; B's iteration 0 then runs while C waits for it to join group-1
        assert c_first.wait(120) and "c:error" not in out, (out.get("c:error"), ctrl1.status())
        ws = []
        ws.append(tb(rb(0))["w"])
        pb()
        x = rb(1)  # B is mid-iteration 1 when A departs
        dep = SchedulerHandle(h).depart(a)
        assert [(m.job_id, m.from_group, m.to_group) for m in dep.moves] == [(b, "group-0", "group-1")]
        old_ctrl = ControllerHandle.of_group("group-0", name)
        try:  # the scheduler's push reaches the controller asynchronously
            wait_until(lambda: old_ctrl.status().moving, timeout_s=90, what="the move pushed")
        except TimeoutError:
            pass
        assert old_ctrl.status().moving == {b: "moved to group-1"}
        ws.append(tb(x)["w"])  # iteration 1 completes on group-0
        pb()
        assert old_ctrl.status().gone[b] == "moved to group-1"
        for it in range(2, n):  # the first permit is refused -> re-home -> group-1
            ws.append(tb(rb(it))["w"])
            pb()
        jb.finish()
        tc.join(timeout=120)
        assert not tc.is_alive() and "c:error" not in out, out.get("c:error")

        rt = jb._runtime
        assert jb.info["group_id"] == "group-1" and rt.rollout_nodes == ["rollout-1"] and rt.train_nodes == ["train-1"]
        assert [(m["from_group"], m["to_group"], m["iteration"]) for m in rt.moves] == [("group-0", "group-1", 2)]
        rec = SchedulerHandle(h).get_job(b)
        assert rec.state == "finished" and rec.iterations_done == n and len(rec.moves) == 1
        # phase order: iterations 0-1 on group-0's nodes, 2-3 on group-1's, first phase per pool "moved"
        tl0 = [e.to_dict() for e in SchedulerHandle(h).group_timeline("group-0") if e.job_id == b]
        tl1 = [e.to_dict() for e in SchedulerHandle(h).group_timeline("group-1") if e.job_id == b]
        seq = [(r["phase"], r["iteration"]) for r in sorted(tl0 + tl1, key=lambda r: r["start"])]
        assert seq == [(ph, it) for it in range(n) for ph in ("rollout", "train", "sync")]
        assert {r["iteration"] for r in tl0} == {0, 1} and {r["iteration"] for r in tl1} == {2, 3}
        assert {r["node"] for r in tl0} == {"rollout-0", "train-0"} and {r["node"] for r in tl1} == {"rollout-1", "train-1"}
        assert all(r["ok"] for r in tl0 + tl1)
        # the move's drain off group-0's nodes (rollmux.drain): group-0's controller reported B stopped after
        # its last phase there ended, B's driver reported its state exported before its first phase on group-1
        (mv,) = rec.moves
        assert mv.from_nodes == ["rollout-0", "train-0"] and mv.drained == "exported", mv
        assert max(r["end"] for r in tl0) <= mv.stopped_at_s <= mv.drained_at_s <= min(r["start"] for r in tl1)
        first = {(r["phase"], r["iteration"]): r["switch"] for r in tl1}
        assert first[("rollout", 2)] == "moved" and first[("train", 2)] == "moved"
        assert first[("sync", 2)] == ("warm" if switch == "warm" else "cold")
        assert {r["sync_backend"] for r in tl0 + tl1 if r["phase"] == "sync"} == {sync_backend}
        # C's group-1 queues took B in at its planned place (after C, in the round C had just
        # served: B's rollout before C's second), then round-robin C, B until B is done
        tlc = [e.to_dict() for e in SchedulerHandle(h).group_timeline("group-1") if e.phase == "rollout"]
        assert [r["job_id"] for r in sorted(tlc, key=lambda r: r["start"])] == [c, b, c, b, c, c], \
            [(r["job_id"], r["iteration"], r["start"], r["end"]) for r in sorted(tlc, key=lambda r: r["start"])]
        try:  # metric totals are flushed by a background thread every 1 s
            wait_until(lambda: ctrl1.status().metrics["switches"].get("moved") == 2, timeout_s=10,
                       what="moved switches counted")
        except TimeoutError:
            pass
        switches = ctrl1.status().metrics["switches"]
        assert switches.get("moved") == 2  # B's first rollout and first training on group-1
        for node in ("rollout-0", "train-0"):  # exported by the move
            assert b not in {x.job_id for x in WorkerHandle(get_or_create_worker(node)).hosted()}
        for node in ("rollout-1", "train-1"):  # finish() unregisters asynchronously
            try:
                wait_until(lambda: b not in {x.job_id for x in WorkerHandle(get_or_create_worker(node)).hosted()}, timeout_s=5,
                           interval_s=0.05, what=f"{b} unregistered on {node}")
            except TimeoutError:
                pass
            assert b not in {x.job_id for x in WorkerHandle(get_or_create_worker(node)).hosted()}
        # on-policy: B (moved mid-run) and C equal solo runs with the same seeds, bit for bit
        for seed, got, skip in ((3, ws, 0), (5, out["c"], 1)):
            solo = rollmux.Job(toy_spec(f"solo-{_uid()}", "small"), attach=False)
            so: dict = {}
            loop(solo, make_toy(solo, "small", seed=seed), n, so, "s")
            assert len(got) == n and all(torch.equal(u, v) for u, v in zip(so["s"][skip:], got[skip:]))
    finally:
        kill_scheduler_and_controllers(h, name)
