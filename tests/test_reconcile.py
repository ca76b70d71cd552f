"""The GlobalScheduler's reconcile path without Ray: fake handles (``tests/factories.py``) stand in
for the controllers and workers (:class:`actors.scheduler.reconciler.HandleFactory`), so pushes,
acknowledgements, re-sends, restarts, attaches and worker releases are driven step by step."""

from __future__ import annotations

import asyncio

import pytest

from actors.scheduler.kv import MemoryKV
from factories import FakeAck, FakeController, FakeHandles, InProcessWorker, small_spec, unit_kw
from rollmux.messages import EventKind, RuntimeEvent


def _sched(handles, kv=None, **kw):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from rollmux.config import CONFIG_DIR, load_cluster

    return GlobalSchedulerImpl(load_cluster(CONFIG_DIR / "cluster_local.yaml"), kv=kv or MemoryKV(),
                               max_group_size=2, **unit_kw(handles), **kw)


def test_admission_pushes_the_groups_membership_and_an_ack_clears_it():
    ack = FakeAck(pending=True)  # the controller's answer to every push, released below
    ctrl = FakeController(answer=lambda p: ack)
    s = _sched(FakeHandles({"group-0": ctrl}))  # a controller of group-0 exists (found at start)
    ctrl.pushes.clear()
    assert s.admit(small_spec("a")).admitted and s.admit(small_spec("b")).admitted
    assert [[m.job_id for m in p.members] for p in ctrl.pushes] == [["a"], ["a", "b"]]
    assert [p.seq for p in ctrl.pushes] == sorted({p.seq for p in ctrl.pushes})  # increasing, unique
    assert s.health().unacked_pushes == 1
    assert s.reconcile_once() == {"pushed": [], "acked": []}  # not answered yet: nothing to re-send
    ack.pending = False
    assert s.reconcile_once() == {"pushed": [], "acked": ["group-0"]} and s.health().unacked_pushes == 0
    assert len(ctrl.pushes) == 2  # nothing re-sent once acknowledged


def test_a_failed_or_overdue_push_is_sent_again_with_a_newer_seq(monkeypatch):
    from actors.scheduler import reconciler

    answers = [FakeAck({}), FakeAck(error=RuntimeError("controller died")), FakeAck(pending=True),
               FakeAck({})]  # the start-up push, the admission's, then two re-sends
    ctrl = FakeController(answer=lambda p: answers.pop(0) if answers else FakeAck({}))
    s = _sched(FakeHandles({"group-0": ctrl}))
    assert s.admit(small_spec("a")).admitted
    first = ctrl.pushes[-1].seq
    assert s.reconcile_once()["pushed"] == ["group-0"]  # the controller raised: push again
    second = ctrl.pushes[-1].seq
    assert second > first and s.health().unacked_pushes == 1
    assert s.reconcile_once()["pushed"] == []  # in flight, not overdue
    monkeypatch.setattr(reconciler, "PUSH_RETRY_S", -1.0)  # now it is overdue
    assert s.reconcile_once()["pushed"] == ["group-0"] and ctrl.pushes[-1].seq > second
    monkeypatch.setattr(reconciler, "PUSH_RETRY_S", 10.0)
    assert s.reconcile_once()["acked"] == ["group-0"] and s.health().unacked_pushes == 0


def test_a_stale_handle_is_looked_up_again_by_the_next_pass():
    class Broken(FakeController):
        def push(self, push):
            raise RuntimeError("stale handle")

    kv = MemoryKV()
    assert _sched(FakeHandles(), kv=kv).admit(small_spec("a")).admitted
    handles = FakeHandles({"group-0": Broken()})
    s = _sched(handles, kv=kv)  # restarted: its push to group-0's controller fails
    assert "group-0" not in s.reconciler.controllers and s.health().unacked_pushes == 1
    good = handles.controllers["group-0"] = FakeController()  # the controller came back under its name
    assert s.reconcile_once()["pushed"] == ["group-0"] and [m.job_id for m in good.pushes[-1].members] == ["a"]
    assert s.reconcile_once()["acked"] == ["group-0"] and s.health().unacked_pushes == 0


