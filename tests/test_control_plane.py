"""The runtime control plane's typed records, pure group ledger and asynchronous pushes (no Ray)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from actors.scheduler.kv import MemoryKV
from factories import FakeController, FakeHandles, small_spec, unit_kw
from rollmux.group_ledger import GroupLedger, PermitError, Report
from rollmux.messages import EventKind, Grant, MembershipPush, PhaseRecord, RuntimeEvent
from rollmux.records import IllegalTransition, JobRecord, JobState, MoveRecord


class Clock:
    """An injected clock (seconds)."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---- records
def test_job_state_is_an_ordered_lifecycle():
    A, R, F, X = JobState.ADMITTED, JobState.RUNNING, JobState.FINISHED, JobState.FAILED
    assert A < R < F and R < X and not (F < X) and sorted([F, A, R]) == [A, R, F]
    assert [s.is_active() for s in (A, R, F, X)] == [True, True, False, False]
    assert A.advance(R) == R and R.advance(A) == R and F.advance(R) == F and X.advance(F) == X
    assert JobState("running") == "running" and str(JobState.FAILED) == "failed"


def test_job_state_changes_only_by_its_transitions():
    Q, A, R, F, X, E, C = (JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING, JobState.FINISHED, JobState.FAILED,
                           JobState.EXPIRED, JobState.CANCELLED)
    assert Q.to(A) == A and Q.to(C) == C and Q.to(X) == X and A.to(R) == R and A.to(E) == E and R.to(F) == F
    for bad_from, bad_to in ((F, R), (R, A), (Q, R), (C, A), (E, R), (A, Q)):
        with pytest.raises(IllegalTransition, match=f"a {bad_from} job cannot become {bad_to}"):
            bad_from.to(bad_to)
    assert not C.is_active() and C.is_ended() and not F.can(X)
    assert F.advance(R) == F  # a late event after the end changes nothing (no error)


def test_decision_codes_are_one_enum_equal_to_their_text():
    import json

    from rollmux.codes import HTTP_STATUS, Code

    assert set(HTTP_STATUS) == set(Code) and Code.RETRY_LATER == "retry_later" and json.dumps([Code.OK]) == '["ok"]'
    assert Code("queue_full") is Code.QUEUE_FULL and {"never": 1}[Code.NEVER] == 1
    assert (Code.OK.outcome, Code.NEVER.outcome, HTTP_STATUS[Code.QUEUED]) == ("admitted", "never", 202)


def test_job_record_folds_iterations_and_hides_moves_until_moved():
    r = JobRecord(job_id="j", state="admitted", slo=2.0)
    r.note_iteration(1, t_iter_s=3.0, t_solo_s=2.0, slowdown=1.5)
    r.note_iteration(2, t_iter_s=5.0, t_solo_s=2.0, slowdown=2.0)
    r.note_iteration(1, t_iter_s=None, t_solo_s=None, slowdown=2.0)  # a late, older report
    assert r.iterations_done == 2 and r.measured == {"t_iter_s": 4.0, "t_solo_s": 2.0}
    assert "moves" not in r.public() and r.public()["state"] == "admitted"
    r.moves = [MoveRecord(job_id="j", from_group="group-0", to_group="group-1", trigger="x")]
    assert r.public()["moves"][0]["to_group"] == "group-1"
    with pytest.raises(ValueError, match="extra"):
        JobRecord.model_validate({"job_id": "j", "state": "admitted", "bogus": 1})
    with pytest.raises(ValueError, match="state"):
        JobRecord(job_id="j", state="lost")


# ---- the pure group ledger (injected clock)
def _rec(ledger, node, t0, t1):
    return PhaseRecord(node=node, start=t0, end=t1, switch="warm", switch_s=0.0, ok=True)


def _reports(effects):
    return [e.message.to_dict() for e in effects if isinstance(e, Report)]


