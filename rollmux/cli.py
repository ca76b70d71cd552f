"""The pure part of the ``rollmux`` command line (typer): ``rollmux simulate``.

``rollmux simulate`` replays a trace through the policies (pure, no Ray). This module imports
nothing from ``actors/``: the full ``rollmux`` command (this app plus the cluster operation
commands of :mod:`actors.ops.cli_ops`) is assembled at the top of the import graph, in
:mod:`rollmux_cli`. ``python -m rollmux.cli simulate ...`` runs the replay alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rollmux.policies import POLICY_NAMES
from rollmux.sim.command import run_simulate

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
                               "\\[default: the full Philly trace shipped as data/philly-adaptdl-philly.csv.gz]"),
    mix: str = typer.Option("mixed", "--mix", help="workload mix: balanced | rollout-heavy | training-heavy | mixed"),
    policies: str = typer.Option(",".join(POLICY_NAMES), "--policies", help="comma-separated policies"),
    jobs: int = typer.Option(DEFAULT_JOBS, "--jobs", min=1, help="jobs replayed (first N of the window)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="seed of the workload draw, of stochastic phase times and of "
                                       "the random baseline \\[default: the config's seed]"),
    out: Path = typer.Option(Path("results/sim"), "--out", help="output folder (summary.json, PNG plots)"),
    stochastic: bool = typer.Option(False, "--stochastic", help="long-tailed rollout lengths per iteration (long-tail migration on)"),
    window_start: float = typer.Option(DEFAULT_WINDOW_START_H, "--window-start", min=0, help="window start, hours after the first (filtered) arrival"),
    window_hours: Optional[float] = typer.Option(None, "--window-hours", help="window length, hours \\[default: unbounded]"),
    min_duration_s: float = typer.Option(DEFAULT_MIN_DURATION_S, "--min-duration-s", min=0, help="drop trace jobs shorter than this"),
    max_duration_s: Optional[float] = typer.Option(DEFAULT_MAX_DURATION_S, "--max-duration-s", help="cap trace durations at this"),
    vc: Optional[str] = typer.Option(None, "--vc", help="keep one Philly virtual cluster (cluster column)"),
    slo_min: float = typer.Option(1.0, "--slo-min", help="SLO ~ U(slo-min, slo-max)"),
    slo_max: float = typer.Option(2.0, "--slo-max"),
    config: Path = typer.Option(None, "--config", envvar="ROLLMUX_SCHEDULER_CONFIG",
                                help="scheduler settings YAML, the file the cluster's GlobalScheduler reads (`rollmux up "
                                "--scheduler-config`) \\[default: configs/scheduler.yaml]; the flags below override a "
                                "copy; recorded in summary.json's meta"),
    max_group_size: Optional[int] = typer.Option(None, "--max-group-size", min=1, max=16,
                                                 help="jobs per co-execution group \\[default: the config's]"),
    exact_max_jobs: int = typer.Option(16, "--exact-max-jobs", min=1, max=64,
                                       help="the optimum is exact up to this many active jobs (best found beyond)"),
    cluster_config: Path = typer.Option(None, "--cluster", help="cluster YAML \\[default: configs/cluster_sim.yaml]"),
    repack: Optional[bool] = typer.Option(None, "--repack/--no-repack", help="RollMux re-packs small groups after "
                                          "departures and re-optimises each event's neighbourhood (--no-repack: the "
                                          "paper's admission-only Alg. 1) \\[default: the config's]"),
    queue: bool = typer.Option(False, "--queue", help="a bounded --cluster holds jobs that do not fit in the admission "
                               "queue (admitted in order, with backfill, after departures); reports queue waits per policy. "
                               "Scheduler policies only (rollmux, random, most-idle)"),
    profile_source: Optional[str] = typer.Option(None, "--profile-source", help="phase times admission plans with: "
                                                 "worst_case | measured (learned from the iterations each job has run; the "
                                                 "SLO watch re-checks and moves jobs at iteration boundaries) | blended "
                                                 "\\[default: the config's]"),
    priorities: Optional[str] = typer.Option(None, "--priorities", help="priority classes drawn with these shares, "
                                             "e.g. production=0.2,research=0.5,best-effort=0.3 (classes of the config's "
                                             "priority_classes; tenants = the trace's virtual clusters where it has them, "
                                             "quotas from the config's tenants); implies --queue on a bounded --cluster, "
                                             "preempts lower classes at iteration boundaries, reports per class"),
    async_share: float = typer.Option(0.0, "--async-share", help="share of the jobs made asynchronous (off-policy: "
                                      "rollout i+1 overlaps training i), drawn with the seed; 0: every job synchronous"),
    max_staleness: int = typer.Option(1, "--max-staleness", help="staleness bound k of the asynchronous jobs "
                                      "(rollout i uses a policy version >= i - k)"),
    staleness_mode: str = typer.Option("mixed", "--staleness-mode", help="exact (rollout i uses version i - k) | "
                                       "bounded (the newest published, >= i - k) | mixed (each asynchronous job draws one)"),
    lower_bound: bool = typer.Option(False, "--lower-bound", help="also compare RollMux with a proven lower bound "
                                     "at every instant (the exact optimum where exact, else the LP relaxation by "
                                     "column generation; slower): cost_vs_lower_bound in summary.json"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Replay a real cluster trace through the scheduling policies; write summary.json and plots.

    Source: RollMux §7.4-§7.5 (trace-driven simulation against the baselines).
    """
    run_simulate(trace=trace, mix=mix, policies=policies, jobs=jobs, seed=seed, out=out, stochastic=stochastic,
                 window_start=window_start, window_hours=window_hours, min_duration_s=min_duration_s,
                 max_duration_s=max_duration_s, vc=vc, slo_min=slo_min, slo_max=slo_max, max_group_size=max_group_size,
                 exact_max_jobs=exact_max_jobs, cluster_config=cluster_config, repack=repack, progress=progress,
                 config=config, queue=queue, profile_source=profile_source, priorities=priorities,
                 lower_bound=lower_bound, async_share=async_share, max_staleness=max_staleness,
                 staleness_mode=staleness_mode)


if __name__ == "__main__":  # pragma: no cover
    app()
