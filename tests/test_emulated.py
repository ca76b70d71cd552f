"""Emulated accelerators: the timed waits are the profiler's model x the time factor, lengths are
seeded and capped, progress is reported response by response, the counted sync counts the plan's
bytes, and a small emulated group on the session's Ray cluster matches the simulator."""

from __future__ import annotations

import sys
import uuid

import numpy as np
import pytest

from rollmux import emulation, profiler
from rollmux.emulation import EmulationConfig
from rollmux.models import ClusterSpec, JobSpec, NodeSpec, PhaseProfile, PoolSpec


def _cluster(nr: int = 2, nt: int = 2) -> ClusterSpec:
    from rollmux.config import load_gpu_types

    g = load_gpu_types()
    return ClusterSpec(name="emul-test",
                       rollout_pool=PoolSpec(node=NodeSpec(gpu=g["H20"], gpus_per_node=8, host_mem_gb=2048), num_nodes=nr),
                       train_pool=PoolSpec(node=NodeSpec(gpu=g["H800"], gpus_per_node=8, host_mem_gb=2048), num_nodes=nt),
                       cross_cluster_gbps=20, intra_cluster_gbps=400)


def _job(job_id: str = "emu-a", t_roll: float = 200.0, t_train: float = 100.0, slo: float = 2.0, **kw) -> JobSpec:
    base = dict(job_id=job_id, model_params_b=7, num_prompts=64, responses_per_prompt=8, max_response_tokens=4096,
                num_rollout_gpus=8, num_train_gpus=8, slo=slo)
    base.update(kw)
    spec = JobSpec(**base)
    sync = profiler.sync_time(spec, _cluster())
    return spec.model_copy(update={"measured": PhaseProfile(t_roll_s=t_roll, t_train_s=t_train, t_sync_s=sync)})


class FakeClock:
    """A virtual clock whose sleep advances it exactly (the waits' arithmetic, free of jitter)."""

    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def _rollout_on_fake_clock(seed: int):
    """A default job's emulated rollout engine at 10 ms per modelled second on a fake clock, and its
    response lengths drawn with ``seed``: ``(cluster, job, cfg, lengths, clock, engine)``."""
    from actors.worker.emulated import EmulatedRollout

    c, job = _cluster(), _job()
    cfg = EmulationConfig(wall_ms_per_model_s=10.0, progress_tick_ms=5.0)
    lengths = emulation.draw_lengths(job, emulation.job_rng(job.job_id, seed), cfg)
    fc = FakeClock()
    return c, job, cfg, lengths, fc, EmulatedRollout(job, c, cfg, clock=fc.clock, sleep=fc.sleep)


def test_rollout_wait_is_the_model_times_the_time_factor():
    c, job, cfg, lengths, fc, eng = _rollout_on_fake_clock(seed=3)
    out = eng.generate(lengths)
    expect = profiler.response_finish_times(job, c, lengths)[-1]
    assert out["t_roll_model_s"] == pytest.approx(expect)
    assert out["wall_s"] == pytest.approx(expect * 0.010, rel=1e-9)  # exactly model x factor on a virtual clock
    # and what the simulator realises for the same lengths (one copy of the model)
    it = profiler.iteration_times(job, c, lengths)
    assert it.t_roll_s == pytest.approx(expect) and out["token_fraction"] == pytest.approx(it.t_train_s / job.measured.t_train_s)
    # worst case: every response at the cap takes the job's worst-case rollout time
    full = eng.generate(np.full(len(lengths), float(job.max_response_tokens)))
    assert full["t_roll_model_s"] == pytest.approx(job.measured.t_roll_s)


def test_rollout_wait_on_the_real_clock_within_tolerance():
    import time

    from actors.worker.emulated import EmulatedRollout

    c, job = _cluster(), _job(t_roll=40.0)
    cfg = EmulationConfig(wall_ms_per_model_s=2.0)  # 40 modelled s -> 80 ms
    eng = EmulatedRollout(job, c, cfg)
    lengths = np.full(job.num_prompts * job.responses_per_prompt, float(job.max_response_tokens))
    t0 = time.perf_counter()
    out = eng.generate(lengths, progress=lambda d, n: None)
    dt = time.perf_counter() - t0
    assert 0.080 <= dt <= 0.160  # never early; late only by the machine's scheduling delay of the last wake-up
    assert out["wall_s"] == pytest.approx(dt, abs=0.005)