def test_ledger_accounts_slowdown_from_its_clock_and_reports_iterations():
    clk = Clock()
    g = GroupLedger("group-t", lease_s=0, clock=clk)
    for j in ("a", "b"):
        g.add(j, ["rollout-0"], ["train-0"], slo=2.0)
        g.activate(j)
    reports = []
    for j in ("a", "b"):  # a: rollout 1000-1002, train 1002-1004, sync 1004-1005; b waits for the nodes
        for ph, dur in (("rollout", 2.0), ("train", 2.0), ("sync", 1.0)):
            grant = g.try_grant(j, ph, None, clk.t)
            assert grant is not None and grant.pool == ("rollout" if ph == "rollout" else "train")
            t0 = clk.t
            clk.t += dur
            _, eff = g.release(grant, _rec(g, grant.nodes[0], t0, clk.t))
            reports += _reports(eff)
    assert [r["iterations_done"] for r in reports] == [1, 1]
    a, b = reports
    assert (a["t_iter_s"], a["t_solo_s"], a["slowdown"]) == (5.0, 5.0, 1.0)
    assert (b["t_iter_s"], b["t_solo_s"], b["slowdown"]) == (5.0, 5.0, 1.0)  # b's clock starts at its grant
    assert g.slowdown("a") == 1.0 and g.status()["jobs"]["a"]["iterations_done"] == 1
    assert a["cold_start"] and b["cold_start"]  # each one's first iteration in the group: not a profile
    for ph, dur in (("rollout", 2.0), ("train", 2.0), ("sync", 1.0)):  # a's second iteration is warm
        grant = g.try_grant("a", ph, None, clk.t)
        t0 = clk.t
        clk.t += dur
        _, eff = g.release(grant, _rec(g, grant.nodes[0], t0, clk.t))
        reports += _reports(eff)
    assert [(r["iterations_done"], r["cold_start"]) for r in reports[2:]] == [(2, False)]


def test_the_iteration_report_carries_the_rollouts_long_tail_trigger():
    """What the SLO watch's predictor needs (rollmux.admission.slo_watch.measured_predictor): when the
    rollout reached the trigger fraction (s from its grant), the responses unfinished then and whether
    migration acted (b waits for the node, so it did)."""
    clk = Clock()
    g = GroupLedger("group-t", lease_s=0, clock=clk, migrate=True)
    for j in ("a", "b"):
        g.add(j, ["rollout-0"], ["train-0"], slo=2.0)
        g.activate(j)
    reports = []
    grant = g.try_grant("a", "rollout", None, clk.t)
    assert g.try_grant("b", "rollout", None, clk.t) is None  # b waits for rollout-0
    clk.t += 3.0
    assert g.progress("a", 7, 10) is None  # 70% < the 80% trigger
    clk.t += 1.0
    d = g.progress("a", 8, 10)
    assert d is not None and d.acted
    for ph, dur in (("rollout", 2.0), ("train", 2.0), ("sync", 1.0)):
        if ph != "rollout":
            grant = g.try_grant("a", ph, None, clk.t)
        t0 = grant.granted_at if ph == "rollout" else clk.t
        clk.t += dur
        _, eff = g.release(grant, _rec(g, grant.nodes[0], t0, clk.t))
        reports += _reports(eff)
    (r,) = reports
    assert (r["t_trigger_s"], r["tail_responses"], r["tail_migrated"]) == (4.0, 2, True)
    assert r["t_roll_s"] == 6.0


def test_ledger_lease_evicts_only_silent_drivers_without_a_running_phase():
    clk = Clock()
    g = GroupLedger("group-t", lease_s=30.0, clock=clk)
    for j in ("a", "b"):
        g.add(j, ["rollout-0"], ["train-0"])
        g.activate(j)
    grant = g.try_grant("a", "rollout", None, clk.t)
    assert g.phase_started("a", "rollout") and grant.job_id == "a"
    clk.t += 31.0
    assert g.heartbeat("b") and g.expired() == ([], [])  # a runs a phase; b just heart-beat
    clk.t += 31.0
    evicted, eff = g.expired()
    assert evicted == ["b"] and _reports(eff)[0]["event"] == "failed" and "no heartbeat for 31.0s" in _reports(eff)[0]["error"]
    with pytest.raises(PermitError, match="failed: driver lost"):
        g.activate("b")


