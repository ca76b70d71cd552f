#!/usr/bin/env python
"""The control plane under load: many emulated jobs on a full emulated cluster (docs/EMULATION.md).

The real runtime (GlobalScheduler, one GroupController per co-execution group, permits, the pool
nodes' workers, the durable checkpoint) runs ``--jobs`` emulated jobs (mixed rollout-heavy,
training-heavy and balanced; 8 or 16 GPUs per pool) on ``configs/cluster_emulated.yaml`` (32 H20
rollout + 32 H800 training nodes; one Ray node carries a pool's nodes). Measured:

* **hand-off** on one node between two jobs' phases: the previous phase's end to the next job's
  phase start, for a next job that had asked before the previous one ended (it waited for the
  node): p50 / p99, and its parts (release -> grant, grant -> start);
* **scheduler time per event**: the scheduler's own admission latency (policy + checkpoint write),
  and its process's CPU seconds while the jobs ran per event (admissions + departures; the
  reconcile thread's passes included);
* **reconcile loop**: the duration of each reconcile pass (p50 / p99 / max);
* **checkpoint** per event: bytes and seconds of each write-ahead record, and of base rewrites
  (compactions);
* phases of iteration 0 are left out (cold starts: workers start where jobs land, builders run);
* **overhead**: per phase, the time outside the phase function (start-up, offload, commit,
  release) plus the hand-off gap before it, over the phase's wall time; and per iteration against
  the modelled solo iteration time;
* **RSS and CPU of every Ray process** (actors by class, the raylets, the GCS) at the end, and
  the load average beside every figure.

Goals: hand-off p50 <= 5 ms, p99 <= 50 ms, control-plane overhead <= 1% of the modelled iteration time.
Writes ``results/bench_control_plane.json``.

    python scripts/bench_control_plane.py            # 24 jobs, 64 nodes
    python scripts/bench_control_plane.py --quick    # 8 jobs on 8 + 8 nodes, 3 iterations each (a smaller config)

The scheduler's internals are read through Ray's ``__ray_call__`` (a function run inside the actor):
its checkpoint store's writes and its metrics recorder's admission / reconcile samples are
wrapped for the benchmark's duration; nothing else of the scheduler changes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from actors.ops.local_cluster import use_ephemeral_ray_token  # noqa: E402

use_ephemeral_ray_token()  # Ray token mode with a fresh token unless RAY_AUTH_MODE is set
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

#: Modelled worst-case phase times (s) of the job kinds, cycled over the jobs.
KINDS = {"rollout_heavy": {"t_roll_s": 240.0, "t_train_s": 80.0, "t_sync_s": 6.0},
         "train_heavy": {"t_roll_s": 90.0, "t_train_s": 220.0, "t_sync_s": 6.0},
         "balanced": {"t_roll_s": 150.0, "t_train_s": 140.0, "t_sync_s": 6.0}}
#: GPUs per pool (rollout, training), cycled.
SIZES = [(8, 8), (8, 8), (16, 8), (8, 16)]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 jobs on 8 + 8 nodes, 3 iterations (a smaller config)")
    ap.add_argument("--jobs", type=int, default=None, help="default 24 (quick 8)")
    ap.add_argument("--nodes-per-pool", type=int, default=None, help="default 32 (quick 8)")
    ap.add_argument("--iterations", type=int, default=None, help="per job (default 4, quick 3)")
    ap.add_argument("--wall-ms-per-model-s", type=float, default=10.0, help="time factor")
    ap.add_argument("--arrival-gap-s", type=float, default=0.5, help="wall seconds between arrivals")
    ap.add_argument("--timeout-s", type=float, default=1200.0)
    ap.add_argument("--prestart-workers", action="store_true", help="start every pool node's worker before the jobs "
                    "arrive (64 processes: ~9 GiB); default: workers start where jobs land (iteration 0 pays it)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_control_plane.json"))
    return ap.parse_args(argv)


def make_cluster(nodes: int):
    from rollmux.config import CONFIG_DIR, load_cluster

    c = load_cluster(CONFIG_DIR / "cluster_emulated.yaml")
    return c.model_copy(update={"name": f"emulated-{nodes}x{nodes}",
                                "rollout_pool": c.rollout_pool.model_copy(update={"num_nodes": nodes}),
                                "train_pool": c.train_pool.model_copy(update={"num_nodes": nodes})})


def make_specs(n: int, uid: str) -> list:
    from rollmux.models import DeclaredProfile, JobSpec

    kinds = list(KINDS)
    out = []
    for k in range(n):
        kind = kinds[k % len(kinds)]
        nr, nt = SIZES[(k // len(kinds)) % len(SIZES)]
        out.append(JobSpec(job_id=f"cp-{k:02d}-{kind.split('_')[0]}-{uid}", model_params_b=7.0, num_prompts=64,
                           responses_per_prompt=8, max_response_tokens=4096, num_rollout_gpus=nr, num_train_gpus=nt,
                           slo=2.0, measured=DeclaredProfile(**KINDS[kind])))
    return out


# ------------------------------------------------------------------ inside the scheduler (__ray_call__)
def _instrument(self) -> bool:
    """Run inside the GlobalScheduler: record every checkpoint write (kind, bytes, seconds) and
    every admission / reconcile sample its metrics recorder receives (bounded deques)."""
    import collections
    import time as _t

    if getattr(self, "_bench", None) is not None:
        return True
    bench = {"ckpt": collections.deque(maxlen=200_000), "metrics": collections.deque(maxlen=200_000)}
    self._bench = bench
    st = self.store
    orig_append, orig_base = st.append, st.write_base

    def append(delta):
        t = _t.perf_counter()
        seq = orig_append(delta)
        bench["ckpt"].append(("wal", int(st._wal_sizes.get(seq, 0)), _t.perf_counter() - t))
        return seq

    def write_base(seq, state):
        t = _t.perf_counter()
        ok = orig_base(seq, state)
        bench["ckpt"].append(("base", int(st.base_bytes), _t.perf_counter() - t))
        return ok

    st.append, st.write_base = append, write_base
    orig_push = self.metrics._push

    def push(kind, a):
        if kind in ("admission", "reconcile"):
            bench["metrics"].append((kind, tuple(a), _t.time()))
        return orig_push(kind, a)

    self.metrics._push = push
    return True


def _collect(self) -> dict:
    """Run inside the GlobalScheduler: what :func:`_instrument` recorded, and the checkpoint's counters."""
    b = getattr(self, "_bench", None) or {"ckpt": [], "metrics": []}
    return {"ckpt": list(b["ckpt"]), "metrics": list(b["metrics"]), "seq": self.store.seq,
            "base_bytes": self.store.base_bytes, "wal_bytes": self.store.wal_bytes}


