"""Round-robin queues and the intra-group simulator (RollMux §4.3): exact timelines, sync,
scale-out groups, long-tail migration, and queue robustness under joins and departures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.admission import is_saturated
from rollmux.admission.groups import GroupSummary, summarise_group
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.intra_group import IterationTimes, LongTailPolicy, coexec_times, simulate_group, steady_meta_iterations, steady_schedule
from rollmux.models import CoExecutionGroup, GroupMember, JobSpec, PhaseProfile, Placement
from rollmux.round_robin import RoundRobinQueues

from factories import QueueDriver

SIM_CLUSTER = load_cluster(CONFIG_DIR / "cluster_sim.yaml")


def mem(j, tr, tt, ts=0.0, r=("rollout-0",), t=("train-0",), gpus=8, slo=2.0):
    return GroupMember(spec=JobSpec(job_id=j, model_params_b=7, num_rollout_gpus=gpus, slo=slo),
                       profile=PhaseProfile(t_roll_s=tr, t_train_s=tt, t_sync_s=ts),
                       placement=Placement(job_id=j, rollout_nodes=r, train_nodes=t))


def group_figures(members) -> GroupSummary:
    """The policy's own figures of a group of ``members`` (admission's one implementation:
    node loads, ``T_cycle`` = max solo time, ``T_load`` = the busiest node's load, seconds)."""
    def nodes(pool):
        return tuple(dict.fromkeys(n for m in members for n in getattr(m.placement, f"{pool}_nodes")))

    group = CoExecutionGroup(group_id="g", rollout_nodes=nodes("rollout"), train_nodes=nodes("train"), members=tuple(members))
    return summarise_group(group, SIM_CLUSTER)


def saturated(members) -> bool:
    s = group_figures(members)
    return is_saturated(s.t_load, s.t_cycle)


# --- RoundRobinQueues ---------------------------------------------------------------------------

def test_queue_order_and_dependencies():
    q = RoundRobinQueues()
    q.add_job("A", ["rollout-0"], ["train-0"])
    q.add_job("B", ["rollout-0"], ["train-0"])
    assert [(r.job_id, r.phase) for r in q.ready()] == [("A", "rollout")]
    q.grant("A", "rollout")
    assert q.ready() == []
    with pytest.raises(ValueError, match="not ready"):
        q.grant("B", "rollout")
    nxt = q.on_phase_done("A", "rollout", 10.0)
    assert sorted((r.job_id, r.phase) for r in nxt) == [("A", "train"), ("B", "rollout")]
    q.grant("A", "train")
    q.grant("B", "rollout")
    q.on_phase_done("A", "train")
    assert [(r.job_id, r.phase) for r in q.ready()] == [("A", "sync")]  # sync holds the training slot
    q.grant("A", "sync")
    q.on_phase_done("B", "rollout")
    assert q.ready() == []  # B's training waits behind A's sync; A's rollout behind B's (FIFO)
    q.on_phase_done("A", "sync")
    assert q.iteration("A") == 1
    assert sorted((r.job_id, r.phase) for r in q.ready()) == [("A", "rollout"), ("B", "train")]
    assert q.queue("rollout-0") == ("A", "B") and q.queue("train-0") == ("B", "A")


def test_declaring_no_sync_ends_the_turn_with_training():
    q = RoundRobinQueues()
    q.add_job("A", ["rollout-0"], ["train-0"])
    q.add_job("B", ["rollout-0"], ["train-0"])
    q.grant("A", "rollout")
    q.on_phase_done("A", "rollout")
    q.grant("A", "train")
    q.on_phase_done("A", "train")
    assert q.next_phase("A") == "sync" and q.iteration("A") == 0
    q.set_has_sync("A", False)  # declared late (e.g. by a restarted driver): the empty sync slot ends
    assert q.next_phase("A") == "rollout" and q.iteration("A") == 1
    q.set_has_sync("B", False)  # B has not trained yet: nothing ends now
    assert q.next_phase("B") == "rollout" and q.iteration("B") == 0
    q.grant("B", "rollout")
    q.on_phase_done("B", "rollout")
    q.grant("B", "train")
    q.on_phase_done("B", "train")
    assert q.next_phase("B") == "rollout" and q.iteration("B") == 1
    assert q.queue("train-0") == ("A", "B")  # both turns ended on the training node
    with pytest.raises(KeyError):
        q.set_has_sync("C", False)