def test_ledger_evicts_a_dead_drivers_job_before_the_lease():
    """A driver the cluster reports dead (its process exited) is evicted as soon as it is late,
    not after the whole lease; a late driver still alive, one of unknown identity and one whose
    phase runs wait for the lease as before."""
    clk = Clock()
    g = GroupLedger("group-t", lease_s=30.0, clock=clk)
    for j in ("dead", "alive", "anon", "busy"):
        g.add(j, [f"rollout-{j}"], [f"train-{j}"])
        g.activate(j)
        g.heartbeat(j, None if j == "anon" else f"drv-{j}")
    g.try_grant("busy", "rollout", None, clk.t)
    g.phase_started("busy", "rollout")
    clk.t += 1.0
    assert g.late_drivers(4.0) == {}
    clk.t += 4.0
    assert g.late_drivers(4.0) == {"dead": "drv-dead", "alive": "drv-alive"}
    evicted, eff = g.expired({"drv-dead", "drv-busy"})
    assert evicted == ["dead"] and "its process exited" in _reports(eff)[0]["error"]
    assert _reports(eff)[0]["error"].startswith("driver lost")
    clk.t += 26.0  # the lease: the silent ones go (the running phase keeps "busy")
    assert sorted(g.expired(set())[0]) == ["alive", "anon"]


def test_ledger_moved_job_leaves_at_its_iteration_boundary():
    clk = Clock()
    g = GroupLedger("group-t", lease_s=0, clock=clk)
    g.add("a", ["rollout-0"], ["train-0"])
    g.activate("a")
    grant = g.try_grant("a", "rollout", None, clk.t)
    assert g.remove("a", "moved to group-9") and g.moving == {"a": "moved to group-9"} and g.is_member("a")

    def stopped(effects) -> list[tuple]:  # its leaving, as reported to the scheduler (rollmux.drain)
        return [(e.job_id, e.message.group_id) for e in effects
                if isinstance(e, Report) and getattr(e.message, "kind", None) == EventKind.STOPPED]

    effects = g.take_effects()
    for ph in ("rollout", "train", "sync"):
        assert stopped(effects) == []  # mid-iteration: its phases still run here
        if ph != "rollout":
            grant = g.try_grant("a", ph, None, clk.t)
            assert grant is not None
        effects += g.release(grant, _rec(g, "train-0", clk.t, clk.t))[1] + g.take_effects()
    assert stopped(effects) == [("a", "group-t")]  # left at its boundary: reported once, with this group
    assert g.gone == {"a": "moved to group-9"} and g.moving == {}
    with pytest.raises(PermitError, match="moved to another group"):
        g.try_grant("a", "rollout", None, clk.t)
    # a job between iterations leaves (and is reported) at once; one this ledger never knew, too
    g.add("b", ["rollout-0"], ["train-0"])
    assert g.remove("b", "moved to group-9") and stopped(g.take_effects()) == [("b", "group-t")]
    assert g.mark_gone("c", "moved to group-9") and stopped(g.take_effects()) == [("c", "group-t")]
    assert g.remove("d", "departed") is False and not g.mark_gone("c", "moved to group-9")
    assert stopped(g.take_effects()) == []


def test_ledger_redoes_a_phase_whose_worker_was_lost_without_failing_the_job():
    """A phase interrupted by a lost worker (the driver's abort, or the worker's release marked
    ``lost``) is granted again at the same place, is not a failure and reports nothing; a phase
    already released before the loss answers "done" (not run twice)."""
    clk = Clock()
    g = GroupLedger("group-t", lease_s=0, clock=clk)
    for j in ("a", "b"):
        g.add(j, ["rollout-0"], ["train-0"])
        g.activate(j)
    assert g.try_grant("a", "rollout", None, clk.t) is not None
    clk.t += 2.0
    status, eff = g.abort("a", "rollout", "worker on rollout-0 was lost")
    assert status == "aborted" and _reports(eff) == []
    assert g.is_queued("a") and "a" not in g.gone and g.rr.next_phase("a") == "rollout"
    assert g.try_grant("b", "rollout", None, clk.t) is None  # a's turn is kept: b still waits
    redo = g.try_grant("a", "rollout", None, clk.t)  # the redo
    assert redo is not None
    _, eff = g.release(redo, PhaseRecord(ok=False, lost=True, error="peer lost", node="rollout-0", start=clk.t,
                                         end=clk.t))
    assert _reports(eff) == [] and g.rr.next_phase("a") == "rollout"
    assert g.timeline[-1]["lost"] and not g.timeline[-1]["ok"]
    again = g.try_grant("a", "rollout", None, clk.t)
    assert again is not None
    g.release(again, _rec(g, "rollout-0", clk.t, clk.t + 1))
    assert g.abort("a", "rollout", "lost after its release")[0] == "done"
    assert g.abort("a", "train", "no grant yet")[0] == "none"
    stale = Grant(job_id="b", group_id="group-t", phase="rollout", pool="rollout", nodes=("rollout-0",), iteration=0,
                  granted_at=clk.t, waited_s=0.0)
    g.release(stale, PhaseRecord(ok=False, error="boom"))  # no grant for b: nothing changes
    assert g.is_member("b")
    with pytest.raises(PermitError):
        g.abort("zz", "rollout", "x")


