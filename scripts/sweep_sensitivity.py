#!/usr/bin/env python
"""Sensitivity of RollMux's cost saving and SLO attainment (the analogue of RollMux §7.5, Fig. 14).

Replays a window of the trace (first ``--jobs`` jobs, duration >= 1 h capped at 3 days) through
RollMux and Solo-D while one factor varies and the others stay at the defaults (``mixed`` mix,
SLO ~ U(1, 2), max group size 5):

* job mix: balanced, rollout-heavy, training-heavy, mixed;
* SLO range: U(1, 1.2), U(1, 1.5), U(1, 2), U(1, 3), U(1.5, 2.5);
* maximum group size: 1, 2, 3, 4, 5, 6, 8.

Each point is replayed with worst-case phase times (deterministic, as the paper's simulation) and
with stochastic phase times (long-tailed rollouts, long-tail migration), over ``--seeds``. Per point:
``cost_saving_vs_solo_d = 1 - cost(RollMux) / cost(Solo-D)`` (total $ of each replay),
``slo_attainment`` (slowdown against the realised solo time) and ``slo_attainment_vs_planned_solo``
(against the worst-case solo time admission plans with; equal in deterministic replays), averaged
over the seeds (min and max kept). Writes ``results/sensitivity.json`` and ``results/sensitivity.png``;
docs/SENSITIVITY.md discusses the trends beside the paper's.

    python scripts/sweep_sensitivity.py --quick   # 60 jobs, seed 0: ~1-2 min on 2 cores
    python scripts/sweep_sensitivity.py           # 200 jobs, seeds 0-2: ~30 min on a shared 2-core host (what results/ holds)

One process (``--procs 2`` runs the points on two); no Ray.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollmux.config import CONFIG_DIR, load_cluster  # noqa: E402
from rollmux.sim.simulator import simulate  # noqa: E402
from rollmux.traces import DEFAULT_TRACE, EXTRACT_TRACE, TraceWindow, load_trace  # noqa: E402
from rollmux.workloads import draw_jobs  # noqa: E402

DEFAULT = {"mix": "mixed", "slo_range": (1.0, 2.0), "max_group_size": 5}
FACTORS = {
    "mix": ["balanced", "rollout-heavy", "training-heavy", "mixed"],
    "slo_range": [(1.0, 1.2), (1.0, 1.5), (1.0, 2.0), (1.0, 3.0), (1.5, 2.5)],
    "max_group_size": [1, 2, 3, 4, 5, 6, 8],
}
METRICS = ("cost_saving_vs_solo_d", "slo_attainment", "slo_attainment_vs_planned_solo")


def run_point(args: tuple) -> dict:
    """One replay pair (RollMux, Solo-D) for one setting, seed and realisation mode."""
    trace_path, jobs_n, setting, seed, stochastic = args
    cluster = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    trace = load_trace(trace_path, TraceWindow(max_jobs=jobs_n, min_duration_s=3600, max_duration_s=3 * 86400))
    jobs = draw_jobs(trace, cluster, mix=setting["mix"], seed=seed, slo_range=tuple(setting["slo_range"]))
    r = simulate(jobs, cluster, ["rollmux", "solo-d"], stochastic=stochastic, seed=seed,
                 max_group_size=setting["max_group_size"], shadow_policies=())
    rm, sd = r.summary["policies"]["rollmux"], r.summary["policies"]["solo-d"]
    return {"cost_saving_vs_solo_d": 1.0 - rm["total_cost_usd"] / sd["total_cost_usd"],
            "slo_attainment": rm["slo_attainment"], "slo_attainment_vs_planned_solo": rm["slo_attainment_vs_planned_solo"],
            "max_slowdown_over_slo": rm["max_slowdown_over_slo"], "rollmux_total_cost_usd": rm["total_cost_usd"],
            "solo_d_total_cost_usd": sd["total_cost_usd"]}


def _label(factor: str, v) -> str:
    return f"U({v[0]:g}, {v[1]:g})" if factor == "slo_range" else str(v)


def plot(points: list[dict], path: Path) -> Path:
    """Cost saving vs Solo-D (top) and SLO attainment (bottom) per factor, both realisations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5), sharey="row")
    for col, factor in enumerate(FACTORS):
        pts = [p for p in points if p["factor"] == factor]
        labels = [p["label"] for p in pts if p["mode"] == "deterministic"]
        x = range(len(labels))
        for mode, style in (("deterministic", "o-"), ("stochastic", "s--")):
            ps = [p for p in pts if p["mode"] == mode]
            axes[0, col].plot(x, [100 * p["mean"]["cost_saving_vs_solo_d"] for p in ps], style, label=mode)
            axes[1, col].plot(x, [100 * p["mean"]["slo_attainment"] for p in ps], style, label=f"{mode}: vs realised solo")
            if mode == "stochastic":
                axes[1, col].plot(x, [100 * p["mean"]["slo_attainment_vs_planned_solo"] for p in ps], "^:",
                                  label="stochastic: vs worst-case solo")
        for row in (0, 1):
            axes[row, col].set_xticks(list(x))
            axes[row, col].set_xticklabels(labels, rotation=20)
            axes[row, col].grid(alpha=0.3)
        axes[1, col].set_xlabel({"mix": "job mix", "slo_range": "SLO range", "max_group_size": "max group size"}[factor])
    axes[0, 0].set_ylabel("cost saving vs Solo-D, %")
    axes[1, 0].set_ylabel("RollMux SLO attainment, %")
    axes[0, 0].legend(fontsize=8)
    axes[1, 0].legend(fontsize=8)
    fig.suptitle("RollMux sensitivity (trace replay; one factor varied, others at mixed / U(1, 2) / 5)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 jobs, seed 0")
    ap.add_argument("--jobs", type=int, default=None, help="jobs replayed (default 200, quick 60)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2, quick 0)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE if DEFAULT_TRACE.is_file() else EXTRACT_TRACE)
    ap.add_argument("--procs", type=int, default=1, choices=(1, 2), help="worker processes (at most 2)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "sensitivity.json")
    args = ap.parse_args(argv)
    jobs_n = args.jobs or (60 if args.quick else 200)
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    t0 = time.perf_counter()
    tasks, keys = [], []
    for factor, values in FACTORS.items():
        for v in values:
            setting = dict(DEFAULT, **{factor: v})
            for mode in ("deterministic", "stochastic"):
                for seed in seeds:
                    tasks.append((str(args.trace), jobs_n, setting, seed, mode == "stochastic"))
                    keys.append((factor, _label(factor, v), mode, setting))
    if args.procs > 1:
        with ProcessPoolExecutor(max_workers=args.procs) as ex:
            results = list(ex.map(run_point, tasks))
    else:
        results = [run_point(t) for t in tasks]
    points: dict[tuple, dict] = {}
    for (factor, label, mode, setting), res in zip(keys, results):
        p = points.setdefault((factor, label, mode), {"factor": factor, "label": label, "mode": mode,
                                                      "setting": {k: (list(v) if isinstance(v, tuple) else v)
                                                                  for k, v in setting.items()}, "seeds": []})
        p["seeds"].append(res)
    for p in points.values():
        p["mean"] = {k: sum(s[k] for s in p["seeds"]) / len(p["seeds"]) for k in METRICS + ("max_slowdown_over_slo",)}
        p["min"] = {k: min(s[k] for s in p["seeds"]) for k in METRICS}
        p["max"] = {k: max(s[k] for s in p["seeds"]) for k in METRICS}
        print(f"{p['factor']:>15} {p['label']:>14} {p['mode']:>13}: saving vs Solo-D {p['mean']['cost_saving_vs_solo_d']:6.1%}, "
              f"SLO attainment {p['mean']['slo_attainment']:6.1%} (vs worst-case solo "
              f"{p['mean']['slo_attainment_vs_planned_solo']:6.1%})", flush=True)
    pts = list(points.values())
    png = plot(pts, args.out.with_suffix(".png"))
    out = {"config": {"trace": args.trace.name, "jobs": jobs_n, "seeds": seeds, "defaults": {k: (list(v) if isinstance(v, tuple) else v)
                                                                                           for k, v in DEFAULT.items()},
                      "policies": ["rollmux", "solo-d"], "quick": args.quick, "wall_s": round(time.perf_counter() - t0, 1)},
           "points": pts, "plot": png.name}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} and {png} in {out['config']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
