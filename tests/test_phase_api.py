"""Phase API in plain (solo) mode: no Ray, no scheduler (RollMux §5 "phase API")."""

from __future__ import annotations

import pytest
import torch

import rollmux
from rollmux.phase_api import (AdmissionRefused, PhaseFailed, RuntimeHook, is_resident, split_state,
                               state_resume, state_suspend)

SPEC = {"job_id": "plain-job", "model_params_b": 0.001, "num_rollout_gpus": 1, "num_train_gpus": 1}


def make_job(job_id="plain-job", fail_at=None, **kw):
    job = rollmux.Job({**SPEC, "job_id": job_id}, attach=False, **kw)

    @job.state("rollout")
    def build_rollout():
        torch.manual_seed(0)  # builders may seed; phases must use their own generator
        return {"policy": torch.nn.Linear(4, 2), "gen": torch.Generator().manual_seed(1), "version": 0}

    @job.state("train")
    def build_train():
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2)
        return {"policy": m, "opt": torch.optim.SGD(m.parameters(), lr=0.1)}

    @job.phase("rollout")
    def rollout(state, iteration, hook):
        x = torch.randn(8, 4, generator=state["gen"])
        for i in range(1, 5):
            hook.progress(2 * i, 8)
        return {"x": x, "y": state["policy"](x).detach(), "version": state["version"], "it": iteration}

    @job.phase("train")
    def train(state, samples):
        if fail_at is not None and samples["it"] == fail_at:
            raise ValueError("injected training failure")
        loss = (state["policy"](samples["x"]) - samples["y"].roll(1, 0)).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        return {"loss": float(loss.detach())}

    @job.phase("sync")
    def publish(state):
        return {k: v.detach().clone() for k, v in state["policy"].state_dict().items()}

    @job.apply_weights
    def apply(state, weights):
        state["policy"].load_state_dict(weights)
        state["version"] += 1

    return job, rollout, train, publish


def run(job, rollout, train, publish, n):
    out = []
    with job:
        for it in range(n):
            s = rollout(it)
            out.append((s["version"], train(s)["loss"]))
            publish()
    return out


def test_plain_loop_runs_phases_in_order_and_counts_iterations():
    events = []
    job, r, t, p = make_job("plain-a")
    job.runtime_hook(events.append)
    hist = run(job, r, t, p, 3)
    assert job.mode == "plain" and job.lifecycle == "finished" and job.iteration == 3
    assert [v for v, _ in hist] == [0, 1, 2]  # each rollout saw the weights of the previous sync
    tl = job.timeline
    assert [x["phase"] for x in tl] == ["rollout", "train", "sync"] * 3
    assert [x["iteration"] for x in tl] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert tl[0]["switch"] == "cold" and tl[3]["switch"] == "resident"
    assert all(a["end_s"] <= b["start_s"] + 1e-9 for a, b in zip(tl, tl[1:]))
    kinds = [e["event"] for e in events]
    assert kinds.count("granted") == 9 and kinds.count("done") == 9 and kinds.count("progress") == 12
    assert events[kinds.index("progress")]["done"] == 2


def test_same_seed_same_results_and_global_rng_untouched():
    a = run(*make_job("plain-b"), 3)
    torch.manual_seed(123)  # global RNG must not matter
    torch.rand(5)
    b = run(*make_job("plain-c"), 3)
    assert a == b


def test_failure_inside_training_marks_failed_and_reraises():
    events = []
    job, r, t, p = make_job("plain-fail", fail_at=1)
    job.runtime_hook(events.append)
    with pytest.raises(ValueError, match="injected"):
        run(job, r, t, p, 3)
    assert job.lifecycle == "failed" and "injected" in job.error
    assert events[-1]["event"] == "failed"
    with pytest.raises(PhaseFailed):
        r(2)


