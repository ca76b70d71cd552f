#!/usr/bin/env python
"""Warm vs cold phase-switch latency under RollMux (RollMux §5: warm start keeps state in host
memory and the process alive; cold start rebuilds the phase state from a checkpoint on disk).

Starts its own local multi-node Ray cluster (``configs/cluster_local.yaml``) and GlobalScheduler,
runs a GRPO job attached to it once with ``switch="warm"`` and once with ``switch="cold"``, and
reads every phase's start-up latency (``switch_s``: object store -> process for warm; builder +
``torch.load`` of the checkpoint for cold) and offload latency from the recorded timeline.
Writes the medians to ``results/bench_switch.json``.

    python scripts/bench_switch.py [--iterations 6] [--config configs/jobs/grpo_train_heavy.yaml] [--sizes config,256x4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from actors.ops.local_cluster import use_ephemeral_ray_token  # noqa: E402

use_ephemeral_ray_token()  # Ray token mode with a fresh token unless RAY_AUTH_MODE is set
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {"n": len(xs), "median_s": statistics.median(xs), "min_s": xs[0], "max_s": xs[-1]}


def summarise(timeline: list[dict], kind: str) -> dict:
    """Start-up (``switch_s``) and offload latency of the phases that started ``kind``."""
    recs = [r for r in timeline if r.get("switch") == kind and r["phase"] in ("rollout", "train")]
    out = {"startup": _stats([r["switch_s"] for r in recs]),
           "offload": _stats([r["offload_s"] for r in recs if r.get("offload_s") is not None])}
    for pool in ("rollout", "train"):
        out[f"startup_{pool}"] = _stats([r["switch_s"] for r in recs if r["phase"] == pool])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="warm vs cold phase switch latency -> results/bench_switch.json")
    ap.add_argument("--config", default=str(ROOT / "configs" / "jobs" / "grpo_train_heavy.yaml"))
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_switch.json"))
    ap.add_argument("--sizes", default="config,256x4",
                    help="model sizes: 'config' (the job file's model) and/or HIDDENxLAYERS entries")
    args = ap.parse_args(argv)

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from actors.ops.local_cluster import start_local_cluster
    from examples.grpo.config import load_job_config
    from examples.grpo.job import run_job
    from examples.grpo.model import build_model
    from rollmux.config import CONFIG_DIR, load_cluster, repo_label

    spec = load_cluster(CONFIG_DIR / "cluster_local.yaml")
    cfg = load_job_config(args.config, iterations=args.iterations)
    uid = uuid.uuid4().hex[:6]
    t0 = time.time()
    lc = start_local_cluster(spec, head_cpus=2, node_cpus=1, object_store_mb=128)
    runs = {}
    try:
        name = f"rollmux-bench-{uid}"
        h = get_or_create_scheduler(spec, name=name)
        SchedulerHandle(h).health(timeout_s=None)
        ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=lc.run_dir)  # removed with the cluster's run dir
        for size in args.sizes.split(","):
            c0 = cfg
            if size != "config":
                hidden, layers = (int(x) for x in size.lower().split("x"))
                c0 = cfg.model_copy(update={"model": cfg.model.model_copy(update={
                    "hidden_size": hidden, "num_layers": layers, "intermediate_size": 2 * hidden})})
            for kind in ("warm", "cold"):
                jid = f"{cfg.job.job_id}-{size}-{kind}-{uid}".replace("x", "-")
                c = c0.model_copy(update={"job": c0.job.model_copy(update={"job_id": jid})})
                res = run_job(c, attach=True, scheduler_name=name, switch=kind, checkpoint_dir=ckpt)
                runs[(size, kind)] = {"timeline": res["timeline"], "weights_sha256": res["weights_sha256"]}
            runs[(size, "params")] = sum(p.numel() for p in build_model(c0.model, 0).parameters())
    finally:
        lc.shutdown()
    sizes = []
    for size in args.sizes.split(","):
        warm, cold = summarise(runs[(size, "warm")]["timeline"], "warm"), summarise(runs[(size, "cold")]["timeline"], "cold")
        wm, cm = warm["startup"].get("median_s"), cold["startup"].get("median_s")
        sizes.append({"model": size, "params": runs[(size, "params")], "warm": warm, "cold": cold,
                      "warm_switch_s_median": wm, "cold_switch_s_median": cm,
                      "cold_over_warm": (cm / wm) if wm and cm else None,
                      "same_weights_warm_vs_cold": runs[(size, "warm")]["weights_sha256"] == runs[(size, "cold")]["weights_sha256"]})
    result = {
        "config": repo_label(args.config), "iterations": args.iterations, "cluster": spec.name, "sizes": sizes,
        "warm_switch_s_median": sizes[0]["warm_switch_s_median"], "cold_switch_s_median": sizes[0]["cold_switch_s_median"],
        "wall_s": time.time() - t0,
        "notes": "switch_s = phase state start-up on the worker (warm: Ray object store -> process; cold: state builder "
                 "+ checkpoint load from disk); the first phase of the warm run is a cold build and is excluded from warm.",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for z in sizes:
        print(f"model {z['model']} ({z['params'] / 1e6:.2f} M params): warm start median "
              f"{z['warm_switch_s_median'] * 1e3:.1f} ms (n={z['warm']['startup']['n']}), cold start median "
              f"{z['cold_switch_s_median'] * 1e3:.1f} ms (n={z['cold']['startup']['n']}), cold/warm "
              f"{z['cold_over_warm']:.1f}x; warm == cold weights: {z['same_weights_warm_vs_cold']}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