def test_train_and_sync_waits_are_the_model_times_the_time_factor():
    from actors.worker.emulated import EmulatedTrain

    c, job = _cluster(), _job(t_train=120.0)
    cfg = EmulationConfig(wall_ms_per_model_s=5.0)
    fc = FakeClock()
    tr = EmulatedTrain(job, c, cfg, clock=fc.clock, sleep=fc.sleep)
    out = tr.step(0.5)
    assert out["t_train_model_s"] == pytest.approx(60.0) and out["wall_s"] == pytest.approx(0.300)
    t = fc.t
    w = tr.send_weights()
    assert fc.t - t == pytest.approx(profiler.sync_time(job, c) * 0.005)
    assert sum(v.numel() * v.element_size() for v in w.values()) == int(round(2 * 7e9))
    assert len(w) == profiler.SYNC_PLAN_TENSORS
    assert tr.host_gb == pytest.approx(profiler.state_gb(job, "train", c))
    assert tr.gpu_gb == pytest.approx(profiler.train_gpu_state_gb(job))


def test_lengths_are_seeded_capped_and_the_simulators_samples():
    from rollmux.sim.realisation import Realisation

    c, job = _cluster(), _job(max_response_tokens=2048)
    cfg = EmulationConfig(response_lengths="sampled")
    a = emulation.draw_lengths(job, emulation.job_rng(job.job_id, 7), cfg)
    b = emulation.draw_lengths(job, emulation.job_rng(job.job_id, 7), cfg)
    other = emulation.draw_lengths(job, emulation.job_rng("emu-b", 7), cfg)
    assert a.shape == (job.num_prompts * job.responses_per_prompt,)
    assert np.array_equal(a, b) and not np.array_equal(a, other)
    assert a.min() >= 1.0 and a.max() == 2048.0 and (a == 2048.0).sum() < 0.3 * len(a)  # capped, a long tail
    assert (emulation.draw_lengths(job, emulation.job_rng(job.job_id, 7), cfg.model_copy(
        update={"response_lengths": "worst_case"})) == 2048.0).all()
    # cycled draws are exactly the simulator's stochastic samples of the same job and seed
    real = Realisation(c, stochastic=True, seed=7, samples=4)
    rng = emulation.job_rng(job.job_id, 7)
    for sample in real.iterations_of(job):
        it = profiler.iteration_times(job, c, emulation.draw_lengths(job, rng, cfg),
                                      trigger_fraction=real.long_tail.trigger_fraction)
        assert it == sample


def test_progress_is_reported_response_by_response():
    from actors.worker.emulated import EmulatedRollout

    c, job = _cluster(), _job(num_prompts=16, responses_per_prompt=4)
    cfg = EmulationConfig(wall_ms_per_model_s=10.0, progress_tick_ms=1.0)
    lengths = emulation.draw_lengths(job, emulation.job_rng(job.job_id, 1), cfg)
    fin = profiler.response_finish_times(job, c, lengths) * 0.010
    fc = FakeClock()
    t0 = fc.t
    calls = []
    EmulatedRollout(job, c, cfg, clock=fc.clock, sleep=fc.sleep).generate(
        lengths, progress=lambda d, n: calls.append((fc.t - t0, d, n)))
    done = [d for _, d, _ in calls]
    assert done == sorted(set(done)) and calls[-1][1:] == (64, 64) and len(calls) > 10
    for t, d, _ in calls:  # each report counts exactly the responses finished by then
        assert d == max(1, int(np.searchsorted(fin, t + 1e-12, side="right")))
    k = next(i for i, (_, d, _) in enumerate(calls) if d >= 0.8 * 64)  # the trigger moment is the model's
    assert calls[k][0] == pytest.approx(fin[calls[k][1] - 1], abs=0.0011)