def test_a_restarted_scheduler_repushes_every_group_and_tells_dissolved_ones():
    """After a restart, every group with an active job, every group a job moved out of, and the
    live controllers of groups that no longer exist get their target state (the latter dissolved)."""
    kv = MemoryKV()
    s = _sched(FakeHandles(), kv=kv)
    for j, kind in (("A", "big"), ("B", "small"), ("C", "small")):
        assert s.admit(small_spec(j, kind)).admitted
    out = s.depart("A")
    assert [(m.job_id, m.to_group) for m in out.moves] == [("B", "group-1")]
    logs = {g: [] for g in ("group-0", "group-1", "group-7")}
    s2 = _sched(FakeHandles({g: FakeController(v) for g, v in logs.items()}), kv=kv)
    assert s2.restored
    assert logs["group-1"][-1][:2] == (["C", "B"], {})
    assert logs["group-0"][-1][:2] == ([], {"A": "departed", "B": "moved to group-1"})  # (A never ran: cancelled)
    pushes = {g: c.pushes[-1] for g, c in s2.reconciler.handles.controllers.items()}
    assert pushes["group-0"].dissolved and pushes["group-7"].dissolved and not pushes["group-1"].dissolved
    assert set(s2.reconcile_once()["acked"]) == set(logs)
    assert set(s2.reconciler.controllers) == {"group-1"}  # dissolved groups' handles are dropped once acked


def test_attach_creates_the_controller_and_waits_for_its_acknowledgement(monkeypatch):
    from actors.scheduler import membership

    handles = FakeHandles()
    s = _sched(handles)
    assert s.admit(small_spec("a")).admitted
    assert handles.created == []  # admissions start no actor
    t = asyncio.run(s.attach("a"))
    assert handles.created == ["group-0"] and t.pushed and t.controller == "rollmux-group-0"
    assert t.record.job_id == "a" and t.group_id == "group-0" and t.record.state == "admitted"
    assert [m.job_id for m in handles.controllers["group-0"].pushes[-1].members] == ["a"]
    assert asyncio.run(s.attach("nope")) is None
    # a controller that does not answer in time: the ticket says so (it pulls the membership itself)
    handles.controllers["group-0"].answer = lambda p: _Never()
    monkeypatch.setattr(membership, "ATTACH_PUSH_TIMEOUT_S", 0.05)  # the module that awaits the ack
    assert s.admit(small_spec("b")).admitted
    t = asyncio.run(s.attach("b"))
    assert not t.pushed and t.controller == "rollmux-group-0"
    s.depart("a")  # attached, but never reported running: withdrawn
    ended = asyncio.run(s.attach("a"))
    assert ended.controller is None and ended.record.state == "cancelled"


class _Never(FakeAck):
    def __init__(self):
        super().__init__(pending=True)

    def __await__(self):
        return asyncio.sleep(3600).__await__()


def test_a_restarted_controller_pulls_its_membership_when_an_unknown_job_calls():
    """A controller that does not know a calling job (it restarted, or the attach's push was not
    acknowledged in time) pulls its group's membership and applies it as a push; a known job's
    calls ask nothing."""
    from actors.scheduler.group_controller import GroupControllerImpl

    s = _sched(FakeHandles())
    assert s.admit(small_spec("a")).admitted
    pulls = []

    class Scheduler:
        async def _membership(self, gid):
            pulls.append(gid)
            return s.membership(gid)

        def membership(self, gid):
            return self._membership(gid)

        def forget(self):
            pass

    async def scenario():
        c = GroupControllerImpl("group-0", None, metrics_flush_s=0, metrics_enabled=False, lease_s=0)
        c._sched = Scheduler()
        reply = await c.attach("a")  # unknown to the restarted controller: it pulls, then attaches
        await c.heartbeat("a")  # known now: no pull
        with pytest.raises(Exception, match="not a member"):
            await c.attach("zz")  # not in the pulled membership either
        return reply

    reply = asyncio.run(scenario())
    assert pulls == ["group-0", "group-0"] and reply.group_id == "group-0" and reply.queues["rollout-0"] == ("a",)


def test_ended_jobs_workers_are_released_through_the_handle_factory(tmp_path):
    from actors.worker.workers import RolloutWorkerImpl, TrainWorkerImpl

    handles = FakeHandles()
    s = _sched(handles)
    assert s.admit(small_spec("a")).admitted
    rec = s.get_job("a")
    workers = {}
    for n in (*rec.placement.rollout_nodes, *rec.placement.train_nodes):
        w = (RolloutWorkerImpl if n.startswith("rollout") else TrainWorkerImpl)(n)
        w.register_job("a", {"builder": dict, "checkpoint_dir": str(tmp_path), "admission": rec.admission_id})
        workers[n] = handles.workers[n] = InProcessWorker(w)
    assert s.release_workers_once() == []  # nothing ended yet
    s.report("a", RuntimeEvent(EventKind.FAILED, error="boom"))
    assert sorted(n for _, n in s.release_workers_once()) == sorted(workers)
    assert all(w.calls == [("a", rec.admission_id)] and "a" not in w.worker.jobs for w in workers.values())
    assert s.release_workers_once() == []  # sent once