def test_queue_errors():
    q = RoundRobinQueues()
    q.add_job("A", ["rollout-0"], ["train-0"], has_sync=False)
    with pytest.raises(ValueError, match="already"):
        q.add_job("A", ["rollout-1"], ["train-1"])
    with pytest.raises(ValueError, match="at least one"):
        q.add_job("C", [], ["train-1"])
    with pytest.raises(ValueError, match="not running"):
        q.on_phase_done("A", "rollout")
    with pytest.raises(KeyError):
        q.grant("Z", "rollout")
    with pytest.raises(ValueError, match="no running"):
        q.release("A")
    q.grant("A", "rollout")
    q.on_phase_done("A", "rollout")
    q.grant("A", "train")
    q.on_phase_done("A", "train")  # no sync registered: training completes the iteration
    assert q.iteration("A") == 1 and q.next_phase("A") == "rollout"


def test_release_lets_next_rollout_start():
    q = RoundRobinQueues()
    q.add_job("A", ["rollout-0"], ["train-0"])
    q.add_job("B", ["rollout-0"], ["train-0"])
    q.grant("A", "rollout")
    q.release("A")
    assert [(r.job_id, r.phase) for r in q.ready()] == [("B", "rollout")]
    with pytest.raises(ValueError):
        q.release("A")
    q.grant("B", "rollout")
    q.on_phase_done("A", "rollout")
    assert [(r.job_id, r.phase) for r in q.ready()] == [("A", "train")]


def test_remove_job_keeps_heads_consistent():
    q = RoundRobinQueues()
    for j in "ABC":
        q.add_job(j, ["rollout-0"], ["train-0"])
    q.grant("A", "rollout")
    q.on_phase_done("A", "rollout")
    assert q.head("rollout-0") == "B"
    q.remove_job("B")
    assert q.head("rollout-0") == "C" and q.queue("rollout-0") == ("C", "A")
    q.remove_job("C")
    q.remove_job("A")
    assert q.nodes == () and q.head("rollout-0") is None


# --- simulate_group -------------------------------------------------------------------------------

def test_two_job_timeline_exact():
    g = [mem("A", 100, 100), mem("B", 50, 50)]
    s = simulate_group(g, meta_iterations=4)
    roll = [(r.job_id, r.start_s, r.end_s) for r in s.timeline if r.pool == "rollout"][:4]
    train = [(r.job_id, r.start_s, r.end_s) for r in s.timeline if r.phase == "train"][:4]
    assert roll == [("A", 0, 100), ("B", 100, 150), ("A", 200, 300), ("B", 300, 350)]
    assert train == [("A", 100, 200), ("B", 200, 250), ("A", 300, 400), ("B", 400, 450)]
    assert s.t_coexec_s == {"A": 200, "B": 200} and s.t_meta_s == 200
    assert s.slowdowns == {"A": 1.0, "B": 2.0}
    assert s.busy_fraction == {"rollout": 0.75, "train": 0.75}
    assert s.bubble_fraction["train"] == pytest.approx(0.25)
    s = group_figures(g)
    assert (s.t_cycle, s.t_load, saturated(g)) == (200, 150, False)


def test_sync_holds_training_node_and_gates_next_rollout():
    s = simulate_group([mem("A", 100, 100, 20)], meta_iterations=3)
    recs = [(r.phase, r.start_s, r.end_s, r.node) for r in s.timeline][:4]
    assert recs == [("rollout", 0, 100, "rollout-0"), ("train", 100, 200, "train-0"),
                    ("sync", 200, 220, "train-0"), ("rollout", 220, 320, "rollout-0")]
    assert s.t_coexec_s["A"] == 220 and s.slowdown("A") == 1.0


def test_scale_out_group_runs_rollouts_in_parallel():
    g = [mem("A", 100, 50, r=("rollout-0",)), mem("B", 100, 50, r=("rollout-1",))]
    assert group_figures(g).loads == {"rollout-0": 100, "rollout-1": 100, "train-0": 100}
    assert not saturated(g)
    s = simulate_group(g)
    assert s.t_coexec_s == {"A": 150, "B": 150}
    starts = [r.start_s for r in s.timeline if r.job_id == "A" and r.phase == "rollout"][:3]
    assert starts == [0, 150, 300]
    assert coexec_times(g) == {"A": 150, "B": 150}