# ---- the planned round-robin order reaches the queues (the order admission's SLO check simulated)
def _ring_group():
    """``factories.ring_quartet`` admitted by Alg. 1 in arrival order: one group whose planned
    round-robin order (00059, 00095, 00075, 00097) is not the arrival order (00059, 00095, 00097,
    00075), feasible only in the planned one. Returns (cluster, specs in arrival order, group)."""
    from factories import ring_quartet

    from rollmux.admission import InterGroupScheduler

    cluster, jobs = ring_quartet()
    sched = InterGroupScheduler(cluster)
    for j in jobs:
        assert sched.admit(j, j.measured).admitted
    (grp,) = sched.groups
    return cluster, jobs, grp


def _drive(ledger, profiles, iterations):
    """Run the ledger's group on a simulated clock: every driver asks for its next phase as soon as
    its previous one ends, each phase lasts its profile's time. Returns the training node's grant
    sequence."""
    import heapq

    heap, running, train_seq = [], set(), []
    while min(ledger.members[j].iterations_done for j in profiles) < iterations:
        for j in profiles:
            if j in running:
                continue
            ph = ledger.rr.next_phase(j)
            grant = ledger.try_grant(j, ph, None, ledger.clock())
            if grant is not None:
                p = profiles[j]
                dur = {"rollout": p.t_roll_s, "train": p.t_train_s, "sync": p.t_sync_s}[ph]
                heapq.heappush(heap, (ledger.clock() + dur, j, ph, ledger.clock(), grant))
                running.add(j)
                if ph == "train":
                    train_seq.append(j)
        end, j, ph, start, grant = heapq.heappop(heap)
        ledger.clock.t = end
        running.discard(j)
        ledger.release(grant, _rec(ledger, grant.nodes[0], start, end))
    return train_seq


