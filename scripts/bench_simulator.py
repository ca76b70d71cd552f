#!/usr/bin/env python
"""Simulator speed at trace scale: jobs replayed per second and the cost of an event.

**The trace.** The full Philly trace shipped as ``data/philly-adaptdl-philly.csv.gz``, filtered as ``rollmux simulate``
does by default (jobs of at least 1 h, durations capped at 3 days), holds fewer jobs than the
largest size (18,645 of the full trace's 82,247 rows pass). A trace of N jobs is made by
*repeating the filtered trace back to back*: copy ``c`` (0, 1, 2, ...) is the whole filtered
trace with every arrival shifted by ``c x period``, ``period`` = the span of the filtered trace
(last arrival - first arrival) + 1 h, so copies do not interleave and the load (jobs active at a
time) stays that of the real trace; the first N jobs of the repetition are replayed (sizes
``--sizes``, default 1,000, 10,000 and 100,000). Each job's workload (``mixed``) is drawn from
its position in the repetition (seeded), so repeated trace rows get fresh jobs.

**What is timed.** For each size, the replay of ``--policies`` (default ``rollmux``) through
:func:`rollmux.sim.simulator.simulate` -- what ``rollmux simulate --policies rollmux`` runs, the
same-instant exact-optimum comparison included -- excluding trace reading and workload
drawing: ``wall_s``, ``jobs_per_s``, ``events``, ``ms_per_event``, and the cost of an event by
the number of jobs active right after it (``per_event_by_active``: mean and p90 ms per bin).
With ``--cli`` (default for the largest size) the repetition is also written as a plain CSV
and ``python -m rollmux.cli simulate --policies rollmux --jobs N --trace that.csv`` is timed end
to end (``cli_wall_s``: process start, trace reading, workload drawing, replay, plots).

Writes ``results/bench_simulator.json`` with the host's load average before and after each
size and the process's niceness (the host is shared: other work inflates the times).
Not a test: numbers depend on the machine.

    python scripts/bench_simulator.py                      # 1k, 10k, 100k jobs, rollmux (hours on a shared 2-core host)
    python scripts/bench_simulator.py --sizes 1000,10000 --no-reopt-sizes 1000 --reopt-limits 0,8 --cli none   # docs/RESULTS.md's figures (~15 min)
    python scripts/bench_simulator.py --sizes 1000 --no-reopt-sizes 1000 --cli none   # with and without re-optimisation
    python scripts/bench_simulator.py --sizes 200 --policies rollmux,random,most-idle,solo-d
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollmux.admission import load_scheduler_config  # noqa: E402
from rollmux.cli import DEFAULT_MAX_DURATION_S, DEFAULT_MIN_DURATION_S  # noqa: E402
from rollmux.config import CONFIG_DIR, load_cluster  # noqa: E402
from rollmux.sim.simulator import simulate  # noqa: E402
from rollmux.traces import DEFAULT_TRACE, EXTRACT_TRACE, TraceJob, TraceWindow, load_trace, trace_label  # noqa: E402
from rollmux.workloads import draw_jobs  # noqa: E402

PERIOD_GAP_S = 3600.0


def _host() -> dict:
    return {"load_avg_1_5_15_min": [round(x, 2) for x in os.getloadavg()], "nice": os.nice(0)}


def repeated_trace(trace: Path, n: int) -> tuple[list[TraceJob], dict]:
    """The first ``n`` jobs of the filtered trace repeated back to back (see the module text)."""
    window = TraceWindow(min_duration_s=DEFAULT_MIN_DURATION_S, max_duration_s=DEFAULT_MAX_DURATION_S)
    base = load_trace(trace, window)
    period = base[-1].arrival_s - base[0].arrival_s + PERIOD_GAP_S
    out: list[TraceJob] = []
    c = 0
    while len(out) < n:
        for j in base:
            if len(out) == n:
                break
            out.append(TraceJob(len(out), j.arrival_s + c * period, j.duration_s, j.num_gpus, j.cluster))
        c += 1
    how = {"trace": trace_label(trace), "filtered_jobs": len(base), "window": window.model_dump(), "period_s": period,
           "copies": c, "method": "the filtered trace repeated back to back, copy c shifted by c x period "
                                 "(period = span of the filtered trace + 1 h); first N jobs"}
    return out, how


def _per_event(stamps: list[float], jobs, run) -> dict:
    """Mean / p90 ms per event by the number of jobs active after it (bins of 50 jobs)."""
    evs = [(j.arrival_s, 1, 1) for j in jobs] + [(o.departure_s, 0, -1) for o in run.outcomes.values()]
    evs.sort(key=lambda e: (e[0], e[1]))  # departures first on ties (the replay's rule)
    active, act = 0, []
    for _, _, d in evs:
        active += d
        act.append(active)
    ms = np.diff(np.asarray(stamps)) * 1e3
    act = np.asarray(act[: len(ms)])
    bins = {}
    for lo in range(0, int(act.max(initial=0)) + 50, 50):
        sel = ms[(act >= lo) & (act < lo + 50)]
        if len(sel) >= 20:
            bins[f"{lo}-{lo + 49}"] = {"events": int(len(sel)), "mean_ms": round(float(sel.mean()), 3),
                                       "p90_ms": round(float(np.percentile(sel, 90)), 3)}
    return {"bins": bins, "max_active": int(act.max(initial=0)), "mean_active": round(float(act.mean()), 1) if len(act) else 0.0}


def _cli(jobs: list[TraceJob], n: int, tmp: Path) -> dict:
    csv_path, out = tmp / f"repeated_{n}.csv", tmp / f"sim_{n}"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "duration_s", "num_gpus"])
        for j in jobs:
            w.writerow([repr(j.arrival_s), repr(j.duration_s), j.num_gpus])
    cmd = [sys.executable, "-m", "rollmux.cli", "simulate", "--policies", "rollmux", "--jobs", str(n), "--trace", str(csv_path),
           "--out", str(out), "--no-progress"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"rollmux simulate failed: {p.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"cli_command": "python -m rollmux.cli simulate --policies rollmux --jobs N --trace <repeated trace CSV> --no-progress",
            "cli_wall_s": round(wall, 2), "cli_jobs": s["policies"]["rollmux"]["jobs"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE if DEFAULT_TRACE.is_file() else EXTRACT_TRACE)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--policies", default="rollmux")
    ap.add_argument("--cli", choices=("largest", "all", "none"), default="largest",
                    help="also time `rollmux simulate` end to end for these sizes")
    ap.add_argument("--no-reopt-sizes", default="",
                    help="sizes also replayed with the neighbourhood re-optimisation off (reopt_max_jobs 0; other "
                         "decisions), to show what it costs")
    ap.add_argument("--reopt-limits", default="0",
                    help="the reopt_max_jobs values replayed beside the default for --no-reopt-sizes (0: off)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_simulator.json")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    names = [p.strip() for p in args.policies.split(",")]
    cluster = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    cfg = load_scheduler_config()
    rows, how = [], None
    with tempfile.TemporaryDirectory(prefix="rollmux-bench-sim-") as tmp:
        for n in sizes:
            tjobs, how = repeated_trace(args.trace, n)
            jobs = draw_jobs(tjobs, cluster, mix="mixed", seed=cfg.seed)
            variants = [(name, cfg, "default") for name in names]
            if str(n) in args.no_reopt_sizes.split(","):
                limits = [int(x) for x in args.reopt_limits.split(",") if x.strip()]
                variants = [(name, cfg.overridden(reopt_max_jobs=k), f"reopt_max_jobs={k}") for k in limits for name in names] + variants
            for name, vcfg, variant in variants:
                host0 = _host()
                stamps = [time.perf_counter()]
                t0 = stamps[0]
                res = simulate(jobs, cluster, [name], seed=cfg.seed, config=vcfg,
                               on_event=lambda _p, _k: stamps.append(time.perf_counter()))
                wall = time.perf_counter() - t0
                run = res.runs[name]
                row = {"policy": name, "config": variant, "jobs": len(jobs), "wall_s": round(wall, 2), "jobs_per_s": round(len(jobs) / wall, 1),
                       "events": len(run.times_s), "ms_per_event": round(wall / max(1, len(run.times_s)) * 1e3, 3),
                       "per_event_by_active": _per_event(stamps, jobs, run),
                       "avg_cost_usd_per_h": res.summary["policies"][name]["avg_cost_usd_per_h"],
                       "host_before": host0, "host_after": _host()}
                if name == "rollmux" and variant == "default" and (args.cli == "all" or (args.cli == "largest" and n == max(sizes))):
                    row.update(_cli(tjobs, n, Path(tmp)))
                    row["host_after_cli"] = _host()
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "per_event_by_active"}), flush=True)
                _write(args.out, how, names, sizes, rows)  # after every row: a long run keeps what it measured
    print(f"wrote {args.out}")


def _write(path: Path, how: dict, names: list, sizes: list, rows: list) -> None:
    done = sorted({r["jobs"] for r in rows})
    out = {"config": {"trace_repetition": how, "mix": "mixed", "policies": names, "sizes": sizes, "sizes_measured": done,
                      "machine": f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"},
           "goal": "rollmux replays 100,000 jobs in under 60 s on 2 cores",
           "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
