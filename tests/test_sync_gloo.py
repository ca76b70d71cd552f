"""Gloo executor of the sync plan across real processes (gloo on 127.0.0.1).

Checks RollMux §5.2 end to end: rollout weights bit-identical to the trainers' (sha256 per tensor)
for several layouts and uneven shards, models much larger than one bucket, all-or-nothing on an
injected failure (raised fault and a sender process that dies mid-sync), refused mismatches, and
two jobs sharing the same processes, and Ray actors. A module-scoped pool of processes (forked from
a clean forkserver that pre-imported torch) keeps it fast.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from typing import Any

import pytest

N_PROCS = 8
TIMEOUT_S = 10.0


# ------------------------------------------------------------------------------ worker side
def model(seed: int, *, wide: bool = False) -> dict:
    """A small model with mixed dtypes, a 0-dim and an empty tensor (~50 KB)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 97 if wide else 96, generator=g),
        "layers.0.w": torch.randn(96, 96, generator=g).to(torch.bfloat16),
        "layers.0.b": torch.randn(96, generator=g),
        "layers.0.mask": torch.rand(33, generator=g) > 0.5,
        "step": torch.tensor(seed, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "head": torch.randn(17, 5, generator=g).to(torch.float16),
    }


def sums(sd: dict) -> dict:
    from collectives.base import flat_bytes

    return {k: hashlib.sha256(flat_bytes(v).numpy().tobytes()).hexdigest() for k, v in sd.items()}


def _endpoint(spec: dict) -> dict:
    """Run one endpoint through ``spec['syncs']`` (list of trainer seeds); report checksums."""
    import torch

    from collectives import open_endpoint
    from collectives.gloo_executor import GlooExecutor

    out: dict[str, Any] = {"role": spec["role"], "index": spec["index"], "job": spec["job"], "syncs": []}
    die_after = spec.get("die_after")

    class Dying(GlooExecutor):  # a sender whose process dies mid-sync (no exception, no cleanup)
        def _tick(self) -> None:
            super()._tick()
            if self.seq == 2 and self._moved > die_after:
                os._exit(3)

    try:
        kw = dict(addr=spec["addr"], job_id=spec["job"], timeout_s=TIMEOUT_S, bind_host="127.0.0.1",
                  fault_after_buckets=spec.get("fault"))
        ep = Dying(spec["plan"], spec["role"], spec["index"], **kw) if die_after is not None else \
            open_endpoint(spec["plan"], spec["role"], spec["index"], **kw)
    except Exception as e:
        out["init_error"] = (type(e).__name__, str(e))
        return out
    live = model(999, wide=spec.get("bad") == "shape")
    if spec.get("bad") == "dtype":
        live["head"] = live["head"].float()
    for k, seed in enumerate(spec["syncs"]):
        rec: dict[str, Any] = {}
        if spec.get("fault_on_sync") is not None:
            ep.fault_after_buckets = spec["fault"] if k + 1 == spec["fault_on_sync"] else None
        t0 = time.monotonic()
        try:
            if spec["role"] == "train":
                st = ep.send(model(seed))
                rec["cross_sent"] = st.cross_sent_bytes
            else:
                before = sums(live)
                new = ep.receive(live, in_place=spec.get("in_place", False))
                rec["untouched_input"] = sums(live) == before
                if not spec.get("in_place", False):
                    live = new
            rec["ok"] = True
        except Exception as e:
            rec["ok"] = False
            rec["wall_s"] = time.monotonic() - t0
            rec["error"] = (type(e).__name__, str(e))
            rec["sums"] = sums(live)
            if spec.get("fix"):  # the runtime corrects the model and syncs again on the same endpoint
                live = model(999)
            out["syncs"].append(rec)
            continue
        rec["sums"] = sums(live)
        out["syncs"].append(rec)
    ep.close()
    return out


