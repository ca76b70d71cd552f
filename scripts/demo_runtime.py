#!/usr/bin/env python
"""Runtime demo: three tiny GRPO jobs co-executed in one RollMux group vs the same three solo.

1. Starts a local multi-node Ray cluster mirroring ``configs/cluster_local.yaml`` (one Ray node
   per rollout / training node, custom resources ``rollmux_node:<id>``, each node's worker pinned
   to its own CPU where the machine has enough: ``start_local_cluster(pin_cpus=True)``).
2. Solo: each job alone on the same cluster, one after the other, the same script attached to a
   GlobalScheduler of its own (so it runs alone on the nodes a group of it would get); its median
   phase times are reported next to the configured profile. As Solo-D each job is charged its own
   rollout + training node for its whole run.
3. Co-executed: the three jobs of ``configs/jobs/`` (balanced = the long one, rollout-heavy,
   train-heavy) as three user processes running ``scripts/grpo_job.py --attach``, one after the
   other; each admits itself (Alg. 1 packs them into one co-execution group), waits at a start
   barrier, and then they iterate round-robin. Weight sync runs the N -> M plan through
   collectives/ (the default ``sync_backend="auto"``: gloo on CPU); the bytes that crossed the
   pool boundary are counted from what the executors sent (one model copy per sync).
4. Cold switch: one job re-run under the scheduler with ``--switch cold`` (state rebuilt from a
   checkpoint on disk every phase) for the warm-vs-cold start latency.
Writes ``results/runtime_demo.json`` (per job: measured slowdown vs its solo time, the policy's
predicted slowdown on the configured profile and on the phase times measured solo in this run,
the seconds per iteration spent in phase switches, bytes across the boundary per sync vs the
model's bytes, long-tail migrations that acted; per pool: the node's hand-off time between two
jobs' phases) and Gantt PNGs (both pools, colour per job); prints a table.

    python scripts/demo_runtime.py --quick     # ~2-3 minutes on 2 cores, Ray startup included
    python scripts/demo_runtime.py --emulated --quick   # the same on emulated accelerators (docs/EMULATION.md)

``--emulated``: three jobs of the simulator's workload catalogue on emulated H20 / H800 nodes whose
phases are the cost model's timed waits (``scripts/_demo_emulated.py``); writes
``results/runtime_demo_emulated.json``.

Source: RollMux §4.3 (meta-iterations), §5 (phase API, warm start), §6 (bubbles, SLO).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

JOBS = ("grpo_balanced", "grpo_rollout_heavy", "grpo_train_heavy")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run (6 iterations per job)")
    ap.add_argument("--iterations", type=int, default=None, help="iterations per job (default 20, quick 6)")
    ap.add_argument("--cold-iterations", type=int, default=3, help="iterations of the cold-switch run")
    ap.add_argument("--cluster", default=str(ROOT / "configs" / "cluster_local.yaml"))
    ap.add_argument("--jobs-dir", default=str(ROOT / "configs" / "jobs"))
    ap.add_argument("--out", default=str(ROOT / "results" / "runtime_demo.json"))
    ap.add_argument("--timeout-s", type=float, default=900.0, help="limit for each group of job processes")
    ap.add_argument("--emulated", action="store_true",
                    help="emulated accelerators: workload-catalogue jobs whose phases are the cost model's timed waits")
    return ap.parse_args(argv)


def submit(cfg_path: Path, job_id: str, n: int, out: Path, env: dict, switch: str = "warm",
           wait_for: Path | None = None) -> subprocess.Popen:
    """Start one user job process that attaches to the RollMux scheduler (what `ray job submit` runs)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "grpo_job.py"), "--config", str(cfg_path), "--iterations", str(n),
           "--job-id", job_id, "--attach", "--switch", switch, "--quiet", "--out", str(out)]
    if wait_for is not None:
        cmd += ["--wait-for", str(wait_for)]
    return subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_all(procs: dict, timeout_s: float) -> dict:
    """Wait (bounded) for every process; returns {job_id: (returncode, output tail)}."""
    deadline = time.monotonic() + timeout_s
    res = {}
    for jid, p in procs.items():
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        res[jid] = (p.returncode, (out or "")[-2000:])
    return res


