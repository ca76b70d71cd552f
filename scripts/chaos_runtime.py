#!/usr/bin/env python
"""Chaos run: kill the GlobalScheduler, a GroupController and a worker during a three-job run.

For each kill (one after the other, on one local multi-node Ray cluster mirroring
``configs/cluster_local.yaml``): the quickstart demo's three GRPO jobs (``configs/jobs/``, fresh job ids)
are submitted as three user processes (``scripts/grpo_job.py --attach``), start together, and
once the first job has completed an iteration the target actor is killed with ``ray.kill`` (Ray
restarts it: ``max_restarts=-1``). Recorded per kill:

- ``killed``: what was killed (actor name);
- ``api_unavailable_s``: how long the scheduler's ``health`` did not answer after the kill
  (probed every 0.1 s, each probe bounded by 2 s), seconds;
- ``jobs_failed``: jobs whose record ended ``failed`` (with the record's reason);
- ``jobs_finished_all_iterations``: jobs ``finished`` with ``iterations_done`` equal to the
  iterations asked;
- ``jobs_bit_identical_to_solo``: jobs whose final trainer weights' SHA-256 equals the same job
  run solo (plain mode, same iterations) before the kills; ``phases_redone_after_a_lost_worker``:
  per job, its phase records that started from a commit after a lost worker (``recovered``) or
  returned a committed result (``replayed``);
- ``leaked``: what the run left behind after every job ended: job state still hosted on a worker
  (``hosted``), cold-start files of the run's jobs (``cold_start_files``) and live controllers of
  groups that no longer exist (``controllers_of_dissolved_groups``).

Writes ``results/chaos.json`` and prints a table.

    python scripts/chaos_runtime.py --quick     # 4 iterations per job; a few minutes on 2 cores

Source: RollMux §5 (fault tolerance of the control plane).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from actors.ops.local_cluster import use_ephemeral_ray_token  # noqa: E402

use_ephemeral_ray_token()
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from demo_runtime import JOBS, submit, wait_all  # noqa: E402

KILLS = ("scheduler", "controller", "worker")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 iterations per job (default 8)")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--kills", default=",".join(KILLS), help="comma-separated subset of " + ",".join(KILLS))
    ap.add_argument("--cluster", default=str(ROOT / "configs" / "cluster_local.yaml"))
    ap.add_argument("--jobs-dir", default=str(ROOT / "configs" / "jobs"))
    ap.add_argument("--out", default=str(ROOT / "results" / "chaos.json"))
    ap.add_argument("--timeout-s", type=float, default=600.0, help="limit for one run's job processes, s")
    return ap.parse_args(argv)


def _probe_unavailable(sched, stop: threading.Event, out: dict) -> None:
    """Seconds the scheduler's health call did not answer, from the start of the probing."""
    down_since = None
    total = 0.0
    while not stop.is_set():
        t = time.monotonic()
        try:
            sched.health(timeout_s=2.0)
            if down_since is not None:
                total += t - down_since
                down_since = None
        except Exception:
            if down_since is None:
                down_since = t
        stop.wait(max(0.0, 0.1 - (time.monotonic() - t)))
    if down_since is not None:
        total += time.monotonic() - down_since
    out["s"] = total


def solo_digests(paths: dict, n: int) -> dict[str, str]:
    """SHA-256 of each job's trainer weights after ``n`` iterations run solo (plain mode, in this
    process): what a run that lost an actor must end with (on-policy: bit-identical)."""
    from examples.grpo.config import load_job_config
    from examples.grpo.job import run_job

    return {name: run_job(load_job_config(p, iterations=n), attach=False)["weights_sha256"] for name, p in paths.items()}