# ------------------------------------------------------------------------------------ analysis
def pct(xs: list[float], q: float):
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def summary(xs: list[float], scale: float = 1.0, nd: int = 3) -> dict:
    xs = [x * scale for x in xs]
    return {"n": len(xs), "p50": _r(pct(xs, 0.5), nd), "p99": _r(pct(xs, 0.99), nd), "max": _r(max(xs), nd) if xs else None,
            "mean": _r(statistics.mean(xs), nd) if xs else None}


def _r(x, nd):
    return None if x is None else round(float(x), nd)


def handoffs(records: list[dict]) -> dict:
    """Hand-off gaps (s) between consecutive phases of different jobs on one node, where the next
    job asked before the previous phase ended (it waited for the node)."""
    by_node: dict[str, list[dict]] = {}
    for r in records:
        if r.get("start") is None or r.get("end") is None:
            continue
        for nd in (r.get("nodes") or [r.get("node")]):
            if nd:
                by_node.setdefault(nd, []).append(r)
    gap, rel, disp = [], [], []
    for recs in by_node.values():
        recs.sort(key=lambda r: r["start"])
        for a, b in zip(recs, recs[1:]):
            asked = (b.get("granted_at") or b["start"]) - float(b.get("waited_s") or 0.0)
            if a["job_id"] != b["job_id"] and asked <= a["end"] <= b["start"]:
                gap.append(b["start"] - a["end"])
                if b.get("granted_at"):
                    rel.append(max(0.0, b["granted_at"] - a["end"]))
                    disp.append(b["start"] - b["granted_at"])
    return {"handoff_ms": summary(gap, 1e3), "release_to_grant_ms": summary(rel, 1e3),
            "grant_to_start_ms": summary(disp, 1e3), "nodes": len(by_node)}


def _sched_cpu() -> float:
    """CPU seconds (user + system) of the GlobalScheduler's process(es) so far."""
    return sum(p["cpu_s"] for p in per_actor_processes() if p["kind"] == "GlobalSchedulerImpl")


