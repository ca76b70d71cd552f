"""Departure re-packing (InterGroupScheduler.repack): a departure lets a small group dissolve into
another one when every member keeps its SLO (including one host-state copy) and the $/h drops;
otherwise the scheduler state is rolled back exactly. Policy core and simulator."""

from __future__ import annotations

import pytest

from rollmux import profiler
from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.config import CONFIG_DIR, load_cluster
from rollmux.models import JobSpec, PhaseProfile
from rollmux.sim.simulator import Realisation, make_policy, replay
from rollmux.workloads import SimJob
from tests.test_admission import R_PRICE, T_PRICE, job, make_cluster

PAIR = R_PRICE + T_PRICE


def three_groups_scenario(slo=1.05, **cfg):
    """A and B interleave perfectly in group-0 (saturated: T_load = T_cycle = 200 s), so C opens
    group-1; when A leaves, B alone in group-0 could join C."""
    s = InterGroupScheduler(make_cluster(), config=SchedulerConfig(**{"saturation": "paper", **cfg}))
    assert s.admit(job("A", 100, 100, slo=slo)).strategy == "isolated"
    assert s.admit(job("B", 100, 100, slo=slo)).group_id == "group-0"
    c = s.admit(job("C", 100, 100, slo=slo))
    assert c.strategy == "isolated" and c.pruned == [{"group_id": "group-0", "plugin": "saturation",
                                                       "reason": "saturated: T_load 200.0 s >= T_cycle 200.0 s"}]
    assert s.cost_usd_per_h() == pytest.approx(2 * PAIR)
    return s


def test_departure_dissolves_a_small_group_into_another():
    s = three_groups_scenario()
    s.depart("A")
    moves = s.repack("group-0")
    mv = profiler.move_time_s(job("B", 100, 100), s.cluster)
    assert mv == pytest.approx((10 + 10) * 8 / 400)  # 20 GB of host state at 400 Gbit/s
    assert moves == [{"job_id": "B", "from_group": "group-0", "to_group": "group-1",
                      "placement": {"rollout_nodes": ["rollout-1"], "train_nodes": ["train-1"]},
                      "from_placement": {"rollout_nodes": ["rollout-0"], "train_nodes": ["train-0"]},
                      "move_s": pytest.approx(mv), "saved_usd_per_h": pytest.approx(PAIR), "source": "repack"}]
    assert s.cost_usd_per_h() == pytest.approx(PAIR)
    assert [g.group_id for g in s.groups] == ["group-1"] and s.group_of("B").job_ids == ("C", "B")
    assert s.group_stats("group-1")["predicted_slowdowns"] == pytest.approx({"C": 1.0, "B": 1.0})
    # the freed node pair is reused by the next isolated group
    d = s.admit(job("D", 300, 300, slo=1.0))
    assert d.strategy == "isolated" and d.placement.rollout_nodes == ("rollout-0",)
    # a restored snapshot is the re-packed state
    r = InterGroupScheduler.restore(s.cluster, s.snapshot())
    assert r.snapshot() == s.snapshot()


def test_move_that_cannot_absorb_the_state_copy_is_rolled_back():
    # SLO exactly 1.0: B would iterate at solo speed with C, but copying its state breaks the SLO
    s = three_groups_scenario(slo=1.0)
    s.depart("A")
    before = s.snapshot()
    assert s.repack("group-0") == []
    assert s.snapshot() == before  # exact rollback, pools included
    assert s.admit(job("D", 300, 300, slo=1.0)).placement.rollout_nodes == ("rollout-2",)
    assert s.cost_usd_per_h() == pytest.approx(3 * PAIR)


def test_a_rolled_back_what_if_leaves_the_groups_as_they_were():
    # the groups tuple is kept between changes: a what-if that read it and was rolled back must
    # not leave its own groups behind
    s = three_groups_scenario()
    before = s.groups
    saved = s._save()
    s.depart("A")
    assert [g.job_ids for g in s.groups] == [("B",), ("C",)]  # read inside the what-if
    s._load(saved)
    assert s.groups == before and [g.job_ids for g in s.groups] == [("A", "B"), ("C",)]