def test_saturated_group():
    g = [mem("A", 100, 100), mem("B", 100, 10)]
    s = group_figures(g)
    assert s.t_load == 200 and s.t_cycle == 200 and saturated(g)  # equality counts as saturated
    assert simulate_group(g).t_meta_s == 200
    over = [mem("A", 100, 100), mem("B", 120, 10)]
    assert simulate_group(over).t_meta_s == 220  # overloaded: the cycle stretches to T_load > T_cycle


def test_phase_times_mapping_and_callable():
    g = [mem("A", 100, 100)]
    seq = {"A": [IterationTimes(50, 50), IterationTimes(150, 50)]}
    s = simulate_group(g, meta_iterations=4, phase_times=seq)
    assert [r.end_s - r.start_s for r in s.timeline if r.phase == "rollout"][:4] == [50, 150, 50, 150]
    s2 = simulate_group(g, meta_iterations=4, phase_times=lambda j, i: PhaseProfile(t_roll_s=10 + i, t_train_s=5))
    assert [r.end_s - r.start_s for r in s2.timeline if r.phase == "rollout"] == [10, 11, 12, 13]
    with pytest.raises(ValueError, match="t_roll_s"):
        IterationTimes(-1, 1)
    with pytest.raises(ValueError, match="t_trigger_s"):
        IterationTimes(10, 1, t_trigger_s=11)


def test_simulate_group_input_errors():
    with pytest.raises(ValueError, match="at least one"):
        simulate_group([])
    with pytest.raises(ValueError, match="meta_iterations"):
        simulate_group([mem("A", 1, 1)], meta_iterations=1)
    with pytest.raises(ValueError, match="already"):
        simulate_group([mem("A", 1, 1), mem("A", 2, 2)])


# --- long-tail migration ---------------------------------------------------------------------------

def test_long_tail_policy_rules():
    p = LongTailPolicy()
    assert (p.trigger_fraction, p.tail_gpus) == (0.8, 1)
    assert not p.should_migrate(79, 100) and p.should_migrate(80, 100) and not p.should_migrate(100, 100)
    assert p.split_workers(["w0", "w1", "w2"]) == (("w0",), ("w1", "w2"))
    assert p.held_fraction(8) == 0.125
    assert p.worthwhile(100, 50) and not p.worthwhile(100, 99) and not p.worthwhile(100, None)
    for bad in (dict(trigger_fraction=0), dict(tail_gpus=0), dict(migration_overhead_s=-1)):
        with pytest.raises(ValueError):
            LongTailPolicy(**bad)


def test_long_tail_migration_pipelines_the_next_rollout():
    # two jobs whose rollouts reach 80% of responses at 20 s but end at 100 s (stragglers); few
    # stragglers (tail_load 0.1: 0.8 of one GPU's slots on the tail GPU) so the tail keeps its pace
    g = [mem("A", 100, 10), mem("B", 100, 10)]
    it = IterationTimes(100, 10, 0, t_trigger_s=20, tail_load=0.1)
    times = {"A": [it], "B": [it]}
    base = simulate_group(g, phase_times=times)
    lt = simulate_group(g, phase_times=times, long_tail=LongTailPolicy(0.8, tail_gpus=1, migration_overhead_s=2))
    assert base.t_meta_s == 200 and base.migrations == 0
    assert lt.migrations > 0
    recs = [r for r in lt.timeline if r.phase == "rollout" and r.iteration == 0]
    first = {j: (min(r.start_s for r in recs if r.job_id == j), max(r.end_s for r in recs if r.job_id == j)) for j in "AB"}
    assert first["A"] == (0, 102)  # the migrated tail pays the overhead
    # A's rollout record is split at the release: the whole node until 22 s, then the tail's 1/8
    a = sorted((r.start_s, r.end_s, r.gpus) for r in recs if r.job_id == "A")
    assert a == [(0, 22, None), (22, 102, 0.125)]
    assert first["B"][0] == 22  # B starts on the freed GPUs at trigger + overhead
    # B runs at 7/8 speed while A's tail holds 1/8 of the node: 80 s * 7/8 = 70 s of work done by
    # 102 s, 30 s left at full speed. B's own trigger (at ~44.9 s) finds nobody waiting (A's
    # rollout still runs), so B is not migrated in this iteration
    assert first["B"][1] == pytest.approx(102 + 30)
    assert lt.t_meta_s < base.t_meta_s