def model_bytes(cfg) -> int:
    """Bytes of one copy of the job's policy weights (what one sync moves)."""
    from examples.grpo.model import build_model

    return sum(int(v.numel() * v.element_size()) for v in build_model(cfg.model, 0).state_dict().values())


def migrations_acted(timeline: list, job_id: str) -> int:
    """Rollouts of ``job_id`` during which another job's rollout started on the same node: its
    long-tail migration released the node (the GroupController acted on the decision)."""
    mine = [r for r in timeline if r["job_id"] == job_id and r["phase"] == "rollout"]
    others = [r for r in timeline if r["job_id"] != job_id and r["phase"] == "rollout"]
    return sum(1 for a in mine if any(b["node"] == a["node"] and a["start"] < b["start"] < a["end"] for b in others))


def report_phase_medians(timeline: list) -> dict:
    """Median seconds of each phase over iterations > 0 (all iterations if there is only one)."""
    import statistics

    tl = [r for r in timeline if r["iteration"] > 0] or timeline
    return {ph: round(statistics.median(d), 4) for ph in ("rollout", "train", "sync")
            if (d := [r["end"] - r["start"] for r in tl if r["phase"] == ph])}


def switch_s_per_iteration(timeline: list) -> float:
    """Mean seconds per iteration (> 0) the job's phases spent switching: warm/cold start
    (``switch_s``) plus offload (``offload_s``), summed over the iteration's phases and ranks."""
    tl = [r for r in timeline if r["iteration"] > 0] or timeline
    its = {r["iteration"] for r in tl}
    tot = sum(float(r.get("switch_s") or 0.0) + float(r.get("offload_s") or 0.0) for r in tl)
    return tot / max(1, len(its))


def handoffs(timeline: list) -> dict:
    """How long a node stays idle when one job's phase hands it to the next job, already queued
    for it, from the co-executed records (iterations > 0): ``release_to_grant_s`` (previous
    phase's end -> the next job's permit granted: the release round trip to the GroupController)
    and ``grant_to_start_s`` (permit granted -> the phase starting on the worker: the driver's
    dispatch); medians per pool, ``handoffs``: how many hand-offs to a waiting job were seen."""
    import statistics

    out: dict = {}
    tl = [r for r in timeline if r["iteration"] > 0 and r.get("granted_at")]
    for pool in ("rollout", "train"):
        recs = sorted((r for r in tl if r["pool"] == pool), key=lambda r: r["start"])
        rel = [b["granted_at"] - a["end"] for a, b in zip(recs, recs[1:])
               if a["job_id"] != b["job_id"] and b["granted_at"] >= a["end"]
               and b["granted_at"] - float(b.get("waited_s") or 0.0) <= a["end"]]  # b asked before a ended
        disp = [r["start"] - r["granted_at"] for r in recs]
        out[pool] = {"release_to_grant_s": round(statistics.median(rel), 4) if rel else None,
                     "grant_to_start_s": round(statistics.median(disp), 4) if disp else None, "handoffs": len(rel)}
    return out


def steady_iteration_s(timeline: list, until: float) -> Optional[float]:
    """Mean iteration time of a job while every member of its group was still running: from the
    end of its iteration 0 to the end of its last iteration that ended by ``until`` (the first
    member's last phase end); None when fewer than one such iteration follows iteration 0. The
    policy's prediction is a steady state of the whole group; after the first departure the rest
    run in a smaller group and pay the departures' work (RollMux §4.3)."""
    ends: dict = {}
    for r in timeline:
        ends[r["iteration"]] = max(ends.get(r["iteration"], 0.0), r["end"])
    its = sorted(ends)
    done = [k for k in its[1:] if ends[k] <= until]
    if not its or not done:
        return None
    return (ends[done[-1]] - ends[its[0]]) / its.index(done[-1])


