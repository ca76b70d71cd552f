"""Admission throughput and latency through HTTP (Ray Serve) against a scheduler holding many jobs.

Starts its own single-node local Ray (``ray.init(address="local")``; never touches other
clusters), a GlobalScheduler planning for an unbounded cluster (``configs/cluster_sim.yaml``),
pre-loads ``--preload`` jobs directly through the actor, deploys the Serve admission app on
127.0.0.1 and fires ``POST /v1/jobs`` (each a new job id) at 1, 8 and 32 concurrent clients.
Every level is bounded in request count and wall time. Writes ``results/bench_admission.json``:
one entry per level with ``clients``, ``requests``, ``requests_per_s``, ``p50_ms``, ``p90_ms``,
``p99_ms``, ``max_ms`` (client-side HTTP round trip; a percentile is ``null`` with fewer samples
than it needs: 100 for p90, 1,000 for p99, ``scripts/_bench.py``), ``status_counts`` and the
scheduler's own decision latency (``scheduler_decision``, same fields); then
the same levels for ``POST /v1/jobs:dry-run`` (``dry_run_levels``: no commit, no checkpoint).

Usage: ``python scripts/bench_admission.py [--preload 1000] [--requests 1000] [--levels 1,8,32]`` (~5 min on 2 cores)
Source: RollMux §7 "decision latency".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "scripts"))
from _bench import percentiles  # noqa: E402
from rollmux.config import CONFIG_DIR, ServeConfig, load_cluster  # noqa: E402
from rollmux.models import JobSpec, PhaseProfile  # noqa: E402


def make_spec(rng: random.Random, job_id: str) -> JobSpec:
    """A seeded RL job with worst-case phase times drawn like the paper's simulation (§7.5)."""
    size = rng.choice([7.0, 14.0, 32.0])
    return JobSpec(
        job_id=job_id, model_params_b=size, max_response_tokens=rng.choice([4096, 8192, 16384]),
        num_rollout_gpus=rng.choice([8, 16]), num_train_gpus=rng.choice([8, 16]), slo=round(rng.uniform(1.0, 2.0), 3),
        measured=PhaseProfile(t_roll_s=rng.uniform(50, 900), t_train_s=rng.uniform(50, 600), t_sync_s=rng.uniform(2, 20)),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_level(base_url: str, token: str, clients: int, n_requests: int, time_cap_s: float, rng: random.Random, tag: str,
                    path: str = "/v1/jobs") -> dict:
    import httpx

    specs = [make_spec(rng, f"bench-{tag}-c{clients}-{i:05d}").model_dump(mode="json") for i in range(n_requests)]
    lat_ms: list[float] = []
    sched_ms: list[float] = []
    status: dict[str, int] = {}
    queue: asyncio.Queue = asyncio.Queue()
    for s in specs:
        queue.put_nowait(s)
    deadline = time.monotonic() + time_cap_s
    headers = {"Authorization": f"Bearer {token}"}

    async def worker(client: "httpx.AsyncClient") -> None:
        while time.monotonic() < deadline:
            try:
                spec = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            try:
                r = await client.post(path, json=spec, headers=headers)
                code = str(r.status_code)
                if r.status_code in (200, 201, 409):
                    body = r.json()
                    d = body.get("decision", body)
                    if d.get("latency_ms") is not None:
                        sched_ms.append(float(d["latency_ms"]))
            except httpx.HTTPError as e:
                code = type(e).__name__
            lat_ms.append((time.perf_counter() - t0) * 1e3)
            status[code] = status.get(code, 0) + 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - t0
    a = np.asarray(lat_ms)
    return {
        "clients": clients,
        "requests": len(lat_ms),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(lat_ms) / wall, 2) if wall > 0 else None,
        **(percentiles(lat_ms, 2) if a.size else {"samples": 0}),
        "mean_ms": round(float(a.mean()), 2) if a.size else None,
        "scheduler_decision": percentiles(sched_ms, 3) if sched_ms else {"samples": 0},
        "status_counts": status,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preload", type=int, default=1000, help="jobs admitted through the actor before measuring")
    ap.add_argument("--requests", type=int, default=1000, help="HTTP admissions per concurrency level (>= 1,000 for a p99)")
    ap.add_argument("--levels", default="1,8,32", help="concurrent clients per level")
    ap.add_argument("--time-cap-s", type=float, default=90.0, help="wall-time bound per level")
    ap.add_argument("--cluster", default=str(CONFIG_DIR / "cluster_sim.yaml"))
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_admission.json"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from actors.local_cluster import use_ephemeral_ray_token

    use_ephemeral_ray_token()  # Ray token mode with a fresh token (never ~/.ray) unless RAY_AUTH_MODE is set
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from actors.global_scheduler import NAMESPACE, get_or_create_scheduler
    from serve_app import deploy

    cluster = load_cluster(args.cluster)
    rng = random.Random(args.seed)
    token = "bench-" + str(rng.getrandbits(64))
    tmp = Path(tempfile.mkdtemp(prefix="rollmux-bench-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace=NAMESPACE,
             object_store_memory=128 * 2**20, log_to_driver=False, logging_level="ERROR")
    try:
        # no GroupController actors: ~hundreds of groups would each start a process on this small host;
        # the measured path is HTTP -> Serve replica -> scheduler actor -> policy (Alg. 1) -> checkpoint
        sched = get_or_create_scheduler(cluster, checkpoint_path=str(tmp / "checkpoint"), name="rollmux-bench-scheduler",
                                        create_controllers=False)
        t0 = time.perf_counter()
        admitted = 0
        batch = 50
        for start in range(0, args.preload, batch):
            refs = [sched.admit.remote(make_spec(rng, f"pre-{i:05d}").model_dump(mode="json"))
                    for i in range(start, min(args.preload, start + batch))]
            admitted += sum(bool(d.get("admitted")) for d in ray.get(refs, timeout=600))
        preload_s = time.perf_counter() - t0
        health = ray.get(sched.health.remote(), timeout=60)
        print(f"pre-loaded {admitted}/{args.preload} jobs in {preload_s:.1f} s: {health}", flush=True)

        cfg = ServeConfig(port=free_port(), state_dir=tmp, request_timeout_s=120, scheduler_name="rollmux-bench-scheduler")
        base = deploy(cfg, token)
        levels = []
        for clients in (int(x) for x in args.levels.split(",")):
            res = asyncio.run(run_level(base, token, clients, args.requests, args.time_cap_s, rng, tag=str(args.seed)))
            print(json.dumps(res), flush=True)
            levels.append(res)
        dry = []  # the same decision without commit and checkpoint: HTTP + Serve + policy only
        for clients in (int(x) for x in args.levels.split(",")):
            res = asyncio.run(run_level(base, token, clients, args.requests, args.time_cap_s, rng,
                                        tag=f"dry{args.seed}", path="/v1/jobs:dry-run"))
            print("dry-run", json.dumps(res), flush=True)
            dry.append(res)
        out = {
            "benchmark": "admission through HTTP (Ray Serve + FastAPI -> GlobalScheduler actor)",
            "endpoint": "POST /v1/jobs on 127.0.0.1",
            "cluster_spec": Path(args.cluster).name,
            "scheduler": "GlobalScheduler actor (real policy + file checkpoint per admission), no GroupControllers",
            "preloaded_jobs": admitted,
            "preload_s": round(preload_s, 2),
            "scheduler_health_before": health,
            "scheduler_health_after": ray.get(sched.health.remote(), timeout=60),
            "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
                        "ray_num_cpus": 2, "note": "load from other work on the host lowers these figures"},
            "levels": levels,
            "dry_run_levels": dry,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.out}")
    finally:
        try:
            serve.shutdown()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        ray.shutdown()


if __name__ == "__main__":
    main()
