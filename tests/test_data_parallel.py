"""Data-parallel training over a job's own process group, without Ray (two spawned processes):
the torch backend averages gradients over the job's gloo group, DeepSpeed ZeRO-2 runs as rank
i of 2 through the job's rendezvous store, every rank ends with the same weights, both equal the
single-process step on the averaged loss, and a DeepSpeed world is replaced by the next job's once
its engines closed."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch

pytest.importorskip("deepspeed")

from rollmux.phase_state import ParallelContext  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]

ROWS = 4
LR = 1e-2


def _tiny():
    from examples.grpo.config import ModelConfig
    from examples.grpo.model import build_model

    return build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                                   max_position_embeddings=16), 0)


def _batch():
    from examples.grpo.tokenizer import CharTokenizer

    return CharTokenizer().encode_batch(["3>45", "7>81", "1>22", "0>19"])


def _loss(t, seq):
    return t.forward(seq).logsumexp(-1).mean()


def _worker(rank: int, port: int, out: dict) -> None:
    import torch.distributed as dist

    from actors.backends import make_train_backend

    torch.set_num_threads(1)
    seq = _batch()[ParallelContext("train", rank, 2).shard(ROWS)]
    store = dist.TCPStore("127.0.0.1", port, world_size=None, is_master=rank == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timedelta(seconds=60)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    group = dist.ProcessGroupGloo(dist.PrefixStore("job-a/group/", store), rank, 2, opts)
    tt = make_train_backend("torch", _tiny(), lr=LR, group=group)
    for _ in range(2):
        tt.backward_step(_loss(tt, seq))
    res = {"torch": tt.weights()}
    for job in ("job-a", "job-b"):  # the second job's world replaces the first once it closed
        ds = make_train_backend("deepspeed", _tiny(), lr=LR, stage=2, micro_batch=2, rank=rank, world_size=2,
                                store=dist.PrefixStore(f"{job}/", store))
        for _ in range(2):
            ds.backward_step(_loss(ds, seq))
        res[job] = ds.weights()
        ds.close()
    res["world"] = dist.get_world_size()
    torch.save(res, out[rank])
    dist.barrier()


def test_torch_and_deepspeed_data_parallel_ranks_agree(tmp_path):
    import torch.multiprocessing as mp

    from actors.backends import make_train_backend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = {r: str(tmp_path / f"rank{r}.pt") for r in range(2)}
    mp.spawn(_worker, args=(port, out), nprocs=2, join=True)
    r0, r1 = (torch.load(out[r], weights_only=False) for r in range(2))
    assert r0["world"] == 2
    for k in ("torch", "job-a", "job-b"):  # every rank holds the same weights, bit for bit
        assert all(torch.equal(r0[k][n], r1[k][n]) for n in r0[k]), k
    # and they equal one process stepping on the mean of the two shards' losses
    ref = make_train_backend("torch", _tiny(), lr=LR)
    seq = _batch()
    halves = [seq[ParallelContext("train", r, 2).shard(ROWS)] for r in range(2)]
    for _ in range(2):
        ref.backward_step((_loss(ref, halves[0]) + _loss(ref, halves[1])) / 2)
    want = ref.weights()
    for k in ("torch", "job-a", "job-b"):
        assert max(float((r0[k][n] - want[n]).abs().max()) for n in want) <= 1e-5, k
    # the check can fail: one shard alone trains elsewhere
    solo = make_train_backend("torch", _tiny(), lr=LR)
    for _ in range(2):
        solo.backward_step(_loss(solo, halves[0]))
    assert max(float((r0["torch"][n] - solo.weights()[n]).abs().max()) for n in want) > 1e-4


def test_parallel_context_shards_cover_the_batch_once():
    for n in (0, 1, 5, 8):
        for w in (1, 2, 3):
            idx = [i for r in range(w) for i in range(n)[ParallelContext("rollout", r, w).shard(n)]]
            assert idx == list(range(n))
    with pytest.raises(ValueError, match="rank"):
        ParallelContext("train", 2, 2)