def test_long_tail_stretch_grows_with_stragglers_per_tail_gpu():
    p = LongTailPolicy(0.8, tail_gpus=1, migration_overhead_s=2.0)
    assert p.tail_stretch(8) == pytest.approx(1.6)  # 20% of 8 GPUs' slots packed onto 1 GPU
    assert p.tail_stretch(8, tail_load=0.05) == 1.0  # fewer stragglers than one GPU's slots
    assert LongTailPolicy(0.8, tail_gpus=2).tail_stretch(8) == 1.0
    assert p.tail_stretch(16) == pytest.approx(3.2)
    with pytest.raises(ValueError, match="tail_load"):
        IterationTimes(100, 10, 0, t_trigger_s=20, tail_load=-1)


def _member(j, t, r="rollout-0"):
    s = JobSpec(job_id=j, model_params_b=7, slo=3, measured=PhaseProfile(t_roll_s=100, t_train_s=20, t_sync_s=2))
    return GroupMember(spec=s, profile=s.measured, placement=Placement(job_id=j, rollout_nodes=(r,), train_nodes=(t,)))


def test_lone_job_never_migrates():
    """Nobody waits for a lone job's rollout nodes: migration would only add its overhead."""
    m = _member("r1", "train-0")
    it = {"r1": [IterationTimes(100, 20, 2, t_trigger_s=40)]}
    off = simulate_group([m], meta_iterations=6, phase_times=it)
    on = simulate_group([m], meta_iterations=6, phase_times=it, long_tail=LongTailPolicy(0.8, 1, 2.0))
    assert off.t_meta_s == on.t_meta_s == 122.0 and on.migrations == 0


def test_early_trigger_is_penalised_by_packed_stragglers():
    """Two jobs on one rollout node; 80% of responses done at ``trig`` s of a 100 s rollout. The
    20% stragglers of 8 GPUs would stretch the rest of the rollout 1.6x on 1 tail GPU, beyond
    what admission planned (no slack: measured = realised), so the tail keeps 2 GPUs (no
    stretch) and frees only 6/8 of the node: a very early trigger then buys nothing (the next
    rollout crawls at 6/8 speed beside a 90 s tail) while a later one shortens the cycle."""
    g = [_member("a", "train-0"), _member("b", "train-1")]
    got = {}
    for trig in (10, 40, 60, 80):
        it = [IterationTimes(100, 20, 2, t_trigger_s=trig)]
        r = simulate_group(g, meta_iterations=10, phase_times={"a": it, "b": it}, long_tail=LongTailPolicy(0.8, 1, 2.0))
        got[trig] = r.t_meta_s
        end = max(x.end_s for x in r.timeline if x.job_id == "a" and x.phase == "rollout" and x.iteration == 0)
        assert end == pytest.approx(100 + 2)  # never later than planned + the overhead
        tail = [x for x in r.timeline if x.job_id == "a" and x.phase == "rollout" and x.iteration == 0 and x.start_s > 0]
        assert tail and tail[0].start_s == trig + 2 and tail[0].gpus == pytest.approx(2 / 8)  # 2 of 8 GPUs
    assert got == pytest.approx({10: 200.0, 40: 157.0, 60: 172.0, 80: 164.0}, abs=0.1)
    assert got[10] > got[40] and all(v <= 200.0 for v in got.values())