def _worker_main(wid: int, inbox: Any, outbox: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: F401  (pay the import once per process)

    for _ in range(10_000):  # bounded: a worker idle for 10 minutes exits
        try:
            item = inbox.get(timeout=600)
        except queue.Empty:
            return
        if item is None:
            return
        run_id, specs = item
        results: list[Any] = [None] * len(specs)

        def go(i: int, spec: dict) -> None:
            try:
                results[i] = _endpoint(spec)
            except Exception:
                results[i] = {"crash": traceback.format_exc()}

        threads = [threading.Thread(target=go, args=(i, s)) for i, s in enumerate(specs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outbox.put((run_id, wid, results))


# ------------------------------------------------------------------------------ pool
class Pool:
    """Spawned worker processes; ``run`` hands one list of endpoint specs to each worker."""

    def __init__(self, n: int) -> None:
        # forkserver: a clean server process (started like spawn, never a fork of pytest) imports
        # torch once; workers fork from it, which saves N torch imports on a small machine
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["torch", "collectives"])
        self.outbox = self.ctx.Queue()
        self.procs: list[Any] = [None] * n
        self.inboxes: list[Any] = [None] * n
        self.run_id = 0
        for i in range(n):
            self._spawn(i)

    def _spawn(self, i: int) -> None:
        self.inboxes[i] = self.ctx.Queue()
        self.procs[i] = self.ctx.Process(target=_worker_main, args=(i, self.inboxes[i], self.outbox), daemon=True)
        self.procs[i].start()

    def run(self, per_worker: list[list[dict]], timeout_s: float = 90.0) -> dict[int, Any]:
        self.run_id += 1
        for i, specs in enumerate(per_worker):
            self.inboxes[i].put((self.run_id, specs))
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < len(per_worker) and time.monotonic() < deadline:
            try:
                rid, wid, res = self.outbox.get(timeout=0.5)
            except queue.Empty:
                for i in range(len(per_worker)):
                    if i not in got and not self.procs[i].is_alive():
                        got[i] = "died"
                continue
            if rid == self.run_id:
                got[wid] = res
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                self._spawn(i)
        assert len(got) == len(per_worker), f"workers {set(range(len(per_worker))) - set(got)} did not answer"
        return got

    def close(self) -> None:
        for q in self.inboxes:
            q.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


@pytest.fixture(scope="module")
def pool():
    p = Pool(N_PROCS)
    yield p
    p.close()
    _STORES.clear()


# the jobs' rendezvous stores, hosted by this (pytest) process for the module's lifetime: every
# endpoint connects as a client to a server that is already listening (no port chosen in advance)
_STORES: dict[str, Any] = {}


def specs_for(plan, job: str, syncs: list[int], **extra) -> list[dict]:
    from collectives import host_store

    _STORES[job], addr = host_store("127.0.0.1", timeout_s=TIMEOUT_S)
    out = [dict(plan=plan, role="train", index=i, addr=addr, job=job, syncs=syncs) for i in range(plan.num_train)]
    out += [dict(plan=plan, role="rollout", index=j, addr=addr, job=job, syncs=syncs) for j in range(plan.num_rollout)]
    for s in out:
        s.update(extra)
    return out


def run_job(pool: Pool, specs: list[dict]) -> list[dict]:
    res = pool.run([[s] for s in specs])
    return [res[i] if res[i] == "died" else res[i][0] for i in range(len(specs))]


def plan_for(n: int, m: int, **kw):
    from rollmux.sync_plan import build_plan, metas_of

    kw.setdefault("bucket_bytes", 4096)
    return build_plan(metas_of(model(1)), n, m, **kw)


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("n,m,scheme,split", [
    (1, 1, "topo", True), (2, 2, "topo", True), (2, 4, "topo", True), (4, 2, "topo", True),
    (3, 5, "topo", True), (3, 5, "topo", False), (2, 3, "flat", True), (4, 2, "flat", False),
])
def test_rollout_weights_bit_identical_after_each_sync(pool, n, m, scheme, split):
    plan = plan_for(n, m, scheme=scheme, split_tensors=split)
    assert plan.model_bytes > 10 * plan.bucket_bytes  # many buckets per model
    if not split:
        assert len({s.nbytes for s in plan.shards}) > 1  # uneven shards
    want = [sums(model(11)), sums(model(12))]
    assert want[0] != want[1]
    results = run_job(pool, specs_for(plan, f"lay-{n}-{m}-{scheme}-{split}", [11, 12]))
    for r in results:
        assert "init_error" not in r and "crash" not in r, r
        assert [s["ok"] for s in r["syncs"]] == [True, True], r
        if r["role"] == "rollout":  # two syncs over the same groups (control plane kept alive)
            assert [s["sums"] for s in r["syncs"]] == want
            assert all(s["untouched_input"] for s in r["syncs"])
    sent = sum(r["syncs"][0]["cross_sent"] for r in results if r["role"] == "train")
    assert sent == plan.cross_bytes == (1 if scheme == "topo" else m) * plan.model_bytes


def test_injected_fault_mid_sync_keeps_previous_weights(pool):
    plan = plan_for(2, 3)
    specs = specs_for(plan, "fault-raise", [21, 22], fault=3, fault_on_sync=2, in_place=True)
    for s in specs:
        if not (s["role"] == "train" and s["index"] == 1):
            s["fault"] = None  # only trainer 1 fails, after 3 buckets of the second sync
    results = run_job(pool, specs)
    first = sums(model(21))
    for r in results:
        assert r["syncs"][0]["ok"] is True
        assert r["syncs"][1]["ok"] is False
        assert r["syncs"][1]["error"][0] == "SyncAbortedError", r["syncs"][1]
        # the failing trainer publishes its failure in the job's store (and aborts its groups): the
        # other endpoints give up at once or at their next poll (0.2 s), not after their timeout
        assert r["syncs"][1]["wall_s"] < TIMEOUT_S / 4, r["syncs"][1]
        if r["role"] == "rollout":
            assert r["syncs"][0]["sums"] == first
            assert r["syncs"][1]["sums"] == first  # still the complete weights of sync 1


def test_sender_process_dies_mid_sync_keeps_previous_weights(pool):
    plan = plan_for(2, 3)
    specs = specs_for(plan, "fault-kill", [31, 32])
    specs[0]["die_after"] = 2  # trainer 0's process exits after 2 buckets of sync 2
    results = run_job(pool, specs)
    assert results[0] == "died"
    first = sums(model(31))
    for r in results[1:]:
        assert [s["ok"] for s in r["syncs"]] == [True, False], r
        assert r["syncs"][1]["error"][0] == "SyncAbortedError"
        assert "rollout weights unchanged" in r["syncs"][1]["error"][1] or "aborted" in r["syncs"][1]["error"][1]
        assert r["syncs"][1]["wall_s"] < TIMEOUT_S / 4, r["syncs"][1]  # a closed socket fails at once
        if r["role"] == "rollout":
            assert r["syncs"][1]["sums"] == first


@pytest.mark.parametrize("bad,needle", [
    ("shape", "rollout 1: embed.weight: expected shape (64, 96) dtype float32, got shape (64, 97)"),
    ("dtype", "rollout 1: head: expected shape (17, 5) dtype float16, got shape (17, 5) dtype float32"),
])
def test_mismatch_refused_before_any_byte_moves(pool, bad, needle):
    plan = plan_for(2, 2)
    specs = specs_for(plan, f"mismatch-{bad}", [41, 42])
    specs[3].update(bad=bad, fix=True)  # rollout 1's model differs from the trainers'
    results = run_job(pool, specs)
    for r in results:
        rec = r["syncs"][0]
        assert rec["ok"] is False
        assert rec["error"][0] == "SyncMismatchError"
        assert needle in rec["error"][1]
        assert "refused before any byte moved" in rec["error"][1]
        assert r["syncs"][1]["ok"] is True  # a mismatch does not break the endpoints
    assert results[2]["syncs"][0]["sums"] == sums(model(999))  # rollout 0 untouched
    assert results[2]["syncs"][1]["sums"] == results[3]["syncs"][1]["sums"] == sums(model(42))


def test_endpoints_with_different_plans_are_refused(pool):
    from rollmux.sync_plan import build_plan, metas_of

    plan = plan_for(1, 2)
    specs = specs_for(plan, "plan-mismatch", [51])
    specs[2]["plan"] = build_plan(metas_of(model(1)), 1, 2, bucket_bytes=2048)
    results = run_job(pool, specs)
    for r in results:
        assert r["init_error"][0] == "SyncMismatchError"
        assert "plan digest" in r["init_error"][1]


def test_two_jobs_share_the_same_processes(pool):
    a = specs_for(plan_for(2, 2), "share-a", [61])
    b = specs_for(plan_for(2, 2, scheme="flat"), "share-b", [62])
    res = pool.run([[a[i], b[i]] for i in range(4)])
    for i in range(4):
        ra, rb = res[i]
        assert ra["syncs"][0]["ok"] and rb["syncs"][0]["ok"], (ra, rb)
        if ra["role"] == "rollout":
            assert ra["syncs"][0]["sums"] == sums(model(61))
            assert rb["syncs"][0]["sums"] == sums(model(62))


def test_endpoints_only_connect_to_a_store_that_is_already_listening():
    """No endpoint binds a port chosen in advance (a race with every outgoing connection on the
    host): the store's host binds a port the kernel picks, and an endpoint given only the
    address, rank 0 included, joins it as a client."""
    import torch.distributed

    import collectives
    from collectives import host_store
    from collectives.base import open_job_store

    assert not hasattr(collectives, "free_port")
    hosted, addr = host_store("127.0.0.1", timeout_s=5)
    host, _, port = addr.rpartition(":")
    assert host == "127.0.0.1" and int(port) == hosted.port > 0
    client = open_job_store(addr, None, prefix="rollmux-sync/j/", timeout_s=5)  # would raise EADDRINUSE if it hosted
    client.set("k", "v")
    assert torch.distributed.PrefixStore("rollmux-sync/j/", hosted).get("k") == b"v"
    with pytest.raises(collectives.SyncPlanError, match="addr"):
        open_job_store(None, None, prefix="p/", timeout_s=5)


# ------------------------------------------------------------------------------ benchmark harness
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_sync.py")


def test_bench_refuses_without_iproute2(tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, PATH=str(tmp_path))  # no `ip` / `tc` on PATH
    r = subprocess.run([sys.executable, BENCH, "--quick", "--out", str(tmp_path / "x.json")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "needs root and iproute2" in r.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not __import__("shutil").which("ip"), reason="needs root and iproute2")
def test_bench_removes_its_namespaces_when_interrupted(tmp_path):
    import re
    import signal
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, BENCH, "--workers", "2", "--ratios", "20", "--sizes-mib", "64",
                          "--out", str(tmp_path / "x.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # printed once the namespaces exist
    names = re.findall(r"rmx-(?:tr|ro)-\d+", line)
    assert len(names) == 2, line
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(n in listed for n in names)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, (p.returncode, err[-3000:])
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)
    assert not (tmp_path / "x.json").exists()


# ------------------------------------------------------------------------------ inside Ray actors
class SyncActor:
    """What a TrainWorker / RolloutWorker does: one endpoint per job, kept across syncs."""

    def __init__(self) -> None:
        self.eps: dict = {}
        self.stores: dict = {}  # job -> the rendezvous store this actor hosts (trainer 0)

    def host(self, job: str) -> str:
        """Host the job's rendezvous store in this process (trainer 0); returns its address."""
        from collectives import host_store

        self.stores[job], addr = host_store("127.0.0.1", timeout_s=30)
        return addr

    def open(self, plan, role: str, index: int, addr: str, job: str) -> int:
        from collectives import open_endpoint

        store = self.stores.get(job)
        self.eps[job] = open_endpoint(plan, role, index, addr=None if store else addr, store=store, job_id=job,
                                      bind_host="127.0.0.1", timeout_s=30)
        return os.getpid()

    def sync(self, job: str, seed: int) -> dict:
        ep = self.eps[job]
        if ep.role == "train":
            ep.send(model(seed))
            return {}
        return sums(ep.receive(model(999)))

    def close(self, job: str) -> None:
        self.eps.pop(job).close()


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_endpoints_inside_ray_actors_on_their_pool_nodes(ray_cluster):
    import sys
    import uuid

    import ray

    from rollmux.nodes import node_resource

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    job = f"ray-{uuid.uuid4().hex[:8]}"
    Actor = ray.remote(num_cpus=0)(SyncActor)
    trainers = [Actor.options(resources={node_resource(f"train-{i}"): 1}).remote() for i in range(2)]
    rollouts = [Actor.options(resources={node_resource(f"rollout-{j}"): 1}).remote() for j in range(2)]
    plan = plan_for(2, 2)
    try:
        addr = ray.get(trainers[0].host.remote(job), timeout=60)
        pids = ray.get([a.open.remote(plan, "train", i, addr, job) for i, a in enumerate(trainers)]
                       + [a.open.remote(plan, "rollout", j, addr, job) for j, a in enumerate(rollouts)], timeout=120)
        assert len(set(pids)) == 4  # four worker processes, one endpoint each
        for seed in (71, 72):  # two syncs over the same communicators
            out = ray.get([a.sync.remote(job, seed) for a in trainers + rollouts], timeout=120)
            assert out[2] == out[3] == sums(model(seed))
        ray.get([a.close.remote(job) for a in trainers + rollouts], timeout=60)
    finally:
        for a in trainers + rollouts:
            ray.kill(a)