def test_counted_sync_counts_the_plans_bytes(monkeypatch):
    import actors.worker.weight_sync as ws
    from actors.worker.weight_sync import SyncSession
    from rollmux.sync_plan import build_plan, metas_of

    job = _job()
    receivers = {f"rollmux-worker-rollout-{i}": SyncSession("j", "rollout", f"rollout-{i}", backend="counted")
                 for i in range(2)}

    class Peer:
        def __init__(self, s):
            self.s = s

        def receive_counted_nowait(self, key, weights, cross, intra, version=None):
            return self.s.receive_counted(weights, cross, intra, version)

    monkeypatch.setattr(ws, "gather", lambda pending, timeout_s=None: list(pending))
    lead = SyncSession("j", "train", "train-0", backend="counted", world_size=2, peers=("w0", "w1"),
                       rollout_workers=tuple(receivers), workers=lambda n: Peer(receivers[n]))
    follower = SyncSession("j", "train", "train-1", backend="counted", rank=1, world_size=2, peers=("w0", "w1"),
                           rollout_workers=tuple(receivers))
    w = emulation.virtual_weights(job)
    plan = build_plan(metas_of(w), 2, 2, scheme="topo")
    out = lead.run(lambda st: w, {})
    out1 = follower.run(lambda st: w, {}, follower=True)
    assert out["backend"] == "counted" and out1["backend"] == "counted"
    assert out["cross_bytes"] + out1["cross_bytes"] == plan.cross_bytes == int(round(2 * 7e9))  # one model copy
    assert out["cross_bytes"] == sum(s.nbytes for s in plan.shards_sent_by(0))
    acks = out["receivers"]
    assert [a.cross_recv_bytes for a in acks] == plan.received_bytes()
    assert all(a.cross_recv_bytes + a.intra_recv_bytes == plan.model_bytes for a in acks)
    assert all(s.pending is not None and s.pending.tensors is w for s in receivers.values())


def test_emulated_job_imports_neither_torch_nor_ray_in_plain_mode():
    import subprocess

    code = ("import sys; from tests.test_emulated import _cluster, _job; "
            "from examples.emulated.job import EmulatedJobConfig, run_job; "
            "from rollmux.emulation import EmulationConfig; "
            "r = run_job(EmulatedJobConfig(spec=_job(), cluster=_cluster(), "
            "emulation=EmulationConfig(wall_ms_per_model_s=0.1), iterations=2), attach=False); "
            "import actors.worker.workers, actors.worker.emulated; "
            "print(r['iterations'], 'torch' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": "."})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "False", "False"]


def test_emulated_group_on_the_runtime_matches_the_simulator(ray_cluster, tmp_path):
    """Two complementary jobs (rollout-heavy, training-heavy) admitted into one co-execution group
    on the session's Ray cluster: each job's steady-state iteration time (after iteration 0,
    modelled s) within [-3%, +10%] of the simulator's rate for the same group (the runtime's own
    per-phase overhead only adds; scripts/fidelity.py measures whole lifetimes over longer runs),
    same group, sync bytes counted = one model copy."""
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle, gather
    from actors.worker.workers import worker_handle
    from examples.emulated.job import EmulatedJobConfig, run_arrivals
    from examples.grpo import report
    from factories import kill_scheduler_and_controllers
    from rollmux.admission import load_scheduler_config
    from rollmux.emulation import scheduler_config
    from rollmux.sim.realisation import Realisation
    from rollmux.sim.simulator import make_policy, replay
    from rollmux.workloads import SimJob

    c = _cluster(2, 2)
    em = EmulationConfig(wall_ms_per_model_s=20.0, response_lengths="worst_case")  # overhead << 10% of a phase
    cfg = scheduler_config(load_scheduler_config(), em)  # the default, its time bounds and measured times in modelled s
    uid = uuid.uuid4().hex[:6]
    specs = [_job(f"emu-r-{uid}", t_roll=240.0, t_train=80.0), _job(f"emu-t-{uid}", t_roll=80.0, t_train=240.0)]
    n = 3
    arrivals = [0.0, 20.0]
    real = Realisation(c, seed=cfg.seed)
    jobs = [SimJob(spec=s, job_type="test", category="balanced", arrival_s=a, duration_s=n * real.solo_time_s(s))
            for s, a in zip(specs, arrivals)]
    pol = make_policy("rollmux", c, real, config=cfg)
    sim_groups: dict = {}
    steady: dict = {}  # the co-executed group's steady-state iteration time per job (the replay's rate)

    def snap(_k: int) -> None:
        for g in pol.groups():
            sim_groups.update({j: g.group_id for j in g.job_ids})
            if len(g.members) == 2:
                steady.update(real.group_unit(g).iter_time_s)

    replay(jobs, pol, real, on_event=snap)
    assert set(steady) == {s.job_id for s in specs}
    name = f"rollmux-emul-test-{uid}"
    h = get_or_create_scheduler(c, name=name, config=cfg)
    try:
        SchedulerHandle(h).health(timeout_s=None)
        gather([worker_handle(x).where_nowait() for x in ("rollout-0", "rollout-1", "train-0", "train-1")], timeout_s=120)
        cfgs = [EmulatedJobConfig(spec=s, cluster=c, emulation=em, iterations=n) for s in specs]
        res = run_arrivals(cfgs, [a * 0.020 for a in arrivals], timeout_s=120, scheduler_name=name,
                           checkpoint_dir=str(tmp_path))
        for s, a in zip(specs, arrivals):
            r = res[s.job_id]
            assert isinstance(r, dict), r
            # steady state: after iteration 0 (the second job's join, the cold start), as the replay's rate
            it_rt = report.iteration_time_s(r["timeline"]) / 0.020
            it_sim = steady[s.job_id]
            assert it_sim * 0.97 <= it_rt <= it_sim * 1.10, (s.job_id, it_rt, it_sim)  # overheads only add
            syncs = [x for x in r["timeline"] if x["phase"] == "sync"]
            assert len(syncs) == n and all(x["sync_backend"] == "counted" for x in syncs)
            assert all(x["sync_cross_bytes"] == int(round(2 * 7e9)) for x in syncs)
        groups = {res[s.job_id]["info"]["group_id"] for s in specs}
        assert len(groups) == 1  # co-executed, as the simulator's policy grouped them
        assert {sim_groups[s.job_id] for s in specs} == groups  # the same admission code: the same group id
        rolls = sorted((x["start"], x["end"], x["job_id"]) for s in specs for x in res[s.job_id]["timeline"]
                       if x["phase"] == "rollout")
        assert any(a[2] != b[2] for a, b in zip(rolls, rolls[1:]))  # the two jobs' rollouts interleave on one node
    finally:
        kill_scheduler_and_controllers(h, name)
        assert ray.is_initialized()


