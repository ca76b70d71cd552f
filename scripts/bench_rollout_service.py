#!/usr/bin/env python
"""The rollout service over HTTP vs the same workload in process, FIFO / prefix / mixed.

Workload: ``bench_rollout_sched.py``'s CPU-engine stream (:data:`bench_rollout_sched.CPU_SPEC`, the same
``Stream`` and seed, so the same request contents): a GRPO-like trainer runs N steps; each step
submits a critical batch of GRPO groups (over-sampled), sends a critical reward query for each
finished sample, trains on the first ``prompts_per_step`` fully-scored groups, cancels the rest
(batch cancel), "trains" for ``train_s`` and advances the policy version (``POST /v1/policy``);
open-loop background: evaluation sweeps, state queries with dialogue history, replay items and a
burst of reward queries, released at their arrival times.

* in process: ``bench_rollout_sched.run_policy(policy, CPU_SPEC, "cpu")`` (scheduler + CPU engine
  in this process, ``actors.rollout.engine.serve``);
* over HTTP: the same trainer as an asyncio client of the service (``/v1/rollouts``, results
  streamed over NDJSON, up to ``--connections`` concurrent connections), one engine replica,
  the service restarted with each policy behind the same API.

Figures per policy: trainer idle ratio (trainer side: sum over steps of first critical submit ->
the step's last needed result, over the run's wall time), short-request p99 queueing delay (reward
and state queries, dispatch - submission on the scheduler's clock), throughput; the mixed/FIFO
ratios in process and over HTTP. Service overhead: p50 of one-request ``POST /v1/rollouts`` round
trips on an idle service (and the actor's own handling time). Memory: the service process's RSS
before and while 1,000 requests are queued. ``os.getloadavg()`` beside every figure.

Usage:  .venv/bin/python scripts/bench_rollout_service.py [--quick] [--steps N] [--connections 64]
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
    """``bench_rollout_sched.TrainerSource`` as an HTTP client of the rollout service."""

    def __init__(self, client, stream: "brs.Stream", connections: int):
        self.c, self.st, self.spec = client, stream, stream.s
        self.sem = asyncio.Semaphore(connections)
        self.inflight = self.peak_inflight = 0
        self.waits: list[float] = []
        self.short_ids: list[str] = []
        self.bg_ids: list[str] = []
        self.reward_latency_ms: list[float] = []
        self.samples = 0
        self.version = 0
        self.timeouts = 0

    async def _call(self, coro):
        async with self.sem:
            self.inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.inflight)
            try:
                return await coro
            finally:
                self.inflight -= 1

    async def submit(self, reqs) -> list[str]:
        ids = []
        for i in range(0, len(reqs), 512):
            acc = await self._call(_submit(self.c, [_body(r, self.version) for r in reqs[i:i + 512]]))
            ids += [a["id"] for a in acc]
        return ids

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
                ids = await self.submit(due)
                self.bg_ids += ids
                self.short_ids += [rid for rid, r in zip(ids, due) if r.is_short(4)]
            else:
                await asyncio.sleep(min(0.05, max(0.0, bg[i].arrival_s - now)))

    async def reward(self, gen, out_tokens, open_: set, group: str, done: list, target: asyncio.Event) -> None:
        from rollmux.rollout_sched import Completion

        rw = self.st.reward_for(gen, Completion(gen.request_id, tuple(out_tokens), 0.0), 0.0, critical=True)
        t = time.perf_counter()
        rid = (await self.submit([rw]))[0]
        self.short_ids.append(rid)
        async for _ in self.c.stream([rid], timeout_s=120):
            pass
        self.reward_latency_ms.append((time.perf_counter() - t) * 1e3)
        open_.discard(gen.request_id)
        if not open_ and group not in done:
            done.append(group)
            if len(done) >= self.spec.prompts_per_step:
                target.set()

    async def step(self, step: int) -> None:
        s = self.spec
        batch = self.st.critical_batch(step, 0.0)
        t_submit = time.monotonic()
        ids = await self.submit(batch)
        by_id = dict(zip(ids, batch))
        groups: dict[str, set] = {}
        for r in batch:
            groups.setdefault(r.request_id.rsplit("-k", 1)[0], set()).add(r.request_id)
        done: list[str] = []
        tasks: list[asyncio.Task] = []
        target = asyncio.Event()

        async def consume() -> None:
            async for res in self.c.stream(ids, timeout_s=300):
                r = by_id[res["id"]]
                g = r.request_id.rsplit("-k", 1)[0]
                if res["status"] == "finished":
                    self.samples += 1
                    tasks.append(asyncio.create_task(self.reward(r, res["output_token_ids"], groups[g], g, done, target)))

        consumer = asyncio.create_task(consume())
        try:
            await asyncio.wait_for(target.wait(), STEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.timeouts += 1  # recorded; the step ends with what it has
        finally:
            self.waits.append(time.monotonic() - t_submit)
            consumer.cancel()
            for t in tasks:
                t.cancel()
        await self._call(self.c.cancel(ids))  # over-sampling: the leftovers
        await asyncio.sleep(s.train_s)
        await self._call(self.c.set_policy(step + 1))
        self.version = step + 1


async def http_run(base: str, token: str, spec, seed: int, connections: int) -> dict:
    from serve_api.trainer_client import AsyncTrainerClient

    c = AsyncTrainerClient(base, token, timeout_s=300, max_connections=connections + 8)
    try:
        await c.stats()  # the service may have been restarted: the first read re-finds it
        tr = HttpTrainer(c, brs.Stream(spec, seed), connections)
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
                "sample_throughput": st["counters"]["samples"] / wall, "samples_seen_by_trainer": tr.samples, "prefix_hit_ratio": st["prefix_hit_ratio"],
                "service_trainer_idle_ratio": st["trainer_idle_ratio"], "diversity_score": st["diversity_score"],
                "index_bytes": st["index_bytes"], "steps": len(tr.waits), "wall_s": wall, "steps_s": steps_s,
                "short_requests": len(waits), "step_timeouts": tr.timeouts,
                "reward_latency": percentiles(tr.reward_latency_ms, 2) if tr.reward_latency_ms else None,
                "peak_concurrent_requests": tr.peak_inflight, "loadavg": _load()}
    finally:
        await c.aclose()


async def overhead(base: str, token: str, n: int) -> dict:
    """One-request submits on an idle service, sequential: client round trip p50 (ms)."""
    from serve_api.trainer_client import AsyncTrainerClient

    c = AsyncTrainerClient(base, token, timeout_s=60, max_connections=4)
    lat, ids = [], []
    try:
        await c.stats()  # the service may have been restarted: the first read re-finds it
        for i in range(n):
            t = time.perf_counter()
            ids += [a["id"] for a in await _submit(c, [{"task_type": "reward", "prompt_token_ids": [1, 2, 3], "max_tokens": 1}])]
            lat.append((time.perf_counter() - t) * 1e3)
        st = await c.stats()
        rt = time.perf_counter()
        await c.stats()
        stats_ms = (time.perf_counter() - rt) * 1e3
    finally:
        await c.aclose()
    return {"submit_round_trip": percentiles(lat, 3), "actor_submit_handling_ms_p50": st["submit_handling_ms_p50"],
            "stats_read_ms": round(stats_ms, 3), "loadavg": _load()}


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
        ax.bar(x - 0.2, [res["in_process"][p][key] or 0 for p in POLICIES], 0.4, label="in process")
        ax.bar(x + 0.2, [res["http"][p][key] or 0 for p in POLICIES], 0.4, label="over HTTP")
        ax.set_xticks(x, POLICIES)
        ax.set_title(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 steps, fewer overhead samples (< 3 min)")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default 3 quick, 6 full)")
    ap.add_argument("--connections", type=int, default=64, help="concurrent HTTP connections of the trainer (16..64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_rollout_service.json")
    args = ap.parse_args(argv)
    steps = args.steps or (3 if args.quick else 6)
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

    res: dict = {"config": {"stream": spec.__dict__, "seed": args.seed, "quick": args.quick, "connections": args.connections,
                            "service": SERVICE_OVERRIDES, "cpus": os.cpu_count()}, "in_process": {}, "http": {}}
    for p in POLICIES:  # in process first, on an idle machine
        r = brs.run_policy(p, spec, "cpu", args.seed, max_wall_s=120)
        res["in_process"][p] = {k: r[k] for k in ("trainer_idle_ratio", "short_p99_wait_s", "sample_throughput",
                                                  "prefix_hit_ratio", "steps_done", "makespan_s")} | {"loadavg": _load()}
        print("in-process", p, json.dumps(res["in_process"][p]), flush=True)

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
        for p in POLICIES:
            h = ensure_rollout_service(name, overrides={**SERVICE_OVERRIDES, "policy": p})
            h.ready_sync(timeout_s=300)
            if p == "mixed":
                res["overhead"] = asyncio.run(overhead(base, token, 50 if args.quick else 300))
                print("overhead", json.dumps(res["overhead"]), flush=True)
            res["http"][p] = asyncio.run(http_run(base, token, spec, args.seed, args.connections))
            print("http", p, json.dumps(res["http"][p]), flush=True)
            if p == "mixed":
                res["hold_1000"] = asyncio.run(hold_1000(base, token, h))
                print("hold_1000", json.dumps(res["hold_1000"]), flush=True)
            h.shutdown_sync()
            time.sleep(1.0)
    finally:
        serve.shutdown()
        ray.shutdown()

    def ratio(side: str, key: str) -> float | None:
        a, b = res[side]["mixed"][key], res[side]["fifo"][key]
        return None if a is None or not b else a / b

    g = {}
    for key in ("trainer_idle_ratio", "short_p99_wait_s"):
        rin, rhttp = ratio("in_process", key), ratio("http", key)
        g[key] = {"mixed_over_fifo_in_process": rin, "mixed_over_fifo_http": rhttp,
                  "within_10pct": None if rin is None or rhttp is None else abs(rhttp - rin) <= 0.1 * rin}
    ov = res["overhead"]["submit_round_trip"]["p50_ms"]
    g["overhead_p50_ms"] = {"value": ov, "goal_ms": 5.0, "met": ov <= 5.0}
    g["hold_1000"] = {"rss_per_request_bytes": res["hold_1000"]["rss_per_request_bytes"],
                      "bounded_by_queue_capacity": res["hold_1000"]["queue_capacity"],
                      "met": res["hold_1000"]["queued_and_running"] >= 1000 and res["hold_1000"]["queued_after_cancel"] == 0}
    res["goals"] = g
    why = (f"this machine has {os.cpu_count()} cores shared with other work (load average {_load()}): over HTTP the "
           "Serve proxy and replica, the service actor, the engine replica actor and the trainer client all run on "
           "them beside the CPU engine, while in process only the engine and the trainer loop do")
    notes = {}
    for key in ("trainer_idle_ratio", "short_p99_wait_s"):
        if g[key]["within_10pct"] is False:
            notes[key] = f"mixed/FIFO ratio over HTTP differs from in process by more than 10%: {why}"
    if not g["overhead_p50_ms"]["met"]:
        notes["overhead_p50_ms"] = (f"one-request submit round trip p50 {ov:.1f} ms > 5 ms: two Python hops (Serve proxy -> "
                                    f"replica -> service actor) on {why}")
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