def per_actor_processes() -> list[dict]:
    """Every descendant Ray process of this one: kind (actor class / daemon), pid, RSS MiB, CPU s."""
    import psutil

    from actors.ops.proc_stats import _kind

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            with p.oneshot():
                out.append({"kind": _kind(p), "pid": p.pid, "rss_mb": round(p.memory_info().rss / 2**20, 1),
                            "cpu_s": round(sum(p.cpu_times()[:2]), 2)})
        except Exception:
            continue
    return sorted(out, key=lambda x: (x["kind"], x["pid"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    n_jobs = args.jobs or (8 if args.quick else 24)
    nodes = args.nodes_per_pool or (8 if args.quick else 32)
    iters = args.iterations or (3 if args.quick else 4)

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle, gather, run_in_actor
    from actors.ops.local_cluster import start_local_cluster
    from actors.ops.proc_stats import ray_process_stats
    from actors.worker.workers import worker_handle
    from examples.emulated.job import EmulatedJobConfig, run_arrivals
    from rollmux import profiler
    from rollmux.admission import load_scheduler_config
    from rollmux.emulation import load_emulation_config, scheduler_config

    cluster = make_cluster(nodes)
    em = load_emulation_config().model_copy(update={"wall_ms_per_model_s": args.wall_ms_per_model_s})
    uid = uuid.uuid4().hex[:6]
    specs = make_specs(n_jobs, uid)
    load: dict[str, tuple] = {"start": os.getloadavg()}
    t0 = time.time()
    lc = start_local_cluster(cluster, head_cpus=2, node_cpus=1, object_store_mb=128, pool_nodes_per_ray_node=nodes,
                             worker_niceness=0)  # timed waits must wake on time on a loaded machine
    startup_s = time.time() - t0
    name = f"bench-cp-{uid}"
    tmp = Path(tempfile.mkdtemp(prefix="cp-", dir=lc.run_dir))  # removed with the cluster's run dir
    try:
        sched = get_or_create_scheduler(cluster, name=name, checkpoint_path=str(tmp / "scheduler-ckpt"),
                                        config=scheduler_config(load_scheduler_config(), em))
        sh = SchedulerHandle(sched)
        sh.health(timeout_s=None)
        run_in_actor(sched, _instrument, timeout_s=60)
        t1 = time.time()
        if args.prestart_workers:
            all_nodes = [f"{p}-{i}" for p in ("rollout", "train") for i in range(nodes)]
            for k in range(0, len(all_nodes), 4):  # the pool nodes' workers exist before the jobs arrive
                gather([worker_handle(n).where_nowait() for n in all_nodes[k:k + 4]], timeout_s=600)
        workers_start_s = time.time() - t1
        load["jobs_start"] = os.getloadavg()
        before = ray_process_stats()
        cpu0 = _sched_cpu()
        loads: list[float] = []
        peak: dict[str, dict] = {}
        stop = threading.Event()

        def poll() -> None:  # load average, and each kind's peak RSS (groups dissolve before the end)
            k = 0
            while not stop.wait(1.0):
                loads.append(os.getloadavg()[0])
                k += 1
                if k % 5 == 0:
                    for kind, v in ray_process_stats().items():
                        e = peak.setdefault(kind, {"processes_max": 0, "rss_mb_total_max": 0.0, "rss_mb_max": 0.0})
                        e["processes_max"] = max(e["processes_max"], v["processes"])
                        e["rss_mb_total_max"] = max(e["rss_mb_total_max"], v["rss_mb_total"])
                        e["rss_mb_max"] = max(e["rss_mb_max"], v["rss_mb_max"])

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        cfgs = [EmulatedJobConfig(spec=sp, cluster=cluster, emulation=em, iterations=iters) for sp in specs]
        t_run = time.time()
        res = run_arrivals(cfgs, [args.arrival_gap_s * k for k in range(n_jobs)], timeout_s=args.timeout_s,
                           scheduler_name=name, checkpoint_dir=str(tmp / "ckpt"))
        run_s = time.time() - t_run
        stop.set()
        th.join(timeout=5)
        load["jobs_end"] = os.getloadavg()
        sched_cpu = _sched_cpu() - cpu0
        inner = run_in_actor(sched, _collect, timeout_s=120)
        health = sh.health().to_dict()
        procs = per_actor_processes()
        after = ray_process_stats()
    finally:
        lc.shutdown()
    import traceback

    errors = {k: {"error": repr(v)[:500], "where": [ln.strip() for ln in traceback.format_exception(v)[-8:]][:8]}
              for k, v in res.items() if isinstance(v, BaseException)}
    ok = {k: v for k, v in res.items() if not isinstance(v, BaseException)}
    # the steady state: iteration 0 pays the cold starts (workers spawned where jobs land, builders)
    recs = [r for v in ok.values() for r in v["timeline"] if r.get("ok", True) and (r.get("iteration") or 0) >= 1]
    groups = {v["info"].get("group_id") for v in ok.values()}
    # overhead: time outside the phase function inside the phase records, and hand-off gaps
    inside = [max(0.0, (r["end"] - r["start"]) - float(r.get("run_s") or 0.0)) for r in recs
              if r.get("start") is not None and r.get("end") is not None and r.get("run_s") is not None]
    phase_wall = sum(r["end"] - r["start"] for r in recs if r.get("start") is not None and r.get("end") is not None)
    ho = handoffs(recs)
    factor = args.wall_ms_per_model_s / 1000.0
    solo_wall = statistics.mean(profiler.estimate(sp, cluster).t_solo_s for sp in specs) * factor
    per_phase_overhead_s = (statistics.mean(inside) if inside else 0.0) + (ho["handoff_ms"]["p50"] or 0.0) / 1e3
    overhead_per_iteration_s = 3 * per_phase_overhead_s  # rollout, training, sync
    adm = [a[1] for k, a, _ in inner["metrics"] if k == "admission"]
    rec = [a[1] for k, a, _ in inner["metrics"] if k == "reconcile"]
    wal = [(b, s) for k, b, s in inner["ckpt"] if k == "wal"]
    base = [(b, s) for k, b, s in inner["ckpt"] if k == "base"]
    events = len(adm) + sum(1 for v in ok.values()) + len(errors)  # admissions + departures
    result = {
        "config": {"jobs": n_jobs, "nodes_per_pool": nodes, "pool_nodes": 2 * nodes, "iterations": iters,
                   "wall_ms_per_model_s": args.wall_ms_per_model_s, "quick": bool(args.quick),
                   "cluster": cluster.name, "kinds": KINDS, "sizes": SIZES},
        "loadavg": load, "loadavg_1m_during_run": {"mean": _r(statistics.mean(loads), 2) if loads else None,
                                                   "max": _r(max(loads), 2) if loads else None},
        "startup_s": _r(startup_s, 2), "workers_start_s": _r(workers_start_s, 2), "run_s": _r(run_s, 2),
        "jobs_ok": len(ok), "jobs_failed": errors, "groups": len(groups), "phase_records": len(recs),
        "handoff": ho,
        "scheduler": {"admission_latency_ms": summary(adm, 1.0), "cpu_s_during_jobs": _r(sched_cpu, 2),
                      "events": events, "cpu_ms_per_event": _r(1e3 * sched_cpu / max(1, events), 2),
                      "health": health},
        "reconcile_pass_ms": summary(rec, 1e3),
        "checkpoint": {"wal_records": len(wal), "wal_bytes_per_event": summary([b for b, _ in wal], 1.0, 0),
                       "wal_ms_per_event": summary([s for _, s in wal], 1e3),
                       "base_writes": len(base), "base_bytes": summary([b for b, _ in base], 1.0, 0),
                       "base_ms": summary([s for _, s in base], 1e3), "final_seq": inner["seq"],
                       "final_base_bytes": inner["base_bytes"], "final_wal_bytes": inner["wal_bytes"]},
        "overhead": {"inside_phase_ms": summary(inside, 1e3),
                     "share_of_phase_wall": _r(sum(inside) / max(1e-9, phase_wall), 5),
                     "per_iteration_s": _r(overhead_per_iteration_s, 4),
                     "modelled_solo_iteration_wall_s_mean": _r(solo_wall, 3),
                     "fraction_of_modelled_iteration": _r(overhead_per_iteration_s / solo_wall, 5)},
        "processes": {"peak_during_jobs": peak, "by_kind_end": after, "by_kind_before_jobs": before, "every_process_end": procs},
    }
    result["goals"] = {"handoff_p50_ms<=5": (ho["handoff_ms"]["p50"] or 1e9) <= 5.0,
                       "handoff_p99_ms<=50": (ho["handoff_ms"]["p99"] or 1e9) <= 50.0,
                       "overhead<=1%": result["overhead"]["fraction_of_modelled_iteration"] <= 0.01}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    h = ho["handoff_ms"]
    print(f"{len(ok)}/{n_jobs} jobs ok on {2 * nodes} nodes ({len(groups)} groups), {len(recs)} phases; "
          f"hand-off p50 {h['p50']} ms p99 {h['p99']} ms (n={h['n']}); admission p50 "
          f"{result['scheduler']['admission_latency_ms']['p50']} ms; reconcile p50 {result['reconcile_pass_ms']['p50']} ms; "
          f"wal {result['checkpoint']['wal_bytes_per_event']['p50']} B / {result['checkpoint']['wal_ms_per_event']['p50']} ms "
          f"per event; overhead {100 * result['overhead']['fraction_of_modelled_iteration']:.2f}% of the modelled "
          f"iteration; load {load['start'][0]:.1f} -> {load['jobs_end'][0]:.1f}  -> {out}")
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
