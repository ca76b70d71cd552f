#!/usr/bin/env python
"""Flat vs topology-aware weight sync (RollMux §5.2, Fig. 12) over a real, shaped network link.

Topology built here (root + iproute2 required; everything is torn down on exit, also on
SIGINT / SIGTERM):

* two network namespaces, ``rmx-tr-<id>`` ("training cluster") and ``rmx-ro-<id>`` ("rollout
  cluster"), joined by a veth pair with private addresses ``10.213.<k>.1`` / ``.2`` that exist only
  inside these namespaces;
* the veth pair is the *cross-cluster link*: ``tc tbf`` on both ends at ``cross`` Mbit/s;
* rollout workers talk to each other over the rollout namespace's loopback (they bind the
  namespace's address, so their traffic is routed via ``lo``); ``tc tbf`` on that ``lo`` caps the
  *intra-cluster fabric* at ``intra`` Mbit/s (one shared link), so the fast:slow ratio is controlled
  rather than set by how fast this small machine copies memory. ``intra`` is fixed and
  ``cross = intra / ratio``.

Every worker is a separate process (gloo, :mod:`collectives.gloo_executor`), forked from this
script after it imported torch and moved into its namespace with ``setns(2)`` (what
``ip netns exec`` does), which saves 2N interpreter start-ups on a small machine. For each worker count (N trainers -> N rollout workers), ratio and model size it
runs the flat plan (every rollout worker pulls a full copy across) and the topology-aware plan (one
copy across, broadcast inside), checks that every rollout worker ends bit-identical to the
trainers, and writes ``results/bench_sync.json``: a list of runs with ``workers, model_bytes,
link_ratio, flat_s, topo_s, flat_cross_bytes, topo_cross_bytes, measured_speedup,
predicted_speedup`` (+ rates and predictions). ``flat_s`` / ``topo_s`` are the slowest rollout
worker's wall time of one sync (median of ``--repeats``), pre-flight and commit votes included.

    python scripts/bench_sync.py            # 2->2, 4->4, 8->8; ratios 20:1 and 5:1; 2 model sizes
    python scripts/bench_sync.py --quick    # 8->8, 20:1, one model size (< 1 min)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEP_TIMEOUT_S = 240.0


# -------------------------------------------------------------------------------- worker mode
def make_model(model_bytes: int, seed: int) -> dict:
    """A transformer-like state dict of ~``model_bytes`` float32 bytes (a few big, some small)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n = model_bytes // 4
    hidden = 256
    sd = {"embed.weight": torch.randn(n // 4 // hidden, hidden, generator=g)}
    layer = (n - sd["embed.weight"].numel()) // 4
    for i in range(4):
        sd[f"layers.{i}.mlp.weight"] = torch.randn(max(1, (layer - hidden) // hidden), hidden, generator=g)
        sd[f"layers.{i}.norm.weight"] = torch.randn(hidden, generator=g)
    return sd


def _rendezvous(work: Path, job: str, role: str, index: int, train_ip: str) -> dict:
    """Trainer 0 hosts ``job``'s store (the kernel picks the port) and publishes its address in
    ``work``; every other endpoint waits (bounded) for that file and connects to it."""
    from collectives import host_store

    path = work / f"store-{job}"
    if role == "train" and index == 0:
        store, addr = host_store(train_ip, timeout_s=STEP_TIMEOUT_S)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(addr)
        tmp.rename(path)  # atomic: readers never see a partial address
        return {"store": store}
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job}: trainer 0 published no store address within {STEP_TIMEOUT_S} s")
        time.sleep(0.02)
    return {"addr": path.read_text()}


def worker(cfg_path: str, role: str, index: int) -> int:
    import hashlib

    import torch

    from collectives import open_endpoint
    from collectives.base import flat_bytes
    from rollmux.sync_plan import build_plan, metas_of

    torch.set_num_threads(1)
    cfg = json.loads(Path(cfg_path).read_text())
    work = Path(cfg["dir"])
    out = work / f"res-{role}-{index}.jsonl"
    w = cfg["workers"]
    for p, phase in enumerate(cfg["phases"]):
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not (work / f"go-{p}").exists():  # the controller re-shapes the links between phases
            if time.monotonic() > deadline:
                return 2
            time.sleep(0.05)
        for size in cfg["sizes"]:
            trainer_sd = make_model(size, seed=7 + p)
            want = {k: hashlib.sha256(flat_bytes(v).numpy().tobytes()).hexdigest() for k, v in trainer_sd.items()}
            live = make_model(size, seed=1000) if role == "rollout" else None
            for scheme in ("flat", "topo"):
                plan = build_plan(metas_of(trainer_sd), w, w, scheme=scheme, bucket_bytes=cfg["bucket_bytes"])
                job = f"bench-{p}-{size}-{scheme}"
                ep = open_endpoint(plan, role, index, **_rendezvous(work, job, role, index, cfg["train_ip"]),
                                   job_id=job, bind_host=cfg[f"{role}_ip"], timeout_s=STEP_TIMEOUT_S)
                for r in range(cfg["repeats"]):
                    t0 = time.perf_counter()
                    if role == "train":
                        ep.send(trainer_sd)
                        ok = True
                    else:
                        new = ep.receive(live)
                        ok = all(hashlib.sha256(flat_bytes(v).numpy().tobytes()).hexdigest() == want[k]
                                 for k, v in new.items())
                    rec = dict(phase=p, size=size, scheme=scheme, rep=r, role=role, index=index,
                               wall_s=time.perf_counter() - t0, ok=ok)
                    with out.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
                ep.close()
        (work / f"done-{p}-{role}-{index}").touch()
    return 0


CLONE_NEWNET = 0x40000000
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
_STOPPED: list[int] = []  # signals received; the wait loops check it in case an exception got swallowed


def _child(ns: str, cfg_path: str, role: str, index: int) -> None:
    """Forked worker: enter network namespace ``ns`` (setns(2)), then run :func:`worker`."""
    import ctypes

    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    work = Path(cfg_path).parent
    sys.stderr = open(work / f"err-{role}-{index}.log", "w", buffering=1)
    os.dup2(sys.stderr.fileno(), 2)  # C++ (gloo / c10d) warnings go to the log too
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns({ns}) failed")
    os.close(fd)
    try:
        code = worker(cfg_path, role, index)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stderr.flush()
    os._exit(code)


# -------------------------------------------------------------------------------- controller
class Netns:
    """Two namespaces + a shaped veth pair + a shaped loopback in the rollout namespace."""

    def __init__(self) -> None:
        uid = f"{os.getpid() % 100000:05d}{random.randint(0, 99):02d}"
        self.a, self.b = f"rmx-tr-{uid}", f"rmx-ro-{uid}"
        self.va, self.vb = f"rmxa{uid}"[:15], f"rmxb{uid}"[:15]
        k = random.randint(1, 254)
        self.ip_a, self.ip_b = f"10.213.{k}.1", f"10.213.{k}.2"
        self.created: list[str] = []

    @staticmethod
    def sh(*cmd: str) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def up(self) -> None:
        for ns in (self.a, self.b):
            self.sh("ip", "netns", "add", ns)
            self.created.append(ns)
            self.sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.sh("ip", "link", "add", self.va, "netns", self.a, "type", "veth", "peer", "name", self.vb, "netns", self.b)
        self.sh("ip", "-n", self.a, "addr", "add", f"{self.ip_a}/24", "dev", self.va)
        self.sh("ip", "-n", self.b, "addr", "add", f"{self.ip_b}/24", "dev", self.vb)
        self.sh("ip", "-n", self.a, "link", "set", self.va, "up")
        self.sh("ip", "-n", self.b, "link", "set", self.vb, "up")

    def shape(self, cross_mbit: float, intra_mbit: float) -> None:
        def tbf(ns: str, dev: str, mbit: float) -> None:
            burst = max(256 * 1024, int(mbit * 1e6 / 8 / 250))  # >= 4 ms worth, >= several GSO packets
            self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                    "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms")
        tbf(self.a, self.va, cross_mbit)
        tbf(self.b, self.vb, cross_mbit)
        tbf(self.b, "lo", intra_mbit)

    def down(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.created.clear()


def run_config(net: Netns, workers: int, ratios: list[float], sizes: list[int], intra_mbit: float, args,
               procs: list) -> list[dict]:
    from rollmux.sync_plan import LinkModel, build_plan, metas_of

    work = Path(tempfile.mkdtemp(prefix="rmx-bench-"))
    try:
        cfg = dict(dir=str(work), workers=workers, phases=[{"ratio": r} for r in ratios], sizes=sizes,
                   bucket_bytes=args.bucket_bytes, repeats=args.repeats,
                   train_ip=net.ip_a, rollout_ip=net.ip_b)
        (work / "cfg.json").write_text(json.dumps(cfg))
        ctx = mp.get_context("fork")  # children inherit the imported torch: no 2N interpreter start-ups
        mine: list = []
        for role, ns in (("train", net.a), ("rollout", net.b)):
            for i in range(workers):
                p = ctx.Process(target=_child, args=(ns, str(work / "cfg.json"), role, i), daemon=True)
                old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # no handler mid-fork
                try:
                    p.start()
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)
                mine.append(p)
                procs.append(p)
        for p_idx, ratio in enumerate(ratios):
            cross = intra_mbit / ratio
            net.shape(cross, intra_mbit)
            (work / f"go-{p_idx}").touch()
            deadline = time.monotonic() + STEP_TIMEOUT_S * len(sizes)
            while len(list(work.glob(f"done-{p_idx}-*"))) < 2 * workers:
                if _STOPPED:
                    raise KeyboardInterrupt(f"signal {_STOPPED[0]}")
                dead = [p for p in mine if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    logs = "\n".join((work / f).read_text()[-2000:] for f in os.listdir(work) if f.startswith("err-"))
                    raise RuntimeError(f"{workers}->{workers} ratio {ratio}: workers failed or timed out\n{logs}")
                time.sleep(0.1)
            print(f"  {workers}->{workers} ratio {ratio:g}:1 done", flush=True)
        for p in mine:
            p.join(timeout=60)
        recs = [json.loads(line) for f in work.glob("res-*.jsonl") for line in f.read_text().splitlines()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    runs = []
    for p_idx, ratio in enumerate(ratios):
        cross = intra_mbit / ratio
        links = LinkModel(cross_gbps=cross / 1000, intra_gbps=intra_mbit / 1000, intra_shared=True)
        for size in sizes:
            metas = metas_of(make_model(size, 0))
            t = {}
            plans = {}
            identical = True
            for scheme in ("flat", "topo"):
                rr = [r for r in recs if r["phase"] == p_idx and r["size"] == size and r["scheme"] == scheme]
                identical = identical and bool(rr) and all(r["ok"] for r in rr)
                if not identical:  # explicit (not an assert: python -O must not drop it)
                    raise RuntimeError(f"{scheme}: a rollout worker is not bit-identical to the trainer")
                per_rep = [max(r["wall_s"] for r in rr if r["rep"] == k and r["role"] == "rollout")
                           for k in range(args.repeats)]
                t[scheme] = statistics.median(per_rep)
                plans[scheme] = build_plan(metas, workers, workers, scheme=scheme, bucket_bytes=args.bucket_bytes)
            pf, pt = plans["flat"].predict(links), plans["topo"].predict(links)
            runs.append(dict(
                workers=workers, model_bytes=plans["topo"].model_bytes, link_ratio=ratio,
                flat_s=round(t["flat"], 4), topo_s=round(t["topo"], 4),
                flat_cross_bytes=plans["flat"].cross_bytes, topo_cross_bytes=plans["topo"].cross_bytes,
                measured_speedup=round(t["flat"] / t["topo"], 3),
                predicted_speedup=round(pf.total_s / pt.total_s, 3),
                predicted_flat_s=round(pf.total_s, 4), predicted_topo_s=round(pt.total_s, 4),
                cross_mbit_per_s=cross, intra_mbit_per_s=intra_mbit, bucket_bytes=args.bucket_bytes,
                topo_intra_bytes=plans["topo"].intra_bytes, all_bit_identical=identical,
                effective_cross_mbit_per_s=round(plans["flat"].cross_bytes * 8 / t["flat"] / 1e6, 1),
            ))
            r = runs[-1]
            print(f"  {workers}->{workers} {size / 2**20:.0f} MiB {ratio:g}:1  flat {r['flat_s']:.2f}s  "
                  f"topo {r['topo_s']:.2f}s  speedup {r['measured_speedup']:.2f}x (predicted "
                  f"{r['predicted_speedup']:.2f}x)", flush=True)
    return runs


def paper_scale_prediction() -> list[dict]:
    """The plan's predicted speed-up at the paper's scale (RollMux §6.1, Fig. 12): a 7B bf16 model,
    20 Gbps cross-cluster Ethernet, 400 Gbps InfiniBand per rollout NIC."""
    from rollmux.sync_plan import LinkModel, TensorMeta, build_plan

    tensors = [TensorMeta(f"layer{i}", (7 * 10**9 // 64,), "bfloat16", 2 * 7 * 10**9 // 64) for i in range(64)]
    links = LinkModel(cross_gbps=20.0, intra_gbps=400.0)
    out = []
    for w in (8, 16):
        f = build_plan(tensors, w, w, scheme="flat").predict(links).total_s
        t = build_plan(tensors, w, w).predict(links).total_s
        out.append(dict(workers=w, model_bytes=2 * 7 * 10**9, flat_s=round(f, 2), topo_s=round(t, 2),
                        predicted_speedup=round(f / t, 2)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8->8, 20:1, one model size")
    ap.add_argument("--workers", default="2,4,8", help="worker counts N (N trainers -> N rollout workers)")
    ap.add_argument("--ratios", default="20,5", help="fast:slow bandwidth ratios")
    ap.add_argument("--sizes-mib", default="4,16", help="model sizes, MiB")
    ap.add_argument("--intra-mbit", type=float, default=800.0, help="rollout-cluster fabric rate, Mbit/s")
    ap.add_argument("--bucket-bytes", type=int, default=256 * 1024)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=None, help="default results/bench_sync.json "
                    "(--quick: results/bench_sync_quick.json)")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("bench_sync: needs root and iproute2 ('ip', 'tc') to build network namespaces and shape "
              "the cross-cluster link; not running (no figures produced).", file=sys.stderr)
        return 2
    if args.quick:
        args.workers, args.ratios, args.sizes_mib = "8", "20", "8"
    workers = [int(x) for x in args.workers.split(",")]
    ratios = [float(x) for x in args.ratios.split(",")]
    sizes = [int(float(x) * 2**20) for x in args.sizes_mib.split(",")]

    net = Netns()
    procs: list = []
    import collectives  # noqa: F401  (imported once here; forked workers inherit it)

    def on_signal(signum, frame):  # turn SIGTERM/SIGHUP into an exception so `finally` cleans up
        _STOPPED.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    for s in _STOP_SIGNALS:
        signal.signal(s, on_signal)
    t0 = time.time()
    runs: list[dict] = []
    try:
        net.up()
        print(f"bench_sync: namespaces {net.a} / {net.b}; intra {args.intra_mbit:g} Mbit/s; "
              f"ratios {ratios}; workers {workers}; sizes {[s >> 20 for s in sizes]} MiB", flush=True)
        for w in workers:
            runs += run_config(net, w, ratios, sizes, args.intra_mbit, args, procs)
            if _STOPPED:
                raise KeyboardInterrupt(f"signal {_STOPPED[0]}")
    except KeyboardInterrupt as e:
        print(f"bench_sync: interrupted ({e}); cleaning up", file=sys.stderr)
        return 130
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        net.down()
    out = Path(args.out or ROOT / "results" / ("bench_sync_quick.json" if args.quick else "bench_sync.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(quick=args.quick, wall_s=round(time.time() - t0, 1), cpu_count=os.cpu_count(),
                setup=f"netns + veth (tbf cross = intra / ratio) + tbf on the rollout namespace's lo "
                      f"(intra {args.intra_mbit:g} Mbit/s, shared); gloo; bucket {args.bucket_bytes} B",
                paper_scale_prediction=paper_scale_prediction())
    out.write_text(json.dumps(runs, indent=1) + "\n")
    out.with_name(out.stem + "_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"bench_sync: wrote {len(runs)} runs to {out} in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