def test_tail_stretches_within_the_planned_slack():
    """With slack (realised 100 s rollouts planned at 150 s) one tail GPU may take the stragglers:
    the rest of the rollout stretches 1.6x as long as it ends by the planned end + overhead."""
    p = LongTailPolicy(0.8, 1, 2.0)
    assert p.plan_tail(8, remaining_s=60, slack_s=50) == (1, pytest.approx(1.6))  # 36 s <= 50 s
    assert p.plan_tail(8, remaining_s=90, slack_s=50) == (2, 1.0)  # 54 s > 50 s: keep 2 GPUs
    assert p.plan_tail(2, remaining_s=90, slack_s=0, tail_load=0.9) is None  # would need all GPUs
    s = JobSpec(job_id="a", model_params_b=7, slo=3, measured=PhaseProfile(t_roll_s=150, t_train_s=20, t_sync_s=2))
    a = GroupMember(spec=s, profile=s.measured, placement=Placement(job_id="a", rollout_nodes=("rollout-0",), train_nodes=("train-0",)))
    b = _member("b", "train-1")
    it = [IterationTimes(100, 20, 2, t_trigger_s=40)]
    r = simulate_group([a, b], meta_iterations=6, phase_times={"a": it, "b": it}, long_tail=p)
    end = max(x.end_s for x in r.timeline if x.job_id == "a" and x.phase == "rollout" and x.iteration == 0)
    assert end == pytest.approx(40 + 2 + 60 * 1.6)



# --- robustness: joins and departures while running ------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "step", "step", "step"]), st.integers(0, 3),
                          st.integers(0, 3)), min_size=5, max_size=60))
def test_queues_never_deadlock_under_joins_and_departures(ops):
    """A driver completes running phases oldest-first; jobs join / leave at random points. Every
    remaining job keeps making progress (no deadlock) and FIFO heads stay valid."""
    d = QueueDriver()
    for op, a, b in ops:
        if op == "add":
            d.add([f"rollout-{a}"], [f"train-{b}"])
        elif op == "remove":
            d.remove(a)
        elif d.running:
            d.q.on_phase_done(*d.running.pop(0))
        d.pump()
    d.drain(rounds=20, pick=lambda i: 0)  # every remaining job completes two more iterations


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "order", "release", "step", "step", "step"]),
                          st.sets(st.integers(0, 2), min_size=1), st.sets(st.integers(0, 1), min_size=1),
                          st.permutations(range(8)), st.integers(0, 8)), min_size=5, max_size=60))
def test_multi_node_queues_never_deadlock_under_joins_plans_and_releases(ops):
    """Jobs spanning several nodes join mid-cycle, leave, get re-planned round-robin orders and
    release long-tail rollouts while a driver completes running phases in any order: some phase
    is always running (no deadlock), no node runs two unreleased phases at once, and every job
    left completes two more iterations. (Appending a multi-node job at the end of each node's
    list, instead of at one consistent turn, deadlocked here.)"""
    d = QueueDriver(exclusive_nodes=True)
    q, running = d.q, d.running
    for op, rn, tn, perm, k in ops:
        if op == "add":
            d.add([f"rollout-{x}" for x in sorted(rn)], [f"train-{x}" for x in sorted(tn)])
        elif op == "remove":
            d.remove(k)
        elif op == "order":
            q.set_order([f"j{i}" for i in perm[:k]])
        elif op == "release":
            d.release_one()
        elif running:
            q.on_phase_done(*running.pop(k % len(running)))
        d.pump()
        assert running or not q.job_ids
    d.drain(rounds=40, pick=lambda i: i % len(running))


def test_planned_order_places_a_late_job_and_keeps_the_head():
    """A plan re-sorts the queues keeping a running phase's node; a job attaching later takes its
    planned place in the cycle, or the next round where that place was already served."""
    q = RoundRobinQueues()
    q.set_order(["B", "C", "A"])
    q.add_job("A", ["rollout-0"], ["train-0"])
    q.add_job("C", ["rollout-0"], ["train-0"])
    assert q.queue("rollout-0") == ("C", "A")
    q.grant("C", "rollout")
    q.add_job("B", ["rollout-0"], ["train-0"])  # B's place (before C) was served this round
    assert q.queue("rollout-0") == ("C", "A", "B") and q.planned_order == ("B", "C", "A")
    q.on_phase_done("C", "rollout")
    assert [(r.job_id, r.phase) for r in q.ready()] == [("A", "rollout"), ("C", "train")]
    q.set_order(["A", "B", "C"])
    assert q.queue("rollout-0") == ("A", "B", "C")


# --- the admission fast path equals the event simulation ---------------------------------------------

@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300), st.integers(0, 20),
                          st.sets(st.integers(0, 2), min_size=1), st.sets(st.integers(0, 1), min_size=1)),
                min_size=1, max_size=5))
