"""The emulated mode of ``scripts/demo_runtime.py`` (``--emulated``): three RL jobs of the
simulator's workload catalogue (balanced, rollout-heavy, training-heavy; Qwen-7B on 8 x H20 rollout
and 8-16 x H800 training GPUs) on emulated accelerators (docs/EMULATION.md), solo vs co-executed.

1. A local Ray cluster whose pool nodes (3 rollout + 4 training, 8 GPUs each, modelled) are custom
   resources of one Ray node per pool; every pool node's worker is started before the jobs.
2. Solo: each job alone (a GlobalScheduler of its own), one after the other.
3. Co-executed: the three jobs attached to one GlobalScheduler, admitted one after another (Alg. 1
   packs them), then iterating round-robin; weight sync is the counted plan (bytes counted, not moved).
Writes ``results/runtime_demo_emulated.json``: per job the solo and co-executed iteration times
(modelled seconds = wall / time factor), the measured slowdown against the admission's
prediction, the bytes each sync's plan sent across the pool boundary; the group's bubbles; a Gantt
PNG. Source: RollMux §4.3 (meta-iterations), §6 (bubbles, SLO).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

#: (job type of rollmux.workloads.JOB_TYPES, its category): one of each
DEMO_TYPES = (("qwen7b-math-s4k", "balanced"), ("qwen7b-math-s16k", "rollout"), ("qwen7b-math-s4k-bigbatch", "training"))


def demo_jobs(cluster, slo: float = 2.0) -> list:
    """The three demo job specs: each type's mid-range worst-case phase times as ``measured``."""
    from rollmux import profiler
    from rollmux.models import JobSpec, PhaseProfile
    from rollmux.workloads import JOB_TYPES

    by = {t.name: t for t in JOB_TYPES}
    out = []
    for name, _ in DEMO_TYPES:
        t = by[name]
        base = JobSpec(job_id=f"emu-{t.category}", model_params_b=t.model_params_b, num_prompts=t.num_prompts,
                       responses_per_prompt=t.responses_per_prompt, max_response_tokens=t.max_response_tokens,
                       multi_turn=t.multi_turn, turns=t.turns, num_rollout_gpus=t.rollout_gpus,
                       num_train_gpus=t.train_gpus, slo=slo)
        prof = PhaseProfile(t_roll_s=sum(t.t_roll_s) / 2, t_train_s=sum(t.t_train_s) / 2,
                            t_sync_s=profiler.sync_time(base, cluster))
        out.append(base.model_copy(update={"measured": prof}))
    return out


def _iteration_model_s(r: dict, factor: float) -> float:
    """Mean iteration time after iteration 0 (the cold start), modelled seconds."""
    from examples.grpo import report

    return report.iteration_time_s(r["timeline"]) / factor


