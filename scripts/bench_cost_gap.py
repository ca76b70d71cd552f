#!/usr/bin/env python
"""RollMux's cost against the exact optimum over a grid of replays (seeds, SLO ranges, mixes).

Each run replays the first ``--jobs`` jobs of the Philly trace (the full job log shipped as
``data/philly-adaptdl-philly.csv.gz``, or ``--trace``) through RollMux, Solo-D, colocated and Gavel+, with the same-instant exact
optimum computed along RollMux's replay (``cost_vs_optimal_exact``: compared only at instants
where a certificate proves the optimum is a lower bound, see ``docs/ARCHITECTURE.md``
"Optimum") and against a proven lower bound at *every* instant (``cost_vs_lower_bound``: that
exact optimum where it is exact, else the LP relaxation of the same set partitioning by column
generation, :mod:`rollmux.partition_bound`; its gap to the exact optimum is sampled at every
10th exact instant). The ratio to the bound is split at every instant by the cheapest *known*
partition (the exact optimum, else the best partition of the LP master's columns, which all
exist): RollMux / bound = (RollMux / best known partition) x (best known partition / bound), so a
run's distance to the bound reads as RollMux's own (the first factor) or at most the bound's
slack (the second). Each LP bound runs within ``--bound-cut-rounds`` and no wall-clock limit by
default, so the figures do not depend on the host's load. The grid varies one dimension at a
time around the default setting (mix ``mixed``, SLO ~ U(1.0, 2.0)):

* the default setting on seeds 0..``--seeds``-1;
* mix ``mixed`` with SLO ~ U(1.0, 1.2), U(1.5, 2.5), U(2.0, 3.0) on ``--slice-seeds``;
* mixes ``balanced``, ``rollout-heavy``, ``training-heavy`` with SLO ~ U(1.0, 2.0) on ``--slice-seeds``.

Writes ``results/cost_gap.json`` (``meta`` says which grid ran): per run RollMux / optimum, the
share of RollMux's spend and time the exact comparison covers, RollMux / lower bound over 100%
of the spend (the instants by the bound's kind: ``exact``, ``lp``, ``lagrangian``), the bound's
gap to the exact optimum, Gavel+ / RollMux, SLO attainment, saving vs Solo-D
and vs colocated, every baseline that keeps 100% SLO yet costs less than RollMux, where the gap
opened (the excess $ over the optimum after arrivals vs after departures), jobs per group of
RollMux vs the optimum at the compared instants, jobs moved and the re-optimisation latency
after each admission; per setting and overall the spend-weighted ratio, the mean and max of
the per-run ratios; and a plot (``cost_gap.png``). It prints a Markdown table (docs/RESULTS.md's).
Full grid: seeds 0-9 and slice seeds 3 4, 200 jobs, 22 runs; ``--quick``: seeds 0-1, slice
seed 0, 60 jobs (a few minutes). At most 2 worker processes. ``--set KEY=VALUE`` replays RollMux
with a scheduler setting other than its default (``meta.scheduler_overrides`` says which).

Not a test: a benchmark writing JSON. Source: RollMux §7.5 ("x of optimal").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rollmux.config import CONFIG_DIR, load_cluster  # noqa: E402
from rollmux.partition_bound import BoundBudget  # noqa: E402
from rollmux.traces import DEFAULT_TRACE, EXTRACT_TRACE, TraceWindow, load_trace  # noqa: E402

POLICIES = ("rollmux", "solo-d", "colocated", "gavel+")
SETTINGS: tuple[tuple[str, float, float], ...] = (
    ("mixed", 1.0, 1.2), ("mixed", 1.0, 2.0), ("mixed", 1.5, 2.5), ("mixed", 2.0, 3.0),
    ("balanced", 1.0, 2.0), ("rollout-heavy", 1.0, 2.0), ("training-heavy", 1.0, 2.0),
)
DEFAULT_SETTING = ("mixed", 1.0, 2.0)
GOAL_MEAN, GOAL_SLICE = 1.05, 1.10
#: against the lower bound: spend-weighted over the grid, every run; moves per job (mean over runs)
GOAL_BOUND_SPEND, GOAL_BOUND_RUN, GOAL_MOVES_PER_JOB = 1.03, 1.06, 1.3


def setting_name(mix: str, lo: float, hi: float) -> str:
    return f"{mix} SLO~U({lo:g},{hi:g})"


def run_one(args: tuple) -> dict:
    """One replay: (trace, jobs, seed, mix, slo_min, slo_max, exact_max_jobs, lower_bound, bound budget
    as a dict of :class:`rollmux.partition_bound.BoundBudget` fields, incumbent: with the bound, also
    the cheapest known partition at every LP instant[, scheduler settings that replace the defaults
    (``--set``)]) -> its record."""
    from rollmux.admission import SchedulerConfig
    from rollmux.sim.simulator import simulate
    from rollmux.workloads import draw_jobs

    trace, n_jobs, seed, mix, lo, hi, exact_max, bound, budget, incumbent, *rest = args
    overrides = rest[0] if rest else {}
    cl = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    tjobs = load_trace(trace, TraceWindow(max_jobs=n_jobs, min_duration_s=3600.0, max_duration_s=3 * 86400.0))
    jobs = draw_jobs(tjobs, cl, mix=mix, seed=seed, slo_range=(lo, hi))
    t0 = time.perf_counter()
    res = simulate(jobs, cl, POLICIES, seed=seed, exact_max_jobs=exact_max, shadow_policies=("rollmux",), lower_bound=bound,
                   bound_budget=BoundBudget(**budget), bound_incumbent=bound and incumbent,
                   config=SchedulerConfig(**overrides) if overrides else None)
    pol = res.summary["policies"]
    rm = pol["rollmux"]
    run = res.runs["rollmux"]
    cheaper = [p for p in POLICIES[1:] if pol[p]["slo_attainment"] >= 1.0 and pol[p]["total_cost_usd"] < rm["total_cost_usd"]]
    return {
        "setting": setting_name(mix, lo, hi), "seed": seed, "mix": mix, "slo_range": [lo, hi], "jobs": len(jobs),
        "rollmux_vs_optimum": rm.get("cost_vs_optimal_exact"),
        "spend_share_covered": rm.get("optimal_exact_spend_fraction", 0.0),
        "time_share_covered": rm.get("optimal_exact_time_fraction", 0.0),
        "instants_without_certificate": rm.get("optimal_exact_events_outside_layouts", 0),
        "compared_rollmux_usd": run.shadow_policy_usd, "compared_optimum_usd": run.shadow_optimal_usd,
        "rollmux_vs_lower_bound": rm.get("cost_vs_lower_bound"),
        "lower_bound_spend_share_covered": rm.get("lower_bound_spend_fraction", 0.0),
        "lower_bound_time_share_covered": rm.get("lower_bound_time_fraction", 0.0),
        "lower_bound_instants_by_kind": rm.get("lower_bound_instants_by_kind", {}),
        "lower_bound_gap_to_exact_max": rm.get("lower_bound_gap_to_exact_max"),
        "lower_bound_gap_to_exact_mean": rm.get("lower_bound_gap_to_exact_mean"),
        "lower_bound_gap_samples": rm.get("lower_bound_gap_samples", 0),
        "bound_rollmux_usd": run.bound_policy_usd, "bound_usd": run.bound_usd,
        "rollmux_vs_best_known_partition": rm.get("cost_vs_best_known_partition"),
        "best_known_partition_vs_lower_bound": rm.get("best_known_partition_vs_lower_bound"),
        "best_known_rollmux_usd": run.best_known_policy_usd, "best_known_usd": run.best_known_usd,
        "best_known_bound_usd": run.best_known_bound_usd,
        "gavel_plus_vs_rollmux": pol["gavel+"]["total_cost_usd"] / rm["total_cost_usd"],
        "slo_attainment": {p: pol[p]["slo_attainment"] for p in POLICIES},
        "total_cost_usd": {p: pol[p]["total_cost_usd"] for p in POLICIES},
        "saving_vs_solo_d": 1.0 - rm["total_cost_usd"] / pol["solo-d"]["total_cost_usd"],
        "saving_vs_colocated": 1.0 - rm["total_cost_usd"] / pol["colocated"]["total_cost_usd"],
        "baselines_cheaper_at_100pct_slo": cheaper,
        "jobs_moved": rm.get("jobs_moved", 0),
        "moves_per_job": rm.get("moves_per_job", 0.0),
        "moves_by_source": rm.get("moves_by_source", {}),
        "move_stall_gpu_h": rm.get("move_stall_gpu_h", 0.0),
        "global_plans": rm.get("global_plans", 0),
        "global_plan_latency_ms_p50": rm.get("global_plan_latency_ms_p50"),
        "global_plan_latency_ms_max": rm.get("global_plan_latency_ms_max"),
        "excess_usd_after": {k: v for k, v in sorted(run.shadow_gap_usd_by_event.items())},
        "jobs_per_group_compared": ({"rollmux": run.shadow_jobs_per_group_s[0] / run.shadow_s,
                                     "optimum": run.shadow_jobs_per_group_s[1] / run.shadow_s} if run.shadow_s > 0 else None),
        "reopt_latency_ms_p50": rm.get("reopt_latency_ms_p50"),
        "reopt_latency_ms_max": rm.get("reopt_latency_ms_max"),
        "largest_group_seen": len(run.gantt_group.members) if run.gantt_group is not None else 0,
        "decision_latency_ms_p50": rm["decision_latency_ms_p50"],
        "wall_s": time.perf_counter() - t0,
    }


def _indexed_run(item: tuple[int, tuple]) -> tuple[int, dict]:
    return item[0], run_one(item[1])


def code_digest(trace: Path) -> str:
    """SHA-256 over what a run's figures depend on: the policy and simulator code (``rollmux/``),
    the configs, this script and the trace file, so a run saved by ``--resume-dir`` is reused only
    by the same code on the same input."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    files = sorted([*root.glob("rollmux/**/*.py"), *root.glob("configs/**/*.yaml"), Path(__file__).resolve(),
                    Path(trace).resolve()])
    for f in files:
        h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def run_key(task: tuple, digest: str) -> str:
    """The file name (without ``.json``) of one run of the grid under ``--resume-dir``."""
    _, n_jobs, seed, mix, lo, hi, exact_max, bound, budget, incumbent, *rest = task
    key = [n_jobs, seed, mix, lo, hi, exact_max, bound, budget, incumbent, digest]
    if rest and rest[0]:  # scheduler settings other than the defaults (--set)
        key.append(rest[0])
    args = json.dumps(key, sort_keys=True)
    return f"{mix}-{lo:g}-{hi:g}-seed{seed}-{hashlib.sha256(args.encode()).hexdigest()[:16]}"


