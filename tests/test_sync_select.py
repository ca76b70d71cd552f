"""Which sync transport a job gets (``sync_backend="auto"``) and how fast a sync gives up on a
dead peer. CPU only: the NCCL choice is decided from each endpoint's reported capabilities, so
it is checked here without a GPU (the NCCL executor itself runs in the ``gpu``-marked tests)."""

from __future__ import annotations

import threading
import time

import pytest

from collectives import SYNC_BACKENDS, choose_backend, endpoint_caps, host_store, open_endpoint
from rollmux.sync_plan import SyncAbortedError, SyncPlanError, TensorMeta, build_plan


def gpu(name, device, nccl=True, why="ok"):
    return {"name": name, "cuda": True, "nccl": nccl, "why": why, "device": device}


def cpu(name):
    return {"name": name, "cuda": False, "nccl": False, "why": "no CUDA device", "device": None}


def test_auto_takes_nccl_only_when_every_endpoint_has_its_own_gpu():
    eps = [gpu("train-0", "GPU-a"), gpu("train-1", "GPU-b"), gpu("rollout-0", "GPU-c")]
    assert choose_backend("auto", eps)[0] == "nccl"
    assert choose_backend("nccl", eps)[0] == "nccl"
    assert choose_backend("gloo", eps) == ("gloo", "gloo asked for")


@pytest.mark.parametrize("eps,needle", [
    ([gpu("train-0", "GPU-a"), cpu("rollout-0")], "rollout-0: no CUDA device"),
    ([gpu("train-0", "GPU-a"), gpu("rollout-0", "GPU-b", nccl=False, why="cupy.cuda.nccl not importable")],
     "rollout-0: cupy.cuda.nccl not importable"),
    ([gpu("train-0", "GPU-a"), gpu("rollout-0", "GPU-a")], "rollout-0: shares its GPU with train-0"),
])
def test_auto_falls_back_to_gloo_and_says_why_explicit_nccl_refuses(eps, needle):
    backend, why = choose_backend("auto", eps)
    assert backend == "gloo" and needle in why and why.startswith("nccl not usable")
    with pytest.raises(SyncPlanError, match=needle):
        choose_backend("nccl", eps)


def test_choice_refuses_object_store_unknown_names_and_no_endpoints():
    assert SYNC_BACKENDS == ("auto", "nccl", "gloo", "object_store", "counted")
    for bad in ("object_store", "mpi", ""):
        with pytest.raises(SyncPlanError, match="sync_backend"):
            choose_backend(bad, [cpu("a")])
    with pytest.raises(SyncPlanError, match="endpoints"):
        choose_backend("auto", [])


def test_this_cpu_machine_reports_no_cuda_so_auto_is_gloo():
    caps = endpoint_caps()
    if caps["cuda"]:
        pytest.skip("this machine has a CUDA device")
    assert caps == {"cuda": False, "nccl": False, "why": caps["why"], "device": None} and caps["why"] != "ok"
    assert choose_backend("auto", [dict(caps, name="train-0"), dict(caps, name="rollout-0")])[0] == "gloo"


def test_abort_interrupts_a_sync_waiting_on_a_silent_peer_within_a_second():
    """A trainer whose rollout peer never joins the sync (its task died before receiving) would
    wait ``timeout_s``; :meth:`abort` from another thread ends the wait at once, the rollout
    weights stay unchanged, and the next pair of endpoints syncs normally."""
    import torch

    sd = {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(7)}
    plan = build_plan([TensorMeta(k, tuple(v.shape), "float32", v.numel() * 4) for k, v in sd.items()], 1, 1)

    def pair(job):
        store, addr = host_store("127.0.0.1", timeout_s=30)
        eps = {}
        t = threading.Thread(target=lambda: eps.update(r=open_endpoint(
            plan, "rollout", 0, addr=addr, job_id=job, timeout_s=30, bind_host="127.0.0.1")))
        t.start()
        eps["t"] = open_endpoint(plan, "train", 0, store=store, job_id=job, timeout_s=30, bind_host="127.0.0.1")
        t.join(30)
        return eps["t"], eps["r"], store

    trainer, roll, store = pair("abort-a")
    err: list = []
    t0 = time.monotonic()
    threading.Timer(0.3, trainer.abort, args=("rollout-0's receive task died (ActorDiedError)",)).start()
    with pytest.raises(SyncAbortedError, match="rollout-0's receive task died") as ei:
        trainer.send(sd)  # the rollout endpoint never calls receive()
    err.append(ei.value)
    waited = time.monotonic() - t0
    assert 0.25 < waited < 3.0, waited
    assert trainer.broken and "rollout weights unchanged" in str(err[0])
    with pytest.raises(SyncAbortedError, match="broken"):
        trainer.send(sd)
    roll.abort("peer trainer 0 aborted")
    with pytest.raises(SyncAbortedError, match="peer trainer 0 aborted"):
        roll.receive({k: torch.zeros_like(v) for k, v in sd.items()})
    trainer.close()
    roll.close()
    # rebuilt endpoints sync normally
    trainer, roll, store = pair("abort-b")
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(roll.receive({k: torch.zeros_like(v) for k, v in sd.items()})))
    t.start()
    trainer.send(sd)
    t.join(30)
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    trainer.close()
    roll.close()