def run(args, root: Path) -> int:
    """The emulated demo (see the module docstring); returns the exit code."""
    from rich.console import Console
    from rich.table import Table

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle, gather
    from actors.ops.local_cluster import start_local_cluster
    from actors.worker.workers import worker_handle
    from examples.emulated.job import EmulatedJobConfig, run_arrivals, run_job
    from rollmux.admission import load_scheduler_config
    from rollmux.emulation import scheduler_config
    from examples.grpo import report
    from rollmux.admission import InterGroupScheduler
    from rollmux.config import CONFIG_DIR, load_cluster, repo_label
    from rollmux.emulation import load_emulation_config
    from rollmux.sim.plots import plot_gantt

    con = Console(width=150)
    n = args.iterations or (5 if args.quick else 12)
    # worst-case lengths: the phase times admission plans with, so measured and predicted compare
    em = load_emulation_config().model_copy(update={"response_lengths": "worst_case"})
    factor = em.wall_ms_per_model_s / 1000.0
    base = load_cluster(CONFIG_DIR / "cluster_emulated.yaml")
    cluster = base.model_copy(update={"name": "emulated-demo",
                                      "rollout_pool": base.rollout_pool.model_copy(update={"num_nodes": 3}),
                                      "train_pool": base.train_pool.model_copy(update={"num_nodes": 4})})
    specs = demo_jobs(cluster)
    uid = uuid.uuid4().hex[:6]
    specs = [s.model_copy(update={"job_id": f"{s.job_id}-{uid}"}) for s in specs]
    out_path = Path(args.out) if args.out != str(root / "results" / "runtime_demo.json") else \
        root / "results" / "runtime_demo_emulated.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    load_start = os.getloadavg()
    con.print(f"[bold]RollMux runtime demo, emulated accelerators[/]: 3 jobs x {n} iterations, "
              f"{em.wall_ms_per_model_s:g} wall ms per modelled s")
    lc = start_local_cluster(cluster, head_cpus=2, node_cpus=1, object_store_mb=96, pool_nodes_per_ray_node=4, worker_niceness=0)
    tmp = Path(tempfile.mkdtemp(prefix="rollmux-demo-emul-"))
    try:
        nodes = [f"rollout-{i}" for i in range(3)] + [f"train-{i}" for i in range(4)]
        gather([worker_handle(x).where_nowait() for x in nodes], timeout_s=300)
        cfgs = {s.job_id: EmulatedJobConfig(spec=s, cluster=cluster, emulation=em, iterations=n) for s in specs}
        solo = {}
        for s in specs:  # each alone, on a scheduler of its own
            name = f"rollmux-demo-emul-solo-{s.job_id}"
            sh = get_or_create_scheduler(cluster, name=name, config=scheduler_config(load_scheduler_config(), em))
            SchedulerHandle(sh).health(timeout_s=None)
            solo_cfg = cfgs[s.job_id].model_copy(update={"spec": s.model_copy(update={"job_id": f"{s.job_id}-solo"})})
            solo[s.job_id] = run_job(solo_cfg, attach=True, scheduler_name=name, checkpoint_dir=str(tmp / "solo"))
            import ray

            ray.kill(sh, no_restart=True)
        name = f"rollmux-demo-emul-{uid}"
        SchedulerHandle(get_or_create_scheduler(cluster, name=name, config=scheduler_config(load_scheduler_config(), em))).health(timeout_s=None)
        co = run_arrivals([cfgs[s.job_id] for s in specs], [0.0, 0.5, 1.0], timeout_s=args.timeout_s,
                          scheduler_name=name, checkpoint_dir=str(tmp / "co"))
        bad = {k: repr(v) for k, v in co.items() if not isinstance(v, dict)}
        if bad:
            raise RuntimeError(f"co-executed emulated jobs failed: {bad}")
    finally:
        lc.shutdown()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

    replay = InterGroupScheduler(cluster, policy="rollmux")
    for s in specs:
        replay.admit(s)
    # the prediction each job's admission made (Alg. 1 line 10; the runtime's re-optimisation may
    # regroup jobs afterwards: group_id says where each one ran)
    pred = {s.job_id: co[s.job_id]["info"].get("predicted_slowdown") for s in specs
            if co[s.job_id]["info"].get("predicted_slowdown") is not None}
    replay_groups = {g.group_id: list(g.job_ids) for g in replay.groups}
    co_tl = [r for s in specs for r in co[s.job_id]["timeline"]]
    per_job = {}
    for s in specs:
        t_co, t_solo = _iteration_model_s(co[s.job_id], factor), _iteration_model_s(solo[s.job_id], factor)
        syncs = [x for x in co[s.job_id]["timeline"] if x["phase"] == "sync"]
        per_job[s.job_id] = {
            "iterations": n, "profile_modelled": s.measured.model_dump(), "solo_iteration_s_modelled": s.measured.t_solo_s,
            "iteration_s_solo": t_solo, "iteration_s_coexec": t_co, "slowdown_vs_solo": t_co / t_solo,
            "predicted_slowdown_at_admission": pred.get(s.job_id), "slo": s.slo, "slo_met": t_co / t_solo <= s.slo,
            "measured_over_predicted": (t_co / t_solo / pred[s.job_id]) if s.job_id in pred else None,
            "group_id": co[s.job_id]["info"].get("group_id"), "placement": co[s.job_id]["info"].get("placement"),
            "sync_backend": sorted({x.get("sync_backend") for x in syncs}),
            "sync_cross_bytes_one_model_copy": all(x.get("sync_cross_bytes") == int(round(2e9 * s.model_params_b))
                                                   for x in syncs),
        }
    rn = sorted({x for s in specs for x in (co[s.job_id]["info"].get("placement") or {}).get("rollout_nodes", [])})
    tn = sorted({x for s in specs for x in (co[s.job_id]["info"].get("placement") or {}).get("train_nodes", [])})
    co_u = report.coexec_utilisation(co_tl, max(1, len(rn)), max(1, len(tn)))
    png = out_path.with_name("runtime_gantt_emulated.png")
    plot_gantt(report.gantt_records(co_tl), png, title=f"RollMux co-execution on emulated accelerators ({n} iterations x 3 jobs)")
    result = {
        "iterations_per_job": n, "cluster": cluster.name, "emulation": em.model_dump(),
        "groups": sorted({j["group_id"] for j in per_job.values()}), "groups_admission_replay": replay_groups,
        "jobs": per_job, "coexec": co_u,
        "median_measured_over_predicted": statistics.median([j["measured_over_predicted"] for j in per_job.values()
                                                            if j["measured_over_predicted"] is not None] or [0.0]),
        "gantt_png": repo_label(png), "wall_s": time.time() - t_start,
        "load_average_1m_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
        "notes": "times in modelled seconds (wall / time factor); iteration times exclude iteration 0 (cold start); "
                 "solo: each job alone on its own scheduler; worst-case lengths (the phase times admission plans with); "
                 "predicted: the slowdown each job's admission predicted (the runtime's re-optimisation may regroup later); "
                 "groups_admission_replay: Alg. 1 replayed on the three specs without the runtime's re-optimisation",
    }
    out_path.write_text(json.dumps(result, indent=1))
    t = Table(title=f"emulated accelerators: 3 jobs, {n} iterations each (modelled seconds)")
    for c in ("job", "solo s", "co-exec s", "slowdown", "predicted", "measured / predicted", "SLO", "group"):
        t.add_column(c)
    for jid, j in per_job.items():
        t.add_row(jid, f"{j['iteration_s_solo']:.0f}", f"{j['iteration_s_coexec']:.0f}", f"{j['slowdown_vs_solo']:.2f}x",
                  "n/a" if j["predicted_slowdown_at_admission"] is None else f"{j['predicted_slowdown_at_admission']:.2f}x",
                  "n/a" if j["measured_over_predicted"] is None else f"{j['measured_over_predicted']:.3f}",
                  f"{j['slo']:.1f} {'ok' if j['slo_met'] else 'MISSED'}", str(j["group_id"]))
    con.print(t)
    con.print(f"Gantt: {png}; JSON: {out_path}; total {result['wall_s']:.0f}s")
    return 0