def test_repack_switched_off_and_baselines_never_move():
    s = three_groups_scenario(repack_on_departure=False)
    s.depart("A")
    assert s.repack("group-0") == [] and s.cost_usd_per_h() == pytest.approx(2 * PAIR)
    for policy in ("random", "most-idle"):
        b = InterGroupScheduler(make_cluster(), policy=policy)
        for jid in "ABC":
            b.admit(job(jid, 100, 100, slo=1.05))
        n = len(b.groups)
        b.depart("A")
        assert b.repack(None) == [] and len(b.groups) <= n


def test_partial_dissolution_is_rolled_back_and_the_next_candidate_tried():
    s = InterGroupScheduler(make_cluster())
    s.admit(job("A", 100, 100, slo=1.05))
    s.admit(job("B", 50, 50, slo=2.1))
    s.admit(job("E", 40, 40, slo=2.5))  # group-0 = {A, B, E}: loads 190 s, T_cycle 200 s
    assert s.admit(job("C", 100, 100, slo=1.05)).strategy == "isolated"  # group-1: A's SLO forbids sharing
    s.depart("A")
    before = s.snapshot()
    # group-0 first: B fits beside C (slowdown 2.0 + copy <= 2.1) but E cannot absorb its state
    # copy (2.5 + copy > 2.5), so group-0 stays as it was; then group-1 dissolves into group-0
    moves = s.repack("group-0")
    assert [(m["job_id"], m["from_group"], m["to_group"]) for m in moves] == [("C", "group-1", "group-0")]
    assert s.group_of("B").job_ids == ("B", "E", "C") and s.cost_usd_per_h() == pytest.approx(PAIR)
    assert s.group_stats("group-0")["predicted_slowdowns"] == pytest.approx({"B": 2.0, "E": 2.5, "C": 1.0})
    assert before["groups"][0]["members"] == s.snapshot()["groups"][0]["members"][:2]


def test_config_validation():
    with pytest.raises(ValueError, match="repack_max_groups"):
        SchedulerConfig(repack_max_groups=-1)
    with pytest.raises(ValueError, match="repack_max_members"):
        SchedulerConfig(repack_max_members=0)


# --- in the simulator -------------------------------------------------------------------------

SIM = load_cluster(CONFIG_DIR / "cluster_sim.yaml")


def sim_job(jid, arrival, duration, slo=1.05):
    spec = JobSpec(job_id=jid, model_params_b=7, slo=slo, measured=PhaseProfile(t_roll_s=100, t_train_s=100, t_sync_s=0))
    return SimJob(spec=spec, job_type="hand", category="balanced", arrival_s=arrival, duration_s=duration)


@pytest.mark.parametrize("repack", [True, False])
def test_replay_moves_jobs_and_charges_the_state_copy(repack):
    jobs = [sim_job("A", 0, 2000), sim_job("B", 0, 20000), sim_job("C", 10, 20000)]
    real = Realisation(SIM)
    run = replay(jobs, make_policy("rollmux", SIM, real, repack=repack), real)
    pair = SIM.rollout_pool.node.price_usd_per_h + SIM.train_pool.node.price_usd_per_h
    mv = profiler.move_time_s(jobs[1].spec, SIM)
    assert 5 < mv < 10  # 7B: ~91 GB rollout + ~268 GB training state at 400 Gbit/s
    dep = {k: o.departure_s for k, o in run.outcomes.items()}
    m = run.metrics()
    if repack:
        assert dep == pytest.approx({"A": 2000, "B": 20000 + mv, "C": 20010})
        assert run.cost_usd == pytest.approx(pair * (10 + 2 * 1990 + (20010 - 2000)) / 3600)
        assert m["jobs_moved"] == 1 and m["move_stall_h"] == pytest.approx(mv / 3600)
    else:
        assert dep == pytest.approx({"A": 2000, "B": 20000, "C": 20010})
        assert run.cost_usd == pytest.approx(pair * (10 + 2 * 19990 + 10) / 3600)
        assert m["jobs_moved"] == 0
    assert m["slo_attainment"] == 1.0


