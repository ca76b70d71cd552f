#!/usr/bin/env python
"""The rollout service over HTTP vs the same workload in process, FIFO / prefix / mixed, with
repeats; a trainer that trains through it; what a request costs on the way in.

Workload: ``bench_rollout_sched.py``'s CPU-engine stream (:data:`bench_rollout_sched.CPU_SPEC`, the same
``Stream`` contents for a seed): a GRPO-like trainer runs N steps; each step submits a critical
batch of GRPO groups (over-sampled), each generation naming its reward query (``then``: the
service queues it when the sample ends, as the in-process trainer does, with no client round
trip), trains on the first ``prompts_per_step`` fully-scored groups, cancels the rest (batch
cancel), "trains" for ``train_s`` and advances the policy version; open-loop background:
evaluation sweeps, state queries with dialogue history, replay items and a burst of reward
queries, released at their arrival times.

* in process: ``bench_rollout_sched.run_policy(policy, CPU_SPEC, "cpu", seed)`` (scheduler + CPU
  engine in this process, ``actors.rollout.engine.serve``);
* over HTTP: the same trainer as an asyncio client of the service through the rollout ingress
  (``/v1/rollouts``, results streamed over NDJSON, up to ``--connections`` concurrent
  connections), one engine replica, the service restarted with each policy behind the same API.

Each (policy, side) runs ``--repeats`` times with seeds ``seed .. seed + repeats - 1`` (fifo and
mixed; prefix once), seed by seed with both sides of a seed back to back (the service restarted with
each policy): the mixed/FIFO ratios are taken per seed and reported as mean, standard deviation,
min and max. Figures per run: trainer idle ratio (trainer side: sum over steps of
first critical submit -> the step's last needed result, over the run's wall time), short-request
p99 queueing delay (reward and state queries, dispatch - submission on the scheduler's clock),
throughput.

Per-request cost of the path (``overhead``): one-request submits, through Serve's proxy and
through the rollout ingress, (a) one after another on an idle service, (b) with 64 connections
open (63 streams waiting on results, one client submitting), (c) 64 connections all submitting
at once (latency and wall time per request); and the service actor's own handling time.

The trainer of ``examples/rollout_service_trainer.py`` (tiny Llama, GRPO) trains through the
service over HTTP: per version the upload time, load time and bytes, whether every replica served
the trainer's weights (digest equal) after each step, and whether the run was bit-identical to the
same trainer generating in process. Memory: the service process's RSS before and while 1,000
requests are queued. ``os.getloadavg()`` beside every figure.

Usage:  .venv/bin/python scripts/bench_rollout_service.py [--quick] [--steps N] [--repeats R] [--connections 64]
Writes results/bench_rollout_service.json and results/bench_rollout_service.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_rollout_sched as brs  # noqa: E402
from _bench import percentiles  # noqa: E402

POLICIES = ("fifo", "prefix", "mixed")
STEP_TIMEOUT_S = 120.0  # bound on one trainer step's wait for its scored groups
DRAIN_S = 60.0  # bound on waiting for the background to drain after the last step
SERVICE_OVERRIDES = {"num_replicas": 1, "max_tokens_limit": 256, "queue_capacity": 4096}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _submit(c, items: list[dict], tries: int = 10) -> list[dict]:
    """``c.submit(items)``, retried after the ``Retry-After`` of a 429 / 503 (the service restarting
    between policies, a full queue), at most ``tries`` times."""
    from serve_api.trainer_client import RolloutError

    for k in range(tries):
        try:
            return await c.submit(items)
        except RolloutError as e:
            if e.status not in (429, 503) or k == tries - 1:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


def _body(r, version: int) -> dict:
    """A bench ``Request`` as a ``POST /v1/rollouts`` item, issued by policy ``version`` (the
    in-process scheduler does not look at a request's version; the service refuses old ones)."""
    return {"task_type": r.type.value, "prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens,
            "critical": r.critical, "policy_version": version, "task_family": r.task_family}


class HttpTrainer:
    """``bench_rollout_sched.TrainerSource`` as an HTTP client of the rollout service; each
    generation names its reward query (``then``), queued by the service when the sample ends."""

    def __init__(self, client, stream: "brs.Stream", connections: int, version: int):
        self.c, self.st, self.spec = client, stream, stream.s
        self.sem = asyncio.Semaphore(connections)
        self.inflight = self.peak_inflight = 0
        self.waits: list[float] = []
        self.short_ids: list[str] = []
        self.bg_ids: list[str] = []
        self.samples = 0
        self.version = version
        self.timeouts = 0

    async def _call(self, coro):
        async with self.sem:
            self.inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.inflight)
            try:
                return await coro
            finally:
                self.inflight -= 1

    async def submit(self, bodies: list[dict]) -> list[dict]:
        acc = []
        for i in range(0, len(bodies), 512):
            acc += await self._call(_submit(self.c, bodies[i:i + 512]))
        return acc

    async def background(self, t0: float, stop: asyncio.Event) -> None:
        bg = self.st.background()
        i = 0
        while i < len(bg) and not stop.is_set():
            now = time.monotonic() - t0
            due = []
            while i < len(bg) and bg[i].arrival_s <= now:
                due.append(bg[i])
                i += 1
            if due:
                ids = [a["id"] for a in await self.submit([_body(r, self.version) for r in due])]
                self.bg_ids += ids
                self.short_ids += [rid for rid, r in zip(ids, due) if r.is_short(4)]
            else:
                await asyncio.sleep(min(0.05, max(0.0, bg[i].arrival_s - now)))

    async def step(self, step: int) -> None:
        s = self.spec
        batch = self.st.critical_batch(step, 0.0)
        then = {"task_type": "reward", "prompt_token_ids": list(self.st.reward_sys), "output_tail_tokens": s.reward_tail,
                "max_tokens": 1}  # bench_rollout_sched.Stream.reward_for, run by the service
        t_submit = time.monotonic()
        acc = await self.submit([{**_body(r, self.version), "then": then} for r in batch])
        ids = [a["id"] for a in acc]
        reward_of = {a["chained_id"]: r for a, r in zip(acc, batch)}
        self.short_ids += list(reward_of)
        open_: dict[str, int] = {}
        for r in batch:
            g = r.request_id.rsplit("-k", 1)[0]
            open_[g] = open_.get(g, 0) + 1
        done: list[str] = []
        target = asyncio.Event()

        async def consume() -> None:
            async for res in self.c.stream(ids + list(reward_of), timeout_s=300):
                if res["id"] in reward_of:
                    if res["status"] != "finished":
                        continue
                    g = reward_of[res["id"]].request_id.rsplit("-k", 1)[0]
                    open_[g] -= 1
                    if open_[g] == 0 and g not in done:
                        done.append(g)
                        if len(done) >= s.prompts_per_step:
                            target.set()
                elif res["status"] == "finished":
                    self.samples += 1

        consumer = asyncio.create_task(consume())
        try:
            await asyncio.wait_for(target.wait(), STEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.timeouts += 1  # recorded; the step ends with what it has
        finally:
            self.waits.append(time.monotonic() - t_submit)
            consumer.cancel()
        await self._call(self.c.cancel(ids))  # over-sampling: the leftovers (their chained rewards follow)
        await asyncio.sleep(s.train_s)
        self.version += 1
        await self._call(self.c.set_policy(self.version))


async def http_run(base: str, token: str, spec, seed: int, connections: int) -> dict:
    from serve_api.trainer_client import AsyncTrainerClient

    c = await AsyncTrainerClient.create(base, token, timeout_s=300, max_connections=connections + 8, ingress=True)
    try:
        st0 = await c.stats()  # the service may have been restarted: the first read re-finds it
        tr = HttpTrainer(c, brs.Stream(spec, seed), connections, st0["policy_version"])
        stop = asyncio.Event()  # never set: the background runs to its horizon, as in process
        t0 = time.monotonic()
        bg = asyncio.create_task(tr.background(t0, stop))
        for k in range(spec.steps):
            await tr.step(k)
        steps_s = time.monotonic() - t0
        await bg  # every background request released (open loop, up to the stream's horizon)
        for i in range(0, len(tr.bg_ids), 512):  # as in process: the run ends when the background drained
            async for _ in c.stream(tr.bg_ids[i:i + 512], timeout_s=max(1.0, DRAIN_S - (time.monotonic() - t0 - steps_s))):
                pass
        wall = time.monotonic() - t0
        for i in range(0, len(tr.bg_ids), 4096):  # whatever the drain bound left
            await c.cancel(tr.bg_ids[i:i + 4096])
        views = []
        for i in range(0, len(tr.short_ids), 512):  # the short requests' queueing delay, from the service
            async for v in c.stream(tr.short_ids[i:i + 512], timeout_s=60):
                views.append(v)
        waits = [v["timings"]["queue_wait_s"] for v in views if v["timings"]["queue_wait_s"] is not None]
        st = await c.stats()
        return {"trainer_idle_ratio": sum(tr.waits) / wall, "short_p99_wait_s": float(np.percentile(waits, 99)) if waits else None,
                "sample_throughput": (st["counters"]["samples"] - st0["counters"]["samples"]) / wall,
                "samples_seen_by_trainer": tr.samples, "prefix_hit_ratio": st["prefix_hit_ratio"],
                "steps": len(tr.waits), "wall_s": wall, "steps_s": steps_s, "short_requests": len(waits),
                "step_timeouts": tr.timeouts, "peak_concurrent_requests": tr.peak_inflight, "loadavg": _load()}
    finally:
        await c.aclose()


ONE = [{"task_type": "reward", "prompt_token_ids": [1, 2, 3], "max_tokens": 1}]


async def _sequential(c, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        await _submit(c, ONE)
        lat.append((time.perf_counter() - t) * 1e3)
    return lat


async def path_cost(base: str, token: str, ingress: bool, n: int, connections: int) -> dict:
    """One-request submit latency through one path (Serve's proxy, or the rollout ingress), ms:
    sequential on an idle service; with ``connections`` open (all but one are streams waiting on
    long requests); with ``connections`` clients submitting at once (and wall time per request)."""
    from serve_api.trainer_client import AsyncTrainerClient

    c = await AsyncTrainerClient.create(base, token, timeout_s=120, max_connections=connections + 4, ingress=ingress)
    try:
        await c.stats()
        await _sequential(c, 20)  # warm connections
        idle = await _sequential(c, n)
        # connections - 1 streams held open on long background requests, one client submitting
        held = [a["id"] for a in await _submit(c, [{"prompt_token_ids": [7] * 8, "max_tokens": 256, "background": True,
                                                    "ignore_eos": True}] * (connections - 1))]

        async def hold(rid: str) -> None:
            async for _ in c.stream([rid], timeout_s=120):
                pass

        holders = [asyncio.create_task(hold(rid)) for rid in held]
        await asyncio.sleep(0.5)
        open_ = await _sequential(c, n)
        for t in holders:
            t.cancel()
        await c.cancel(held)
        lat: list[float] = []
        t0 = time.perf_counter()

        async def client(k: int) -> None:
            lat.extend(await _sequential(c, k))

        per = max(1, n // connections)
        await asyncio.gather(*(client(per) for _ in range(connections)))
        wall_ms = (time.perf_counter() - t0) * 1e3
        st = await c.stats()
    finally:
        await c.aclose()
    return {"path": "rollout ingress" if ingress else "Serve proxy", "idle": percentiles(idle, 3),
            f"{connections}_open": percentiles(open_, 3), f"{connections}_active": percentiles(lat, 3),
            f"{connections}_active_wall_ms_per_request": round(wall_ms / len(lat), 3),
            "actor_submit_handling_ms_p50": st["submit_handling_ms_p50"], "loadavg": _load()}


def train_through_service(base: str, token: str, steps: int) -> dict:
    """``examples/rollout_service_trainer.py`` over HTTP (ingress) and in process: per version the
    upload and load time, bytes, digest equality; bit-identity of the two runs."""
    import torch

    import examples.rollout_service_trainer as ex
    from actors.rollout.engine import tiny_llama
    from serve_api.trainer_client import TrainerClient

    cfg = ex.TrainConfig(steps=steps)
    t0 = time.monotonic()
    http = ex.train(ex.HttpRollouts(TrainerClient(base, token, timeout_s=300, ingress=True)), cfg)
    wall = time.monotonic() - t0
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = tiny_llama()
    local = ex.train(ex.InProcessRollouts(model), cfg, model)
    per = [{"version": s["push"]["version"], "bytes": s["push"]["bytes"], "upload_and_load_s": round(s["push"]["push_s"], 4),
            "load_s": s["push"]["load_s"], "served_equal": s["served_equal"], "reward_mean": round(s["reward_mean"], 4),
            "same_tokens_as_in_process": s["outputs_sha256"] == r["outputs_sha256"],
            "same_weights_as_in_process": s["digest"] == r["digest"]} for s, r in zip(http["steps"], local["steps"])]
    return {"config": cfg.__dict__, "per_version": per, "hash_equal_every_step": all(p["served_equal"] for p in per),
            "bit_identical_to_in_process": http["final_digest"] == local["final_digest"]
            and all(p["same_tokens_as_in_process"] for p in per), "wall_s": round(wall, 3), "loadavg": _load()}


async def hold_1000(base: str, token: str, svc) -> dict:
    """RSS of the service before and while 1,000 long background requests are queued."""
    from serve_api.trainer_client import AsyncTrainerClient

    c = AsyncTrainerClient(base, token, timeout_s=120, max_connections=4)
    try:
        st0 = await c.stats()
        before, version = st0["service_rss_bytes"], st0["policy_version"]  # the trainer's current version
        ids = []
        for k in range(2):
            ids += [a["id"] for a in await _submit(c, [{"prompt_token_ids": [int(x) % 255 + 1 for x in range(k, k + 64)],
                                                      "max_tokens": 256, "background": True, "policy_version": version}
                                                     for _ in range(500)])]
        st = await c.stats()
        await c.cancel(ids)
        after = (await c.stats())
    finally:
        await c.aclose()
    return {"queued_and_running": st["queued"] + st["running"], "rss_before_bytes": before,
            "rss_holding_bytes": st["service_rss_bytes"], "rss_per_request_bytes": (st["service_rss_bytes"] - before) / 1000,
            "queue_capacity": st["queue_capacity"], "rss_after_cancel_bytes": after["service_rss_bytes"],
            "queued_after_cancel": after["queued"], "loadavg": _load()}


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "trainer_idle_ratio", "trainer idle ratio"),
                           (axes[1], "short_p99_wait_s", "short-request p99 wait (s)")):
        x = np.arange(len(POLICIES))
        for off, side, name in ((-0.2, "in_process", "in process"), (0.2, "http", "over HTTP")):
            vals = [[r[key] or 0 for r in res[side][p]] for p in POLICIES]
            ax.bar(x + off, [statistics.fmean(v) if v else 0 for v in vals], 0.4, label=name,
                   yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in vals], capsize=3)
        ax.set_xticks(x, POLICIES)
        ax.set_title(label + " (mean, std over seeds)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _spread(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": round(statistics.fmean(xs), 4), "std": round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0,
            "min": round(min(xs), 4), "max": round(max(xs), 4), "values": [round(x, 4) for x in xs]}