@pytest.mark.parametrize("planned", [True, False])
def test_ledger_runs_members_in_the_planned_round_robin_order(planned):
    """Drivers attach in arrival order. With the order admission planned (00059, 00095, 00075,
    00097) the ledger's measured steady-state slowdowns are the SLO check's prediction, every one
    within its SLO; in attach order the four trainings chain within one meta-iteration and
    job-00095, job-00097 and job-00075 break their SLOs, as the SLO check predicts for that order."""
    from rollmux.intra_group import coexec_times, steady_meta_iterations

    cluster, jobs, grp = _ring_group()
    arrival = [j.job_id for j in jobs]
    assert list(grp.job_ids) != arrival
    by = {m.spec.job_id: m for m in grp.members}
    clk = Clock(0.0)
    g = GroupLedger("group-p", lease_s=0, clock=clk)
    for j in arrival:  # admitted / attached in arrival order
        m = by[j]
        g.add(j, list(m.placement.rollout_nodes), list(m.placement.train_nodes), slo=m.spec.slo)
    if planned:
        assert g.set_order(list(grp.job_ids)) and not g.set_order(list(grp.job_ids))
    for j in arrival:
        g.activate(j)
    order = [by[j] for j in (grp.job_ids if planned else arrival)]
    n = steady_meta_iterations(order)
    _drive(g, {j: by[j].profile for j in arrival}, n)
    steady = {j: sum(g.members[j].iter_s[n // 2:n]) / sum(g.members[j].solo_s[n // 2:n]) for j in by}
    tco = coexec_times(order)
    for j, m in by.items():
        assert steady[j] == pytest.approx(tco[j] / m.profile.t_solo_s, rel=1e-9)
    over = {j for j, m in by.items() if steady[j] > m.spec.slo}
    if planned:
        assert g.status()["order"] == list(grp.job_ids) and over == set()
        assert steady["job-00075"] == pytest.approx(1041.8165 / 859.204, rel=1e-6)
    else:
        assert g.status()["order"] == [] and over == {"job-00095", "job-00097", "job-00075"}  # no plan: attach order
        assert steady["job-00075"] == pytest.approx(1260.501 / 859.204, rel=1e-6)


def test_ledger_new_plan_reorders_queued_jobs_without_preempting():
    """A plan pushed while a phase runs: the running job keeps its node; the next turn follows the plan."""
    clk = Clock()
    g = GroupLedger("group-o", lease_s=0, clock=clk)
    for j in ("a", "b", "c"):
        g.add(j, ["rollout-0"], ["train-0"])
        g.activate(j)
    held = g.try_grant("a", "rollout", None, clk.t)
    assert held is not None
    assert g.set_order(["c", "b", "a"])
    assert g.try_grant("c", "rollout", None, clk.t) is None  # a still holds rollout-0
    assert g.queues()["rollout-0"] == ["a", "c", "b"]
    g.release(held, _rec(g, "rollout-0", clk.t, clk.t))
    assert g.try_grant("b", "rollout", None, clk.t) is None
    assert g.try_grant("c", "rollout", None, clk.t) is not None


def test_scheduler_pushes_members_in_the_planned_round_robin_order(monkeypatch):
    """The GlobalScheduler pushes a group's members in the policy's round-robin order (the one its
    SLO check simulated), not in admission order; a recovering controller reads the same order."""
    import ray

    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from factories import ring_quartet

    monkeypatch.setattr(ray, "get", lambda *a, **k: (_ for _ in ()).throw(AssertionError("waited")))
    cluster, jobs = ring_quartet()
    planned = ["job-00059", "job-00095", "job-00075", "job-00097"]
    log = []
    s = GlobalSchedulerImpl(cluster, kv=MemoryKV(), **unit_kw(FakeHandles({"group-0": FakeController(log)})),
                            metrics_flush_s=0)
    for spec in jobs:
        assert s.admit(spec.model_dump()).admitted
    assert log[-1][:2] == (planned, {})
    assert [m.job_id for m in s.group_members("group-0")] == planned

    async def controller_takes_it():
        c = _ctrl(lease_s=0)
        await c.sync_members(MembershipPush.of("group-u", s.group_members("group-0"), {}, seq=1))
        for spec in jobs:
            await c.attach(spec.job_id)
        return await c.status()

    st = asyncio.run(controller_takes_it())
    assert st.order == tuple(planned)
    assert st.queues["train-0"] == ("job-00059", "job-00095", "job-00097")
    assert st.queues["train-1"] == ("job-00059", "job-00075", "job-00097")


# ---- the controller actor's class: reconcile pushes and a watchdog that never dies silently
def _ctrl(**kw):
    from actors.scheduler.group_controller import GroupControllerImpl

    return GroupControllerImpl("group-u", None, metrics_flush_s=0, metrics_enabled=False, **kw)


def test_controller_applies_pushes_in_sequence_and_ignores_stale_ones():
    async def scenario():
        c = _ctrl(lease_s=0)
        m = [{"job_id": "a", "rollout_nodes": ["rollout-0"], "train_nodes": ["train-0"], "slo": 2.0}]
        assert (await c.sync_members(MembershipPush.of("group-u", m, {}, seq=5))).added == ("a",)
        assert (await c.sync_members(MembershipPush.of("group-u", [], {"a": "departed"}, seq=7))).removed == ("a",)
        assert (await c.sync_members(MembershipPush.of("group-u", m, {}, seq=6))).stale  # late: would re-add a departed job
        return await c.status()

    st = asyncio.run(scenario())
    assert st.gone == {"a": "departed"} and st.pending == ()


def test_dissolved_groups_controller_exits_once_its_last_member_left():
    """A push saying the group is dissolved makes the controller end itself once none of its
    jobs is queued (a moved job in mid-iteration keeps it alive until its iteration boundary),
    after the grace; a newer push for a live group cancels the exit."""
    async def scenario():
        c = _ctrl(lease_s=0)
        c.exit_grace_s = 0.05
        killed = []
        c._kill_self = lambda: killed.append(c.group_id)
        m = [{"job_id": "a", "rollout_nodes": ["rollout-0"], "train_nodes": ["train-0"], "slo": 2.0}]
        await c.sync_members(MembershipPush.of("group-u", m, {}, seq=1))
        await c.attach("a")
        g = await c.acquire("a", "rollout")  # a is mid-iteration when it moves away
        await c.sync_members(MembershipPush.of("group-u", [], {"a": "moved to group-9"}, seq=2, dissolved=True))
        await asyncio.sleep(0.3)
        assert killed == [] and c.ledger.is_queued("a")  # waits for a's iteration boundary
        for ph in ("rollout", "train", "sync"):
            if ph != "rollout":
                g = await c.acquire("a", ph)
            await c.release(g, PhaseRecord(ok=True, node=g.nodes[0], start=0.0, end=0.0))
        for _ in range(40):
            if killed:
                break
            await asyncio.sleep(0.05)
        assert killed == ["group-u"] and c.closed
        # a live group is never ended: a newer push without "dissolved" cancels a pending exit
        c2 = _ctrl(lease_s=0)
        c2.exit_grace_s = 0.2
        c2._kill_self = lambda: killed.append("c2")
        await c2.sync_members(MembershipPush.of("group-u", [], {}, seq=1, dissolved=True))
        await c2.sync_members(MembershipPush.of("group-u", m, {}, seq=2))
        await asyncio.sleep(0.5)
        return killed

    assert asyncio.run(scenario()) == ["group-u"]


def test_a_dissolved_groups_timeline_outlives_its_controller(local_cluster_spec):
    """An exiting controller hands its timeline to the scheduler, which answers
    ``group_timeline`` from that copy once the controller is gone (an operator reads a dissolved
    group's phases after its last job moved away)."""
    from actors.scheduler.global_scheduler import DISSOLVED_TIMELINES_KEPT, GlobalSchedulerImpl

    s = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0)

    class Sched:  # the controller's scheduler handle, delivering to the scheduler in this process
        def report_nowait(self, job_id, message):
            return None

        def keep_timeline_nowait(self, group_id, records):
            async def deliver():
                return s.keep_timeline(group_id, records)
            return deliver()

    async def scenario():
        c = _ctrl(lease_s=0)
        c.exit_grace_s = 0.01
        c._sched = Sched()
        killed = []
        c._kill_self = lambda: killed.append(c.group_id)
        m = [{"job_id": "a", "rollout_nodes": ["rollout-0"], "train_nodes": ["train-0"], "slo": 2.0}]
        await c.sync_members(MembershipPush.of("group-u", m, {}, seq=1))
        await c.attach("a")
        for ph in ("rollout", "train", "sync"):
            g = await c.acquire("a", ph)
            await c.release(g, PhaseRecord(ok=True, node=g.nodes[0], start=1.0, end=2.0))
        await c.sync_members(MembershipPush.of("group-u", [], {"a": "moved to group-9"}, seq=2, dissolved=True))
        for _ in range(100):
            if killed:
                break
            await asyncio.sleep(0.02)
        assert killed == ["group-u"]
        return await s.group_timeline("group-u")

    tl = asyncio.run(scenario())
    assert [(r.job_id, r.phase) for r in tl] == [("a", "rollout"), ("a", "train"), ("a", "sync")]
    for i in range(DISSOLVED_TIMELINES_KEPT):  # bounded: the oldest kept timeline goes first
        s.keep_timeline(f"group-x{i}", [])
    assert asyncio.run(s.group_timeline("group-u")) == []


def test_controller_watchdog_logs_a_failing_pass_and_goes_on(caplog):
    async def scenario():
        c = _ctrl(lease_s=0.3)
        calls = {"n": 0}
        real = c.ledger.expired

        def flaky(*args):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return real(*args)

        c.ledger.expired = flaky
        await c.add_job("a", ["rollout-0"], ["train-0"])
        await c.attach("a")  # starts the watchdog; a's driver then goes silent
        for _ in range(100):
            await asyncio.sleep(0.05)
            if "a" in c.ledger.gone:
                break
        c.closed = True
        return c, calls["n"]

    with caplog.at_level(logging.ERROR, logger="rollmux.controller"):
        c, n = asyncio.run(scenario())
    assert n >= 2 and c.ledger.gone["a"].startswith("failed: driver lost")
    assert any("lease watchdog pass failed" in r.getMessage() for r in caplog.records)


# ---- the scheduler pushes target state and never waits on a controller
def test_scheduler_pushes_target_state_to_controllers_without_waiting(local_cluster_spec, monkeypatch):
    import ray

    from actors.scheduler.global_scheduler import GlobalSchedulerImpl

    def never(*a, **k):  # admission and departure must not wait on any controller
        raise AssertionError("the scheduler waited on a Ray call")

    monkeypatch.setattr(ray, "get", never)
    monkeypatch.setattr(ray, "wait", never)

    logs = {"group-0": [], "group-1": []}
    fakes = FakeHandles({g: FakeController(v) for g, v in logs.items()})  # fake handles stand in for the actors
    for c in fakes.controllers.values():
        c.answer = lambda push: __import__("factories").FakeAck(pending=True)  # never acknowledged here
    s = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(fakes), metrics_flush_s=0,
                            max_group_size=2)
    for v in logs.values():
        v.clear()  # the start-up's re-push of the (empty) groups
    a, b, c = "A", "B", "C"
    for j, kind in ((a, "big"), (b, "small"), (c, "small")):
        assert s.admit(small_spec(j, kind)).admitted
    assert logs["group-0"][-1][:2] == ([a, b], {}) and logs["group-1"][-1][:2] == ([c], {})
    out = s.depart(a)
    assert [(m.job_id, m.to_group) for m in out.moves] == [(b, "group-1")]
    # A never ran (no driver reported it running): withdrawn (``cancelled``), "departed" to its controller
    assert logs["group-0"][-1][:2] == ([], {a: "departed", b: "moved to group-1"})
    assert logs["group-1"][-1][:2] == ([c, b], {})  # the planned round-robin order: the mover joins last
    seqs = [x[2] for v in logs.values() for x in v]
    assert len(set(seqs)) == len(seqs) and s.health().unacked_pushes == 2
    assert s.get_job(b).placement.model_dump() == {"rollout_nodes": ["rollout-1"], "train_nodes": ["train-1"]}
    assert s.get_job(a).group_id == "group-0" and s.get_job(a).placement.rollout_nodes == ["rollout-0"]


def test_an_explicit_policy_overrides_the_config(local_cluster_spec):
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from rollmux.admission import InterGroupScheduler, SchedulerConfig

    cfg = SchedulerConfig(policy="random", max_group_size=3, seed=4)
    assert InterGroupScheduler(local_cluster_spec, policy="rollmux", config=cfg).policy == "rollmux"
    igs = InterGroupScheduler(local_cluster_spec, config=cfg)
    assert (igs.policy, igs.max_group_size, igs.seed) == ("random", 3, 4)
    s = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0,
                            config={"policy": "random"}, policy="rollmux", max_group_size=5)
    assert (s.igs.policy, s.igs.config.policy, s.igs.max_group_size) == ("rollmux", "rollmux", 5)