# --- neighbourhood re-optimisation (InterGroupScheduler.reoptimise) ---------------------------------

def _two_singletons(slo, **cfg):
    """A (rollout-heavy) and B (training-heavy) alone in group-0 and group-1 on the simulation
    cluster (restored from a snapshot): together they interleave on one node pair."""
    from rollmux.models import GroupMember, Placement

    cl = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    groups = []
    slos = slo if isinstance(slo, tuple) else (slo, slo)
    for i, (jid, r, t) in enumerate((("A", 300.0, 60.0), ("B", 60.0, 300.0))):
        spec = JobSpec(job_id=jid, model_params_b=7.0, num_rollout_gpus=8, num_train_gpus=8, slo=slos[i],
                       measured=PhaseProfile(t_roll_s=r, t_train_s=t, t_sync_s=5.0))
        m = GroupMember(spec=spec, profile=spec.measured, placement=Placement(
            job_id=jid, rollout_nodes=(f"rollout-{i}",), train_nodes=(f"train-{i}",)))
        groups.append({"group_id": f"group-{i}", "rollout_nodes": [f"rollout-{i}"], "train_nodes": [f"train-{i}"],
                       "members": [m.model_dump(mode="json")]})
    snap = {"version": 1, "policy": "rollmux", "max_group_size": 5, "seed": 0,
            "config": SchedulerConfig(**cfg).model_dump(), "next_group": 2, "groups": groups}
    return cl, InterGroupScheduler.restore(cl, snap)


def test_reoptimise_merges_a_neighbourhood_when_it_is_cheaper_and_every_slo_absorbs_the_move():
    from rollmux.baselines import OptimalPartition

    cl, s = _two_singletons(1.04)
    pair = s.cost_usd_per_h()
    solver = OptimalPartition(cl, exact_max_jobs=8)
    moves = s.reoptimise("group-0", solver=solver)
    mv = profiler.move_time_s(s.member("A").spec, cl)
    assert mv == pytest.approx(7.176)
    # the merged group takes over group-0: A stays on its nodes, only B moves (one copy, not two)
    assert [(m["job_id"], m["from_group"], m["to_group"]) for m in moves] == [("B", "group-1", "group-0")]
    assert all(m["move_s"] == pytest.approx(mv) and m["placement"] == {"rollout_nodes": ["rollout-0"],
                                                                        "train_nodes": ["train-0"]} for m in moves)
    assert s.member("A").placement.rollout_nodes == ("rollout-0",) and s.member("A").placement.train_nodes == ("train-0",)
    assert s.cost_usd_per_h() == pytest.approx(pair / 2) == pytest.approx(solver.solve(
        [(m.spec, m.profile) for m in s.group("group-0").members]).cost_usd_per_h)
    assert moves[0]["saved_usd_per_h"] == pytest.approx(pair / 2)
    # the predicted slowdown plus one host-state copy is within the mover's SLO
    sd = s.group_stats("group-0")["predicted_slowdowns"]
    assert sd == {"A": pytest.approx(370 / 365), "B": pytest.approx(370 / 365)}
    assert sd["B"] + mv / 365.0 <= 1.04
    # the state round-trips, and the freed nodes are reused by the next admission
    r = InterGroupScheduler.restore(cl, s.snapshot())
    assert r.snapshot() == s.snapshot() and r.nodes_in_use() == s.nodes_in_use() == {"rollout": 1, "train": 1}
    assert s.reoptimise("group-0", solver=solver) == []  # nothing left to improve