def aggregate(rows: list[dict]) -> dict:
    if not rows:
        return {"runs": 0}
    ratios = [r["rollmux_vs_optimum"] for r in rows if r["rollmux_vs_optimum"] is not None]
    pu = sum(r["compared_rollmux_usd"] for r in rows)
    ou = sum(r["compared_optimum_usd"] for r in rows)
    bp = sum(r["bound_rollmux_usd"] for r in rows)  # 0 without the bound (--no-bound)
    bu = sum(r["bound_usd"] for r in rows)
    gaps = [r["lower_bound_gap_to_exact_max"] for r in rows if r["lower_bound_gap_to_exact_max"] is not None]
    kp, ku, kb = (sum(r[k] for r in rows) for k in ("best_known_rollmux_usd", "best_known_usd", "best_known_bound_usd"))
    return {
        "runs": len(rows),
        "rollmux_vs_optimum_spend_weighted": pu / ou if ou > 0 else None,
        "rollmux_vs_optimum_mean": sum(ratios) / len(ratios) if ratios else None,
        "rollmux_vs_optimum_max": max(ratios, default=None),
        "spend_share_covered_mean": sum(r["spend_share_covered"] for r in rows) / len(rows),
        "rollmux_vs_lower_bound_spend_weighted": bp / bu if bu > 0 else None,
        "rollmux_vs_lower_bound_max": max((r["rollmux_vs_lower_bound"] for r in rows if r["rollmux_vs_lower_bound"]), default=None),
        "lower_bound_spend_share_covered_min": min(r["lower_bound_spend_share_covered"] for r in rows),
        # rollmux / bound = (rollmux / best known partition) x (best known partition / bound)
        "rollmux_vs_best_known_partition_spend_weighted": kp / ku if ku > 0 else None,
        "best_known_partition_vs_lower_bound_spend_weighted": ku / kb if kb > 0 else None,
        "lower_bound_gap_to_exact_max": max(gaps, default=None),
        "lower_bound_instants_by_kind": {k: sum(r["lower_bound_instants_by_kind"].get(k, 0) for r in rows)
                                         for k in sorted({k for r in rows for k in r["lower_bound_instants_by_kind"]})},
        "gavel_plus_vs_rollmux_min": min(r["gavel_plus_vs_rollmux"] for r in rows),
        "slo_attainment_min": min(r["slo_attainment"]["rollmux"] for r in rows),
        "saving_vs_solo_d_mean": sum(r["saving_vs_solo_d"] for r in rows) / len(rows),
        "saving_vs_colocated_mean": sum(r["saving_vs_colocated"] for r in rows) / len(rows),
        "runs_above_slice_goal": sum(1 for x in ratios if x > GOAL_SLICE),
        "runs_with_cheaper_100pct_slo_baseline": sum(1 for r in rows if r["baselines_cheaper_at_100pct_slo"]),
        "excess_share_after_arrivals": (lambda a, d: a / (a + d) if a + d > 0 else None)(
            sum(r["excess_usd_after"].get("arrival", 0.0) for r in rows),
            sum(r["excess_usd_after"].get("departure", 0.0) for r in rows)),
        "jobs_moved_mean": sum(r["jobs_moved"] for r in rows) / len(rows),
        "moves_per_job_mean": sum(r.get("moves_per_job", 0.0) for r in rows) / len(rows),
        "move_stall_gpu_h_sum": sum(r.get("move_stall_gpu_h", 0.0) for r in rows),
        "runs_above_bound_goal_per_run": sum(1 for r in rows if (r["rollmux_vs_lower_bound"] or 0.0) > GOAL_BOUND_RUN),
        "reopt_latency_ms_p50_max": max((r["reopt_latency_ms_p50"] or 0.0 for r in rows), default=None),
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [setting_name(*s) for s in SETTINGS]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, n in enumerate(names):
        ys = [r["rollmux_vs_optimum"] for r in rows if r["setting"] == n and r["rollmux_vs_optimum"] is not None]
        ax.scatter([i] * len(ys), ys, s=18, color="tab:blue", alpha=0.7)
    ax.axhline(GOAL_MEAN, color="tab:green", ls="--", lw=1, label=f"goal: mean {GOAL_MEAN}x")
    ax.axhline(GOAL_SLICE, color="tab:red", ls="--", lw=1, label=f"goal: every run {GOAL_SLICE}x")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("RollMux / exact optimum ($, same instants)")
    ax.set_title("RollMux vs the exact optimum per replay (one dot per seed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="seeds 0-1, slice seed 0, 60 jobs (a few minutes)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 of the default setting (default 10, quick 2)")
    ap.add_argument("--slice-seeds", type=str, default=None,
                    help="comma-separated seeds of the other settings (default 3,4; quick 0)")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per replay (default 200, quick 100)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="Philly trace CSV (default: the full trace data/philly-adaptdl-philly.csv.gz)")
    ap.add_argument("--exact-max-jobs", type=int, default=16)
    ap.add_argument("--procs", type=int, default=2, help="worker processes (at most 2)")
    ap.add_argument("--no-bound", action="store_true",
                    help="skip the LP lower bound beyond the exact instants (much faster; no RollMux / bound figures)")
    ap.add_argument("--bound-cut-rounds", type=int, default=2,
                    help="rounds of subset-row cuts per LP bound (default 2: rounds past 2 cost ~40%% of the "
                         "bound's time for ~0.1%% of its value on a 120-job replay)")
    ap.add_argument("--bound-time-limit-s", type=float, default=None,
                    help="wall seconds per LP bound (default: none, so the figures do not depend on the host's "
                         "load; the iteration and layout counts still bound each call)")
    ap.add_argument("--no-incumbent", action="store_true",
                    help="with the bound, skip the cheapest known partition at each LP instant (CP-SAT over the "
                         "master's columns within 2 deterministic seconds: 1-7 s of wall time per busy instant, "
                         "most of a 200-job run); RollMux / bound is then not split into its two factors")
    ap.add_argument("--resume-dir", type=Path, default=None,
                    help="save each finished run there and reuse the runs already saved by the same code on the "
                         "same trace (code_digest), so a grid stopped part-way goes on where it stopped")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default results/cost_gap.json; the plot beside it)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a scheduler setting (configs/scheduler.yaml's key, a JSON or plain value) that replaces its "
                         "default for RollMux in every run; repeatable (the runs are saved under other --resume-dir keys)")
    args = ap.parse_args()
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 10)
    n_jobs = args.jobs if args.jobs is not None else (60 if args.quick else 200)
    out = args.out or Path("results") / "cost_gap.json"
    trace = args.trace or (DEFAULT_TRACE if DEFAULT_TRACE.is_file() else EXTRACT_TRACE)
    if not trace.is_file():
        ap.error(f"--trace: {trace} is not a file")
    slice_seeds = ([int(x) for x in args.slice_seeds.split(",") if x.strip()] if args.slice_seeds is not None
                   else ([0] if args.quick else [3, 4]))
    grid = [(st, sd) for st in SETTINGS for sd in (range(seeds) if st == DEFAULT_SETTING else slice_seeds)]
    # the slower (looser-SLO) runs first so that the two workers finish together
    grid.sort(key=lambda x: -x[0][2])
    overrides = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            ap.error(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            overrides[key.strip()] = json.loads(value)
        except ValueError:
            overrides[key.strip()] = value
    if overrides:
        from pydantic import ValidationError

        from rollmux.admission import SchedulerConfig

        try:
            SchedulerConfig(**overrides)
        except ValidationError as e:
            ap.error("--set: " + "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
    try:
        budget = BoundBudget(cut_rounds=args.bound_cut_rounds,
                             time_limit_s=math.inf if args.bound_time_limit_s is None else args.bound_time_limit_s)
    except ValueError as e:
        ap.error(str(e))
    tasks = [(str(trace), n_jobs, seed, mix, lo, hi, args.exact_max_jobs, not args.no_bound, asdict(budget),
              not args.no_incumbent, overrides)
             for (mix, lo, hi), seed in grid]
    t0 = time.perf_counter()
    rows: list[dict] = []
    saved: dict[int, Path] = {}
    if args.resume_dir is not None:
        args.resume_dir.mkdir(parents=True, exist_ok=True)
        digest = code_digest(trace)
        saved = {i: args.resume_dir / f"{run_key(t, digest)}.json" for i, t in enumerate(tasks)}
    done = {i for i, f in saved.items() if f.is_file()}
    rows = [json.loads(saved[i].read_text()) for i in sorted(done)]
    if args.resume_dir is not None:
        print(f"{len(rows)} of {len(tasks)} runs reused from {args.resume_dir}", flush=True)
    todo = [(i, t) for i, t in enumerate(tasks) if i not in done]
    resumed = len(rows)
    with mp.get_context("spawn").Pool(processes=max(1, min(2, args.procs))) as pool:
        for i, r in pool.imap_unordered(_indexed_run, todo):
            if i in saved:
                saved[i].write_text(json.dumps(r, indent=1))
            rows.append(r)
            print(f"{r['setting']:<28} seed {r['seed']}: rollmux/opt {r['rollmux_vs_optimum'] or float('nan'):.3f} "
                  f"(spend covered {r['spend_share_covered']:.0%}), rollmux/bound {r['rollmux_vs_lower_bound'] or float('nan'):.3f} "
                  f"(spend covered {r['lower_bound_spend_share_covered']:.0%}, {r['lower_bound_instants_by_kind']}), "
                  f"Gavel+/rollmux {r['gavel_plus_vs_rollmux']:.3f}, SLO {r['slo_attainment']['rollmux']:.0%}, "
                  f"vs Solo-D -{r['saving_vs_solo_d']:.1%}, cheaper baselines {r['baselines_cheaper_at_100pct_slo'] or '-'}",
                  flush=True)
    rows.sort(key=lambda r: ([setting_name(*s) for s in SETTINGS].index(r["setting"]), r["seed"]))
    by_setting = {setting_name(*s): aggregate([r for r in rows if r["setting"] == setting_name(*s)]) for s in SETTINGS}
    overall = aggregate(rows)
    result = {
        "meta": {"trace": trace.name, "jobs": n_jobs, "seeds": list(range(seeds)), "slice_seeds": slice_seeds,
                 "default_setting": setting_name(*DEFAULT_SETTING), "policies": list(POLICIES),
                 "exact_max_jobs": args.exact_max_jobs, "goal": {"mean": GOAL_MEAN, "every_run": GOAL_SLICE,
                                                                        "lower_bound_spend_weighted": GOAL_BOUND_SPEND,
                                                                        "lower_bound_every_run": GOAL_BOUND_RUN,
                                                                        "moves_per_job": GOAL_MOVES_PER_JOB},
                 "wall_s": time.perf_counter() - t0, "runs_wall_s_sum": sum(r["wall_s"] for r in rows),
                 "runs_reused": resumed, "quick": args.quick, "scheduler_overrides": overrides,
                 "loadavg_1_5_15": list(os.getloadavg()), "procs": max(1, min(2, args.procs)),
                 "lower_bound": not args.no_bound, "incumbent": not (args.no_bound or args.no_incumbent), **({} if args.no_bound else {"bound_budget": budget.to_json()})},
        "overall": overall, "by_setting": by_setting, "runs": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    png = out.with_suffix(".png")
    plot(rows, png)
    print(f"\n{'setting':<28} {'runs':>4} {'rm/opt (spend-w.)':>17} {'mean':>6} {'max':>6} {'covered':>8} {'SLO min':>8} "
          f"{'vs Solo-D':>9} {'vs coloc.':>9} {'cheaper base.':>13}")
    for name, a in list(by_setting.items()) + [("all", overall)]:
        if not a["runs"]:
            continue
        print(f"{name:<28} {a['runs']:>4} {a['rollmux_vs_optimum_spend_weighted'] or float('nan'):>17.3f} "
              f"{a['rollmux_vs_optimum_mean'] or float('nan'):>6.3f} {a['rollmux_vs_optimum_max'] or float('nan'):>6.3f} "
              f"{a['spend_share_covered_mean']:>8.0%} {a['slo_attainment_min']:>8.0%} {-a['saving_vs_solo_d_mean']:>9.1%} "
              f"{-a['saving_vs_colocated_mean']:>9.1%} {a['runs_with_cheaper_100pct_slo_baseline']:>13}")
    print("\n| setting | runs | RollMux / lower bound (spend-weighted, 100% of spend) "
          "| RollMux / best known partition | best known partition / lower bound | RollMux / exact optimum (spend-weighted) "
          "| spend covered by the exact optimum | bound's gap to exact (max) | SLO min "
          "| saving vs Solo-D | saving vs colocated | Gavel+ / RollMux (min) | runs with a cheaper 100%-SLO baseline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, a in list(by_setting.items()) + [("all", overall)]:
        if not a["runs"]:
            continue
        gx, lb, ex = (a["lower_bound_gap_to_exact_max"], a["rollmux_vs_lower_bound_spend_weighted"],
                      a["rollmux_vs_optimum_spend_weighted"])
        kr, kb = a["rollmux_vs_best_known_partition_spend_weighted"], a["best_known_partition_vs_lower_bound_spend_weighted"]
        print(f"| {name} | {a['runs']} | {'-' if lb is None else format(lb, '.3f') + 'x'} "
              f"| {'-' if kr is None else format(kr, '.3f') + 'x'} | {'-' if kb is None else format(kb, '.3f') + 'x'} "
              f"| {'-' if ex is None else format(ex, '.3f') + 'x'} "
              f"| {a['spend_share_covered_mean']:.0%} | {'-' if gx is None else format(gx, '.1%')} "
              f"| {a['slo_attainment_min']:.0%} | {a['saving_vs_solo_d_mean']:.1%} "
              f"| {a['saving_vs_colocated_mean']:.1%} | {a['gavel_plus_vs_rollmux_min']:.3f} "
              f"| {a['runs_with_cheaper_100pct_slo_baseline']} |")
    print(f"wrote {out} and {png}")


if __name__ == "__main__":
    main()