def test_coexec_recurrence_matches_event_simulation(spec):
    """Multi-node groups (shared and dedicated nodes): coexec_times == simulate_group's t_coexec_s."""
    g = [mem(f"j{i}", r, t, s, r=tuple(f"rollout-{x}" for x in sorted(rn)), t=tuple(f"train-{x}" for x in sorted(tn)))
         for i, (r, t, s, rn, tn) in enumerate(spec)]
    fast = coexec_times(g)
    slow = simulate_group(g, record_timeline=False).t_coexec_s
    assert fast == pytest.approx(slow, rel=1e-9)


def test_stochastic_rollouts_with_long_tail_migration_shorten_meta_iterations():
    """Seeded long-tailed rollouts of three 7B jobs on one node pair: stragglers at the cap set
    each rollout's end, 80% of responses are done far earlier, so migrating the tails pipelines
    the next rollout (RollMux §4.3, Fig. 7)."""
    import numpy as np

    from rollmux import profiler
    from rollmux.config import CONFIG_DIR, load_cluster

    c = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    jobs = [JobSpec(job_id=f"s{i}", model_params_b=7, max_response_tokens=8192, mean_response_tokens=1500,
                    num_prompts=64, slo=2) for i in range(3)]
    g = [GroupMember(spec=j, profile=profiler.estimate(j, c),
                     placement=Placement(job_id=j.job_id, rollout_nodes=("rollout-0",), train_nodes=("train-0",)))
         for j in jobs]
    rng = np.random.default_rng(0)
    times = {j.job_id: [profiler.sample_iteration(j, c, rng) for _ in range(4)] for j in jobs}
    assert all(it.t_trigger_s < 0.5 * it.t_roll_s for v in times.values() for it in v)
    plain = simulate_group(g, phase_times=times)
    migr = simulate_group(g, phase_times=times, long_tail=LongTailPolicy())
    # each rollout migrates only when another member waits for the node (here 2 of 3 per cycle)
    assert plain.migrations == 0 and migr.migrations >= 2 * 10
    assert migr.t_meta_s < 0.6 * plain.t_meta_s
    assert migr.busy_fraction["train"] > plain.busy_fraction["train"]


def test_steady_schedule_equals_the_event_simulation_bit_for_bit():
    """The replay's group units come from steady_schedule: every steady-state figure and the busy
    curve up to the window's end equal simulate_group's exactly (not approximately)."""
    import random

    from rollmux.intra_group import steady_schedule, simulate_group
    from rollmux.models import CoExecutionGroup, GroupMember, JobSpec, PhaseProfile, Placement

    rng = random.Random(7)
    gpn = {"rollout": 8, "train": 8}
    for trial in range(60):
        n, nr, nt = rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 3)
        mems = []
        for k in range(n):
            rn = sorted(rng.sample(range(nr), rng.randint(1, nr)))
            tn = sorted(rng.sample(range(nt), rng.randint(1, nt)))
            prof = PhaseProfile(t_roll_s=rng.uniform(10, 500), t_train_s=rng.uniform(10, 500),
                                t_sync_s=rng.choice([0.0, rng.uniform(0, 30)]))
            spec = JobSpec(job_id=f"j{k}", model_params_b=7, slo=2.0, num_rollout_gpus=8 * len(rn),
                           num_train_gpus=8 * len(tn), measured=prof)
            mems.append(GroupMember(spec=spec, profile=prof, placement=Placement(
                job_id=f"j{k}", rollout_nodes=tuple(f"rollout-{i}" for i in rn), train_nodes=tuple(f"train-{i}" for i in tn))))
        grp = CoExecutionGroup(group_id="g", rollout_nodes=tuple(f"rollout-{i}" for i in range(nr)),
                               train_nodes=tuple(f"train-{i}" for i in range(nt)), members=tuple(mems))
        a = simulate_group(grp, record_timeline=False, gpus_per_node=gpn)
        b = steady_schedule(grp, gpus_per_node=gpn)
        assert (b.t_coexec_s, b.t_coexec_max_s, b.window_s, b.busy_fraction, b.t_meta_s) == \
            (a.t_coexec_s, a.t_coexec_max_s, a.window_s, a.busy_fraction, a.t_meta_s), trial
        w0, w1 = a.window_s
        for pool in ("rollout", "train"):
            for t in (0.0, w0 / 3, w0, (w0 + w1) / 2, w1):
                assert b.busy_curve.cumulative(pool, t) == a.busy_curve.cumulative(pool, t), (trial, pool, t)