def test_reoptimise_keeps_the_groups_when_a_move_would_break_an_slo_or_it_is_off():
    from rollmux.baselines import OptimalPartition

    cl, s = _two_singletons(1.02)  # 370/365 fits 1.02, but not with the 7.2 s copy: 1.0137 + 0.0197 > 1.02
    before = s.snapshot()
    assert s.reoptimise("group-0", solver=OptimalPartition(cl, exact_max_jobs=8)) == [] and s.snapshot() == before
    # the job that cannot absorb its copy stays where it is: B (SLO 1.02) keeps its nodes, A (SLO 1.04) moves in
    cl, s = _two_singletons((1.04, 1.02))
    moves = s.reoptimise("group-0", solver=OptimalPartition(cl, exact_max_jobs=8))
    assert [(m["job_id"], m["from_group"], m["to_group"], m["move_s"]) for m in moves] == [
        ("A", "group-0", "group-1", pytest.approx(7.176))]
    assert s.member("B").placement.rollout_nodes == ("rollout-1",)
    # a job that has not started has no state to copy: B, just admitted, joins A without a move
    cl, s = _two_singletons((1.04, 1.02))
    moves = s.reoptimise("group-1", fresh="B", solver=OptimalPartition(cl, exact_max_jobs=8))
    assert [(m["job_id"], m["move_s"]) for m in moves] == [("B", 0.0)]
    assert s.group_of("B").group_id == s.group_of("A").group_id == "group-0"
    cl, s = _two_singletons(1.04, reopt_max_jobs=0)
    assert s.reoptimise("group-0", solver=OptimalPartition(cl, exact_max_jobs=8)) == [] and len(s.groups) == 2


def test_reoptimise_prices_groups_at_what_they_run_on():
    """``group_price`` (the simulator's per-job allocations): a one-member group running on its
    own allocation at 30% of its nodes' price makes the merge (half the nodes of the two) dearer,
    so the neighbourhood stays; the same scheduler without the hook merges (test above)."""
    from rollmux.baselines import OptimalPartition

    cl, s = _two_singletons(1.04)
    pair = s.cost_usd_per_h()
    s.group_price = lambda g: g.cost_usd_per_h(cl) * (0.3 if len(g.members) == 1 else 1.0)
    hood = s.reopt_neighbourhood("group-0")
    assert sum(hood.costs.values()) == pytest.approx(pair) and sum(hood.prices.values()) == pytest.approx(0.3 * pair)
    before = s.snapshot()
    assert s.reoptimise("group-0", solver=OptimalPartition(cl, exact_max_jobs=8)) == [] and s.snapshot() == before
    s.group_price = lambda g: g.cost_usd_per_h(cl) * (0.6 if len(g.members) == 1 else 1.0)  # now the merge saves
    moves = s.reoptimise("group-0", solver=OptimalPartition(cl, exact_max_jobs=8))
    assert [(m["job_id"], m["to_group"]) for m in moves] == [("B", "group-0")]
    assert moves[0]["saved_usd_per_h"] == pytest.approx(0.6 * pair - pair / 2)


