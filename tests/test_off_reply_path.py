"""What the admission reply path no longer runs: checkpoint compaction and the admissions'
re-optimisation solve. Asserted by counters, checkpoint sequence numbers and call order, never
by timing."""

from __future__ import annotations

import asyncio

from factories import unit_kw

from actors.scheduler.global_scheduler import GlobalSchedulerImpl
from actors.scheduler.kv import MemoryKV
from rollmux.config import CONFIG_DIR, load_cluster

SPEC = dict(model_params_b=7.0, max_response_tokens=4096, num_rollout_gpus=8, num_train_gpus=8, slo=1.5,
            measured=dict(t_roll_s=300.0, t_train_s=200.0, t_sync_s=10.0))


def _sched(kv, **kw):
    return GlobalSchedulerImpl(load_cluster(CONFIG_DIR / "cluster_sim.yaml"), kv=kv, **unit_kw(), metrics_flush_s=0, **kw)


def _free_moves():
    """A config whose moves cost nothing: the planner tests compare planners, not the copy price
    (at the default price the cheaper re-partition below does not pay its copies)."""
    from rollmux.admission import SchedulerConfig

    return {**SchedulerConfig().model_dump(), "plan_move_price_node_pairs_per_copy_s": 0.0}


def _admit_batched(s, ids):
    async def run():
        return [await s.admit_batched({**SPEC, "job_id": j}) for j in ids]

    return asyncio.run(run())


def test_compaction_runs_off_the_reply_path_and_restores_the_same_state():
    kv = MemoryKV()
    s = _sched(kv, compaction="manual")
    s.store.compact_every, s.store.compact_ratio = 4, 0.0
    outs = _admit_batched(s, [f"j{i}" for i in range(10)])
    assert all(o.admitted for o in outs)
    # every write made a base due; none was written on a reply
    assert s.store.seq == 10 and s.store.base_seq == 0 and s.store.wants_compaction()
    assert s.compactions_inline == 0 and s.compactions_off_reply == 0
    assert len(kv.keys(f"{s.store.prefix}.w.")) == 10
    assert s.compact_pending() is True
    assert s.store.base_seq == 10 and s.compactions_off_reply == 1 and kv.keys(f"{s.store.prefix}.w.") == []
    assert s.compact_pending() is False  # nothing due any more
    r = _sched(kv)
    assert r.restored and [j.job_id for j in r.list_jobs()] == [j.job_id for j in s.list_jobs()]
    assert r.list_groups() == s.list_groups()


def test_inline_compaction_writes_the_state_mirror():
    """The default (unit tests): the write that makes a base due writes it, from the mirror."""
    kv = MemoryKV()
    s = _sched(kv)
    s.store.compact_every, s.store.compact_ratio = 3, 0.0
    _admit_batched(s, [f"j{i}" for i in range(7)])
    assert s.compactions_inline == 2 and s.store.base_seq == 6 and s.compactions_off_reply == 0
    r = _sched(kv)
    assert r.list_jobs() == s.list_jobs() and r.list_groups() == s.list_groups()


def test_reoptimisation_solves_without_the_scheduler_lock():
    """The solve of each admission's neighbourhood runs with the scheduler's lock free (an
    admission may be decided meanwhile); a plan whose neighbourhood changed is dropped."""
    s = _sched(MemoryKV())
    _admit_batched(s, [f"j{i}" for i in range(7)])
    assert s.reopt_planned == 0  # the replies ran no solve
    inner = s.reopt.planner()
    seen = []

    class Probe:
        def plan(self, hood, fresh, forget):
            seen.append(s._lock._is_owned())  # RLock: held by this thread?
            plan = inner.plan(hood, fresh, forget)
            if len(seen) == 1:  # an admission lands in the neighbourhood between plan and commit
                s.admit({**SPEC, "job_id": "late", "slo": 3.0})
            return plan

    s.reopt.planner_impl = Probe()
    s.reoptimise_pending()
    assert seen and not any(seen)
    assert s.reopt_planned == len(seen) == 7
    assert s.reopt_stale >= 1  # the first plan saw its neighbourhood change: dropped, not applied
    assert s.reopt_applied + s.reopt_stale <= s.reopt_planned  # the rest found nothing cheaper


def test_process_planner_gives_the_thread_planners_plan():
    from actors.scheduler.reopt_worker import ProcessPlanner, ThreadPlanner

    s = _sched(MemoryKV(), config=_free_moves())
    for i in range(8):  # greedy admission leaves a cheaper re-partition of the first group's neighbourhood
        s.admit({**SPEC, "job_id": f"j{i}", "measured": dict(t_roll_s=250.0 + 25 * i, t_train_s=300.0, t_sync_s=10.0)})
    hood = s.igs.reopt_neighbourhood(s.igs.groups[0].group_id)
    assert hood is not None
    want = ThreadPlanner(s.cluster, s.igs.config).plan(hood, None, [])
    pp = ProcessPlanner(s.cluster, s.igs.config)
    try:
        got = pp.plan(hood, None, ["gone"])
        assert pp.restarts == 0 and got is not None and want is not None
        assert [tuple(g.job_ids) for g, _ in got.groups] == [tuple(g.job_ids) for g, _ in want.groups]
        assert got.after_usd_per_h == want.after_usd_per_h < got.before_usd_per_h
    finally:
        pp.close()


def test_process_planner_restarts_a_dead_child():
    """A child that dies during a call loses that call's solve (None: nothing moves, ``restarts``
    counts it); one found dead before a call is started again; both then answer as before."""
    from actors.scheduler.reopt_worker import ProcessPlanner

    s = _sched(MemoryKV(), config=_free_moves())
    for i in range(8):  # greedy admission leaves a cheaper re-partition of the first group's neighbourhood
        s.admit({**SPEC, "job_id": f"j{i}", "measured": dict(t_roll_s=250.0 + 25 * i, t_train_s=300.0, t_sync_s=10.0)})
    hood = s.igs.reopt_neighbourhood(s.igs.groups[0].group_id)
    assert hood is not None
    pp = ProcessPlanner(s.cluster, s.igs.config)
    try:
        first = pp.plan(hood, None, [])
        assert first is not None
        shape = [tuple(g.job_ids) for g, _ in first.groups]
        pp._proc.kill()
        pp._proc.wait(timeout=10)
        again = pp.plan(hood, None, [])  # found dead before the call: started again, answers
        assert pp.restarts == 0 and again is not None and [tuple(g.job_ids) for g, _ in again.groups] == shape
        pp._send.send("not a request")  # the child cannot unpack it and exits: the next call is lost
        assert pp.plan(hood, None, []) is None and pp.restarts == 1
        third = pp.plan(hood, None, [])
        assert third is not None and [tuple(g.job_ids) for g, _ in third.groups] == shape
        child = pp._proc
    finally:
        pp.close()
    assert child.poll() is not None and pp.plan(hood, None, []) is None  # closed for good