# --- the steady state is the periodic regime, not the first 2n + 4 cycles ---------------------------

def test_a_job_tied_to_a_slower_partner_runs_at_the_partners_cadence():
    """Two jobs on their own rollout nodes sharing one training node, own iterations 790.9 s and
    846.9 s: each training waits for the other's in FIFO order, so both run one iteration per
    846.9 s once the faster one's head start is used up (after ~10 cycles). The first ``2n + 4 = 8``
    cycles still showed 790.9 s for it (its SLO of 1.05 looked kept, at 1.0x)."""
    a = mem("a", 576.345, 203.348, 11.215, r=("rollout-0",), t=("train-0",))
    b = mem("b", 625.276, 210.42, 11.215, r=("rollout-1",), t=("train-0",))
    t = coexec_times([a, b])
    assert t["a"] == pytest.approx(846.911, abs=1e-3) and t["b"] == pytest.approx(846.911, abs=1e-3)
    assert steady_meta_iterations([a, b]) > 8
    s = simulate_group([a, b], record_timeline=False)  # the default horizon is the steady one
    assert s.t_coexec_s == pytest.approx(t, rel=1e-9)
    assert steady_schedule([a, b]).t_coexec_s == s.t_coexec_s
    assert simulate_group([a, b], meta_iterations=8, record_timeline=False).t_coexec_s["a"] == pytest.approx(790.91, abs=0.01)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 900), st.integers(1, 900), st.integers(0, 20),
                          st.sets(st.integers(0, 2), min_size=1), st.sets(st.integers(0, 1), min_size=1)),
                min_size=2, max_size=5))
def test_steady_state_is_the_long_run_rate(spec):
    """The steady ``t_coexec`` equals the recurrence's average over a long horizon (8,000
    cycles, where any head start is spent), and jobs linked by shared nodes share one cadence."""
    from rollmux.steady_state import _canonical, _rr_recurrence

    g = [mem(f"j{i}", r, t, s, r=tuple(f"rollout-{x}" for x in sorted(rn)), t=tuple(f"train-{x}" for x in sorted(tn)))
         for i, (r, t, s, rn, tn) in enumerate(spec)]
    key = _canonical(g)
    fast = coexec_times(g)
    assert list(fast.values()) == pytest.approx(list(_rr_recurrence(key, 8000)), rel=1e-3)
    if len({m.placement.train_nodes for m in g}) == 1:  # one training node set: one cadence
        assert max(fast.values()) == pytest.approx(min(fast.values()), rel=1e-9)


def test_cycled_recurrence_equals_the_event_simulation_bit_for_bit():
    """The SLO watch's prediction without long-tail migration: per-iteration phase times (cycled,
    lists of different lengths, a member on its profile) give the event simulation's t_coexec_s
    exactly (not approximately), on shared and dedicated nodes, over any horizon."""
    import random

    from rollmux.intra_group import cycled_coexec_times

    rng = random.Random(11)
    for trial in range(80):
        n, nr, nt = rng.randint(1, 5), rng.randint(1, 3), rng.randint(1, 3)
        g, times = [], {}
        for k in range(n):
            rn = tuple(f"rollout-{i}" for i in sorted(rng.sample(range(nr), rng.randint(1, nr))))
            tn = tuple(f"train-{i}" for i in sorted(rng.sample(range(nt), rng.randint(1, nt))))
            m = mem(f"j{k}", rng.uniform(10, 500), rng.uniform(10, 500), rng.choice([0.0, rng.uniform(0, 30)]), r=rn, t=tn)
            g.append(m)
            if rng.random() < 0.8:
                times[m.spec.job_id] = [IterationTimes(rng.uniform(5, 600), rng.uniform(5, 600), rng.choice([0.0, rng.uniform(0, 30)]))
                                        for _ in range(rng.randint(1, 6))]
        k = rng.randint(2, 40)
        full = {m.spec.job_id: times.get(m.spec.job_id) or [m.profile] for m in g}
        assert cycled_coexec_times(g, full, k) == simulate_group(g, meta_iterations=k, phase_times=full,
                                                                 record_timeline=False).t_coexec_s, trial
    with pytest.raises(ValueError):
        cycled_coexec_times(g, full, 1)