def _tied_trio(slo_b: float = 1.2848, **cfg):
    """Three members on 2 rollout + 2 training nodes, as a replay of the sparse one-GPU trace
    admitted them when admission averaged the round-robin schedule over ``2n + 4`` cycles: B
    (352.9 s solo, SLO 1.2848) looked 451.8 s (1.280x) with A there, but that window was still in
    the transient. B is tied to C's cadence (457.1 s, 1.295x: over its SLO) with or without A,
    which the steady state (``intra_group.steady_horizon``) shows; the group is restored as it was
    admitted."""
    from rollmux.models import GroupMember, Placement

    cl = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    rows = (("A", 325.673, 120.536, 5.609922641509434, 1.0308, ("rollout-0",), ("train-1",)),
            ("B", 110.12, 237.189, 5.611774074074074, slo_b, ("rollout-0",), ("train-0", "train-1")),
            ("C", 352.102, 99.437, 5.609922641509434, 1.3788, ("rollout-1",), ("train-0",)))
    members = []
    for jid, r, t, y, slo, rn, tn in rows:
        spec = JobSpec(job_id=jid, model_params_b=7.0, num_rollout_gpus=8, num_train_gpus=8 * len(tn), slo=slo,
                       measured=PhaseProfile(t_roll_s=r, t_train_s=t, t_sync_s=y))
        members.append(GroupMember(spec=spec, profile=spec.measured,
                                   placement=Placement(job_id=jid, rollout_nodes=rn, train_nodes=tn)).model_dump(mode="json"))
    snap = {"version": 1, "policy": "rollmux", "max_group_size": 5, "seed": 0,
            "config": SchedulerConfig(**cfg).model_dump(), "next_group": 1,
            "groups": [{"group_id": "group-0", "rollout_nodes": ["rollout-0", "rollout-1"],
                        "train_nodes": ["train-0", "train-1"], "members": members}]}
    return InterGroupScheduler.restore(cl, snap)


def test_a_departure_that_breaks_a_members_slo_moves_it_out():
    s = _tied_trio()
    slow = s.group_stats("group-0")["predicted_slowdowns"]
    assert slow["B"] == pytest.approx(457.15 / 352.92, abs=1e-3) and slow["B"] > 1.2848  # C's cadence, not the transient's 1.280x
    s.depart("A")
    left = s.group_stats("group-0")["predicted_slowdowns"]
    assert left["B"] == pytest.approx(457.15 / 352.92, abs=1e-3) and left["B"] > 1.2848  # still over after the departure
    moves = s.keep_slos("group-0")
    assert len(moves) == 1 and moves[0]["from_group"] == "group-0" and moves[0]["move_s"] > 0
    for g in s.groups:  # every member of every group within its SLO again
        pred = s.group_stats(g.group_id)["predicted_slowdowns"]
        assert all(pred[m.spec.job_id] <= m.spec.slo * (1 + 1e-9) for m in g.members), (g.group_id, pred)
    assert s.keep_slos(s.group_of("B").group_id) == []  # nothing left to repair


def test_keep_slos_is_a_no_op_for_a_group_within_its_slos_and_for_plain_alg1():
    s = _tied_trio(slo_b=1.30)  # B within its SLO at C's cadence
    before = s.snapshot()
    assert s.keep_slos("group-0") == [] and s.snapshot() == before
    s.depart("A")
    before = s.snapshot()
    assert s.keep_slos("group-0") == [] and s.snapshot() == before
    s = _tied_trio(repack_on_departure=False)  # the paper's Alg. 1: admission-time checks only
    s.depart("A")
    before = s.snapshot()
    assert s.keep_slos("group-0") == [] and s.snapshot() == before
    assert s.keep_slos("no-such-group") == []


def test_the_replay_and_the_cluster_repair_slos_after_every_departure(monkeypatch):
    """The simulator's RollMux policy calls keep_slos on the group of every departure, through
    after_departure, which the cluster's GlobalScheduler calls in its departure transaction
    (``Reoptimiser.departure_moves``)."""
    import inspect

    import actors.scheduler.reopt as runtime

    seen = []
    orig = InterGroupScheduler.keep_slos
    monkeypatch.setattr(InterGroupScheduler, "keep_slos", lambda self, gid: seen.append(gid) or orig(self, gid))
    jobs = [sim_job(f"J{i}", float(i), 1000.0 + 10 * i, slo=1.5) for i in range(4)]
    real = Realisation(SIM)
    run = replay(jobs, make_policy("rollmux", SIM, real), real)
    assert len(run.outcomes) == 4 and len(seen) == 4
    assert "self.policy.igs.after_departure(gid" in inspect.getsource(runtime)