def test_module_level_decorators_bind_to_current_job():
    seen = []

    @rollmux.runtime_hook  # before any job: attached to the next one
    def hook(ev):
        seen.append(ev["event"])

    job = rollmux.Job({**SPEC, "job_id": "plain-d"}, attach=False)
    job.state("rollout")(lambda: {"n": 0})

    @rollmux.phase("rollout")
    def rollout(state, iteration):  # no hook parameter: not passed
        state["n"] += 1
        return state["n"]

    assert rollout(0) == 1 and rollout(1) == 2
    assert seen.count("granted") == 2
    job.finish()


def test_bad_input_is_rejected_with_field_names():
    with pytest.raises(Exception, match="slo"):
        rollmux.Job({**SPEC, "slo": 0.5}, attach=False)
    job = rollmux.Job(SPEC, attach=False)
    with pytest.raises(ValueError, match="phase must be one of"):
        job.phase("eval")
    with pytest.raises(ValueError, match="switch"):
        rollmux.Job(SPEC, attach=False, switch="lukewarm")
    with pytest.raises(PhaseFailed, match="no @job.phase"):
        job.run_phase("train")
    job.state("train")(lambda: [1, 2])  # not a dict
    job.phase("train")(lambda s: s)
    with pytest.raises(TypeError, match="must be a dict"):
        job.run_phase("train")
    with pytest.raises(ValueError, match="done <= total"):
        RuntimeHook("j", "rollout", 0, lambda e: None).progress(5, 4)
    assert "refused (never)" in str(AdmissionRefused({"job_id": "x", "code": "never", "reason": "too big"}))


def test_attach_from_env_falls_back_to_plain_without_scheduler(monkeypatch):
    monkeypatch.delenv("ROLLMUX_ATTACH", raising=False)
    monkeypatch.delenv("ROLLMUX_JOB_ID", raising=False)
    assert rollmux.Job(SPEC).mode == "plain"


class _Engine:
    def __init__(self):
        self.calls = []

    def offload(self):
        self.calls.append("offload")

    def load(self):
        self.calls.append("load")


class _Comm:
    rollmux_resident = True

    def sleep(self):
        pass

    def wake(self):
        pass


def test_state_split_and_hooks():
    eng, comm = _Engine(), _Comm()
    st = {"engine": eng, "comm": comm, "w": torch.zeros(2), "cfg": {"a": 1}}
    storable, resident = split_state(st)
    assert set(storable) == {"engine", "w", "cfg"} and set(resident) == {"comm"}
    assert is_resident(comm) and not is_resident(eng) and not is_resident({"rollmux_resident": True})
    state_suspend(st)
    state_resume(st)
    assert eng.calls == ["offload", "load"]
    with pytest.raises(TypeError):
        split_state([1])


def test_one_thread_is_reentrant_across_threads():
    import threading

    from rollmux.phase_api import one_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    inside = []
    gate = threading.Barrier(2)

    def work():
        with one_thread():
            gate.wait(timeout=10)
            inside.append(torch.get_num_threads())
            gate.wait(timeout=10)

    ts = [threading.Thread(target=work) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=20)
    after = torch.get_num_threads()
    torch.set_num_threads(before)
    assert inside == [1, 1] and after == 2


def test_cold_switch_rebuilds_residents_without_losing_their_state(tmp_path):
    """With ``Job(rebuild_resident=True)``, a cold start uses the engine its builder rebuilds when the old one hands over its state
    (or, on the rollout side, gets the last synced weights again); a training engine that cannot
    hand over keeps running (the builder's duplicate is dropped and closed)."""
    import torch

    from actors.worker.workers import RolloutWorkerImpl, TrainWorkerImpl

    class Engine:
        rollmux_resident = True
        built = 0

        def __init__(self):
            Engine.built += 1
            self.id, self.closed, self.w = Engine.built, False, torch.zeros(2)

        def close(self):
            self.closed = True

    class Handover(Engine):
        def state_dict(self):
            return {"w": self.w}

        def load_state_dict(self, sd):
            self.w = sd["w"].clone()

    def run_twice(worker, cls):
        worker.register_job("j", {"builder": lambda: {"engine": cls(), "x": torch.ones(1)}, "switch": "cold",
                                  "checkpoint_dir": str(tmp_path), "rebuild_resident": True})
        h = worker.jobs["j"]
        s1, k1, _ = worker._switch.materialise(h)
        s1["engine"].w += 5
        worker._switch.offload(h, s1)
        s2, k2, _ = worker._switch.materialise(h)
        assert (k1, k2) == ("cold", "cold")
        worker.unregister_job("j")
        return s1["engine"], s2["engine"]

    a, b = run_twice(TrainWorkerImpl("train-0"), Handover)  # rebuilt, state handed over, old closed
    assert b is not a and a.closed and torch.equal(b.w, torch.full((2,), 5.0))
    a, b = run_twice(TrainWorkerImpl("train-0"), Engine)  # cannot hand over: the old engine stays
    assert b is a and not a.closed and torch.equal(b.w, torch.full((2,), 5.0))
    a, b = run_twice(RolloutWorkerImpl("rollout-0"), Engine)  # rollout: rebuilt (weights re-fed)
    assert b is not a and a.closed


