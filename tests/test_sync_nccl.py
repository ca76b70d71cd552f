"""cupy-NCCL executor (RollMux §5.2 on GPUs). GPU tests are skipped visibly without CUDA.

NCCL cannot put two ranks on one GPU, so an N->M test needs N + M CUDA devices; tests that need
more devices than the machine has skip with that reason.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp

import pytest

from rollmux.sync_plan import SyncError, build_plan, TensorMeta


def test_nccl_backend_registered_and_refuses_clearly_without_gpu():
    from collectives import backends, get_executor
    from collectives.nccl_executor import available

    assert backends() == ["gloo", "nccl"]
    ok, why = available()
    if ok:
        pytest.skip("this machine has cupy-NCCL and CUDA")
    plan = build_plan([TensorMeta("w", (4,), "float32", 16)], 1, 1)
    with pytest.raises(SyncError, match="nccl sync backend unavailable"):
        get_executor("nccl")(plan, "train", 0, addr="127.0.0.1:1", job_id="x")
    assert why


def _model(seed, device="cpu"):
    import torch

    g = torch.Generator().manual_seed(seed)
    sd = {"a": torch.randn(257, 129, generator=g).to(torch.bfloat16), "b": torch.randn(1000, generator=g),
          "c": torch.arange(77) * seed}
    return {k: v.to(device) for k, v in sd.items()}


def _sums(sd):
    from collectives.base import flat_bytes

    return {k: hashlib.sha256(flat_bytes(v).cpu().numpy().tobytes()).hexdigest() for k, v in sd.items()}


def _gpu_endpoint(plan, role, index, addr, seeds, fault, q):
    import torch

    from collectives import open_endpoint

    def model(seed):
        return _model(seed, "cuda")

    sums = _sums

    torch.cuda.set_device(index if role == "train" else plan.num_train + index)
    ep = open_endpoint(plan, role, index, backend="nccl", addr=addr, job_id="gpu", timeout_s=30)
    live = model(999)
    out = []
    for k, seed in enumerate(seeds):
        ep.fault_after_buckets = fault if k == len(seeds) - 1 else None
        try:
            if role == "train":
                ep.send(model(seed))
            else:
                live = ep.receive(live)
            out.append(("ok", sums(live) if role == "rollout" else None))
        except SyncError as e:
            out.append((type(e).__name__, sums(live) if role == "rollout" else None))
    q.put((role, index, out))


def _run_gpu(n, m, seeds, fault_trainer=None, scheme="topo"):
    import torch

    from collectives import host_store

    if torch.cuda.device_count() < n + m:
        pytest.skip(f"needs {n + m} CUDA devices (NCCL: one rank per GPU), found {torch.cuda.device_count()}")
    sd_meta = [TensorMeta("a", (257, 129), "bfloat16", 257 * 129 * 2), TensorMeta("b", (1000,), "float32", 4000),
               TensorMeta("c", (77,), "int64", 616)]
    plan = build_plan(sd_meta, n, m, scheme=scheme, bucket_bytes=8192)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    _store, addr = host_store("127.0.0.1", timeout_s=30)  # hosted by this process while the run lasts
    procs = [ctx.Process(target=_gpu_endpoint, args=(plan, "train", i, addr, seeds, 3 if i == fault_trainer else None, q))
             for i in range(n)]
    procs += [ctx.Process(target=_gpu_endpoint, args=(plan, "rollout", j, addr, seeds, None, q)) for j in range(m)]
    for p in procs:
        p.start()
    res = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return res


@pytest.mark.gpu
@pytest.mark.parametrize("n,m,scheme", [(1, 1, "topo"), (2, 2, "topo"), (2, 2, "flat"), (4, 4, "topo")])
def test_nccl_bit_identical(n, m, scheme):
    res = _run_gpu(n, m, [5, 6], scheme=scheme)
    roll = [out for role, _, out in res if role == "rollout"]
    assert all(o[0][0] == "ok" and o[1][0] == "ok" for o in roll)
    assert all(o[0][1] == _sums(_model(5)) and o[1][1] == _sums(_model(6)) for o in roll)


@pytest.mark.gpu
def test_nccl_fault_keeps_previous_weights():
    res = _run_gpu(2, 2, [5, 6], fault_trainer=1)
    roll = [out for role, _, out in res if role == "rollout"]
    for o in roll:
        assert o[0][0] == "ok" and o[1][0] == "SyncAbortedError"
        assert o[1][1] == o[0][1] == _sums(_model(5))


@pytest.mark.gpu
def test_auto_sync_choice_reads_the_real_cuda_device():
    """``sync_backend="auto"`` on a CUDA machine: an endpoint reports its device's UUID; two
    endpoints on one GPU get gloo (NCCL needs one GPU per rank), endpoints on two GPUs get NCCL
    where cupy-NCCL loads."""
    import torch

    from collectives import choose_backend, endpoint_caps
    from collectives.nccl_executor import available

    caps = endpoint_caps()
    ok, _ = available()
    assert caps["cuda"] is True and caps["device"] and caps["nccl"] == ok
    backend, why = choose_backend("auto", [dict(caps, name="train-0"), dict(caps, name="rollout-0")])
    assert backend == "gloo" and ("shares its GPU with train-0" in why or not ok), why
    if torch.cuda.device_count() >= 2:
        torch.cuda.set_device(1)
        try:
            other = endpoint_caps()
        finally:
            torch.cuda.set_device(0)
        assert other["device"] != caps["device"]
        backend, why = choose_backend("auto", [dict(caps, name="train-0"), dict(other, name="rollout-0")])
        assert backend == ("nccl" if ok else "gloo"), why