def predicted_on_profiles(replay, profiles: dict) -> dict:
    """The policy's predicted slowdown of each job of the replayed group(s) on ``profiles``
    (job id -> ``{t_roll_s, t_train_s, t_sync_s}``): the same members, placement and round-robin
    order, each member's planning profile replaced (RollMux Alg. 1 line 10 predictor)."""
    from rollmux.intra_group import coexec_times
    from rollmux.models import PhaseProfile

    out: dict = {}
    cfg = replay.config
    overhead = cfg.migration_overhead_s if cfg.plan_migration_overhead else 0.0
    for g in replay.groups:
        if not all(m.spec.job_id in profiles for m in g.members):
            continue
        ms = [m.model_copy(update={"profile": PhaseProfile(**profiles[m.spec.job_id])}) for m in g.members]
        tco = coexec_times(ms, rollout_overhead_s=overhead)
        out.update({m.spec.job_id: tco[m.spec.job_id] / m.profile.t_solo_s for m in ms})
    return out


def main(argv=None) -> int:
    from actors.ops.local_cluster import use_ephemeral_ray_token

    use_ephemeral_ray_token()  # Ray token mode with a fresh token unless RAY_AUTH_MODE is set
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = parse_args(argv)
    if args.emulated:
        import _demo_emulated

        return _demo_emulated.run(args, ROOT)
    n = args.iterations or (6 if args.quick else 20)
    from rich.console import Console
    from rich.table import Table

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from actors.ops.local_cluster import start_local_cluster
    from examples.grpo import report
    from examples.grpo.config import load_job_config
    from rollmux.config import load_cluster, repo_label
    from rollmux.sim.plots import plot_gantt

    con = Console(width=None if sys.stdout.isatty() else 150)  # wide table in logs too
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rollmux-demo-"))
    uid = uuid.uuid4().hex[:6]
    paths = {name: Path(args.jobs_dir) / f"{name}.yaml" for name in JOBS}
    cfgs = {name: load_job_config(p, iterations=n) for name, p in paths.items()}
    ids = {name: f"{cfgs[name].job.job_id}-{uid}" for name in JOBS}

    t_start = time.time()
    load_start = os.getloadavg()  # the 2-core machine is shared: its load skews co-executed phase times
    con.print(f"[bold]RollMux runtime demo[/]: {len(JOBS)} GRPO jobs x {n} iterations")
    con.print("starting a local multi-node Ray cluster (pinned nodes)")
    spec = load_cluster(args.cluster)
    lc = start_local_cluster(spec, head_cpus=2, node_cpus=1, object_store_mb=128, pin_cpus=True)
    try:
        import ray

        sched_name = f"rollmux-demo-{uid}"
        env = {**os.environ, "RAY_ADDRESS": lc.address, "ROLLMUX_SCHEDULER_NAME": sched_name,
               "ROLLMUX_CKPT_DIR": str(tmp / "ckpt"), "PYTHONPATH": str(ROOT)}  # sync: the default ("auto": gloo on CPU)
        con.print(f"cluster up in {time.time() - t_start:.0f}s ({', '.join(lc.node_ids)})")
        # ---- solo: each job alone on the cluster (a scheduler of its own), one after the other
        con.print("solo runs (each job alone on the cluster, same seeds); they also profile each job's phase times")
        solo = {}
        for name in JOBS:
            s_name = f"rollmux-demo-solo-{name}-{uid}"
            sh = get_or_create_scheduler(spec, name=s_name)
            SchedulerHandle(sh).health(timeout_s=None)
            f = tmp / f"solo-{name}.json"
            rc = wait_all({name: submit(paths[name], f"{ids[name]}-solo", n, f, {**env, "ROLLMUX_SCHEDULER_NAME": s_name})},
                          args.timeout_s)
            solo[name] = json.loads(f.read_text()) if f.is_file() else {"ok": False}
            ray.kill(sh, no_restart=True)
            if not solo[name].get("ok"):
                raise RuntimeError(f"solo run of {ids[name]} failed: {rc[name][1]}")

        # ---- profile: median solo phase times of this run, reported next to the configured `measured`
        # profile that admission (Alg. 1) uses (on a shared 2-core machine they vary with its load, so the
        # configured profile keeps the grouping deterministic). A phase holds its node for its record
        # (switch + run + offload) and for the runtime's hand-off to it (permit release -> grant ->
        # dispatch), which no phase record holds: the time of a solo iteration outside the records is
        # shared equally by its phases, so that the profile adds up to the solo iteration time
        profile_from_solo = {}
        for name in JOBS:
            med = report_phase_medians(solo[name]["timeline"])
            share = max(0.0, report.iteration_time_s(solo[name]["timeline"]) - sum(med.values())) / len(med)
            profile_from_solo[name] = {"t_roll_s": round(med["rollout"] + share, 4),
                                       "t_train_s": round(med["train"] + share, 4),
                                       "t_sync_s": round(med["sync"] + share, 4) if "sync" in med else 0.0}

        sched = SchedulerHandle(get_or_create_scheduler(spec, name=sched_name))
        sched.health(timeout_s=None)
        con.print("submitting the jobs for co-execution")

        # ---- co-executed under RollMux: admitted one by one (long job first, as jobs arrive over
        # time); each waits at a start barrier so that the three iterate together
        barrier = tmp / "start"
        procs = {}
        for name in JOBS:
            procs[name] = submit(paths[name], ids[name], n, tmp / f"{name}.json", env, wait_for=barrier)
            deadline = time.monotonic() + 300
            while sched.get_job(ids[name]) is None:
                if procs[name].poll() is not None or time.monotonic() > deadline:
                    out, _ = procs[name].communicate()
                    raise RuntimeError(f"job {ids[name]} was not admitted: {(out or '')[-2000:]}")
                time.sleep(0.2)
        barrier.touch()
        rcs = wait_all(procs, args.timeout_s)
        co = {}
        for name in JOBS:
            f = tmp / f"{name}.json"
            co[name] = json.loads(f.read_text()) if f.is_file() else {"ok": False, "error": rcs[name][1]}
            if not co[name].get("ok"):
                raise RuntimeError(f"co-executed job {ids[name]} failed (rc {rcs[name][0]}): "
                                   f"{co[name].get('error')}\n{rcs[name][1]}")
        # what the SLO watch did (profile_source: measured, the default): its decision and the moves it made,
        # from the scheduler's job records
        watch = {}
        for name in JOBS:
            got = sched.get_job(ids[name])
            rec = got.public() if got is not None else {}
            watch[name] = {"slo_action": rec.get("slo_action"),
                           "moves": [{k: m.get(k) for k in ("from_group", "to_group", "trigger", "stopped_at_s", "drained")}
                                     for m in rec.get("moves") or []]}
        groups = {co[name]["info"]["group_id"] for name in JOBS}
        placement = {name: co[name]["info"]["placement"] for name in JOBS}
        con.print(f"co-executed run done: group(s) {sorted(groups)}")

        # ---- cold-switch run (warm vs cold start latency)
        cold_name = "grpo_train_heavy"
        cold_id = f"{cfgs[cold_name].job.job_id}-cold-{uid}"
        rc = wait_all({cold_id: submit(paths[cold_name], cold_id, args.cold_iterations, tmp / "cold.json", env,
                                       switch="cold")}, args.timeout_s)
        cold = json.loads((tmp / "cold.json").read_text()) if (tmp / "cold.json").is_file() else {}
        if not cold.get("ok"):
            con.print(f"[yellow]cold-switch run failed: {cold.get('error') or rc[cold_id][1]}[/]")
    finally:
        lc.shutdown()  # removes the cluster's run dir (node temp dirs, Ray session files)
        shutil.rmtree(tmp, ignore_errors=True)  # the jobs' results (read above) and checkpoints

    # ---- figures from the recorded timelines
    co_tl = [r for name in JOBS for r in co[name]["timeline"]]
    rnodes = sorted({x for p in placement.values() for x in p["rollout_nodes"]})
    tnodes = sorted({x for p in placement.values() for x in p["train_nodes"]})
    co_jobs = {ids[name]: co[name]["timeline"] for name in JOBS}
    solo_jobs = {ids[name]: solo[name]["timeline"] for name in JOBS}
    # busy / bubble over the whole run (rollmux.occupancy: union of busy intervals per node; warm-up,
    # cold start and drain included), as in the simulator; the steady state after every job's
    # iteration 0 (cold start incl. the worker's first imports) is reported beside it
    co_u = report.coexec_utilisation(co_tl, len(rnodes), len(tnodes))
    solo_u = report.solo_utilisation(solo_jobs)
    co_u["steady_after_iteration_0"] = report.coexec_utilisation(
        co_tl, len(rnodes), len(tnodes), window=(report.steady_start(co_jobs), report.span(co_tl)[1]))
    solo_u["steady_after_iteration_0"] = report.solo_utilisation(solo_jobs, steady=True)

    # the group's predicted slowdowns once all three are in (Alg. 1 replayed on the same specs, in the
    # same arrival order; each job's own admission-time prediction is `predicted_slowdown`)
    from rollmux.admission import InterGroupScheduler

    replay = InterGroupScheduler(spec, policy="rollmux")
    for name in JOBS:
        decision = replay.admit(cfgs[name].job.model_copy(update={"job_id": ids[name]}))
    group_pred = dict(decision.predicted_slowdowns)
    # profile calibration: the configured profiles admission used are not what the jobs take on this
    # machine, so the policy's prediction is also evaluated on the phase times measured solo in this
    # run (the same group and round-robin order, the same predictor: Alg. 1 line 10's coexec_times)
    pred_measured = predicted_on_profiles(replay, {ids[name]: profile_from_solo[name] for name in JOBS})

    first_finish = min(max(r["end"] for r in co[name]["timeline"]) for name in JOBS)
    per_job = {}
    for name in JOBS:
        t_co = report.iteration_time_s(co[name]["timeline"])
        t_solo = report.iteration_time_s(solo[name]["timeline"])
        slo = cfgs[name].job.slo
        same = [m["weights_sha256"] for m in co[name]["history"]] == [m["weights_sha256"] for m in solo[name]["history"]]
        med_solo, med_co = report_phase_medians(solo[name]["timeline"]), report_phase_medians(co[name]["timeline"])
        per_job[ids[name]] = {
            "config": repo_label(paths[name]),
            "iterations": co[name]["iterations"], "initial_reward": co[name]["initial_reward"],
            "final_reward": co[name]["final_reward"], "iteration_s_coexec": t_co, "iteration_s_solo": t_solo,
            "slowdown_vs_solo": t_co / t_solo, "slo": slo, "slo_met": t_co / t_solo <= slo,
            "weights_identical_to_solo": same, "placement": placement[name],
            "profile_from_solo": profile_from_solo[name],
            "profile_for_admission": cfgs[name].job.measured.model_dump() if cfgs[name].job.measured else None,
            "predicted_slowdown": co[name]["info"].get("predicted_slowdown"),
            "predicted_slowdown_in_group": group_pred.get(ids[name]),
            "predicted_slowdown_on_solo_profile": pred_measured.get(ids[name]),
            # the steady state the prediction models: iterations while all members still ran
            "iteration_s_coexec_all_members": (t_all := steady_iteration_s(co[name]["timeline"], first_finish)),
            "slowdown_all_members": None if t_all is None else t_all / t_solo,
            # measured over predicted on the measured solo profile (goal: <= 1.05 on pinned nodes)
            "measured_over_predicted_all_members": (t_all / t_solo / pred_measured[ids[name]])
            if t_all is not None and ids[name] in pred_measured else None,
            "measured_over_predicted": (t_co / t_solo / pred_measured[ids[name]]) if ids[name] in pred_measured else None,
            # every phase switch is timed: seconds per iteration spent materialising / offloading the
            # phase states (inside the phase records), and the runtime's own time per solo iteration
            # outside any phase record (driver round trips: permit, dispatch, release)
            "switch_s_per_iteration_solo": switch_s_per_iteration(solo[name]["timeline"]),
            "switch_s_per_iteration_coexec": switch_s_per_iteration(co[name]["timeline"]),
            "outside_phases_s_per_iteration_solo": t_solo - sum(med_solo.values()),
            "sync_backend": sorted({r.get("sync_backend") or "?" for r in co[name]["timeline"] if r["phase"] == "sync"}),
            # median phase seconds (iterations > 0): co-executed phases share the cores with the other pool
            "phase_s_solo": med_solo,
            "phase_s_coexec": med_co,
            # slowdown = contention x queueing: co-executed phases run slower than solo ones (the two
            # pool threads and other load share the cores), and a job waits for its permits in the
            # round-robin (what Alg. 1 predicts: `predicted_slowdown_in_group`)
            "contention_factor": sum(med_co.values()) / sum(med_solo.values()),
            "slowdown_from_queueing": t_co / sum(med_co.values()),
            # bytes each sync sent across the pool boundary, counted from the sync executors' sends
            # (one model copy per sync: `model_bytes`), and this job's long-tail migrations that acted
            # (another job's rollout started on the node while this job's tail still ran)
            "sync_cross_bytes": [r.get("sync_cross_bytes") for r in co[name]["timeline"] if r["phase"] == "sync"],
            "model_bytes": model_bytes(cfgs[name]),
            "sync_cross_bytes_one_model_copy": all(
                r.get("sync_cross_bytes") == model_bytes(cfgs[name]) for r in co[name]["timeline"] if r["phase"] == "sync"),
            "migrations_acted": migrations_acted(co_tl, ids[name]),
            # the SLO watch's decision on measured phase times (None: it never had to act) and its moves
            "slo_action": watch[name]["slo_action"],
            "moves": watch[name]["moves"],
        }

    # ---- Gantt charts
    png = out_path.with_name("runtime_gantt.png")
    plot_gantt(report.gantt_records(co_tl), png,
               title=f"RollMux co-execution group ({n} iterations x 3 jobs): real Ray run")
    shifted = []
    for k, name in enumerate(JOBS):
        recs = solo[name]["timeline"]
        t0 = report.span(recs)[0]
        shifted += [dict(r, start=r["start"] - t0, end=r["end"] - t0,
                         node=f"{r['pool']}-{k}") for r in recs]
    png_solo = out_path.with_name("runtime_gantt_solo.png")
    plot_gantt(report.gantt_records(shifted), png_solo, title="Solo-D: each job on its own rollout + training node")

    warm = report.switch_median_s(co_tl, "warm")
    cold_med = report.switch_median_s(cold.get("timeline", []), "cold") if cold.get("ok") else None
    result = {
        "iterations_per_job": n,
        "cluster": spec.name,
        "groups": sorted(groups),
        "group_nodes": {"rollout": rnodes, "train": tnodes},
        "jobs": per_job,
        "coexec": co_u,
        "solo": solo_u,
        "on_policy_identical": all(j["weights_identical_to_solo"] for j in per_job.values()),
        "warm_switch_s_median": warm,
        "cold_switch_s_median": cold_med,
        "cold_switch_runs": len([r for r in cold.get("timeline", []) if r.get("switch") == "cold"]),
        "gantt_png": repo_label(png),
        "gantt_solo_png": repo_label(png_solo),
        "node_seconds_ratio_solo_over_coexec": solo_u["node_seconds"] / co_u["node_seconds"],
        "wall_s": time.time() - t_start,
        "load_average_1m_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
        "cpu_pinning": json.loads(os.environ.get("ROLLMUX_CPU_PIN") or "{}"),
        "handoffs_coexec": handoffs(co_tl),
        "notes": "solo: each job alone on the same local Ray cluster (a scheduler of its own), one after another, "
                 "charged its own rollout+train node (Solo-D); sync: N->M plan through collectives/ (sync_backend "
                 "'auto': gloo on this CPU machine); "
                 "cpu pinning: each pool node's worker process has its own core where there are enough (on 2 cores "
                 "rollout-0 and train-0, the group's nodes, get one core each); drivers, controllers, the scheduler "
                 "and Ray's own processes float over all cores, so a node's compute is not fully isolated; "
                 "predicted_slowdown_in_group: the policy on the configured profiles admission used; "
                 "predicted_slowdown_on_solo_profile: the same group and predictor on profile_from_solo, the phase "
                 "medians measured solo in this run plus an equal share of the solo iteration's time outside the "
                 "phase records (the runtime's hand-off: release, grant, dispatch), so that the profile adds up to "
                 "the solo iteration time (measured_over_predicted = measured slowdown / that); "
                 "co-executed: three user processes attached to one GlobalScheduler on a local multi-node Ray cluster; "
                 "makespan / busy fractions are over the whole run (warm-up, cold start and drain included); the "
                 "steady state after every job's iteration 0 (cold start, which includes the worker processes' first "
                 "imports) is under steady_after_iteration_0; iteration times exclude iteration 0; busy fraction = "
                 "union of busy intervals per node / (nodes x span) (rollmux.occupancy), bubble fraction = 1 - busy.",
    }
    out_path.write_text(json.dumps(result, indent=1))

    t = Table(title=f"RollMux runtime demo: 3 GRPO jobs, {n} iterations each")
    for c in ("job", "iters", "reward (first->last)", "iter s solo", "iter s co-exec", "slowdown", "queueing", "predicted",
              "predicted (solo profile)", "slowdown (all members)", "measured / predicted", "SLO", "bit-identical"):
        t.add_column(c)
    for jid, j in per_job.items():
        t.add_row(jid, str(j["iterations"]), f"{j['initial_reward']:.2f} -> {j['final_reward']:.2f}",
                  f"{j['iteration_s_solo']:.2f}", f"{j['iteration_s_coexec']:.2f}", f"{j['slowdown_vs_solo']:.2f}x", f"{j['slowdown_from_queueing']:.2f}x",
                  "n/a" if j["predicted_slowdown_in_group"] is None else f"{j['predicted_slowdown_in_group']:.2f}x",
                  "n/a" if j["predicted_slowdown_on_solo_profile"] is None else f"{j['predicted_slowdown_on_solo_profile']:.2f}x",
                  "n/a" if j["slowdown_all_members"] is None else f"{j['slowdown_all_members']:.2f}x",
                  "n/a" if j["measured_over_predicted_all_members"] is None else f"{j['measured_over_predicted_all_members']:.3f}",
                  f"{j['slo']:.1f} {'ok' if j['slo_met'] else 'MISSED'}", "yes" if j["weights_identical_to_solo"] else "NO")
    con.print(t)
    for jid, j in per_job.items():  # the SLO watch acts on what it measures; say what it did
        a = j["slo_action"]
        if a:
            con.print(f"SLO watch, {jid}: {a.get('action')}: {a.get('reason')}")
    u = Table(title="Pools over the whole run, warm-up and drain included (from the recorded timeline)")
    for c in ("run", "nodes", "makespan s", "rollout busy", "train busy", "node-seconds"):
        u.add_column(c)
    u.add_row("solo (Solo-D)", "3 + 3", f"{solo_u['makespan_s']:.1f}", f"{solo_u['rollout_busy_fraction']:.0%}",
              f"{solo_u['train_busy_fraction']:.0%}", f"{solo_u['node_seconds']:.0f}")
    u.add_row("co-executed", f"{len(rnodes)} + {len(tnodes)}", f"{co_u['makespan_s']:.1f}",
              f"{co_u['rollout_busy_fraction']:.0%}", f"{co_u['train_busy_fraction']:.0%}", f"{co_u['node_seconds']:.0f}")
    con.print(u)
    fmt = lambda x: "n/a" if x is None else f"{x * 1000:.1f} ms"  # noqa: E731
    con.print(f"warm switch median {fmt(warm)}, cold switch median {fmt(cold_med)}; "
              f"on-policy identical: {result['on_policy_identical']}")
    con.print(f"Gantt: {png} (solo: {png_solo}); JSON: {out_path}; total {result['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
