"""Body of ``rollmux simulate`` (the typer command in :mod:`rollmux.cli` only declares its options).

Kept apart from the CLI assembly so the replay's input handling, run and report can change
without touching the command registration. Source: RollMux §7.4-§7.5.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer


def run_simulate(*, trace: Optional[Path], mix: str, policies: str, jobs: int, seed: Optional[int], out: Path,
                 stochastic: bool, window_start: float, window_hours: Optional[float], min_duration_s: float,
                 max_duration_s: Optional[float], vc: Optional[str], slo_min: float, slo_max: float,
                 max_group_size: Optional[int], exact_max_jobs: int, cluster_config: Optional[Path],
                 repack: Optional[bool], progress: bool, config: Optional[Path] = None, queue: bool = False,
                 profile_source: Optional[str] = None, priorities: Optional[str] = None,
                 lower_bound: bool = False, async_share: float = 0.0, max_staleness: int = 1,
                 staleness_mode: str = "mixed") -> None:
    """Run ``rollmux simulate`` with parsed options: load the trace, replay, write summary.json and
    plots, print the table. Exits with code 2 and a one-line error on bad input.

    The scheduler settings come from ``config`` (default ``configs/scheduler.yaml``, the file the
    cluster's GlobalScheduler reads: one :class:`rollmux.admission.SchedulerConfig`; a given file
    is recorded in summary.json's ``meta`` with the SHA-256 of the settings run); ``seed``,
    ``max_group_size``, ``repack`` and ``profile_source`` override a copy of it when given."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from rollmux.sim import plots
    from rollmux.config import CONFIG_DIR, ConfigError, load_cluster, repo_label
    from rollmux.sim.simulator import gantt_records, simulate as run_sim
    from rollmux.traces import DEFAULT_TRACE, EXTRACT_TRACE, TraceError, TraceWindow, load_trace, trace_label
    from rollmux.workloads import MIXES, draw_jobs, mix_names

    console = Console(width=None if sys.stdout.isatty() else 160)

    def fail(msg: str) -> None:
        typer.echo(f"error: {' '.join(str(msg).split())}", err=True)  # one line on stderr
        raise typer.Exit(code=2)

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        fail("--policies: give at least one policy")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        fail(f"--policies: {', '.join(repr(d) for d in dup)} given more than once")
    try:
        from rollmux.policies import check_policy

        for n in names:
            check_policy(n)
    except ValueError as e:
        fail(f"--policies: {e}")
    queue = queue or priorities is not None
    if queue:
        from rollmux.policies import policy_spec
        from rollmux.sim.policies import QUEUED_SOLO

        other = [n for n in names if policy_spec(n).kind != "scheduler" and n != QUEUED_SOLO]
        if other:
            flag = "--priorities" if priorities is not None else "--queue"
            fail(f"{flag}: {', '.join(other)} do not admit through the scheduler; with {flag} give --policies among "
                 f"the scheduler policies (rollmux, random, most-idle) and {QUEUED_SOLO}")
    for flag, v in (("--window-start", window_start), ("--window-hours", window_hours), ("--min-duration-s", min_duration_s),
                    ("--max-duration-s", max_duration_s), ("--slo-min", slo_min), ("--slo-max", slo_max)):
        if v is not None and not math.isfinite(v):
            fail(f"{flag}: must be a finite number, got {v}")
    if window_hours is not None and window_hours <= 0:
        fail(f"--window-hours: must be > 0, got {window_hours}")
    if max_duration_s is not None and max_duration_s < min_duration_s:
        fail(f"--max-duration-s ({max_duration_s}) is below --min-duration-s ({min_duration_s})")
    if not 1.0 <= slo_min <= slo_max:
        fail(f"--slo-min/--slo-max: need 1 <= --slo-min <= --slo-max, got {slo_min}, {slo_max}")
    problem = _out_problem(out)
    if problem:
        fail(f"--out: {problem}")
    if trace is None:
        trace = DEFAULT_TRACE if DEFAULT_TRACE.is_file() else EXTRACT_TRACE
    window = TraceWindow(start_hours=window_start, length_hours=window_hours, max_jobs=jobs,
                         min_duration_s=min_duration_s, max_duration_s=max_duration_s, cluster=vc)
    try:
        cluster = load_cluster(cluster_config or CONFIG_DIR / "cluster_sim.yaml")
    except (ValueError, ConfigError) as e:
        fail(f"--cluster: {e}")
    try:  # the scheduler settings: the file the cluster's GlobalScheduler reads; flags override a copy
        from rollmux.admission import load_scheduler_config

        sched_cfg = load_scheduler_config(config)
        seed = sched_cfg.seed if seed is None else seed
        sched_cfg = sched_cfg.overridden(seed=seed, max_group_size=max_group_size, repack_on_departure=repack,
                                         profile_source=profile_source)
    except (ValueError, ConfigError) as e:
        fail(f"--config: {e}")
    if priorities is not None and cluster.rollout_pool.num_nodes is None and cluster.train_pool.num_nodes is None:
        fail("--priorities: the cluster is unbounded, so no job ever waits or is preempted; give a bounded --cluster "
             "(e.g. configs/cluster_sim_bounded.yaml)")
    try:
        tjobs = load_trace(trace, window)
    except (ValueError, TraceError) as e:
        fail(f"--trace: {e}")
    if mix not in MIXES:
        fail(f"--mix: unknown mix {mix!r}; known mixes: {mix_names()}")
    try:
        sjobs = draw_jobs(tjobs, cluster, mix=mix, seed=seed, slo_range=(slo_min, slo_max))
    except ValueError as e:
        fail(str(e))
    if async_share:
        from rollmux.workloads import assign_async

        try:
            sjobs = assign_async(sjobs, async_share, max_staleness=max_staleness, mode=staleness_mode, seed=seed)
        except ValueError as e:
            fail(f"--async-share / --max-staleness / --staleness-mode: {e}")
    if priorities is not None:
        from rollmux.workloads import assign_priorities, parse_class_shares

        try:
            shares = parse_class_shares(priorities, sched_cfg.priority_classes)
        except ValueError as e:
            fail(f"--priorities: {e}")
        sjobs = assign_priorities(sjobs, shares, seed=seed, tenants_from_trace=tjobs)
    console.print(f"[bold]rollmux simulate[/]: {len(sjobs)} jobs from {trace} (mix {mix}, seed {seed}, "
                  f"{'stochastic' if stochastic else 'deterministic worst-case'} phase times); policies: {', '.join(names)}")
    total = 2 * len(sjobs) * len(names)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task("replay", total=total)

        def on_event(name: str, k: int) -> None:
            bar.update(task, advance=k, description=f"replay [cyan]{name}[/]")

        load_start = os.getloadavg()  # the host's load skews every wall-time figure (decision latency)
        try:
            res = run_sim(sjobs, cluster, names, stochastic=stochastic, seed=seed, config=sched_cfg, queue=queue,
                          priorities=priorities is not None,
                          exact_max_jobs=exact_max_jobs, on_event=on_event, lower_bound=lower_bound, bound_incumbent=lower_bound,
                          meta={"trace": trace_label(trace), "mix": mix, **({"priority_shares": priorities} if priorities else {}), "window": window.model_dump(), "cluster": cluster.name,
                                **({"async_share": async_share, "max_staleness": max_staleness, "staleness_mode": staleness_mode}
                                   if async_share else {}),
                                **({"scheduler_config": repo_label(config), "scheduler_config_sha256": sched_cfg.sha256()}
                                   if config is not None else {})})
        except (ValueError, RuntimeError) as e:  # e.g. a bounded --cluster refusing a job
            fail(f"--cluster: {e}" if cluster_config else str(e))
            return
    out.mkdir(parents=True, exist_ok=True)
    summary = res.summary
    files = {"summary": str(out / "summary.json")}
    series = {n: (r.times_s, r.cost_usd_per_h) for n, r in res.runs.items()}
    files["cost_over_time_png"] = str(plots.plot_cost_over_time(series, out / "cost_over_time.png"))
    from rollmux.policies import REGISTRY

    drawable = sorted((REGISTRY[n].gantt_rank, n) for n in res.runs if REGISTRY[n].gantt_rank is not None)
    gname = next((n for _, n in drawable if res.runs[n].gantt_group), None)
    if gname:
        recs = gantt_records(res.runs[gname], res.real)
        files["gantt_png"] = str(plots.plot_gantt(recs, out / f"gantt_{gname}.png",
                                                  title=f"{gname}: largest co-execution group, meta-iterations"))
    summary["files"] = files
    # beside the wall-time figures (decision_latency_ms_*, wall_s): where they were measured
    summary["host"] = {"cpus": os.cpu_count(), "load_avg_1_5_15_min_start": [round(x, 2) for x in load_start],
                       "load_avg_1_5_15_min_end": [round(x, 2) for x in os.getloadavg()]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))

    table = Table(title=f"RollMux trace replay: {len(sjobs)} jobs, mix {mix}")
    cols = [("policy", None), ("avg $/h", "avg_cost_usd_per_h"), ("total k$", "total_cost_usd"), ("peak $/h", "peak_cost_usd_per_h"),
            ("SLO att.", "slo_attainment"), ("peak H20", "peak_rollout_gpus"), ("peak H800", "peak_train_gpus"),
            ("roll. bubble", "rollout_bubble_ratio"), ("train bubble", "train_bubble_ratio"),
            ("p50 ms", "decision_latency_ms_p50"), ("max ms", "decision_latency_ms_max"), ("vs optimal policy run", "cost_vs_optimal")]
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
                  "'vs optimal policy run' = avg $/h over that of the 'optimal' policy's own replay (a different job timeline, "
                  "exact only at the share of its decisions printed below: not a bound; the same-instant figure below is)")
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
        console.print(f"rollmux vs the exact optimum of the same active jobs at the same instants: {rm['cost_vs_optimal_exact']:.3f}x, "
                      f"compared over {rm['optimal_exact_time_fraction']:.0%} of its replay time and "
                      f"{rm['optimal_exact_spend_fraction']:.0%} of its spend (instants with <= {exact_max_jobs} active jobs)")
    if rm.get("cost_vs_lower_bound") is not None:
        console.print(f"rollmux vs a proven lower bound at every instant ({rm['lower_bound_instants_by_kind']}: exact "
                      f"optimum, LP relaxation by column generation, Farley bound on its budget): "
                      f"{rm['cost_vs_lower_bound']:.3f}x over {rm['lower_bound_spend_fraction']:.0%} of its spend")
        if rm.get("cost_vs_best_known_partition") is not None:
            console.print(f"  = rollmux vs the cheapest known partition {rm['cost_vs_best_known_partition']:.3f}x "
                          f"x that partition vs the bound {rm['best_known_partition_vs_lower_bound']:.3f}x "
                          f"(the bound's slack is at most the second factor)")
    for name, m in summary["policies"].items():
        if "queue_wait_s_mean" in m:
            console.print(f"{name}: admission queue: {m['queued_jobs']} of {m['jobs']} jobs waited; wait mean "
                          f"{m['queue_wait_s_mean'] / 3600:.2f} h, p50 {m['queue_wait_s_p50'] / 3600:.2f} h, p90 "
                          f"{m['queue_wait_s_p90'] / 3600:.2f} h, max {m['queue_wait_s_max'] / 3600:.2f} h; peak "
                          f"{m['queue_peak_jobs']} queued, {m['queue_refused_jobs']} refused")
    if priorities is not None:
        ct = Table(title=f"per priority class ({priorities})")
        for c in ("policy", "class", "jobs", "wait p50 h", "wait p99 h", "preemptions", "lost GPU-h", "SLO att.", "cost k$"):
            ct.add_column(c, justify="left" if c in ("policy", "class") else "right")
        for name, m in summary["policies"].items():
            for c, v in m.get("by_class", {}).items():
                ct.add_row(name, c, str(v["jobs"]), f"{v['queue_wait_s_p50'] / 3600:.2f}", f"{v['queue_wait_s_p99'] / 3600:.2f}",
                           str(v["preemptions"]), f"{v['lost_gpu_h']:.2f}", f"{v['slo_attainment']:.1%}",
                           f"{v['cost_usd'] / 1e3:.1f}")
        console.print(ct)
    if async_share:
        kt = Table(title=f"per kind of job ({async_share:.0%} asynchronous, staleness bound {max_staleness})")
        for c in ("policy", "kind", "jobs", "SLO att.", "cost k$", "staleness max", "staleness distribution", "over bound"):
            kt.add_column(c, justify="left" if c in ("policy", "kind", "staleness distribution") else "right")
        for name, m in summary["policies"].items():
            for k, v in m.get("by_kind", {}).items():
                dist = ", ".join(f"{s}: {f:.0%}" for s, f in v["staleness_distribution"].items())
                kt.add_row(name, k, str(v["jobs"]), f"{v['slo_attainment']:.1%}", f"{v['cost_usd'] / 1e3:.1f}",
                           str(v["staleness_max"]), dist, f"{v['staleness_over_bound']:g}")
        console.print(kt)
    console.print(f"wrote {out / 'summary.json'} and plots in {out}")




def _out_problem(out: Path) -> Optional[str]:
    """Why ``out`` cannot receive summary.json and the plots (None if it can): checked before the
    replay, so a bad ``--out`` fails in a second, not after the whole run. Creates the folder."""
    for parent in [out, *out.parents]:
        if parent.exists() and not parent.is_dir():
            return f"{parent} exists and is not a folder"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".rollmux-write-check-"):
            pass
    except OSError as e:
        return f"cannot write to {out}: {e.strerror or e}"
    if not os.access(out, os.W_OK):  # pragma: no cover - caught by the write above
        return f"cannot write to {out}"
    return None
