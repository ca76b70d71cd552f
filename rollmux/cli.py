"""The pure part of the ``rollmux`` command line (typer): ``rollmux simulate``.

``rollmux simulate`` replays a trace through the policies (pure, no Ray). This module imports
nothing from ``actors/``: the full ``rollmux`` command (this app plus the cluster operation
commands of :mod:`actors.cli_ops`) is assembled at the top of the import graph, in
:mod:`rollmux_cli`. ``python -m rollmux.cli simulate ...`` runs the replay alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from rollmux.baselines import POLICY_NAMES

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RollMux: co-execution scheduler for disaggregated RL post-training.")


@app.callback()
def _commands() -> None:
    """RollMux: co-execution scheduler for disaggregated RL post-training."""

#: Defaults of ``rollmux simulate`` (the quickstart's run): a window of the Philly trace.
DEFAULT_JOBS = 200
DEFAULT_WINDOW_START_H = 0.0
DEFAULT_MIN_DURATION_S = 3600.0
DEFAULT_MAX_DURATION_S = 3 * 86400.0


@app.command()
def simulate(
    trace: Path = typer.Option(None, "--trace", help="Philly CSV or plain arrival_s,duration_s,num_gpus CSV "
                               "[default: ../shared/traces/philly-adaptdl-philly.csv, else data/philly_extract.csv]"),
    mix: str = typer.Option("mixed", "--mix", help="workload mix: balanced | rollout-heavy | training-heavy | mixed"),
    policies: str = typer.Option(",".join(POLICY_NAMES), "--policies", help="comma-separated policies"),
    jobs: int = typer.Option(DEFAULT_JOBS, "--jobs", min=1, help="jobs replayed (first N of the window)"),
    seed: int = typer.Option(0, "--seed", help="seed of the workload draw and of stochastic phase times"),
    out: Path = typer.Option(Path("results/sim"), "--out", help="output folder (summary.json, PNG plots)"),
    stochastic: bool = typer.Option(False, "--stochastic", help="long-tailed rollout lengths per iteration (long-tail migration on)"),
    window_start: float = typer.Option(DEFAULT_WINDOW_START_H, "--window-start", min=0, help="window start, hours after the first (filtered) arrival"),
    window_hours: Optional[float] = typer.Option(None, "--window-hours", help="window length, hours [default: unbounded]"),
    min_duration_s: float = typer.Option(DEFAULT_MIN_DURATION_S, "--min-duration-s", min=0, help="drop trace jobs shorter than this"),
    max_duration_s: Optional[float] = typer.Option(DEFAULT_MAX_DURATION_S, "--max-duration-s", help="cap trace durations at this"),
    vc: Optional[str] = typer.Option(None, "--vc", help="keep one Philly virtual cluster (cluster column)"),
    slo_min: float = typer.Option(1.0, "--slo-min", help="SLO ~ U(slo-min, slo-max)"),
    slo_max: float = typer.Option(2.0, "--slo-max"),
    max_group_size: int = typer.Option(5, "--max-group-size", min=1, max=16),
    exact_max_jobs: int = typer.Option(16, "--exact-max-jobs", min=1, max=64,
                                       help="the optimum is exact up to this many active jobs (best found beyond)"),
    cluster_config: Path = typer.Option(None, "--cluster", help="cluster YAML [default: configs/cluster_sim.yaml]"),
    repack: bool = typer.Option(True, "--repack/--no-repack", help="RollMux re-packs small groups after departures "
                                "(--no-repack: the paper's admission-only Alg. 1)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Replay a real cluster trace through the scheduling policies; write summary.json and plots.

    Source: RollMux §7.4-§7.5 (trace-driven simulation against the baselines).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from rollmux import plots
    from rollmux.config import CONFIG_DIR, ConfigError, load_cluster
    from rollmux.simulator import gantt_records, simulate as run_sim
    from rollmux.traces import DEFAULT_TRACE, EXTRACT_TRACE, TraceError, TraceWindow, load_trace
    from rollmux.workloads import draw_jobs

    console = Console(width=None if sys.stdout.isatty() else 160)

    def fail(msg: str) -> None:
        console.print(f"[bold red]error:[/] {msg}")
        raise typer.Exit(code=2)

    try:
        names = [p.strip() for p in policies.split(",") if p.strip()]
        if not names:
            fail("--policies: give at least one policy")
        from rollmux.baselines import check_policy

        for n in names:
            check_policy(n)
        if trace is None:
            trace = DEFAULT_TRACE if DEFAULT_TRACE.is_file() else EXTRACT_TRACE
        window = TraceWindow(start_hours=window_start, length_hours=window_hours, max_jobs=jobs,
                             min_duration_s=min_duration_s, max_duration_s=max_duration_s, cluster=vc)
        cluster = load_cluster(cluster_config or CONFIG_DIR / "cluster_sim.yaml")
        tjobs = load_trace(trace, window)
        sjobs = draw_jobs(tjobs, cluster, mix=mix, seed=seed, slo_range=(slo_min, slo_max))
    except (ValueError, TraceError, ConfigError) as e:  # pydantic ValidationError is a ValueError
        fail(str(e))
        return
    console.print(f"[bold]rollmux simulate[/]: {len(sjobs)} jobs from {trace} (mix {mix}, seed {seed}, "
                  f"{'stochastic' if stochastic else 'deterministic worst-case'} phase times); policies: {', '.join(names)}")
    total = 2 * len(sjobs) * len(names)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task("replay", total=total)

        def on_event(name: str, k: int) -> None:
            bar.update(task, advance=k, description=f"replay [cyan]{name}[/]")

        try:
            res = run_sim(sjobs, cluster, names, stochastic=stochastic, seed=seed, max_group_size=max_group_size,
                          exact_max_jobs=exact_max_jobs, on_event=on_event, repack=repack,
                          meta={"trace": str(trace), "mix": mix, "window": window.model_dump(), "cluster": cluster.name})
        except (ValueError, RuntimeError) as e:  # e.g. a bounded --cluster refusing a job
            fail(str(e))
            return
    out.mkdir(parents=True, exist_ok=True)
    summary = res.summary
    files = {"summary": str(out / "summary.json")}
    series = {n: (r.times_s, r.cost_usd_per_h) for n, r in res.runs.items()}
    files["cost_over_time_png"] = str(plots.plot_cost_over_time(series, out / "cost_over_time.png"))
    gname = next((n for n in ("rollmux", "optimal", "most-idle", "random") if n in res.runs and res.runs[n].gantt_group), None)
    if gname:
        recs = gantt_records(res.runs[gname], res.real)
        files["gantt_png"] = str(plots.plot_gantt(recs, out / f"gantt_{gname}.png",
                                                  title=f"{gname}: largest co-execution group, meta-iterations"))
    summary["files"] = files
    (out / "summary.json").write_text(json.dumps(summary, indent=2))

    table = Table(title=f"RollMux trace replay: {len(sjobs)} jobs, mix {mix}")
    cols = [("policy", None), ("avg $/h", "avg_cost_usd_per_h"), ("total k$", "total_cost_usd"), ("peak $/h", "peak_cost_usd_per_h"),
            ("SLO att.", "slo_attainment"), ("peak H20", "peak_rollout_gpus"), ("peak H800", "peak_train_gpus"),
            ("roll. bubble", "rollout_bubble_ratio"), ("train bubble", "train_bubble_ratio"),
            ("p50 ms", "decision_latency_ms_p50"), ("p99 ms", "decision_latency_ms_p99"), ("vs opt. run", "cost_vs_optimal")]
    for c, _ in cols:
        table.add_column(c, justify="left" if c == "policy" else "right")
    for name, m in summary["policies"].items():
        row = [name]
        for _, k in cols[1:]:
            v = m.get(k)
            if k == "total_cost_usd" and v is not None:
                v = v / 1e3
            row.append("-" if v is None else (f"{v:.1%}" if k == "slo_attainment" else f"{v:.0%}" if k.endswith("bubble_ratio")
                                             else f"{v:.2f}x" if k == "cost_vs_optimal" else f"{v:,.1f}" if isinstance(v, float) else str(v)))
        table.add_row(*row)
    console.print(table)
    console.print(f"avg $/h = total cost / {summary['meta']['horizon_h']:.1f} h, the common horizon of the policies run "
                  "together (the last departure among them), so it depends on the policy set; total k$ does not. "
                  "'vs opt. run' = avg $/h over the optimal policy's")
    for k, v in summary["rollmux_cost_ratios"].items():
        if "bubble" in k:
            console.print(f"{k.replace('_', ' ')}: measured {v['measured']:.1%} (paper {v['paper']:.1%})")
        else:
            console.print(f"{k.replace('_', ' ')}: measured {v['measured']:.2f}x (paper {v['paper']:.2f}x)")
    if "optimal" in summary["policies"]:
        console.print(f"optimum exact at {summary['policies']['optimal']['optimal_exact_fraction']:.0%} of its decisions "
                      f"(exact up to {exact_max_jobs} active jobs; beyond: best found by exact blocks, an upper bound)")
    rm = summary["policies"].get("rollmux", {})
    if rm.get("cost_vs_optimal_exact") is not None:
        console.print(f"rollmux vs the exact optimum of the same active jobs: {rm['cost_vs_optimal_exact']:.3f}x "
                      f"over the {rm['optimal_exact_time_fraction']:.0%} of its replay with <= {exact_max_jobs} active jobs")
    console.print(f"wrote {out / 'summary.json'} and plots in {out}")


if __name__ == "__main__":  # pragma: no cover
    app()
