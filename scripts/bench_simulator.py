#!/usr/bin/env python
"""Simulator speed: jobs replayed per second, per policy, on a window of the real Philly trace.

Replays the first ``--jobs`` jobs (duration >= 1 h, capped at 3 days; ``mixed`` workload) of
the trace through each policy and records the wall time of each replay (excluding trace
reading and workload drawing) and ``jobs / wall_s``. Writes ``results/bench_simulator.json``:
``{"config": {...}, "rows": [{policy, jobs, wall_s, jobs_per_s, events}], "all_policies": {...}}``.
Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollmux.policies import POLICY_NAMES  # noqa: E402
from rollmux.config import CONFIG_DIR, load_cluster  # noqa: E402
from rollmux.simulator import Realisation, make_policy, replay  # noqa: E402
from rollmux.traces import DEFAULT_TRACE, EXTRACT_TRACE, TraceWindow, load_trace  # noqa: E402
from rollmux.workloads import draw_jobs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE if DEFAULT_TRACE.is_file() else EXTRACT_TRACE)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument("--stochastic", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_simulator.json")
    args = ap.parse_args()
    cluster = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    window = TraceWindow(max_jobs=args.jobs, min_duration_s=3600, max_duration_s=3 * 86400)
    jobs = draw_jobs(load_trace(args.trace, window), cluster, mix="mixed", seed=args.seed)
    real = Realisation(cluster, stochastic=args.stochastic, seed=args.seed)
    rows = []
    total_t0 = time.perf_counter()
    for name in args.policies.split(","):
        t0 = time.perf_counter()
        run = replay(jobs, make_policy(name, cluster, real, seed=args.seed), real)
        wall = time.perf_counter() - t0
        rows.append({"policy": name, "jobs": len(jobs), "wall_s": round(wall, 3), "jobs_per_s": round(len(jobs) / wall, 2),
                     "events": len(run.times_s)})
        print(json.dumps(rows[-1]), flush=True)
    total = time.perf_counter() - total_t0
    out = {
        "config": {"trace": str(args.trace), "jobs": len(jobs), "mix": "mixed", "stochastic": args.stochastic,
                   "window": window.model_dump()},
        "rows": rows,
        "all_policies": {"wall_s": round(total, 3), "jobs_per_s": round(len(jobs) * len(rows) / total, 2)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}: {out['all_policies']}")


if __name__ == "__main__":
    main()