def one_run(kind: str, sched, sched_name: str, env: dict, paths: dict, n: int, tmp: Path, timeout_s: float,
            solo: dict[str, str]) -> dict:
    import ray

    from actors.naming import NAMESPACE, worker_name
    from actors.handles import WorkerHandle

    uid = uuid.uuid4().hex[:6]
    ids = {name: f"{name.replace('_', '-')}-{kind}-{uid}" for name in JOBS}
    barrier = tmp / f"start-{kind}"
    procs = {}
    for name in JOBS:
        procs[ids[name]] = submit(paths[name], ids[name], n, tmp / f"{kind}-{name}.json", env, wait_for=barrier)
        deadline = time.monotonic() + 300
        while sched.get_job(ids[name]) is None:
            if procs[ids[name]].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job {ids[name]} was not admitted: {procs[ids[name]].communicate()[0][-2000:]}")
            time.sleep(0.2)
    barrier.touch()
    first = ids[JOBS[0]]
    deadline = time.monotonic() + timeout_s
    while getattr(sched.get_job(first), "iterations_done", 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{first} did not complete an iteration")
        time.sleep(0.1)
    rec = sched.get_job(first)
    if kind == "scheduler":
        target = sched_name
    elif kind == "controller":
        target = rec.controller
    else:
        target = worker_name(rec.placement.rollout_nodes[0])
    stop, unavailable = threading.Event(), {}
    probe = threading.Thread(target=_probe_unavailable, args=(sched, stop, unavailable))
    time.sleep(0.2)  # inside the next iteration's phases
    ray.kill(ray.get_actor(target, namespace=NAMESPACE), no_restart=False)
    probe.start()
    rcs = wait_all(procs, timeout_s)
    stop.set()
    probe.join()
    # let the scheduler's reconcile loop release ended jobs' workers (it runs every second)
    time.sleep(5.0)
    recs = {j: sched.get_job(j) for j in ids.values()}
    failed = {j: r.error for j, r in recs.items() if r.state == "failed"}
    done = [j for j, r in recs.items() if r.state == "finished" and r.iterations_done == n]
    hosted = {}
    spec = sched.cluster_spec()
    nodes = [f"{pool}-{i}" for pool, p in (("rollout", spec.rollout_pool), ("train", spec.train_pool))
             for i in range(p.num_nodes)]
    for node in nodes:
        try:
            h = WorkerHandle.of_node(node).hosted(timeout_s=30)
        except Exception:
            continue
        mine = sorted(v.job_id for v in h if v.job_id in ids.values())
        if mine:
            hosted[node] = mine
    files = sorted(str(p.name) for p in (tmp / "ckpt").glob("*") if any(j in p.name for j in ids.values())) \
        if (tmp / "ckpt").is_dir() else []
    live_groups = {g.group_id for g in sched.list_groups()}
    ended_groups = {r.group_id for r in recs.values() if r.group_id} - live_groups
    ctrls = []
    for a in ray.util.list_named_actors(all_namespaces=True):
        name = a["name"] if isinstance(a, dict) else a
        if any(name == f"{sched_name}-{g}" for g in ended_groups):
            ctrls.append(name)
    recovered, identical = {}, []
    for name, jid in ids.items():
        try:
            res = json.loads((tmp / f"{kind}-{name}.json").read_text())
        except (OSError, ValueError):
            continue
        recovered[jid] = sum(1 for r in res.get("timeline") or [] if r.get("switch") in ("recovered", "replayed"))
        if res.get("ok") and res.get("weights_sha256") == solo[name]:
            identical.append(jid)
    return {"killed": kind, "actor": target, "job_ids": sorted(ids.values()), "iterations": n,
            "phases_redone_after_a_lost_worker": recovered,
            "jobs_bit_identical_to_solo": len(identical),
            "api_unavailable_s": round(unavailable.get("s", 0.0), 3),
            "jobs_failed": len(failed), "failed": failed,
            "jobs_finished_all_iterations": len(done),
            "process_returncodes": {j: rc for j, (rc, _) in rcs.items()},
            "leaked": {"hosted": hosted, "cold_start_files": files, "controllers_of_dissolved_groups": sorted(ctrls),
                       "total": sum(len(v) for v in hosted.values()) + len(files) + len(ctrls)}}


def main(argv=None) -> int:
    args = parse_args(argv)
    n = args.iterations or (4 if args.quick else 8)
    kinds = [k for k in args.kills.split(",") if k]
    bad = [k for k in kinds if k not in KILLS]
    if bad:
        raise SystemExit(f"--kills: unknown {bad}; choose from {list(KILLS)}")
    from rich.console import Console
    from rich.table import Table

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from actors.ops.local_cluster import start_local_cluster
    from rollmux.config import load_cluster

    con = Console(width=None if sys.stdout.isatty() else 150)
    tmp = Path(tempfile.mkdtemp(prefix="rollmux-chaos-"))
    paths = {name: Path(args.jobs_dir) / f"{name}.yaml" for name in JOBS}
    spec = load_cluster(args.cluster)
    solo = solo_digests(paths, n)
    lc = start_local_cluster(spec, head_cpus=2, node_cpus=1, object_store_mb=128)
    rows = []
    try:
        sched_name = f"rollmux-chaos-{uuid.uuid4().hex[:6]}"
        sched = SchedulerHandle(get_or_create_scheduler(spec, name=sched_name))
        sched.health(timeout_s=None)
        env = {**os.environ, "RAY_ADDRESS": lc.address, "ROLLMUX_SCHEDULER_NAME": sched_name,
               "ROLLMUX_CKPT_DIR": str(tmp / "ckpt"), "PYTHONPATH": str(ROOT)}
        for kind in kinds:
            con.print(f"run with a {kind} kill ({len(JOBS)} jobs x {n} iterations)")
            rows.append(one_run(kind, sched, sched_name, env, paths, n, tmp, args.timeout_s, solo))
    finally:
        lc.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"iterations_per_job": n, "jobs": list(JOBS), "cluster": Path(args.cluster).name,
           "load_avg": list(os.getloadavg()), "kills": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    t = Table(title=f"chaos run: {len(JOBS)} GRPO jobs x {n} iterations per kill")
    for c in ("killed", "actor", "API unavailable s", "jobs failed", "finished all iterations",
              "bit-identical to solo", "phases redone", "leaked"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["killed"], r["actor"], f"{r['api_unavailable_s']:.2f}", str(r["jobs_failed"]),
                  f"{r['jobs_finished_all_iterations']}/{len(JOBS)}", f"{r['jobs_bit_identical_to_solo']}/{len(JOBS)}",
                  str(sum(r["phases_redone_after_a_lost_worker"].values())), str(r["leaked"]["total"]))
    con.print(t)
    con.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