def test_a_rollout_starting_beside_a_running_one_acts_out_the_simulators_migration():
    """actors.worker.emulated_tail: the running rollout's unfinished responses end the overhead later and
    stretched (LongTailPolicy.plan_tail); the new one starts after the overhead at the freed share
    (the simulator's _finish); a rollout alone on its node is untouched."""
    from actors.worker import emulated_tail as et
    from rollmux.intra_group import _finish

    lt = et.policy()
    scale = 0.01
    fin_a = np.linspace(1.0, 100.0, 100)  # modelled s
    a = et.begin("tail-a", "node-x", fin_a, 0.0, scale, gpus=8, slots=100, slack_model_s=1e6)
    assert np.allclose(a.finish, fin_a * scale) and a.tail is None  # alone: untouched
    alone = et.begin("tail-c", "node-y", fin_a, 0.0, scale, gpus=8, slots=100, slack_model_s=1e6)
    now = 0.805  # 80 of a's 100 responses done
    b = et.begin("tail-b", "node-x", fin_a, now, scale, gpus=8, slots=100, slack_model_s=1e6)
    try:
        k, stretch = lt.plan_tail(8, (1.0 - now) / scale, 1e6, 20 / 100)
        ov = lt.migration_overhead_s * scale
        assert a.tail is not None and a.tail[1] == pytest.approx(k / 8)
        assert a.finish[-1] == pytest.approx(now + ov + (1.0 - now) * stretch)
        assert np.allclose(a.finish[:80], fin_a[:80] * scale)  # the finished ones keep their times
        want = [_finish(now + ov, d, [a.tail]) for d in fin_a * scale]
        assert np.allclose(b.finish, want) and b.finish[-1] > now + fin_a[-1] * scale  # slower while the tail runs
        assert alone.tail is None and np.allclose(alone.finish, fin_a * scale)
    finally:
        for e in (a, b, alone):
            et.end(e)
    assert not et._RUNNING.get("node-x") and not et._RUNNING.get("node-y")


def test_a_lone_rollout_on_a_node_takes_the_models_time():
    c, job, cfg, lengths, fc, eng = _rollout_on_fake_clock(seed=5)
    seen = []
    out = eng.generate(lengths, progress=lambda d, n: seen.append((d, n)), node="lone-node")
    assert out["wall_s"] == pytest.approx(out["t_roll_model_s"] * 0.01, rel=1e-9) and not out["migrated"]
    assert seen[-1] == (len(lengths), len(lengths)) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
