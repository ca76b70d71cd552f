"""Driver-side permits (``with job.permit(phase)``): the integration layer's protocol in plain mode,
and in scheduled mode co-executed with a job whose phases run on RollMux's workers."""

from __future__ import annotations

import sys
import threading
import time
import uuid

import pytest
import torch

import rollmux
from actors.handles import SchedulerHandle
from factories import make_toy, small_spec, wait_until
from rollmux.integrations import PhaseSequencer, SpecFieldMissing, Underivable, build_spec, offload_hooks
from rollmux.phase_state import PhaseFailed


class Engine:
    """A framework object with DeepSpeed-style hooks; logs every call."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def offload_states(self):
        self.log.append(("offload", self.name))

    def reload_states(self):
        self.log.append(("reload", self.name))


def _job(jid: str = "perm-plain") -> rollmux.Job:
    return rollmux.Job(small_spec(jid), attach=False).driver_phases()


def test_plain_permits_are_granted_at_once_and_call_the_hooks_around_the_block():
    job = _job()
    log: list = []
    eng = Engine(log, "e")
    for it in range(2):
        for phase in ("rollout", "train", "sync"):
            with job.permit(phase, offload=[eng]) as p:
                log.append(("run", phase))
                assert p.nodes == ("local",) and p.devices == () and p.device is None
                assert p.iteration == it and p.waited_s == 0.0 and p.pool == ("rollout" if phase == "rollout" else "train")
        assert job.iteration == it + 1  # counted after the job's last phase (sync)
    assert log[:3] == [("reload", "e"), ("run", "rollout"), ("offload", "e")]
    assert len(log) == 18
    tl = job.timeline
    assert [r["phase"] for r in tl] == ["rollout", "train", "sync"] * 2
    assert all(r["driver_side"] and r["ok"] and r["switch"] == "warm" and r["end"] >= r["start"] for r in tl)
    assert [r["iteration"] for r in tl] == [0, 0, 0, 1, 1, 1]
    job.finish()
    assert job.lifecycle == "finished"


def test_a_failing_block_offloads_releases_and_fails_the_job():
    job = _job("perm-fail")
    log: list = []
    with pytest.raises(RuntimeError, match="boom"):
        with job.permit("rollout", offload=[Engine(log, "e")]):
            raise RuntimeError("boom")
    assert log == [("reload", "e"), ("offload", "e")]
    assert job.lifecycle == "failed" and "boom" in job.error
    assert job.timeline[-1]["ok"] is False and "boom" in job.timeline[-1]["error"]
    with pytest.raises(PhaseFailed, match="failed"):
        job.permit("train").__enter__()


def test_a_permit_that_cannot_be_granted_fails_the_job():
    job = _job("perm-refused")

    class Refusing:
        open_phase = None

        def acquire(self, phase):
            raise PhaseFailed("group group-0: job 'perm-refused' asked for rollout but its next phase is train")

    job._runtime._permit_backend = Refusing()
    with pytest.raises(PhaseFailed, match="next phase is train"):
        job.permit("rollout").__enter__()
    assert job.lifecycle == "failed" and "next phase is train" in job.error


def test_undeclared_phase_nested_permit_and_hookless_target_are_refused():
    job = rollmux.Job(small_spec("perm-undecl"), attach=False)
    with pytest.raises(PhaseFailed, match="not declared"):
        job.permit("rollout").__enter__()
    job.driver_phases("rollout", "train")
    with job.permit("rollout"):
        with pytest.raises(PhaseFailed, match="still open"):
            job.permit("train").__enter__()
    with pytest.raises(TypeError, match="none of"):
        job.permit("train", offload=[object()])
    with pytest.raises(ValueError, match="phase must be one of"):
        job.permit("gen")
    with job.permit("train"):
        pass
    assert job.iteration == 1  # no sync declared: the iteration ends with training


def test_offload_hooks_resolution_order_and_pairs():
    class VLLMLike:
        def sleep(self): return "sleep"
        def wake_up(self): return "wake"

    class Both(VLLMLike):
        def offload_states(self): return "os"
        def reload_states(self): return "rs"

    off, rel = offload_hooks(VLLMLike())
    assert (off(), rel()) == ("sleep", "wake")
    off, rel = offload_hooks(Both())  # DeepSpeed's names first
    assert (off(), rel()) == ("os", "rs")
    calls: list = []
    off, rel = offload_hooks((lambda: calls.append("o"), None))
    off()
    assert rel is None and calls == ["o"]


def test_sequencer_fills_skipped_phases_with_empty_permits():
    job = _job("perm-seq")
    seq = PhaseSequencer(job)
    seq.enter("rollout")
    assert seq.enter("rollout") is seq.permit  # same phase: the open permit is kept
    seq.enter("train")
    seq.enter("rollout")  # the framework skipped sync this step: an empty sync permit keeps the turn
    seq.enter("train")
    seq.enter("sync")
    seq.enter("train")  # sync -> train: an empty rollout keeps the turn
    seq.finish()  # the begun iteration is not completed: the departure takes the job out of its queues
    phases = [(r["phase"], r["empty"]) for r in job.timeline]
    assert phases == [("rollout", False), ("train", False), ("sync", True), ("rollout", False), ("train", False),
                      ("sync", False), ("rollout", True), ("train", False)]
    assert job.iteration == 2 and job.lifecycle == "finished" and seq.empty_permits == 2


def test_build_spec_names_every_field_it_cannot_derive():
    derived = {"job_id": "x", "model_params_b": 0.5, "num_prompts": 8, "responses_per_prompt": 4,
               "max_response_tokens": 64, "prompt_tokens": Underivable("the dataset has no prompt column"),
               "num_rollout_gpus": Underivable("vLLM server mode: its GPUs are not in the trainer's config")}
    with pytest.raises(SpecFieldMissing) as e:
        build_spec("TRL", derived)
    msg = str(e.value)
    assert "prompt_tokens: the dataset has no prompt column" in msg and "num_rollout_gpus: vLLM server" in msg
    assert "num_train_gpus" in msg and "rollmux_spec=" in msg and set(e.value.missing) == {
        "prompt_tokens", "num_rollout_gpus", "num_train_gpus"}
    spec = build_spec("TRL", derived, {"prompt_tokens": 3, "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": 2.0})
    assert spec.prompt_tokens == 3 and spec.slo == 2.0 and spec.num_prompts == 8


# ---- scheduled mode: the group's controller grants the driver's permits --------------------

@pytest.fixture(scope="module")
def sched(ray_cluster, local_cluster_spec):
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from factories import FIXED_GROUPS, kill_scheduler_and_controllers

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    name = f"test-permits-{uuid.uuid4().hex[:6]}"
    h = get_or_create_scheduler(local_cluster_spec, name=name, config=FIXED_GROUPS)  # the two jobs share one group
    assert SchedulerHandle(h).health().ok
    yield name, h
    kill_scheduler_and_controllers(h, name)


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_driver_permits_co_execute_with_a_worker_job_in_round_robin_order(sched):
    from actors.driver.runtime_client import group_timeline

    name, h = sched
    uid = uuid.uuid4().hex[:6]
    n = 3
    # the driver-side job (a framework in this process) and a toy job whose phases run on the workers
    fw = rollmux.Job(small_spec(f"fw-{uid}"), attach=True, scheduler_name=name).driver_phases()
    toy = rollmux.Job(small_spec(f"toy-{uid}"), attach=True, scheduler_name=name)
    fns = make_toy(toy, "small", seed=0)
    assert fw.info["group_id"] == toy.info["group_id"], "the two small jobs share one group"
    log: list = []
    eng = Engine(log, "engine")
    seen: dict = {"nodes": set(), "decisions": []}
    errors: list = []

    def framework_loop():
        try:
            with fw:
                for it in range(n):
                    with fw.permit("rollout", offload=[eng]) as p:
                        seen["nodes"].add(("rollout", p.nodes, p.devices))
                        for i in range(1, 6):
                            time.sleep(0.02)
                            d = p.progress(i, 5)
                            if d is not None:
                                seen["decisions"].append(d)
                    with fw.permit("train", offload=[eng]) as p:
                        seen["nodes"].add(("train", p.nodes, p.devices))
                        time.sleep(0.08)
                    with fw.permit("sync"):
                        time.sleep(0.01)
        except BaseException as e:  # asserted below
            errors.append(e)

    def toy_loop():
        rollout, train, publish = fns
        try:
            with toy:
                for it in range(n):
                    train(rollout(it))
                    publish()
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=framework_loop), threading.Thread(target=toy_loop)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=180)
    assert not errors, errors
    pl = fw.info["placement"]
    assert seen["nodes"] == {("rollout", tuple(pl["rollout_nodes"]), ()), ("train", tuple(pl["train_nodes"]), ())}
    assert fw.iteration == n and log.count(("reload", "engine")) == 2 * n == log.count(("offload", "engine"))
    ids = [fw.job_id, toy.job_id]
    tl = [r for r in group_timeline(toy) if r["job_id"] in ids]
    mine = [r for r in tl if r["job_id"] == fw.job_id]
    assert sorted((r["phase"], r["iteration"]) for r in mine) == sorted(
        (ph, i) for ph in ("rollout", "train", "sync") for i in range(n))
    assert all(r["driver_side"] and r["ok"] for r in mine)
    for pool in ("rollout", "train"):  # one FIFO per node: the two jobs alternate, turn by turn
        order = [r["job_id"] for r in sorted(tl, key=lambda r: r["start"]) if r["phase"] == pool]
        assert len(order) == 2 * n and all(order[i] != order[i + 1] for i in range(len(order) - 1)), (pool, order)
    # a bubble filled: a rollout of one job overlaps the other's training
    rolls = [r for r in tl if r["phase"] == "rollout"]
    trains = [r for r in tl if r["phase"] == "train"]
    assert any(a["job_id"] != b["job_id"] and a["start"] < b["end"] and b["start"] < a["end"]
               for a in rolls for b in trains)
    assert all(d["job_id"] == fw.job_id for d in seen["decisions"])  # long-tail decisions reach the driver

    rec = wait_until(lambda: (r := SchedulerHandle(h).get_job(fw.job_id)).state == "finished" and r,
                     what="the framework job's finished record")
    assert rec.iterations_done == n
