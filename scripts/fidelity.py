#!/usr/bin/env python
"""Runtime vs simulator fidelity: one job set through ``rollmux simulate``'s replay and through the
real runtime on emulated accelerators, side by side.

1. Jobs: the Philly trace's first ``--jobs`` arrivals (``data/``), RL profiles from the workload
   mix (:func:`rollmux.workloads.draw_jobs`, ``--mix``), on ``configs/cluster_emulated.yaml``
   (32 x 8 H20 rollout + 32 x 8 H800 training nodes). Each job's work is a whole number of
   iterations (its trace duration over its solo iteration time, clamped to
   ``[--min-iterations, --max-iterations]``; its duration is then that many solo iterations, on
   both sides; an asynchronous job's, ``--async-share``, also its pipeline fill,
   :func:`rollmux.staleness.pipeline_fill_s`). Arrivals are the trace's, rescaled so that the last one is at ``--arrival-span``
   x the mean solo lifetime (so that the jobs overlap), at least ``--min-gap-model-s`` apart.
2. Simulator: :func:`rollmux.sim.simulator.replay` of the policy ``rollmux`` with the scheduler
   settings of ``configs/scheduler.yaml`` (the file the GlobalScheduler reads), deterministic
   worst-case phase times (default) or ``--stochastic`` (the seeded long-tailed samples; long-tail
   migration off on both sides: the emulated tail does not model the tail's packing).
3. Runtime: a local Ray cluster whose 64 pool nodes are custom resources of two Ray nodes, a
   GlobalScheduler on the same cluster spec and settings, one driver thread per job
   (:func:`examples.emulated.job.run_arrivals`) submitted at its arrival x the time factor
   (``configs/emulation.yaml``, ``--wall-ms-per-model-s``), phases as timed waits.
4. Per job: ``iteration_s_runtime`` / ``iteration_s_simulator`` (lifetime from arrival to
   departure over iterations, modelled seconds), slowdown vs the solo iteration time, SLO met,
   group ids from both; per run: cost ($/h over time: the simulator's step series, the runtime's
   groups polled from the scheduler), bubbles, moves; the errors, each miss explained by the terms
   measured (runtime overhead inside the phase records, hand-off gaps between phases, group
   assignment, moves). Writes ``results/fidelity.json`` and ``results/fidelity.png`` (``--quick``:
   ``results/fidelity_quick.*``).

    python scripts/fidelity.py --quick      # 8 jobs, a few minutes on 2 cores
    python scripts/fidelity.py              # 24 jobs

Load average, memory and CPU of the control plane (every Ray process the run started) are
recorded beside the figures. Source: RollMux §7.5 (the simulator's fidelity check).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the goals of the fidelity check (RollMux §7.5): median / every per-job iteration error
GOAL_MEDIAN_ERR = 0.03
GOAL_MAX_ERR = 0.10


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 jobs, 3-6 iterations each")
    ap.add_argument("--jobs", type=int, default=None, help="jobs (default 24, quick 8)")
    ap.add_argument("--mix", default="mixed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-iterations", type=int, default=None, help="default 4 (quick 3)")
    ap.add_argument("--max-iterations", type=int, default=None, help="default 10 (quick 6)")
    ap.add_argument("--arrival-span", type=float, default=0.5,
                    help="last arrival at this fraction of the mean solo lifetime (compressed trace arrivals)")
    ap.add_argument("--min-gap-model-s", type=float, default=60.0, help="arrivals at least this far apart, modelled s")
    ap.add_argument("--wall-ms-per-model-s", type=float, default=40.0,
                    help="time factor, wall ms per modelled s (configs/emulation.yaml's default 10 leaves the runtime's "
                         "own per-phase overhead at a few %% of a phase on a loaded 2-core machine; 40 keeps it under 1%%)")
    ap.add_argument("--no-run", action="store_true", help="only draw the jobs and replay them in the simulator")
    ap.add_argument("--stochastic", action="store_true", help="seeded long-tailed lengths (8 samples per job, cycled)")
    ap.add_argument("--async-share", type=float, default=0.0,
                    help="share of the jobs made asynchronous (rollmux.workloads.assign_async, the seed's draw)")
    ap.add_argument("--max-staleness", type=int, default=1, help="staleness bound k of the asynchronous jobs")
    ap.add_argument("--cluster", default=str(ROOT / "configs" / "cluster_emulated.yaml"))
    ap.add_argument("--config", default=None, help="scheduler settings (default configs/scheduler.yaml)")
    ap.add_argument("--poll-s", type=float, default=0.25, help="wall seconds between the runtime's group polls")
    ap.add_argument("--timeout-s", type=float, default=1500.0)
    ap.add_argument("--out", default=None, help="default results/fidelity.json (quick: results/fidelity_quick.json)")
    return ap.parse_args(argv)


# ------------------------------------------------------------------------------------------ jobs
def build_jobs(args, cluster, real) -> tuple[list, dict]:
    """The job set (SimJobs with whole-iteration durations, compressed arrivals) and iterations per job."""
    from dataclasses import replace

    from rollmux.traces import DEFAULT_TRACE, EXTRACT_TRACE, TraceWindow, load_trace
    from rollmux.workloads import draw_jobs

    trace = DEFAULT_TRACE if DEFAULT_TRACE.is_file() else EXTRACT_TRACE
    tjobs = load_trace(trace, TraceWindow(max_jobs=args.jobs, min_duration_s=60.0))
    jobs = draw_jobs(tjobs, cluster, mix=args.mix, seed=args.seed)
    if args.async_share:  # the same asynchronous jobs on both sides
        from rollmux.workloads import assign_async

        jobs = assign_async(jobs, args.async_share, max_staleness=args.max_staleness, seed=args.seed)
    from rollmux.staleness import pipeline_fill_s

    iters, solo, fill = {}, {}, {}
    for j in jobs:
        solo[j.spec.job_id] = real.solo_time_s(j.spec)
        p = real.mean_profile(j.spec)  # an asynchronous job's first iteration fills its pipeline
        fill[j.spec.job_id] = pipeline_fill_s(p.t_roll_s, p.t_train_s, p.t_sync_s, j.spec.max_staleness)
        iters[j.spec.job_id] = int(min(args.max_iterations, max(args.min_iterations,
                                                                round(j.duration_s / solo[j.spec.job_id]))))
    mean_life = statistics.mean(iters[k] * solo[k] for k in iters)
    first, last = jobs[0].arrival_s, jobs[-1].arrival_s
    scale = (args.arrival_span * mean_life / (last - first)) if last > first else 0.0
    out, prev = [], -math.inf
    for j in jobs:
        a = max((j.arrival_s - first) * scale, prev + args.min_gap_model_s) if prev > -math.inf else 0.0
        prev = a
        out.append(replace(j, arrival_s=round(a, 3),
                           duration_s=iters[j.spec.job_id] * solo[j.spec.job_id] + fill[j.spec.job_id]))
    return out, iters


# ------------------------------------------------------------------------------------- simulator
def run_simulator(jobs, cluster, cfg, real) -> dict:
    """Replay through the policy ``rollmux``; per job its outcome and group ids over time."""
    from rollmux.sim.simulator import make_policy, replay

    pol = make_policy("rollmux", cluster, real, config=cfg)
    groups_of: dict[str, list[str]] = {}

    def snap(_k: int) -> None:
        for g in pol.groups():
            for jid in g.job_ids:
                seq = groups_of.setdefault(jid, [])
                if not seq or seq[-1] != g.group_id:
                    seq.append(g.group_id)

    run = replay(jobs, pol, real, on_event=snap)
    m = run.metrics()
    return {"run": run, "metrics": m, "groups": groups_of}


# --------------------------------------------------------------------------------------- runtime
def run_runtime(jobs, iters, cluster, cfg, em, args, tmp: Path) -> dict:
    """The same jobs on the runtime (emulated accelerators); per job its result, per run the group polls."""
    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle, gather
    from actors.ops.local_cluster import start_local_cluster
    from actors.worker.workers import worker_handle
    from actors.ops.proc_stats import ray_process_stats
    from examples.emulated.job import EmulatedJobConfig, run_arrivals
    from rollmux.emulation import wall_s

    n_ray = max(cluster.rollout_pool.num_nodes, cluster.train_pool.num_nodes)
    t0 = time.time()
    lc = start_local_cluster(cluster, head_cpus=2, node_cpus=1, object_store_mb=128, pool_nodes_per_ray_node=n_ray,
                             worker_niceness=0)
    startup_s = time.time() - t0
    name = f"rollmux-fidelity-{uuid.uuid4().hex[:6]}"
    polls: list[dict] = []
    out: dict = {"startup_s": startup_s}
    try:
        sh = SchedulerHandle(get_or_create_scheduler(cluster, name=name, config=cfg,
                                                     checkpoint_path=str(tmp / "scheduler-ckpt")))
        sh.health(timeout_s=None)
        # the pool nodes' workers exist before the jobs arrive (a running cluster's), as in the simulator
        t1 = time.time()
        nodes = [n for pool in ("rollout", "train") for n in
                 (f"{pool}-{i}" for i in range(cluster.pool(pool).num_nodes))]  # type: ignore[arg-type]
        for k in range(0, len(nodes), 4):  # a few at a time: 64 Python processes at once swamp 2 cores
            gather([worker_handle(n).where_nowait() for n in nodes[k:k + 4]], timeout_s=600)
        out["workers_start_s"] = time.time() - t1
        cfgs = [EmulatedJobConfig(spec=j.spec, cluster=cluster, emulation=em, iterations=iters[j.spec.job_id])
                for j in jobs]
        arrivals = [wall_s(j.arrival_s, em) for j in jobs]
        stop = threading.Event()
        load: list[float] = []

        def poll() -> None:  # the groups ($/h, nodes) over time, and the load average
            while not stop.wait(args.poll_s):
                try:
                    polls.append({"t": time.time(), "groups": [g.to_dict() for g in sh.list_groups()]})
                except Exception as e:  # a slow answer is one missing sample, never fatal
                    polls.append({"t": time.time(), "error": str(e)[:200]})
                load.append(os.getloadavg()[0])

        before = ray_process_stats()
        th = threading.Thread(target=poll, daemon=True)
        t_start = time.time()
        th.start()
        res = run_arrivals(cfgs, arrivals, timeout_s=args.timeout_s, scheduler_name=name,
                           checkpoint_dir=str(tmp / "ckpt"))
        stop.set()
        th.join(timeout=10)
        # how each move's old nodes were drained (rollmux.drain: reported, or overdue after the bounds)
        out["drains"] = {}
        for j in jobs:
            try:
                got = sh.get_job(j.spec.job_id)
                rec = got.public() if got is not None else {}
            except Exception:
                continue
            out["drains"][j.spec.job_id] = [
                {"drained": m.get("drained"), "stop_to_drained_wall_s": (m["drained_at_s"] - m["stopped_at_s"])
                 if m.get("drained_at_s") is not None and m.get("stopped_at_s") is not None else None}
                for m in rec.get("moves") or []]
        out["ray_processes_start"] = before
        out["ray_processes_end"] = ray_process_stats(uss=True)
        out["timelines"] = {}
        for g in {gid for p in polls for gid in (x["group_id"] for x in p.get("groups", []) if x)}:
            try:
                out["timelines"][g] = [e.to_dict() for e in sh.group_timeline(g)]
            except Exception:
                pass
        out.update(results=res, polls=polls, t_start=t_start, load_1m=load, health=sh.health().to_dict())
    finally:
        lc.shutdown()  # disconnects, stops every node and removes the cluster's run dir
    return out


# -------------------------------------------------------------------------------------- analysis
def _union_s(intervals: list[tuple[float, float]]) -> float:
    tot, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        tot += b - max(a, end)
        end = b
    return tot


def runtime_run_metrics(rt: dict, factor: float, gpn: dict, price: dict) -> dict:
    """Cost series, average cost, bubbles and moves of the runtime run (modelled seconds)."""
    t0 = rt["t_start"]
    series, held = [], {}  # (t_model, $/h); node -> held node-seconds
    last_t, last_groups = None, []
    for p in rt["polls"]:
        if "groups" not in p:
            continue
        t = (p["t"] - t0) / factor
        gs = [g for g in p["groups"] if g and g.get("members")]
        if last_t is not None:
            for g in last_groups:
                for n in list(g["rollout_nodes"]) + list(g["train_nodes"]):
                    held[n] = held.get(n, 0.0) + (t - last_t)
        series.append((round(t, 2), round(sum(g["cost_usd_per_h"] for g in gs), 4)))
        last_t, last_groups = t, gs
    ends = [r["finished_at"] for r in rt["results"].values() if isinstance(r, dict)]
    horizon = (max(ends) - t0) / factor if ends else 0.0
    cost_usd = sum((b[0] - a[0]) * a[1] / 3600.0 for a, b in zip(series, series[1:]))
    busy: dict[str, list] = {}
    for r in rt["results"].values():
        if not isinstance(r, dict):
            continue
        for rec in r["timeline"]:
            for n in rec.get("nodes") or [rec["node"]]:
                busy.setdefault(n, []).append(((rec["start"] - t0) / factor, (rec["end"] - t0) / factor))
    out = {"avg_cost_usd_per_h": cost_usd / (horizon / 3600.0) if horizon > 0 else 0.0, "horizon_model_s": horizon,
           "cost_series": series, "jobs_moved": sum(len(r.get("moves", [])) for r in rt["results"].values()
                                                    if isinstance(r, dict))}
    for pool in ("rollout", "train"):
        prov = sum(v for n, v in held.items() if n.startswith(pool))
        b = sum(_union_s(v) for n, v in busy.items() if n.startswith(pool))
        out[f"{pool}_bubble_ratio"] = 1.0 - b / prov if prov > 0 else None
    return out


def job_terms(r: dict, factor: float, t_sync_s: float) -> dict:
    """The runtime's own time in a job's life, modelled seconds per iteration: inside the phase
    records beyond the modelled waits (warm start, offload, commit, the leader's release round
    trip), and the dispatch from a permit's grant to the phase's start on its worker."""
    tl = r["timeline"]
    n = max(1, r["iterations"])
    move_s = sum(h.get("move_model_s", 0.0) for h in r["history"])
    modelled = sum(h["t_train_model_s"] + h["t_roll_model_s"] for h in r["history"]) + n * t_sync_s + move_s
    in_phases = sum(x["end"] - x["start"] for x in tl) / factor
    dispatch = sum(max(0.0, x["start"] - x["granted_at"]) for x in tl if x.get("granted_at")) / factor
    wait_permit = sum(float(x.get("waited_s") or 0.0) for x in tl) / factor
    life = (r["finished_at"] - r["admitted_at"]) / factor
    first = min(tl, key=lambda x: x["start"])
    startup = (first["start"] - r["admitted_at"] - float(first.get("waited_s") or 0.0)) / factor
    return {"startup_model_s": startup, "phase_overhead_model_s_per_iter": (in_phases - modelled) / n,
            "dispatch_model_s_per_iter": dispatch / n, "permit_wait_model_s_per_iter": wait_permit / n,
            # the rest of the lifetime outside phases and permit waits: the driver's round trips per phase
            # (worker -> controller release, driver -> acquire, grant -> dispatch)
            "handoff_model_s_per_iter": (life - in_phases - wait_permit - startup) / n,
            "move_model_s": move_s}


def explain(err: float, terms: dict, groups_same: bool, t_iter_sim: float, moves_rt: int, moves_sim: int) -> str:
    """Which term explains a per-job difference (largest first)."""
    if abs(err) <= GOAL_MEDIAN_ERR:
        return "within 3%"
    parts = []
    if not groups_same:
        parts.append("group assignment differs (an event came in another order: the runtime's departures and "
                     "re-optimisation are not instantaneous)")
    if moves_rt != moves_sim:
        parts.append(f"moves differ (runtime {moves_rt}, simulator {moves_sim})")
    ovh = terms["phase_overhead_model_s_per_iter"] + terms["handoff_model_s_per_iter"]
    if t_iter_sim > 0:
        parts.append(f"runtime overhead {ovh / t_iter_sim:+.1%} of an iteration (inside the phase records and the hand-offs between phases)")
        parts.append(f"start-up (registration on the workers, cold start) {terms['startup_model_s'] / t_iter_sim:+.1%} "
                     "of one iteration, once")
    parts.append("rest: the fluid model's instant rate change at arrivals and departures vs the runtime's "
                 "round-robin warm-up / drain (a new member's first meta-iteration)")
    return "; ".join(parts)


def main(argv=None) -> int:
    from actors.ops.local_cluster import use_ephemeral_ray_token

    use_ephemeral_ray_token()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = parse_args(argv)
    args.jobs = args.jobs or (8 if args.quick else 24)
    args.out = args.out or str(ROOT / "results" / ("fidelity_quick.json" if args.quick else "fidelity.json"))
    args.min_iterations = args.min_iterations or (3 if args.quick else 4)
    args.max_iterations = args.max_iterations or (6 if args.quick else 10)
    from rollmux.admission import load_scheduler_config
    from rollmux.config import load_cluster, repo_label
    from rollmux.emulation import load_emulation_config, scheduler_config
    from rollmux.sim.realisation import Realisation

    t_wall = time.time()
    load_start = os.getloadavg()
    cluster = load_cluster(args.cluster)
    cfg = load_scheduler_config(args.config)
    em = load_emulation_config()
    if args.wall_ms_per_model_s:
        em = em.model_copy(update={"wall_ms_per_model_s": args.wall_ms_per_model_s})
    samples = 8
    if args.stochastic:  # the simulator's realisation: 8 seeded samples per job, cycled; no tail packing
        em = em.model_copy(update={"response_lengths": "sampled", "cycle_samples": samples, "seed": cfg.seed})
        cfg = cfg.model_copy(update={"tail_migration": False})
    else:
        em = em.model_copy(update={"response_lengths": "worst_case", "cycle_samples": 0})
    # the cluster's own time bounds (drains) in modelled time, waited at the time factor like every phase
    cfg = scheduler_config(cfg, em)
    real = Realisation(cluster, stochastic=args.stochastic, seed=cfg.seed, samples=samples)
    real.migrate = cfg.tail_migration
    factor = em.wall_ms_per_model_s / 1000.0
    jobs, iters = build_jobs(args, cluster, real)
    print(f"fidelity: {len(jobs)} jobs ({args.mix}), {min(iters.values())}-{max(iters.values())} iterations, "
          f"last arrival {jobs[-1].arrival_s:.0f} modelled s, time factor {em.wall_ms_per_model_s} ms/s, "
          f"{'stochastic' if args.stochastic else 'worst-case'} phase times", flush=True)
    sim = run_simulator(jobs, cluster, cfg, real)
    print(f"simulator: {sim['run'].wall_s:.2f} s wall, {len(sim['run'].outcomes)} jobs", flush=True)
    if args.no_run:
        for j in jobs:
            o = sim["run"].outcomes[j.spec.job_id]
            print(f"  {j.spec.job_id} {j.job_type:26s} arr {j.arrival_s:8.0f} it {iters[j.spec.job_id]:2d} "
                  f"solo {real.solo_time_s(j.spec):6.0f} iter {(o.departure_s - o.arrival_s) / iters[j.spec.job_id]:6.0f} "
                  f"groups {sim['groups'].get(j.spec.job_id)}")
        print(f"makespan {sim['run'].end_s:.0f} modelled s = {sim['run'].end_s * factor:.0f} wall s; {sim['metrics'].get('jobs_moved')} moves")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="rollmux-fidelity-"))
    try:
        rt = run_runtime(jobs, iters, cluster, cfg, em, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"runtime: done ({time.time() - t_wall:.0f} s so far)", flush=True)

    per_job, errs = {}, []
    failed = {jid: repr(r) for jid, r in rt["results"].items() if not isinstance(r, dict)}
    for j in jobs:
        jid = j.spec.job_id
        o = sim["run"].outcomes[jid]
        n = iters[jid]
        solo = real.solo_time_s(j.spec)
        it_sim = (o.departure_s - o.arrival_s) / n
        r = rt["results"].get(jid)
        if not isinstance(r, dict):
            per_job[jid] = {"failed": failed.get(jid, "missing"), "iteration_s_simulator": it_sim}
            continue
        # from the moment the job is admitted (and attached), as the simulator's lifetime starts at
        # admission; the admission's own latency (decision, checkpoint, a new group's controller
        # start, attach) is reported beside it
        life = (r["finished_at"] - r["admitted_at"]) / factor
        it_rt = life / r["iterations"]
        admit_s = (r["admitted_at"] - r["submitted_at"]) / factor
        err = it_rt / it_sim - 1.0
        errs.append(err)
        moves = r.get("moves", [])
        g_rt = [moves[0]["from_group"]] + [m["to_group"] for m in moves] if moves else [r["info"].get("group_id")]
        g_sim = sim["groups"].get(jid, [])
        terms = job_terms(r, factor, real.mean_profile(j.spec).t_sync_s)
        per_job[jid] = {
            "job_type": j.job_type, "category": j.category, "iterations": n, "arrival_model_s": j.arrival_s,
            "max_staleness": j.spec.max_staleness, "staleness_mode": j.spec.staleness_mode,
            "solo_iteration_s": solo, "iteration_s_runtime": it_rt, "iteration_s_simulator": it_sim,
            "error": err, "slowdown_runtime": it_rt / solo, "slowdown_simulator": o.slowdown, "slo": j.spec.slo,
            "slo_met_runtime": it_rt / solo <= j.spec.slo * (1 + 1e-6), "slo_met_simulator": o.slo_met,
            "groups_runtime": g_rt, "groups_simulator": g_sim, "groups_same": g_rt == g_sim,
            "moves_runtime": len(moves), "admission_latency_model_s": admit_s,
            "drains_runtime": rt.get("drains", {}).get(jid, []),
            "submit_late_model_s": (r["submitted_at"] - (rt["t_start"] + j.arrival_s * factor)) / factor, **terms,
            "sync_cross_bytes": sorted({x.get("sync_cross_bytes") for x in r["timeline"] if x["phase"] == "sync"} - {None}),
        }
    sim_moves: dict[str, int] = {}  # moves per job in the simulator: group changes after its first group
    for jid, gs in sim["groups"].items():
        sim_moves[jid] = max(0, len(gs) - 1)
    for jid, pj in per_job.items():
        if "failed" not in pj:
            pj["moves_simulator"] = sim_moves.get(jid, 0)
            pj["explanation"] = explain(pj["error"], pj, pj["groups_same"], pj["iteration_s_simulator"],
                                        pj["moves_runtime"], pj["moves_simulator"])
    abs_errs = [abs(e) for e in errs]
    gpn = {"rollout": cluster.rollout_pool.node.gpus_per_node, "train": cluster.train_pool.node.gpus_per_node}
    rt_run = runtime_run_metrics(rt, factor, gpn, {})
    sm = sim["metrics"]
    sim_series = list(zip([round(t, 2) for t in sim["run"].times_s], [round(c, 4) for c in sim["run"].cost_usd_per_h]))
    summary = {
        "jobs": len(jobs), "jobs_failed_runtime": len(failed),
        "median_abs_error": statistics.median(abs_errs) if abs_errs else None,
        "max_abs_error": max(abs_errs) if abs_errs else None,
        "mean_error": statistics.mean(errs) if errs else None,
        "goal_median_within": GOAL_MEDIAN_ERR, "goal_max_within": GOAL_MAX_ERR,
        "goal_median_met": bool(abs_errs) and statistics.median(abs_errs) <= GOAL_MEDIAN_ERR,
        "goal_max_met": bool(abs_errs) and max(abs_errs) <= GOAL_MAX_ERR,
        "groups_same_jobs": sum(1 for p in per_job.values() if p.get("groups_same")),
        "slo_met_same_jobs": sum(1 for p in per_job.values() if "slo_met_runtime" in p
                                 and p["slo_met_runtime"] == p["slo_met_simulator"]),
    }
    procs = rt["ray_processes_end"]
    result = {
        "summary": summary,
        "settings": {"jobs": args.jobs, "mix": args.mix, "seed": args.seed, "stochastic": args.stochastic,
                     "async_share": args.async_share, "max_staleness": args.max_staleness,
                     "iterations_range": [args.min_iterations, args.max_iterations], "arrival_span": args.arrival_span,
                     "cluster": repo_label(args.cluster), "emulation": em.model_dump(),
                     "scheduler": {k: v for k, v in cfg.model_dump().items()
                                   if k in ("policy", "max_group_size", "repack_on_departure", "reopt_max_jobs",
                                            "tail_migration", "profile_source", "per_job_allocations",
                                            "measured_min_iterations", "slo_watch_headroom", "drain_grace_s",
                                            "drain_max_s")}},
        "jobs": per_job,
        "run": {
            "simulator": {"avg_cost_usd_per_h": sm["avg_cost_usd_per_h"], "rollout_bubble_ratio": sm["rollout_bubble_ratio"],
                          "train_bubble_ratio": sm["train_bubble_ratio"], "jobs_moved": sm.get("jobs_moved"),
                          "makespan_model_s": sim["run"].end_s, "cost_series": sim_series},
            "runtime": {k: v for k, v in rt_run.items()},
        },
        "control_plane": {
            "ray_processes_end": procs, "ray_processes_start": rt["ray_processes_start"],
            "cluster_startup_s": rt["startup_s"], "workers_start_s": rt["workers_start_s"],
            "scheduler_health": rt["health"],
            "pool_nodes": cluster.rollout_pool.num_nodes + cluster.train_pool.num_nodes,
            "peak_concurrent_jobs": max((sum(len(g.get("members") or []) for g in p.get("groups", []) if g)
                                         for p in rt["polls"]), default=0),
            "peak_groups": max((len([g for g in p.get("groups", []) if g]) for p in rt["polls"]), default=0),
        },
        "load_average_1m_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
        "load_average_1m_during_runtime": {"mean": round(statistics.mean(rt["load_1m"]), 2) if rt["load_1m"] else None,
                                           "max": round(max(rt["load_1m"]), 2) if rt["load_1m"] else None},
        "wall_s": time.time() - t_wall,
        "notes": ("iteration_s_*: lifetime from arrival to departure over the job's iterations, modelled seconds "
                  "(runtime: wall / time factor); solo_iteration_s: the simulator's realised solo time (the same "
                  "phase times the emulated job waits); errors = runtime / simulator - 1; groups_*: the group ids a "
                  "job was in, in order (both sides run the same admission code, so the ids match when the "
                  "decisions do); runtime cost: the scheduler's groups polled every poll_s wall seconds; runtime "
                  "bubbles: union of the phase records per node over the nodes' held time (node = 8 GPUs, jobs "
                  "use whole nodes); phase_overhead_model_s_per_iter: time inside the phase records beyond the "
                  "modelled waits (warm start, offload, commit, release), dispatch: grant -> phase start."),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = repo_label(plot(result, out.with_suffix(".png")))
    out.write_text(json.dumps(result, indent=1, default=str))
    s = summary
    print(f"median |error| {s['median_abs_error']:.2%}, max {s['max_abs_error']:.2%}; groups same for "
          f"{s['groups_same_jobs']}/{s['jobs']}; runtime failures {s['jobs_failed_runtime']}; -> {out}")
    return 0 if not failed else 1


def plot(result: dict, png: Path) -> Path:
    """Per-job iteration time runtime vs simulator (±3% / ±10% bands) and cost over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = [j for j in result["jobs"].values() if "iteration_s_runtime" in j]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.8))
    xs = [j["iteration_s_simulator"] for j in jobs]
    ys = [j["iteration_s_runtime"] for j in jobs]
    lim = [0, 1.1 * max(xs + ys + [1.0])]
    ax[0].plot(lim, lim, "k-", lw=1, label="runtime = simulator")
    for f, st in ((GOAL_MEDIAN_ERR, ":"), (GOAL_MAX_ERR, "--")):
        ax[0].plot(lim, [v * (1 + f) for v in lim], "k" + st, lw=0.8, label=f"±{f:.0%}")
        ax[0].plot(lim, [v * (1 - f) for v in lim], "k" + st, lw=0.8)
    ax[0].scatter(xs, ys, c=["tab:green" if j["groups_same"] else "tab:red" for j in jobs], s=25, zorder=3)
    ax[0].set(xlim=lim, ylim=lim, xlabel="simulator iteration time (modelled s)",
              ylabel="runtime iteration time (modelled s)",
              title=f"per job (green: same groups); median |err| {result['summary']['median_abs_error']:.1%}")
    ax[0].legend(loc="upper left", fontsize=8)
    for key, lab in (("simulator", "simulator"), ("runtime", "runtime (emulated)")):
        ser = result["run"][key]["cost_series"]
        if ser:
            ax[1].step([t for t, _ in ser], [c for _, c in ser], where="post", label=lab)
    ax[1].set(xlabel="modelled time (s)", ylabel="cost ($/h)", title="cluster cost over time")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


if __name__ == "__main__":
    sys.exit(main())
