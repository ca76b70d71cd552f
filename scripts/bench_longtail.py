#!/usr/bin/env python
"""Long-tail migration on real generation: two co-executed GRPO jobs with long-tailed response
lengths, migration on vs off (RollMux §4.3, Fig. 7; the paper's Fig. 11 right).

Both jobs share one rollout node and one training node of a local Ray cluster (one co-execution
group). Their responses have per-row minimum lengths drawn log-normal (``response_tail_sigma``),
so most rows finish early and a few stragglers run to the end. With migration on, the
GroupController (``tail_trigger_fraction`` from ``configs/scheduler.yaml``) lets the other job's
rollout start on the rollout node once 80% of the responses are done and that job waits; off,
the node's FIFO waits for the whole rollout. Measured per setting over the steady state
(iterations 1..n-1; iteration 0 pays the cold starts): the group iteration time, the rollout
node's idle fraction (one minus the union of its busy intervals) and the migrations that acted
(rollouts of two jobs overlapping on the node); off/on runs alternate ``--repeats`` times and
the median run of each setting is reported. Writes ``results/bench_longtail.json`` and ``results/bench_longtail.png``.

    python scripts/bench_longtail.py --quick     # ~1-2 minutes on 2 cores, Ray startup included

On this CPU machine a "GPU" is one core and a straggler batch still computes every row, so the
freed capacity is the second core a concurrent rollout can use; figures are what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from actors.local_cluster import use_ephemeral_ray_token  # noqa: E402

use_ephemeral_ray_token()  # Ray token mode with a fresh token unless RAY_AUTH_MODE is set
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="6 iterations per job (default 12)")
    ap.add_argument("--repeats", type=int, default=2, help="off/on pairs, alternating (the median is reported)")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal shape of the response lengths")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_longtail.json"))
    return ap.parse_args(argv)


def job_configs(n: int, sigma: float, uid: str) -> list:
    """Two rollout-heavy GRPO jobs with long-tailed responses (mean minimum 40, cap 160 tokens)."""
    from examples.grpo.config import ModelConfig, load_job_config
    from rollmux.config import CONFIG_DIR

    base = load_job_config(CONFIG_DIR / "jobs" / "grpo_rollout_heavy.yaml", iterations=n)
    model = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=176)
    out = []
    for k in range(2):
        job = base.job.model_copy(update={"job_id": f"longtail-{k}-{uid}", "slo": 10.0, "num_prompts": 4,
                                          "max_response_tokens": 160})
        run = base.run.model_copy(update={"seed": 10 + k, "num_prompts": 4, "group_size": 4, "min_new_tokens": 40,
                                          "max_new_tokens": 160, "ppo_epochs": 1, "response_tail_sigma": sigma})
        out.append(base.model_copy(update={"job": job, "run": run, "model": model}))
    return out


def measure(res: dict, wall_s: float, n: int) -> dict:
    """Group iteration time, rollout-node idle and acted migrations from the jobs' timelines, over
    the steady state: iterations 1..n-1 (iteration 0 pays the jobs' cold starts: imports, builders)."""
    from rollmux.occupancy import occupancy

    recs = [r for v in res.values() for r in v["timeline"] if (r.get("iteration") or 0) >= 1]
    t0 = min(r["start"] for r in recs)
    t1 = max(r["end"] for r in recs)
    rows = [{"pool": r["pool"], "node": r["node"], "start_s": r["start"] - t0, "end_s": r["end"] - t0} for r in recs]
    nodes = {"rollout": {x["node"]: 1.0 for x in rows if x["pool"] == "rollout"},
             "train": {x["node"]: 1.0 for x in rows if x["pool"] == "train"}}
    occ = occupancy(rows, nodes, window=(0.0, t1 - t0))
    rolls = [r for r in recs if r["phase"] == "rollout"]
    overlaps = sum(1 for a in rolls for b in rolls if a["job_id"] < b["job_id"] and a["node"] == b["node"]
                   and a["start"] < b["end"] and b["start"] < a["end"])
    return {"group_iteration_s": (t1 - t0) / (n - 1), "steady_window_s": t1 - t0, "wall_s": wall_s,
            "rollout_idle_fraction": occ["rollout"].bubble_ratio, "train_idle_fraction": occ["train"].bubble_ratio,
            "migrations_acted": overlaps,
            "rollout_s_median": sorted(r["end"] - r["start"] for r in rolls)[len(rolls) // 2],
            "weights_sha256": [[h["weights_sha256"] for h in res[j]["history"]] for j in sorted(res)],
            "response_len_mean": {j: sum(h["response_len_mean"] for h in v["history"]) / len(v["history"])
                                  for j, v in res.items()}}


def run_setting(spec, migrate: bool, n: int, sigma: float) -> dict:
    import ray

    from actors.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from examples.grpo.job import run_coexecuted

    uid = uuid.uuid4().hex[:6]
    name = f"bench-longtail-{'on' if migrate else 'off'}-{uid}"
    sched = get_or_create_scheduler(spec, name=name, controller_kw={"migrate": migrate})
    SchedulerHandle(sched).health(timeout_s=120)
    cfgs = job_configs(n, sigma, uid)
    t0 = time.perf_counter()
    res = run_coexecuted(cfgs, name, admit_timeout_s=300, finish_timeout_s=900)
    wall = time.perf_counter() - t0
    errors = {k: repr(v) for k, v in res.items() if isinstance(v, BaseException)}
    ray.kill(sched, no_restart=True)
    if errors:
        raise RuntimeError(f"bench_longtail ({'on' if migrate else 'off'}): {errors}")
    groups = {v["info"]["group_id"] for v in res.values()}
    if len(groups) != 1:
        raise RuntimeError(f"bench_longtail: the two jobs were not packed into one group: {groups}")
    return measure(res, wall, n)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(7, 3))
    keys = ("off", "on")
    ax[0].bar(keys, [result[k]["group_iteration_s"] for k in keys], color=["#999", "#1f77b4"])
    ax[0].set_ylabel("group iteration time, s")
    ax[1].bar(keys, [100 * result[k]["rollout_idle_fraction"] for k in keys], color=["#999", "#1f77b4"])
    ax[1].set_ylabel("rollout-node idle, %")
    for a in ax:
        a.set_xlabel("long-tail migration")
    fig.suptitle("Long-tail migration, measured (RollMux Fig. 11 right)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    n = args.iterations or (6 if args.quick else 12)
    if n < 2:
        raise SystemExit("bench_longtail: --iterations must be >= 2 (iteration 0 is the cold start)")
    from actors.local_cluster import start_local_cluster
    from rollmux.admission import load_scheduler_config
    from rollmux.config import CONFIG_DIR, load_cluster

    spec = load_cluster(CONFIG_DIR / "cluster_local.yaml")
    cfg = load_scheduler_config()
    lc = start_local_cluster(spec, head_cpus=2, node_cpus=1, object_store_mb=128)
    try:
        runs: dict[str, list] = {"off": [], "on": []}
        for _ in range(max(1, args.repeats)):  # alternate, so neither setting always runs first
            for key in ("off", "on"):
                runs[key].append(run_setting(spec, key == "on", n, args.sigma))
        result = {"iterations": n, "sigma": args.sigma, "tail_trigger_fraction": cfg.tail_trigger_fraction,
                  "repeats": max(1, args.repeats), "runs": runs}
        for key in ("off", "on"):
            med = sorted(runs[key], key=lambda r: r["group_iteration_s"])[(len(runs[key]) - 1) // 2]
            result[key] = med
    finally:
        lc.shutdown()
    off, on = result["off"], result["on"]
    result["iteration_speedup"] = off["group_iteration_s"] / on["group_iteration_s"]
    # on-policy: scheduling (migration on or off) must not change what the jobs learn
    result["weights_identical_on_off"] = len({json.dumps(r["weights_sha256"]) for k in ("off", "on")
                                              for r in result["runs"][k]}) == 1
    result["rollout_idle_change"] = on["rollout_idle_fraction"] - off["rollout_idle_fraction"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"{'migration':<10}{'iter s':>9}{'roll idle':>11}{'acted':>7}")
    for k in ("off", "on"):
        r = result[k]
        print(f"{k:<10}{r['group_iteration_s']:>9.2f}{100 * r['rollout_idle_fraction']:>10.1f}%{r['migrations_acted']:>7d}")
    print(f"speedup {result['iteration_speedup']:.3f}x, weights identical on/off: "
          f"{result['weights_identical_on_off']}  -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