def test_cold_switch_keeps_the_engine_alive_and_closes_it_when_the_job_leaves(tmp_path):
    """Default (``rebuild_resident=False``): the builder runs once; every later cold start reads the
    stored state back from disk and keeps the resident engine (no new engine process per cold
    phase); the engine is asleep between phases and closed when the job leaves the worker."""
    import torch

    from actors.worker.workers import RolloutWorkerImpl

    calls = {"build": 0}

    class Engine:
        rollmux_resident = True

        def __init__(self):
            self.log, self.closed = [], False

        def sleep(self):
            self.log.append("sleep")

        def wake_up(self):
            self.log.append("wake_up")

        def close(self):
            self.closed = True

    def builder():
        calls["build"] += 1
        return {"engine": Engine(), "step": torch.zeros(1)}

    w = RolloutWorkerImpl("rollout-0")
    w.register_job("j", {"builder": builder, "switch": "cold", "checkpoint_dir": str(tmp_path)})
    h = w.jobs["j"]
    engines, kinds = [], []
    for i in range(4):
        st, kind, _ = w._switch.materialise(h)
        engines.append(st["engine"])
        kinds.append(kind)
        assert float(st["step"]) == i  # the stored state comes back from the cold-start file
        st["step"] = st["step"] + 1
        w._switch.offload(h, st)
    assert kinds == ["cold"] * 4 and calls["build"] == 1
    eng = engines[0]
    assert all(e is eng for e in engines) and not eng.closed
    assert eng.log == ["wake_up", "sleep"] * 4
    assert w.unregister_job("j") and eng.closed


def test_phase_api_and_permits_share_one_phase_core():
    """``@job.phase`` and ``with job.permit(phase)`` are one phase of the same core: the iteration
    counts across both, the events are the same, and only the core writes the lifecycle and count."""
    job, rollout, train, publish = make_job("one-core")
    events: list = []
    job.runtime_hook(lambda e: events.append((e["event"], e.get("phase"), e.get("iteration"))))
    train(rollout(0))
    publish()
    assert job.iteration == 1 and job.lifecycle == "running"
    for phase in ("rollout", "train", "sync"):  # the same phases, under permits (a framework's code)
        with job.permit(phase) as p:
            assert p.iteration == 1
    assert job.iteration == 2
    kinds = [(k, p) for k, p, _ in events if k in ("granted", "done")]
    assert kinds == [(k, p) for p in ("rollout", "train", "sync") for k in ("granted", "done")] * 2
    assert [it for k, _, it in events if k == "done"] == [0, 0, 0, 1, 1, 1]
    with pytest.raises(AttributeError):
        job.iteration = 5  # read-only: the core is its one writer
    with pytest.raises(AttributeError):
        job.lifecycle = "finished"
    with pytest.raises(RuntimeError, match="boom"):
        with job.permit("rollout"):
            raise RuntimeError("boom")
    assert job.lifecycle == "failed" and job.error == "RuntimeError: boom"
    assert [k for k, _, _ in events].count("failed") == 1
    with pytest.raises(PhaseFailed, match="is failed; no more phases"):
        rollout(2)
