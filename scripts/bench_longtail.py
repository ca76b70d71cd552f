#!/usr/bin/env python
"""Long-tail migration, migration on vs off, measured on the runtime and predicted by the simulator
(RollMux §4.3, Fig. 7; the paper's Fig. 11 right).

Default engine ``emulated`` (docs/EMULATION.md): the real runtime (GlobalScheduler, GroupController,
permits, the workers) on emulated accelerators, whose rollouts finish response by response after
the profiler's modelled times (H20 rollout node, H800 training node, heavy-tailed seeded
log-normal lengths capped at ``max_response_tokens``), scaled by the time factor. Two
rollout-heavy jobs share one rollout node and one training node (one co-execution group; one
always waits for the rollout node), plus a lone job: for every seed and trigger fraction
(``tail_trigger_fraction``, default 0.6 / 0.8 / 0.95) migration off and on. Per run, over the
steady state (iterations 1..n-1; iteration 0 pays the cold starts): the group iteration time
(modelled seconds: wall / time factor), the rollout node's idle fraction (one minus the union of
its busy intervals), the migrations that acted (rollouts of two jobs overlapping on the node); and
the simulator's prediction for the same run (:func:`rollmux.intra_group.simulate_group` on the
same jobs, placement, round-robin order and per-iteration response lengths, with the same
``LongTailPolicy``), measured with the same function. ``iteration_speedup`` = off / on.

    python scripts/bench_longtail.py --quick             # emulated, ~3-5 minutes on 2 cores
    python scripts/bench_longtail.py --engine cpu --quick  # real (tiny) GRPO generation on CPU threads

``--engine cpu``: two co-executed GRPO jobs with long-tailed response lengths on a local Ray
cluster (one CPU thread per "GPU"); a straggler batch still computes every row and the freed
capacity is a shared core, so migration cannot pay there; figures are what was measured.
Writes ``results/bench_longtail.json`` and ``results/bench_longtail.png`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from actors.ops.local_cluster import use_ephemeral_ray_token  # noqa: E402

use_ephemeral_ray_token()  # Ray token mode with a fresh token unless RAY_AUTH_MODE is set
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=("emulated", "cpu"), default="emulated",
                    help="emulated accelerators on the real runtime (default) or tiny GRPO jobs on CPU threads")
    ap.add_argument("--quick", action="store_true", help="fewer iterations / seeds (emulated: 5 iterations, "
                    "seeds 0,1; cpu: 6 iterations)")
    ap.add_argument("--repeats", type=int, default=2, help="cpu: off/on pairs, alternating (the median is reported)")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal shape of the response lengths")
    ap.add_argument("--seeds", default=None, help="emulated: comma-separated length seeds (default 0,1,2; quick 0,1)")
    ap.add_argument("--triggers", default="0.6,0.8,0.95", help="emulated: trigger fractions")
    ap.add_argument("--wall-ms-per-model-s", type=float, default=10.0, help="emulated: time factor (wall ms per modelled s)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_longtail.json"))
    return ap.parse_args(argv)


def job_configs(n: int, sigma: float, uid: str) -> list:
    """Two rollout-heavy GRPO jobs with long-tailed responses (mean minimum 40, cap 160 tokens)."""
    from examples.grpo.config import ModelConfig, load_job_config
    from rollmux.config import CONFIG_DIR

    base = load_job_config(CONFIG_DIR / "jobs" / "grpo_rollout_heavy.yaml", iterations=n)
    model = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=176)
    out = []
    for k in range(2):
        job = base.job.model_copy(update={"job_id": f"longtail-{k}-{uid}", "slo": 10.0, "num_prompts": 4,
                                          "max_response_tokens": 160})
        run = base.run.model_copy(update={"seed": 10 + k, "num_prompts": 4, "group_size": 4, "min_new_tokens": 40,
                                          "max_new_tokens": 160, "ppo_epochs": 1, "response_tail_sigma": sigma})
        out.append(base.model_copy(update={"job": job, "run": run, "model": model}))
    return out


def measure(res: dict, wall_s: float, n: int) -> dict:
    """Group iteration time, rollout-node idle and acted migrations from the jobs' timelines, over
    the steady state: iterations 1..n-1 (iteration 0 pays the jobs' cold starts: imports, builders)."""
    from rollmux.occupancy import occupancy

    recs = [r for v in res.values() for r in v["timeline"] if (r.get("iteration") or 0) >= 1]
    t0 = min(r["start"] for r in recs)
    t1 = max(r["end"] for r in recs)
    rows = [{"pool": r["pool"], "node": r["node"], "start_s": r["start"] - t0, "end_s": r["end"] - t0} for r in recs]
    nodes = {"rollout": {x["node"]: 1.0 for x in rows if x["pool"] == "rollout"},
             "train": {x["node"]: 1.0 for x in rows if x["pool"] == "train"}}
    occ = occupancy(rows, nodes, window=(0.0, t1 - t0))
    rolls = [r for r in recs if r["phase"] == "rollout"]
    overlaps = sum(1 for a in rolls for b in rolls if a["job_id"] < b["job_id"] and a["node"] == b["node"]
                   and a["start"] < b["end"] and b["start"] < a["end"])
    return {"group_iteration_s": (t1 - t0) / (n - 1), "steady_window_s": t1 - t0, "wall_s": wall_s,
            "rollout_idle_fraction": occ["rollout"].bubble_ratio, "train_idle_fraction": occ["train"].bubble_ratio,
            "migrations_acted": overlaps,
            "rollout_s_median": sorted(r["end"] - r["start"] for r in rolls)[len(rolls) // 2],
            "weights_sha256": [[h["weights_sha256"] for h in res[j]["history"]] for j in sorted(res)],
            "response_len_mean": {j: sum(h["response_len_mean"] for h in v["history"]) / len(v["history"])
                                  for j, v in res.items()}}


def run_setting(spec, migrate: bool, n: int, sigma: float) -> dict:
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from examples.grpo.job import run_coexecuted

    uid = uuid.uuid4().hex[:6]
    name = f"bench-longtail-{'on' if migrate else 'off'}-{uid}"
    sched = get_or_create_scheduler(spec, name=name, controller_kw={"migrate": migrate})
    SchedulerHandle(sched).health(timeout_s=120)
    cfgs = job_configs(n, sigma, uid)
    t0 = time.perf_counter()
    res = run_coexecuted(cfgs, name, admit_timeout_s=300, finish_timeout_s=900)
    wall = time.perf_counter() - t0
    errors = {k: repr(v) for k, v in res.items() if isinstance(v, BaseException)}
    ray.kill(sched, no_restart=True)
    if errors:
        raise RuntimeError(f"bench_longtail ({'on' if migrate else 'off'}): {errors}")
    groups = {v["info"]["group_id"] for v in res.values()}
    if len(groups) != 1:
        raise RuntimeError(f"bench_longtail: the two jobs were not packed into one group: {groups}")
    return measure(res, wall, n)


# ----------------------------------------------------------------------------- emulated engine
#: Two rollout-heavy jobs (modelled worst-case phase times, s; H20 rollout / H800 training node) and
#: a lone one. Rollout-heavy: in the group, one job always waits for the rollout node.
EMU_JOBS = {"a": {"t_roll_s": 200.0, "t_train_s": 70.0, "t_sync_s": 5.0},
            "b": {"t_roll_s": 180.0, "t_train_s": 60.0, "t_sync_s": 5.0},
            "lone": {"t_roll_s": 200.0, "t_train_s": 70.0, "t_sync_s": 5.0}}


def emu_cluster():
    """``configs/cluster_emulated.yaml`` cut to one rollout node and one training node."""
    from rollmux.config import CONFIG_DIR, load_cluster

    c = load_cluster(CONFIG_DIR / "cluster_emulated.yaml")
    return c.model_copy(update={"name": "emulated-1x1",
                                "rollout_pool": c.rollout_pool.model_copy(update={"num_nodes": 1}),
                                "train_pool": c.train_pool.model_copy(update={"num_nodes": 1})})


def emu_specs(keys: list[str], uid: str) -> list:
    """Job specs: 8 rollout GPUs + 8 training GPUs each (one node of each pool), 64 x 8 responses
    capped at 4096 tokens, the modelled phase times of :data:`EMU_JOBS` (``measured``)."""
    from rollmux.models import DeclaredProfile, JobSpec

    return [JobSpec(job_id=f"longtail-{k}-{uid}", model_params_b=7.0, num_prompts=64, responses_per_prompt=8,
                    max_response_tokens=4096, num_rollout_gpus=8, num_train_gpus=8, slo=3.0,
                    measured=DeclaredProfile(**EMU_JOBS[k])) for k in keys]


def predict(specs: list, cluster, em, n: int, trigger: float, migrate: bool, sched_cfg) -> list[dict]:
    """The simulator's schedule of the same run (same jobs in admission order, same nodes, same
    per-iteration response lengths: the emulated jobs' seeded draws, ``cycle_samples = n``), as
    timeline rows in modelled seconds."""
    from rollmux import emulation, profiler
    from rollmux.intra_group import LongTailPolicy, simulate_group
    from rollmux.models import GroupMember, Placement

    members, times = [], {}
    for sp in specs:
        prof = profiler.estimate(sp, cluster)
        members.append(GroupMember(spec=sp, profile=prof, placement=Placement(
            job_id=sp.job_id, rollout_nodes=("rollout-0",), train_nodes=("train-0",))))
        rng = emulation.job_rng(sp.job_id, em.seed)
        draws = [emulation.draw_lengths(sp, rng, em) for _ in range(em.cycle_samples)]
        times[sp.job_id] = [profiler.iteration_times(sp, cluster, d, trigger_fraction=trigger, profile=prof)
                            for d in draws]
    lt = LongTailPolicy(trigger, sched_cfg.tail_gpus, sched_cfg.migration_overhead_s) if migrate else None
    g = simulate_group(members, meta_iterations=n, phase_times=times, long_tail=lt)
    return [{"job_id": r.job_id, "phase": r.phase, "pool": r.pool, "node": r.node, "iteration": r.iteration,
             "start": r.start_s, "end": r.end_s} for r in g.timeline if r.iteration < n]


def measure_rows(recs: list[dict], n: int, scale_s: float = 1.0) -> dict:
    """Group iteration time (s / ``scale_s``), rollout / training idle and acted migrations over
    the steady state (iterations 1..n-1) of timeline rows ``{job_id, phase, pool, node,
    iteration, start, end}`` (the runtime's or the simulator's)."""
    from rollmux.occupancy import occupancy

    recs = [r for r in recs if (r.get("iteration") or 0) >= 1]
    t0 = min(r["start"] for r in recs)
    t1 = max(r["end"] for r in recs)
    rows = [{"pool": r["pool"], "node": r["node"], "start_s": r["start"] - t0, "end_s": r["end"] - t0} for r in recs]
    nodes = {p: {x["node"]: 1.0 for x in rows if x["pool"] == p} for p in ("rollout", "train")}
    occ = occupancy(rows, nodes, window=(0.0, t1 - t0))
    rolls = [r for r in recs if r["phase"] == "rollout"]
    overlaps = sum(1 for a in rolls for b in rolls if a["job_id"] < b["job_id"] and a["node"] == b["node"]
                   and a["start"] < b["end"] and b["start"] < a["end"])
    return {"group_iteration_s": (t1 - t0) / (n - 1) / scale_s, "rollout_idle_fraction": occ["rollout"].bubble_ratio,
            "train_idle_fraction": occ["train"].bubble_ratio, "migrations_acted": overlaps}


def emu_run(cluster, keys: list[str], seed: int, trigger: float, migrate: bool, n: int, wall_ms: float,
            sigma: float, sched_cfg) -> dict:
    """One emulated run (fresh scheduler, controllers with ``migrate`` / ``tail_trigger_fraction``),
    measured, beside the simulator's prediction of it."""
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from examples.emulated.job import EmulatedJobConfig, run_arrivals
    from rollmux.emulation import load_emulation_config, scheduler_config

    uid = uuid.uuid4().hex[:6]
    em = load_emulation_config().model_copy(update={"wall_ms_per_model_s": wall_ms, "cycle_samples": n,
                                                    "seed": seed, "length_sigma": sigma})
    specs = emu_specs(keys, f"{seed}-{uid}")
    name = f"bench-longtail-{'on' if migrate else 'off'}-{uid}"
    sched = get_or_create_scheduler(cluster, name=name, config=scheduler_config(sched_cfg, em),
                                    controller_kw={"migrate": migrate, "tail_trigger_fraction": trigger})
    SchedulerHandle(sched).health(timeout_s=120)
    cfgs = [EmulatedJobConfig(spec=sp, cluster=cluster, emulation=em, iterations=n) for sp in specs]
    t0 = time.perf_counter()
    try:
        res = run_arrivals(cfgs, [0.4 * k for k in range(len(cfgs))], timeout_s=600, scheduler_name=name)
    finally:
        ray.kill(sched, no_restart=True)
    wall = time.perf_counter() - t0
    errors = {k: repr(v) for k, v in res.items() if isinstance(v, BaseException)}
    if errors:
        raise RuntimeError(f"bench_longtail ({'on' if migrate else 'off'}): {errors}")
    groups = {v["info"]["group_id"] for v in res.values()}
    if len(groups) != 1:
        raise RuntimeError(f"bench_longtail: the jobs were not packed into one group: {groups}")
    scale = wall_ms / 1000.0
    measured = measure_rows([r for v in res.values() for r in v["timeline"]], n, scale)
    predicted = measure_rows(predict(specs, cluster, em, n, trigger, migrate, sched_cfg), n)
    return {"seed": seed, "trigger_fraction": trigger, "migrate": migrate, "jobs": len(specs), "wall_s": wall,
            "measured": measured, "simulated": predicted,
            "runtime_vs_simulator": measured["group_iteration_s"] / predicted["group_iteration_s"]}


def main_emulated(args) -> int:
    n = args.iterations or (5 if args.quick else 10)
    if n < 3:
        raise SystemExit("bench_longtail: --iterations must be >= 3 (iteration 0 is the cold start)")
    seeds = [int(x) for x in (args.seeds or ("0,1" if args.quick else "0,1,2")).split(",")]
    triggers = [float(x) for x in args.triggers.split(",")]
    from actors.ops.local_cluster import start_local_cluster
    from rollmux.admission import load_scheduler_config

    sched_cfg = load_scheduler_config()
    cluster = emu_cluster()
    load_start = os.getloadavg()
    lc = start_local_cluster(cluster, head_cpus=2, node_cpus=2, object_store_mb=96, worker_niceness=0)  # timed waits on time
    runs = []
    try:
        for seed in seeds:
            for f in triggers:
                for migrate in (False, True):  # off first, then on (alternating over the settings)
                    runs.append(emu_run(cluster, ["a", "b"], seed, f, migrate, n, args.wall_ms_per_model_s,
                                        args.sigma, sched_cfg))
                    print(_row(runs[-1]), flush=True)
        lone = []
        for _ in range(3):  # a lone job: nobody waits, nothing may move (alternating pairs: median)
            for migrate in (False, True):
                lone.append(emu_run(cluster, ["lone"], seeds[0], triggers[len(triggers) // 2], migrate, n,
                                    args.wall_ms_per_model_s, args.sigma, sched_cfg))
                print(_row(lone[-1]), flush=True)
    finally:
        lc.shutdown()
    load_end = os.getloadavg()
    cells = []
    for seed in seeds:
        for f in triggers:
            off, on = (next(r for r in runs if r["seed"] == seed and r["trigger_fraction"] == f and r["migrate"] == m)
                       for m in (False, True))
            sp = off["measured"]["group_iteration_s"] / on["measured"]["group_iteration_s"]
            sp_sim = off["simulated"]["group_iteration_s"] / on["simulated"]["group_iteration_s"]
            cells.append({"seed": seed, "trigger_fraction": f,
                          "iteration_s_off": off["measured"]["group_iteration_s"],
                          "iteration_s_on": on["measured"]["group_iteration_s"],
                          "iteration_s_off_simulated": off["simulated"]["group_iteration_s"],
                          "iteration_s_on_simulated": on["simulated"]["group_iteration_s"],
                          "iteration_speedup": sp, "iteration_speedup_simulated": sp_sim,
                          "gain_points_minus_simulated": 100 * (sp - sp_sim),
                          "rollout_idle_off": off["measured"]["rollout_idle_fraction"],
                          "rollout_idle_on": on["measured"]["rollout_idle_fraction"],
                          "rollout_idle_off_simulated": off["simulated"]["rollout_idle_fraction"],
                          "rollout_idle_on_simulated": on["simulated"]["rollout_idle_fraction"],
                          "migrations_acted_on": on["measured"]["migrations_acted"],
                          "migrations_simulated_on": on["simulated"]["migrations_acted"]})
    med = lambda xs: sorted(xs)[(len(xs) - 1) // 2]  # noqa: E731
    lone_off, lone_on = (sorted((r for r in lone if r["migrate"] == m), key=lambda r: r["measured"]["group_iteration_s"])[1]
                         for m in (False, True))  # the median of three runs each
    result = {
        "engine": "emulated", "iterations": n, "sigma": args.sigma, "seeds": seeds, "trigger_fractions": triggers,
        "wall_ms_per_model_s": args.wall_ms_per_model_s, "time_unit": "modelled seconds (wall / time factor)",
        "jobs": EMU_JOBS, "cluster": cluster.name,
        "loadavg_start": load_start, "loadavg_end": load_end,
        "iteration_speedup": med([c["iteration_speedup"] for c in cells]),
        "iteration_speedup_simulated": med([c["iteration_speedup_simulated"] for c in cells]),
        "iteration_speedup_min": min(c["iteration_speedup"] for c in cells),
        # where the simulator migrates (another member waits and the trigger fraction is reached
        # while responses are still unfinished: with lengths capped at max_response_tokens the
        # capped ones finish together, so a late trigger may never fire), migration must shorten
        # the group iteration by at least the simulator's gain minus 2 points
        "cells_migrating": sum(c["migrations_simulated_on"] > 0 for c in cells),
        "goal_met_where_migrating": all(c["iteration_speedup"] > 1.0 and c["gain_points_minus_simulated"] >= -2.0
                                        for c in cells if c["migrations_simulated_on"] > 0),
        "gain_points_minus_simulated_median": med([c["gain_points_minus_simulated"] for c in cells
                                                   if c["migrations_simulated_on"] > 0] or [0.0]),
        "no_migration_cells_speedup": [c["iteration_speedup"] for c in cells if c["migrations_simulated_on"] == 0],
        "off": {"group_iteration_s": med([c["iteration_s_off"] for c in cells]),
                "rollout_idle_fraction": med([c["rollout_idle_off"] for c in cells])},
        "on": {"group_iteration_s": med([c["iteration_s_on"] for c in cells]),
               "rollout_idle_fraction": med([c["rollout_idle_on"] for c in cells])},
        "lone_job": {"iteration_s_off": lone_off["measured"]["group_iteration_s"],
                     "iteration_s_on": lone_on["measured"]["group_iteration_s"],
                     "ratio_on_over_off": lone_on["measured"]["group_iteration_s"] / lone_off["measured"]["group_iteration_s"],
                     "migrations_acted_on": sum(r["measured"]["migrations_acted"] for r in lone if r["migrate"]),
                     "iteration_s_runs": {k: [round(r["measured"]["group_iteration_s"], 2) for r in lone
                                              if r["migrate"] == (k == "on")] for k in ("off", "on")},
                     "iteration_s_simulated": lone_on["simulated"]["group_iteration_s"]},
        "cells": cells, "runs": runs + lone,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"median speedup {result['iteration_speedup']:.3f}x (simulator {result['iteration_speedup_simulated']:.3f}x), "
          f"min {result['iteration_speedup_min']:.3f}x; lone job on/off {result['lone_job']['ratio_on_over_off']:.3f}; "
          f"load {load_start[0]:.1f} -> {load_end[0]:.1f}  -> {out}")
    return 0


def _row(r: dict) -> str:
    m, s_ = r["measured"], r["simulated"]
    return (f"seed {r['seed']} f={r['trigger_fraction']:.2f} {'on ' if r['migrate'] else 'off'} jobs={r['jobs']}: "
            f"iter {m['group_iteration_s']:.1f} s (sim {s_['group_iteration_s']:.1f}), rollout idle "
            f"{100 * m['rollout_idle_fraction']:.1f}% (sim {100 * s_['rollout_idle_fraction']:.1f}%), "
            f"acted {m['migrations_acted']} (sim {s_['migrations_acted']}), wall {r['wall_s']:.0f} s")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(7, 3))
    keys = ("off", "on")
    ax[0].bar(keys, [result[k]["group_iteration_s"] for k in keys], color=["#999", "#1f77b4"])
    ax[0].set_ylabel("group iteration time, s")
    ax[1].bar(keys, [100 * result[k]["rollout_idle_fraction"] for k in keys], color=["#999", "#1f77b4"])
    ax[1].set_ylabel("rollout-node idle, %")
    for a in ax:
        a.set_xlabel("long-tail migration")
    fig.suptitle("Long-tail migration, measured (RollMux Fig. 11 right)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    return main_emulated(args) if args.engine == "emulated" else main_cpu(args)


def main_cpu(args) -> int:
    n = args.iterations or (6 if args.quick else 12)
    if n < 2:
        raise SystemExit("bench_longtail: --iterations must be >= 2 (iteration 0 is the cold start)")
    from actors.ops.local_cluster import start_local_cluster
    from rollmux.admission import load_scheduler_config
    from rollmux.config import CONFIG_DIR, load_cluster

    spec = load_cluster(CONFIG_DIR / "cluster_local.yaml")
    cfg = load_scheduler_config()
    lc = start_local_cluster(spec, head_cpus=2, node_cpus=1, object_store_mb=128)
    try:
        runs: dict[str, list] = {"off": [], "on": []}
        for _ in range(max(1, args.repeats)):  # alternate, so neither setting always runs first
            for key in ("off", "on"):
                runs[key].append(run_setting(spec, key == "on", n, args.sigma))
        result = {"engine": "cpu", "loadavg_start": os.getloadavg(), "iterations": n, "sigma": args.sigma, "tail_trigger_fraction": cfg.tail_trigger_fraction,
                  "repeats": max(1, args.repeats), "runs": runs}
        for key in ("off", "on"):
            med = sorted(runs[key], key=lambda r: r["group_iteration_s"])[(len(runs[key]) - 1) // 2]
            result[key] = med
    finally:
        lc.shutdown()
    off, on = result["off"], result["on"]
    result["iteration_speedup"] = off["group_iteration_s"] / on["group_iteration_s"]
    # on-policy: scheduling (migration on or off) must not change what the jobs learn
    result["weights_identical_on_off"] = len({json.dumps(r["weights_sha256"]) for k in ("off", "on")
                                              for r in result["runs"][k]}) == 1
    result["rollout_idle_change"] = on["rollout_idle_fraction"] - off["rollout_idle_fraction"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"{'migration':<10}{'iter s':>9}{'roll idle':>11}{'acted':>7}")
    for k in ("off", "on"):
        r = result[k]
        print(f"{k:<10}{r['group_iteration_s']:>9.2f}{100 * r['rollout_idle_fraction']:>10.1f}%{r['migrations_acted']:>7d}")
    print(f"speedup {result['iteration_speedup']:.3f}x, weights identical on/off: "
          f"{result['weights_identical_on_off']}  -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