def test_job_sync_backend_defaults_to_auto_and_names_the_choices(monkeypatch):
    import rollmux
    from factories import toy_spec

    monkeypatch.delenv("ROLLMUX_SYNC_BACKEND", raising=False)
    assert rollmux.Job(toy_spec("sb-a", "small"), attach=False).sync_backend == "auto"
    assert rollmux.Job(toy_spec("sb-b", "small"), attach=False, sync_backend="nccl").sync_backend == "nccl"
    monkeypatch.setenv("ROLLMUX_SYNC_BACKEND", "object_store")
    assert rollmux.Job(toy_spec("sb-c", "small"), attach=False).sync_backend == "object_store"
    with pytest.raises(ValueError, match="sync_backend must be one of 'auto', 'nccl', 'gloo', 'object_store', 'counted', got 'mpi'"):
        rollmux.Job(toy_spec("sb-d", "small"), attach=False, sync_backend="mpi")


def test_auto_falls_back_to_the_object_store_when_the_endpoints_cannot_be_built(monkeypatch):
    """The sync leader's decision logic (its SyncSession), without Ray: ``auto`` whose endpoints
    cannot be built syncs through the object store, says why in the record's note, and stays
    there; an explicit ``gloo`` fails instead; ``object_store`` never tries the collectives."""
    import torch

    from actors.worker.weight_sync import SyncSession

    tried: list = []
    publish = lambda s: {"w": torch.ones(2)}  # noqa: E731  (the job's sync function)

    def session(backend):
        s = SyncSession("j", "train", "train-0", backend=backend, rollout_workers=("rollmux-worker-rollout-0",),
                        workers=lambda name: object())  # no peer is ever reached here

        def cannot_build(*a):
            tried.append(s.backend)
            raise RuntimeError("rendezvous timed out after 120 s")

        monkeypatch.setattr(s, "_build_endpoints", cannot_build)
        monkeypatch.setattr(s, "_sync_object_store", lambda weights: {"receivers": [], "cross_bytes": 8,
                                                                      "backend": "object_store"})
        return s

    s = session("auto")
    out = s.run(publish, {})
    assert out["backend"] == "object_store" and out["cross_bytes"] == 8
    assert out["note"] == ("collectives sync endpoints could not be built (rendezvous timed out after 120 s); "
                           "object store used")
    assert s.run(publish, {})["backend"] == "object_store" and tried == ["auto"]  # not tried again
    with pytest.raises(RuntimeError, match="rendezvous timed out"):
        session("gloo").run(publish, {})
    out = session("object_store").run(publish, {})
    assert out["note"] == "object_store asked for" and tried == ["auto", "gloo"]


def test_a_training_rank_waits_for_its_leaders_word_on_the_sync_generation():
    """A non-leader training rank waits for the endpoint generation the leader announced; the
    leader's signal ends the wait at once: ``abort`` raises naming the reason, and
    ``object_store`` sends nothing (and keeps the rank on the object store, as the leader)."""
    import threading as th

    import torch

    from actors.worker import workers as W
    from rollmux.messages import SyncSignal, SyncSignalKind
    from rollmux.sync_plan import SyncAbortedError

    w = W.TrainWorkerImpl("train-1")
    w.jobs["j"] = h = W._Hosted("j", {"builder": dict, "phases": {"sync": lambda s: {"w": torch.ones(2)}}},
                                "train", "train-1")
    publish = h.phases["sync"]
    abort = SyncSignal(3, SyncSignalKind.ABORT, "rollout-0: its sync task failed")
    th.Timer(0.2, w.sync_signal, args=("j", abort)).start()
    t0 = time.monotonic()
    with pytest.raises(SyncAbortedError, match="rollout-0: its sync task failed"):
        h.sync.run(publish, {}, follower=True, gen=3)
    assert time.monotonic() - t0 < 5.0
    th.Timer(0.2, w.sync_signal, args=("j", SyncSignal(4, SyncSignalKind.OBJECT_STORE,
                                                       "endpoints could not be built"))).start()
    assert h.sync.run(publish, {}, follower=True, gen=4) == {"cross_bytes": 0, "backend": "object_store"}
    assert h.sync.fallback == "endpoints could not be built"
    assert h.sync.run(publish, {}, follower=True, gen=5)["backend"] == "object_store"  # no wait
    assert w.sync_signal("not-hosted", abort) is False