def _runs(seeds: list[int], p: str) -> list[int]:
    return seeds if p in ("fifo", "mixed") else seeds[:1]  # the ratio is mixed / FIFO; prefix once


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 steps, 3 repeats, 1,000 overhead samples per path")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default 3 quick, 6 full)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per policy and side (default 3 quick, 5 full)")
    ap.add_argument("--connections", type=int, default=64, help="concurrent HTTP connections of the trainer (16..64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_rollout_service.json")
    args = ap.parse_args(argv)
    steps = args.steps or (3 if args.quick else 6)
    seeds = [args.seed + k for k in range(args.repeats or (3 if args.quick else 5))]
    spec = replace(brs.CPU_SPEC, steps=steps, horizon_s=brs.CPU_SPEC.horizon_s * steps / 3)

    from actors.ops.local_cluster import use_ephemeral_ray_token

    use_ephemeral_ray_token()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from actors.scheduler.global_scheduler import NAMESPACE, get_or_create_scheduler
    from actors.rollout.service import ensure_rollout_service, service_name
    from rollmux.config import CONFIG_DIR, ServeConfig, load_cluster
    from serve_app import deploy

    res: dict = {"config": {"stream": spec.__dict__, "seeds": seeds, "quick": args.quick, "connections": args.connections,
                            "service": SERVICE_OVERRIDES, "cpus": os.cpu_count()},
                 "in_process": {p: [] for p in POLICIES}, "http": {p: [] for p in POLICIES}}
    tmp = Path(tempfile.mkdtemp(prefix="rollmux-bench-rollout-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace=NAMESPACE,
             object_store_memory=128 * 2**20, log_to_driver=False, logging_level="ERROR")
    sched_name = f"rollmux-bench-rollouts-{uuid.uuid4().hex[:6]}"
    token = uuid.uuid4().hex
    try:
        get_or_create_scheduler(load_cluster(CONFIG_DIR / "cluster_local.yaml"), checkpoint_path=str(tmp / "ckpt"),
                                name=sched_name, reconcile_s=None, metrics_enabled=False)
        base = deploy(ServeConfig(port=_free_port(), state_dir=tmp, scheduler_name=sched_name, request_timeout_s=120,
                                  max_ongoing_requests=256, app_name="rollmux-bench-rollouts"), token)
        name = service_name(sched_name)
        # seed by seed, both sides and every policy close together in time: a change of the host's load
        # (other work on its 2 cores) hits the runs a ratio compares alike
        for seed in seeds:
            for p in POLICIES:
                if seed not in _runs(seeds, p):
                    continue
                r = brs.run_policy(p, spec, "cpu", seed, max_wall_s=120)
                res["in_process"][p].append({k: r[k] for k in ("trainer_idle_ratio", "short_p99_wait_s",
                                                               "sample_throughput", "prefix_hit_ratio", "steps_done",
                                                               "makespan_s")} | {"seed": seed, "loadavg": _load()})
                print("in-process", p, json.dumps(res["in_process"][p][-1]), flush=True)
                h = ensure_rollout_service(name, overrides={**SERVICE_OVERRIDES, "policy": p})
                h.ready_sync(timeout_s=300)
                res["http"][p].append(asyncio.run(http_run(base, token, spec, seed, args.connections)) | {"seed": seed})
                print("http", p, json.dumps(res["http"][p][-1]), flush=True)
                if p == "mixed" and seed == seeds[-1]:
                    n = 1000 if args.quick else 3000
                    res["overhead"] = {"ingress": asyncio.run(path_cost(base, token, True, n, args.connections)),
                                       "serve_proxy": asyncio.run(path_cost(base, token, False, n, args.connections))}
                    print("overhead", json.dumps(res["overhead"]), flush=True)
                    res["training"] = train_through_service(base, token, 3 if args.quick else 6)
                    print("training", json.dumps(res["training"]), flush=True)
                    res["hold_1000"] = asyncio.run(hold_1000(base, token, h))
                    print("hold_1000", json.dumps(res["hold_1000"]), flush=True)
                h.shutdown_sync()
                time.sleep(1.0)
    finally:
        serve.shutdown()
        ray.shutdown()

    def ratios(side: str, key: str) -> list[float]:
        by = {r["seed"]: r[key] for r in res[side]["fifo"]}
        return [r[key] / by[r["seed"]] for r in res[side]["mixed"] if r[key] is not None and by.get(r["seed"])]

    g = {}
    for key in ("trainer_idle_ratio", "short_p99_wait_s"):
        rin, rhttp = _spread(ratios("in_process", key)), _spread(ratios("http", key))
        # the advantage is kept when the mean mixed/FIFO ratio over HTTP is at most 10% above the one in process
        ok = None if not rin["n"] or not rhttp["n"] else rhttp["mean"] <= 1.1 * rin["mean"]
        g[key] = {"mixed_over_fifo_in_process": rin, "mixed_over_fifo_http": rhttp, "advantage_kept_within_10pct": ok,
                  "difference_within_one_std": None if ok is None else
                  abs(rhttp["mean"] - rin["mean"]) <= max(rin["std"], rhttp["std"])}
    ing = res["overhead"]["ingress"]
    c = args.connections
    g["overhead_ms"] = {"path": "rollout ingress", "at_connections_open": ing[f"{c}_open"], "goal_p50_ms": 5.0,
                        "goal_p99_ms": 20.0, "met": (ing[f"{c}_open"]["p50_ms"] or 1e9) <= 5.0
                        and (ing[f"{c}_open"]["p99_ms"] or 1e9) <= 20.0,
                        "idle": ing["idle"], "all_connections_submitting": ing[f"{c}_active"],
                        "serve_proxy_idle_p50_ms": res["overhead"]["serve_proxy"]["idle"]["p50_ms"]}
    g["training"] = {"hash_equal_every_step": res["training"]["hash_equal_every_step"],
                     "bit_identical_to_in_process": res["training"]["bit_identical_to_in_process"]}
    g["hold_1000"] = {"rss_per_request_bytes": res["hold_1000"]["rss_per_request_bytes"],
                      "bounded_by_queue_capacity": res["hold_1000"]["queue_capacity"],
                      "met": res["hold_1000"]["queued_and_running"] >= 1000 and res["hold_1000"]["queued_after_cancel"] == 0}
    res["goals"] = g
    why = (f"this machine has {os.cpu_count()} cores shared with other work (load average {_load()}): over HTTP the "
           "ingress, the service actor, the engine replica actor and the trainer client all run on them beside the "
           "CPU engine, while in process only the engine and the trainer loop do")
    notes = {}
    for key in ("trainer_idle_ratio", "short_p99_wait_s"):
        if g[key]["advantage_kept_within_10pct"] is False:
            notes[key] = f"mean mixed/FIFO ratio over HTTP more than 10% above the one in process: {why}"
    if not g["overhead_ms"]["met"]:
        notes["overhead_ms"] = f"submit round trip through the ingress with {c} connections open above 5 / 20 ms: {why}"
    res["notes"] = notes
    res["loadavg_end"] = _load()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    plot(res, args.out.with_suffix(".png"))
    print("goals:", json.dumps(g, indent=1))
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
