"""Admission and read throughput through HTTP (Ray Serve) against a scheduler holding many jobs.

Starts its own single-node local Ray (``ray.init(address="local")``; never touches other
clusters), a GlobalScheduler planning for an unbounded cluster (``configs/cluster_sim.yaml``,
no GroupControllers: the measured path is HTTP -> Serve proxy -> replica -> scheduler actor ->
policy (Alg. 1) -> group-commit checkpoint -> published snapshot), pre-loads ``--preload`` jobs
through the actor, deploys the API with ``--replicas`` replicas on 127.0.0.1 and runs, for each
number of stored jobs in ``--stored`` (the scheduler is topped up between them):

* ``admit_closed``: ``--clients`` clients each posting ``POST /v1/jobs`` (a new job id each) as
  fast as answers come back (closed loop): the saturation throughput;
* ``admit_paced``: the same clients together offering ``--rate`` admissions/s (each client sends
  on its own schedule, or at once when late): latency at the goal rate; ``admit_paced_low``: the
  same at ``--rate-low`` (50/s, below this host's ceiling): latency when the path is not saturated;
* ``read_*``: the clients reading ``GET /v1/jobs?limit=20``, ``GET /v1/jobs/{id}`` and
  ``GET /v1/groups?limit=20`` (closed loop), served by the replicas from their snapshot copies;
* ``serve_ceiling_trivial_app``: the same clients on a FastAPI app answering ``{}`` behind the same
  Serve proxy (what Serve's HTTP path carries on this host at all); ``serve_ceiling_actor_hop``:
  ``POST`` of a job spec to that app, which calls a no-op actor and returns its answer (a write's
  ceiling: proxy -> replica -> one actor, nothing decided or written);
* ``read_job_app_in_process``: ``GET /v1/jobs/{id}`` on the API app built in this process (one
  replica's code and snapshot copy, no Serve proxy).

Every level is bounded in requests and wall time. Each entry: ``clients``, ``requests``,
``requests_per_s``, ``p50_ms`` / ``p90_ms`` / ``p99_ms`` / ``max_ms`` (client-side round trip; a
percentile is ``null`` with fewer samples than it needs: 100 for p90, 1,000 for p99),
``status_counts``, the load average before and after, and for admissions the scheduler's own
decision latency and the commits (published versions) per admission (group commit batch size).
Writes ``results/bench_admission.json`` with the goals and whether each was met.

``--sequential 1000`` runs only the sequential case instead: one client admitting 1,000 identical
jobs one after another on a scheduler as ``rollmux up`` runs it (reconcile loop and re-optimisation
on); goal p99 <= 50 ms and no admission over 200 ms (``sequential_identical`` in the results).

Usage: ``python scripts/bench_admission.py [--preload 1000] [--stored 1000,10000] [--clients 64]``
(~8 min on 2 cores). Source: RollMux §7 "decision latency"; goals: admissions >= 200/s with p99 <
100 ms at 64 clients, reads >= 1,000/s at 64 clients with two replicas, throughput flat from 1,000
to 10,000 stored jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from _bench import percentiles  # noqa: E402
from rollmux.config import CONFIG_DIR, ServeConfig, load_cluster  # noqa: E402
from rollmux.models import JobSpec, PhaseProfile  # noqa: E402

GOALS = {"admissions_per_s": 200.0, "admission_p99_ms": 100.0, "reads_per_s": 1000.0, "flat_ratio_min": 0.8}


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


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def run_level(base_url: str, token: str, clients: int, n_requests: int, time_cap_s: float, make_req,
                    rate_per_s: float = 0.0, transport=None) -> dict:
    """``n_requests`` requests from ``clients`` concurrent clients (closed loop, or paced to
    ``rate_per_s`` in total); ``make_req(i) -> (method, path, json | None)``. ``transport``: an
    httpx ASGI transport (the app in this process, no Serve proxy)."""
    import httpx

    lat_ms: list[float] = []
    sched_ms: list[float] = []
    status: dict[str, int] = {}
    next_i = iter(range(n_requests))
    t_start = time.monotonic()
    deadline = t_start + time_cap_s
    headers = {"Authorization": f"Bearer {token}"}
    interval = clients / rate_per_s if rate_per_s > 0 else 0.0

    async def worker(k: int, client: "httpx.AsyncClient") -> None:
        due = t_start + (k / clients) * interval
        while time.monotonic() < deadline:
            i = next(next_i, None)
            if i is None:
                return
            if interval:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due += interval
            method, path, body = make_req(i)
            t0 = time.perf_counter()
            try:
                r = await client.request(method, path, json=body, headers=headers)
                code = str(r.status_code)
                if method == "POST" and r.status_code in (200, 201, 409):
                    d = r.json()
                    d = d.get("decision", d)
                    if d.get("latency_ms") is not None:
                        sched_ms.append(float(d["latency_ms"]))
            except httpx.HTTPError as e:
                code = type(e).__name__
            lat_ms.append((time.perf_counter() - t0) * 1e3)
            status[code] = status.get(code, 0) + 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    la0 = load()
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=limits, transport=transport) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k, client) for k in range(clients)))
        wall = time.perf_counter() - t0
    ok = sum(v for k, v in status.items() if k.startswith("2"))
    out = {"clients": clients, "requests": len(lat_ms), "wall_s": round(wall, 3),
           "requests_per_s": round(len(lat_ms) / wall, 2) if wall > 0 else None,
           "ok_per_s": round(ok / wall, 2) if wall > 0 else None,
           **(percentiles(lat_ms, 2) if lat_ms else {"samples": 0}), "status_counts": status,
           "load_avg_before": la0, "load_avg_after": load()}
    if rate_per_s:
        out["offered_per_s"] = rate_per_s
    if sched_ms:
        out["scheduler_decision"] = percentiles(sched_ms, 3)
    return out


def deploy_ceiling(replicas: int) -> None:
    """A trivial FastAPI app on the same Serve proxy, same replica count and settings: ``GET
    /ceiling/x`` -> ``{}`` (the most requests/s Serve's HTTP path carries on this host) and ``POST
    /ceiling/hop`` -> one call of a no-op actor, its answer returned (what a write's extra hop,
    replica -> one actor, leaves of it)."""
    import ray
    from fastapi import FastAPI
    from ray import serve

    @ray.remote(num_cpus=0)
    class Noop:
        async def echo(self, body: dict) -> dict:
            return body

    noop = Noop.options(name="bench-noop", lifetime="detached", get_if_exists=True).remote()
    app = FastAPI()

    @app.get("/x")
    async def x() -> dict:
        return {}

    @app.post("/hop")
    async def hop(body: dict) -> dict:
        return await ray.get_actor("bench-noop").echo.remote(body)

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256,
                      logging_config={"enable_access_log": False})
    @serve.ingress(app)
    class Ceiling:
        pass

    serve.run(Ceiling.options(num_replicas=replicas).bind(), name="ceiling", route_prefix="/ceiling")


async def inprocess_reads(token: str, args, ids: list[str]) -> dict:
    """``GET /v1/jobs/{id}`` through the FastAPI app built in this process (a replica's code and
    snapshot copy, following the real scheduler actor), called over httpx's ASGI transport: what
    one replica sustains without the Serve proxy's hop."""
    import httpx

    from serve_app import AppSettings, SchedulerClient, _sha256, create_app

    app = create_app(AppSettings(token_sha256=_sha256(token)), SchedulerClient("rollmux-bench-scheduler", 120.0))
    return await run_level("http://app", token, args.clients, args.requests, args.time_cap_s,
                           lambda i: ("GET", f"/v1/jobs/{ids[i % len(ids)]}", None),
                           transport=httpx.ASGITransport(app=app))


LEVELS = (("admit_closed", "POST /v1/jobs, closed loop"), ("admit_paced", "POST /v1/jobs, offered 200/s"),
          ("admit_paced_low", "POST /v1/jobs, offered 50/s"),
          ("read_jobs_page", "GET /v1/jobs?limit=20"), ("read_job", "GET /v1/jobs/{id}"),
          ("read_groups_page", "GET /v1/groups?limit=20"), ("serve_ceiling_trivial_app", "GET of a trivial app (Serve's ceiling)"),
          ("serve_ceiling_actor_hop", "POST of a trivial app calling a no-op actor (a write's ceiling)"),
          ("read_job_app_in_process", "GET /v1/jobs/{id}, the app in-process (no proxy)"))


SEQ_GOALS = {"p99_ms": 50.0, "max_ms": 200.0}


def sequential_case(args, cluster, token: str, tmp: Path) -> None:
    """One client admitting ``args.sequential`` identical jobs one after another (each POST sent
    when the previous answer came back) through HTTP, on a GlobalScheduler with the actor's
    defaults (reconcile loop with the admissions' re-optimisation, checkpoint compaction off the
    reply path): per admission the round trip, by stored-job count; p50 / p99 / max, the admissions
    over 200 ms and the scheduler's counters. Merged into ``--out`` as ``sequential_identical``."""
    import httpx

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from serve_app import deploy

    name = "rollmux-bench-seq-scheduler"
    sched = SchedulerHandle(get_or_create_scheduler(cluster, checkpoint_path=str(tmp / "checkpoint-seq"), name=name,
                                                    metrics_enabled=False))
    cfg = ServeConfig(port=free_port(), state_dir=tmp, request_timeout_s=120, scheduler_name=name, num_replicas=1)
    base = deploy(cfg, token)
    spec = make_spec(random.Random(7), "x").model_dump(mode="json")
    lat: list[float] = []
    codes: dict[str, int] = {}
    la0 = load()
    deadline = time.monotonic() + 20 * 60  # bounded in time as in count
    with httpx.Client(base_url=base, timeout=60.0, headers={"Authorization": f"Bearer {token}"}) as c:
        for i in range(args.sequential):
            if time.monotonic() > deadline:
                break
            t0 = time.perf_counter()
            r = c.post("/v1/jobs", json={**spec, "job_id": f"seq-{i:05d}"})
            lat.append((time.perf_counter() - t0) * 1e3)
            codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
    health = sched.health(timeout_s=60)
    by_k = {}
    for lo in range(0, len(lat), 250):
        part = lat[lo: lo + 250]
        by_k[f"{lo}-{lo + len(part) - 1}"] = {"p50_ms": round(sorted(part)[len(part) // 2], 2), "max_ms": round(max(part), 2)}
    entry = {"admissions": len(lat), "status_counts": codes, **percentiles(lat, 2),
             "over_200_ms": sum(x > 200 for x in lat), "slowest": sorted(((round(x, 1), i) for i, x in enumerate(lat)),
                                                                          reverse=True)[:10],
             "by_stored_jobs": by_k, "load_avg_before": la0, "load_avg_after": load(),
             "scheduler": {k: getattr(health, k) for k in ("jobs", "groups", "checkpoint_seq", "checkpoint_base_seq",
                                                       "compactions_inline", "compactions_off_reply", "reopt_planned",
                                                       "reopt_applied", "reopt_stale")},
             "goals": SEQ_GOALS, "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    entry["goal_met"] = (entry.get("p99_ms") is not None and entry["p99_ms"] <= SEQ_GOALS["p99_ms"]
                         and entry["max_ms"] <= SEQ_GOALS["max_ms"])
    out_path = Path(args.out)
    out = json.loads(out_path.read_text()) if out_path.is_file() else {}
    out["sequential_identical"] = entry
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2))
    print(json.dumps(entry))
    print(f"wrote {out_path}")


def table(out: dict) -> str:
    """The README / docs table of a results file (markdown)."""
    rows = ["| stored jobs | level | ok/s | p50 ms | p99 ms | load avg (1 min) before / after | admissions per commit |",
            "|---:|---|---:|---:|---:|---|---:|"]
    for r in out["runs"]:
        for key, label in LEVELS:
            x = r.get(key)
            if x:
                rows.append(f"| {r['stored_jobs']:,} | {label} | {x['ok_per_s']:.0f} | {x['p50_ms']:.0f} | "
                            f"{'-' if x.get('p99_ms') is None else round(x['p99_ms'])} | "
                            f"{x['load_avg_before'][0]:.1f} / {x['load_avg_after'][0]:.1f} | "
                            f"{x.get('admissions_per_commit', '')} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preload", type=int, default=1000, help="jobs held before the first measurement")
    ap.add_argument("--stored", default="1000,10000", help="stored-job counts to measure at (topped up between)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1500, help="requests per level (>= 1,000 for a p99)")
    ap.add_argument("--rate", type=float, default=200.0, help="offered admissions/s of the paced level")
    ap.add_argument("--rate-low", type=float, default=50.0,
                    help="offered admissions/s of a second paced level, below the host's ceiling (latency unsaturated)")
    ap.add_argument("--time-cap-s", type=float, default=60.0, help="wall-time bound per level")
    ap.add_argument("--cluster", default=str(CONFIG_DIR / "cluster_sim.yaml"))
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_admission.json"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sequential", type=int, default=0, metavar="N",
                    help="only the sequential case: one client admitting N identical jobs one after another on a "
                         "scheduler as `rollmux up` runs it (reconcile loop, background compaction, re-optimisation "
                         "child); merged into --out as `sequential_identical`")
    ap.add_argument("--print-table", metavar="JSON", help="print the markdown table of a results file and exit")
    args = ap.parse_args()
    if args.print_table:
        print(table(json.loads(Path(args.print_table).read_text())))
        return

    from actors.ops.local_cluster import use_ephemeral_ray_token

    use_ephemeral_ray_token()  # Ray token mode with a fresh token (never ~/.ray) unless RAY_AUTH_MODE is set
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from actors.scheduler.global_scheduler import NAMESPACE, get_or_create_scheduler
    from actors.handles import SchedulerHandle, gather
    from serve_app import deploy

    cluster = load_cluster(args.cluster)
    rng = random.Random(args.seed)
    token = "bench-" + str(rng.getrandbits(64))
    tmp = Path(tempfile.mkdtemp(prefix="rollmux-bench-"))
    stored_levels = [int(x) for x in args.stored.split(",")]
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace=NAMESPACE,
             object_store_memory=128 * 2**20, log_to_driver=False, logging_level="ERROR")
    n_pre = 0

    def top_up(sched, target: int) -> float:
        """Admit through the actor until it holds ``target`` active jobs; seconds taken."""
        nonlocal n_pre
        t0 = time.perf_counter()
        last = -1
        for _ in range(target // 200 + 100):  # bounded: every batch must admit something
            held = sched.health(timeout_s=120).jobs
            if held >= target:
                return time.perf_counter() - t0
            if held <= last:
                raise RuntimeError(f"top-up stalled at {held} of {target} jobs: the last batch admitted none")
            last = held
            calls = [sched.admit_batched_nowait(make_spec(rng, f"pre-{n_pre + i:06d}"), False, False, "chosen")
                     for i in range(min(200, target - held))]  # group commit: one write per batch
            n_pre += len(calls)
            gather(calls, timeout_s=600)
        raise RuntimeError(f"top-up did not reach {target} jobs within its bound of batches")

    if args.sequential:
        try:
            sequential_case(args, cluster, token, tmp)
        finally:
            _teardown(tmp)
        return
    try:
        # no drivers attach here: no reconcile loop and no exported metrics (what the old test-only
        # flag switched off for this scheduler)
        sched = SchedulerHandle(get_or_create_scheduler(cluster, checkpoint_path=str(tmp / "checkpoint"),
                                                        name="rollmux-bench-scheduler", reconcile_s=None,
                                                        metrics_enabled=False))
        cfg = ServeConfig(port=free_port(), state_dir=tmp, request_timeout_s=120, scheduler_name="rollmux-bench-scheduler",
                          num_replicas=args.replicas, max_ongoing_requests=256, max_pending_writes=1024,
                          max_queued_requests=4096)
        base = deploy(cfg, token)
        deploy_ceiling(args.replicas)
        runs = []
        for target in stored_levels:
            took = top_up(sched, max(target, args.preload))
            h0 = sched.health(timeout_s=60)
            print(f"holding {h0.jobs} jobs ({took:.1f} s to top up)", flush=True)
            ids = [f"pre-{i:06d}" for i in range(0, n_pre, max(1, n_pre // 500))]
            tag = f"s{target}-{args.seed}"
            specs = [make_spec(rng, f"bench-{tag}-{i:05d}").model_dump(mode="json") for i in range(2 * args.requests)]
            entry = {"stored_jobs": h0.jobs, "groups": h0.groups, "top_up_s": round(took, 1)}
            asyncio.run(run_level(base, token, 8, 100, 30, lambda i: ("GET", "/v1/jobs?limit=20", None)))  # warm-up
            v0 = h0.snapshot_version
            entry["admit_closed"] = asyncio.run(run_level(
                base, token, args.clients, args.requests, args.time_cap_s, lambda i: ("POST", "/v1/jobs", specs[i])))
            v1 = sched.health(timeout_s=60).snapshot_version
            n_adm = entry["admit_closed"]["status_counts"].get("201", 0)
            entry["admit_closed"]["admissions_per_commit"] = round(n_adm / max(1, v1 - v0), 2)
            print("admit_closed", json.dumps(entry["admit_closed"]), flush=True)
            entry["admit_paced"] = asyncio.run(run_level(
                base, token, args.clients, args.requests, args.time_cap_s,
                lambda i: ("POST", "/v1/jobs", specs[args.requests + i]), rate_per_s=args.rate))
            print("admit_paced", json.dumps(entry["admit_paced"]), flush=True)
            low = [make_spec(rng, f"bench-{tag}-low-{i:05d}").model_dump(mode="json") for i in range(args.requests)]
            entry["admit_paced_low"] = asyncio.run(run_level(
                base, token, args.clients, args.requests, args.time_cap_s,
                lambda i: ("POST", "/v1/jobs", low[i]), rate_per_s=args.rate_low))
            print("admit_paced_low", json.dumps(entry["admit_paced_low"]), flush=True)
            for name, req in (("read_jobs_page", lambda i: ("GET", "/v1/jobs?limit=20", None)),
                              ("read_job", lambda i: ("GET", f"/v1/jobs/{ids[i % len(ids)]}", None)),
                              ("read_groups_page", lambda i: ("GET", "/v1/groups?limit=20", None))):
                entry[name] = asyncio.run(run_level(base, token, args.clients, args.requests, args.time_cap_s, req))
                print(name, json.dumps(entry[name]), flush=True)
            # Serve's own ceiling on this host: a FastAPI app answering {} through the same proxy
            entry["serve_ceiling_trivial_app"] = asyncio.run(run_level(
                base, token, args.clients, args.requests, args.time_cap_s, lambda i: ("GET", "/ceiling/x", None)))
            print("serve_ceiling_trivial_app", json.dumps(entry["serve_ceiling_trivial_app"]), flush=True)
            entry["serve_ceiling_actor_hop"] = asyncio.run(run_level(
                base, token, args.clients, args.requests, args.time_cap_s,
                lambda i: ("POST", "/ceiling/hop", specs[i])))
            print("serve_ceiling_actor_hop", json.dumps(entry["serve_ceiling_actor_hop"]), flush=True)
            # the same reads answered by the API app in this process (one replica's code, no Serve proxy)
            entry["read_job_app_in_process"] = asyncio.run(inprocess_reads(token, args, ids))
            print("read_job_app_in_process", json.dumps(entry["read_job_app_in_process"]), flush=True)
            runs.append(entry)
        first, last = runs[0], runs[-1]
        flat = (last["admit_closed"]["ok_per_s"] or 0) / max(1e-9, first["admit_closed"]["ok_per_s"] or 0)
        paced = first["admit_paced"]
        reads = max(first[k]["ok_per_s"] or 0 for k in ("read_jobs_page", "read_job", "read_groups_page"))
        ceiling = first["serve_ceiling_trivial_app"]["ok_per_s"] or 0
        hop = first["serve_ceiling_actor_hop"]["ok_per_s"] or 0
        verdict = {
            "admissions_per_s_closed_64": first["admit_closed"]["ok_per_s"],
            "admissions_per_s_paced": paced["ok_per_s"], "admission_p99_ms_paced": paced.get("p99_ms"),
            "admissions_goal_met": (paced["ok_per_s"] or 0) >= 0.98 * GOALS["admissions_per_s"]
            and paced.get("p99_ms") is not None and paced["p99_ms"] < GOALS["admission_p99_ms"],
            "reads_per_s_best": reads, "reads_goal_met": reads >= GOALS["reads_per_s"],
            "serve_trivial_app_per_s": ceiling, "reads_over_serve_ceiling": round(reads / max(1e-9, ceiling), 3),
            "serve_actor_hop_per_s": hop,
            "admissions_over_actor_hop_ceiling": round((first["admit_closed"]["ok_per_s"] or 0) / max(1e-9, hop), 3),
            "admissions_closed_over_ceiling_by_stored_jobs": {
                r["stored_jobs"]: round((r["admit_closed"]["ok_per_s"] or 0)
                                        / max(1e-9, r["serve_ceiling_actor_hop"]["ok_per_s"] or 0), 3) for r in runs},
            "reads_per_s_app_in_process": first["read_job_app_in_process"]["ok_per_s"],
            "admissions_closed_ratio_last_over_first": round(flat, 3),
            "admission_p99_ms_paced_low": first["admit_paced_low"].get("p99_ms"),
            "admissions_per_s_paced_low": first["admit_paced_low"]["ok_per_s"],
            "admissions_closed_ratio_last_over_first_vs_ceiling": round(
                flat * (first["serve_ceiling_actor_hop"]["ok_per_s"] or 0)
                / max(1e-9, last["serve_ceiling_actor_hop"]["ok_per_s"] or 0), 3),
            "flat_goal_met": flat >= GOALS["flat_ratio_min"],
        }
        out = {
            "benchmark": "admission and reads through HTTP (Ray Serve + FastAPI -> GlobalScheduler actor)",
            "endpoints": "POST /v1/jobs, GET /v1/jobs?limit=20, GET /v1/jobs/{id}, GET /v1/groups?limit=20 on 127.0.0.1",
            "cluster_spec": Path(args.cluster).name,
            "scheduler": "GlobalScheduler actor: real policy, group-commit file checkpoint, published snapshot; "
                         "no GroupControllers",
            "replicas": args.replicas, "clients": args.clients, "goals": GOALS, "verdict": verdict,
            "machine": {"cpus": os.cpu_count(), "ray_num_cpus": 2, "load_avg_at_end": load(),
                        "note": "one 2-core host shared with other work: the load average says how much; the client, "
                                "Serve proxy, replicas and scheduler all run on these 2 cores"},
            "runs": runs,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
        print(table(out))
        print(json.dumps(verdict))
        print(f"wrote {args.out}")
    finally:
        _teardown(tmp)


def _teardown(tmp: Path) -> None:
    """Serve, Ray and the run's checkpoint directory down: nothing left in /tmp."""
    import ray
    from ray import serve

    try:
        serve.shutdown()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