# ---- one configuration for the replay and the cluster
def test_simulate_reads_the_scheduler_config_and_flags_override_a_copy(tmp_path):
    import json

    from typer.testing import CliRunner

    from rollmux.admission import load_scheduler_config
    from rollmux.cli import app
    from rollmux.config import CONFIG_DIR
    from rollmux.traces import EXTRACT_TRACE

    cfg = tmp_path / "scheduler.yaml"
    cfg.write_text((CONFIG_DIR / "scheduler.yaml").read_text().replace("max_group_size: 5", "max_group_size: 2")
                   .replace("repack_on_departure: true", "repack_on_departure: false").replace("seed: 0", "seed: 3"))
    assert load_scheduler_config(cfg).max_group_size == 2
    base = ["simulate", "--trace", str(EXTRACT_TRACE), "--policies", "rollmux,random", "--jobs", "8",
            "--max-duration-s", "43200", "--no-progress", "--config", str(cfg)]
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "a" / "summary.json").read_text())["meta"]
    assert (meta["max_group_size"], meta["repack_on_departure"], meta["seed"]) == (2, False, 3)
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "b"), "--max-group-size", "4", "--repack", "--seed", "0"])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "b" / "summary.json").read_text())["meta"]
    assert (meta["max_group_size"], meta["repack_on_departure"], meta["seed"]) == (4, True, 0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tie_break: worst\n")
    r = CliRunner().invoke(app, base[:-1] + [str(bad), "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "tie_break" in r.output


def test_every_scheduler_yaml_key_is_a_setting_of_both(local_cluster_spec):
    """configs/scheduler.yaml: each key is a SchedulerConfig field (extra keys are refused), which
    the GlobalScheduler and the replay both build their InterGroupScheduler from."""
    import yaml

    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from rollmux.admission import SchedulerConfig, load_scheduler_config
    from rollmux.config import CONFIG_DIR
    from rollmux.sim.simulator import Realisation, make_policy

    keys = set(yaml.safe_load((CONFIG_DIR / "scheduler.yaml").read_text()))
    assert keys <= set(SchedulerConfig.model_fields)
    cfg = load_scheduler_config()
    s = GlobalSchedulerImpl(local_cluster_spec, kv=MemoryKV(), **unit_kw(), metrics_flush_s=0)
    sim = make_policy("rollmux", local_cluster_spec, Realisation(local_cluster_spec), config=cfg)
    assert s.igs.config == cfg == sim.sched.config


def test_scheduler_reoptimises_admissions_off_the_admission_path():
    """Admissions answer at once; the reconcile pass (here called directly) re-optimises each
    admission's neighbourhood: the moves are in the moved jobs' records and the checkpoint, and $/h
    drops. The cheaper partition puts job-00005 with the just-admitted job-00006: the new group
    takes over group-2's nodes with job-00006 where it is (``rollmux.admission.inherit``), so only
    job-00005 moves (one copy, where laying the group on fresh nodes moved five jobs)."""
    from actors.scheduler.global_scheduler import GlobalSchedulerImpl
    from rollmux.admission import SchedulerConfig
    from rollmux.config import CONFIG_DIR, load_cluster
    from rollmux.traces import EXTRACT_TRACE, TraceWindow, load_trace
    from rollmux.workloads import draw_jobs

    cl = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    tjobs = load_trace(EXTRACT_TRACE, TraceWindow(max_jobs=30, min_duration_s=3600.0, max_duration_s=3 * 86400.0))
    jobs = draw_jobs(tjobs, cl, mix="mixed", seed=3, slo_range=(1.5, 2.5))[:7]
    kv = MemoryKV()
    # a neighbourhood of 12 jobs sees the whole table (the default of 6 sees the triggering group's)
    cfg = {**SchedulerConfig().model_dump(), "reopt_max_jobs": 12}
    s = GlobalSchedulerImpl(cl, kv=kv, **unit_kw(), metrics_flush_s=0, config=cfg)
    for j in jobs[:6]:
        assert s.admit(j.spec.model_copy(update={"measured": j.profile}).model_dump(mode="json")).admitted
        assert s.reoptimise_pending() == []
    out = s.admit(jobs[6].spec.model_copy(update={"measured": jobs[6].profile}).model_dump(mode="json"))
    assert out.group_id == "group-2" and "moves" not in out.to_dict()
    for g in ("group-0", "group-1", "group-2"):
        s.ensure_controller(g)  # drivers attached: a moved job's last phase may still run on its old nodes
    for j in jobs[:6]:
        s.report(j.spec.job_id, RuntimeEvent(EventKind.RUNNING))
    was = {j.spec.job_id: s.get_job(j.spec.job_id).placement.model_dump() for j in jobs}
    before = s.igs.cost_usd_per_h()
    moves = s.reoptimise_pending()
    assert [(m["job_id"], m["from_group"], m["to_group"]) for m in moves] == [("job-00005", "group-0", "group-2")]
    assert moves[0]["move_s"] > 0 and moves[0]["drained"] is None
    assert s.get_job("job-00006").placement.model_dump() == was["job-00006"]  # kept its nodes: nothing moved
    # the move's drain off its old nodes (rollmux.drain)
    m = moves[0]
    assert m["from_nodes"] == was["job-00005"]["rollout_nodes"] + was["job-00005"]["train_nodes"]
    # group-2 keeps its nodes, which job-00005's last phase on group-0's never ran on: nobody is fenced
    assert all(x.fenced == () for x in s.targets.target("group-2").members)
    s.report("job-00005", RuntimeEvent(EventKind.DRAINED, group_id="group-0"))
    assert s.get_job("job-00005").moves[-1].drained == "exported"
    assert m["trigger"] == "job-00006" and s.reoptimise_pending() == []
    assert s.igs.cost_usd_per_h() < before - 1.0
    rec = s.get_job("job-00005")
    assert rec.group_id == m["to_group"] == s.igs.group_of("job-00005").group_id
    assert rec.moves[-1].from_group == m["from_group"]
    r = GlobalSchedulerImpl(cl, kv=kv, **unit_kw(), metrics_flush_s=0, config=cfg)
    assert r.restored and r.list_groups() == s.list_groups() and r.get_job("job-00005") == s.get_job("job-00005")
