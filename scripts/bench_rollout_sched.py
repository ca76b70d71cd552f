#!/usr/bin/env python
"""A/B/C benchmark of rollout request scheduling: fifo vs prefix (hit-length first) vs mixed.

Seed 004 §7.2: the same request stream is replayed through each policy, on the simulated engine
at scale (virtual clock, H20 cost model) and on the real CPU engine with a tiny transformers
model (wall clock, few prompts).

The stream (built deterministically from ``--seed``; identical content for every policy):

* a trainer (on-policy RL, closed loop): each step submits a *critical* batch of
  ``prompts_per_step + over_sample_prompts`` prompts x ``samples_per_prompt`` samples (GRPO
  groups share the prompt); each finished sample spawns a critical reward query (reward system
  prompt + response tail); when ``prompts_per_step`` groups are fully scored the trainer cancels
  the rest (over-sampling) and trains for ``train_s`` (the pool keeps serving background work),
  then loads the next policy version and submits the next batch;
* task families with Zipf(1) popularity: prompt = one of two shared system prompts + the family's
  template + a few perturbed tokens near its end + a random question tail;
* long-tailed output lengths (log-normal, capped at max_tokens);
* open-loop background: periodic evaluation sweeps of non-critical generations, multi-turn state
  queries (family prefix + dialogue history, short outputs), replay items (prefill-only re-scoring
  of old trajectories), and one burst of non-critical reward queries (evaluation scoring);
* a cold-start phase: generated tokens come from a distribution whose exponent grows with the
  policy version (uniform at version 0 -> Zipf 1.2 later), so the output entropy drifts down.

Metrics per policy: sample_throughput (generation + state-query samples / s), trainer_idle_ratio
(time the trainer waits for its critical batch / run time), prefix_hit_ratio (prefix-cache hit
tokens / prompt tokens at dispatch), short_p99_wait_s (p99 queueing delay of reward and state
queries), diversity (normalised entropy of the task families of the GRPO groups each trained
batch consists of, averaged over steps: with over-sampling the trainer trains on the first
groups to finish, so the scheduling order decides the family mix; diversity_early: the first
third of the steps; dispatch_diversity: mean normalised entropy over consecutive chunks of 32
dispatched generations), index_bytes (peak footprint of the prefix index).

Usage:  .venv/bin/python scripts/bench_rollout_sched.py [--quick] [--no-cpu] [--seed 0]
Writes results/bench_rollout_sched.json and results/bench_rollout_sched.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.rollout.engine import CPUEngine, serve  # noqa: E402
from actors.rollout.sim_engine import SimulatedEngine  # noqa: E402
from rollmux.rollout_sched import (  # noqa: E402
    Completion,
    Request,
    RequestType,
    RolloutRequestScheduler,
    load_rollout_sched_config,
)

POLICIES = ("fifo", "prefix", "mixed")
METRIC_KEYS = ("sample_throughput", "trainer_idle_ratio", "prefix_hit_ratio", "short_p99_wait_s", "diversity", "index_bytes")
DIVERSITY_CHUNK = 32  # generations, in dispatch order


def _h(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class StreamSpec:
    """Shape of the request stream (all lengths in tokens, times in seconds)."""

    vocab: int = 32000
    sys_lens: tuple[int, ...] = (96, 64)
    families: int = 8
    template_len: int = 160
    perturb_max: int = 3
    tail_len: tuple[int, int] = (16, 48)
    steps: int = 10
    prompts_per_step: int = 16
    over_sample_prompts: int = 4
    samples_per_prompt: int = 4
    max_tokens: int = 2048
    out_median: float = 300.0
    out_sigma: float = 1.0
    train_s: float = 12.0
    reward_sys_len: int = 32
    reward_tail: int = 48
    sweep_every_s: float = 20.0
    sweep_size: int = 96
    state_rate_per_s: float = 1.0
    state_history: tuple[int, int] = (64, 256)
    state_max_tokens: int = 16
    replay_every_s: float = 20.0
    replay_size: int = 16
    replay_len: tuple[int, int] = (512, 1536)
    burst_at_s: float = 45.0
    burst_size: int = 400
    horizon_s: float = 220.0
    drift_max_exponent: float = 1.2
    drift_per_version: float = 0.15


SIM_QUICK = StreamSpec()
SIM_FULL = StreamSpec(steps=24, horizon_s=520.0)
CPU_SPEC = StreamSpec(
    vocab=256, sys_lens=(24, 16), families=4, template_len=24, perturb_max=2, tail_len=(4, 10), steps=3,
    prompts_per_step=4, over_sample_prompts=2, samples_per_prompt=2, max_tokens=48, out_median=24.0, out_sigma=0.6, train_s=1.5,
    reward_sys_len=8, reward_tail=12, sweep_every_s=1.5, sweep_size=6, state_rate_per_s=4.0, state_history=(8, 24),
    state_max_tokens=4, replay_every_s=2.0, replay_size=2, replay_len=(64, 160), burst_at_s=1.0, burst_size=24,
    horizon_s=6.0, drift_max_exponent=1.2, drift_per_version=0.4,
)


class Stream:
    """Deterministic content generator for a :class:`StreamSpec` (see module doc)."""

    def __init__(self, spec: StreamSpec, seed: int = 0):
        self.s, self.seed = spec, seed
        rng = np.random.default_rng(seed)
        self.sys = [tuple(int(x) for x in rng.integers(1, spec.vocab, n)) for n in spec.sys_lens]
        self.templates = [tuple(int(x) for x in rng.integers(1, spec.vocab, spec.template_len)) for _ in range(spec.families)]
        self.reward_sys = tuple(int(x) for x in rng.integers(1, spec.vocab, spec.reward_sys_len))
        p = 1.0 / np.arange(1, spec.families + 1)
        self.family_p = p / p.sum()
        ranks = np.arange(1, spec.vocab + 1, dtype=np.float64)
        self._cdf: dict[int, np.ndarray] = {}
        self._ranks = ranks
        perm = np.random.default_rng(seed + 1).permutation(spec.vocab)
        self._perm = perm

    def prompt(self, rng: np.random.Generator) -> tuple[str, tuple[int, ...]]:
        s = self.s
        f = int(rng.choice(s.families, p=self.family_p))
        tpl = list(self.templates[f])
        for _ in range(int(rng.integers(0, s.perturb_max + 1))):
            tpl[len(tpl) - 1 - int(rng.integers(0, min(24, len(tpl))))] = int(rng.integers(1, s.vocab))
        tail = rng.integers(1, s.vocab, int(rng.integers(*s.tail_len)))
        return f"family-{f}", self.sys[f % len(self.sys)] + tuple(tpl) + tuple(int(x) for x in tail)

    def out_len(self, req: Request) -> int:
        rng = np.random.default_rng(_h(self.seed, "len", req.request_id))
        return int(min(req.max_tokens, max(1, round(rng.lognormal(math.log(self.s.out_median), self.s.out_sigma)))))

    def out_tokens(self, req: Request, n: int) -> tuple[int, ...]:
        """Generated tokens of policy version ``req.policy_version``: Zipf(a(v)) over the vocab."""
        v = req.policy_version
        if v not in self._cdf:
            a = min(self.s.drift_max_exponent, self.s.drift_per_version * v)
            w = self._ranks ** (-a)
            self._cdf[v] = np.cumsum(w / w.sum())
        rng = np.random.default_rng(_h(self.seed, "tok", req.request_id))
        idx = np.minimum(np.searchsorted(self._cdf[v], rng.random(n)), self.s.vocab - 1)
        return tuple(int(x) for x in self._perm[idx])

    def critical_batch(self, step: int, t: float) -> list[Request]:
        s, rng = self.s, np.random.default_rng(_h(self.seed, "step", step))
        out = []
        for i in range(s.prompts_per_step + s.over_sample_prompts):
            fam, prompt = self.prompt(rng)
            for k in range(s.samples_per_prompt):
                out.append(Request(request_id=f"s{step}-p{i}-k{k}", prompt_token_ids=prompt, max_tokens=s.max_tokens,
                                   arrival_s=t, critical=True, policy_version=step, task_family=fam))
        return out

    def reward_for(self, gen: Request, c: Completion, t: float, critical: bool) -> Request:
        tail = tuple(c.output_token_ids[-self.s.reward_tail :]) or (1,)
        return Request(request_id=f"rw-{gen.request_id}", prompt_token_ids=self.reward_sys + tail, type=RequestType.REWARD,
                       max_tokens=1, arrival_s=t, critical=critical, policy_version=gen.policy_version,
                       task_family=gen.task_family)

    def background(self) -> list[Request]:
        s, rng = self.s, np.random.default_rng(_h(self.seed, "bg"))
        out: list[Request] = []
        t, k = s.sweep_every_s / 2, 0
        while t < s.horizon_s:  # evaluation sweeps of non-critical generations
            for i in range(s.sweep_size):
                fam, prompt = self.prompt(rng)
                out.append(Request(request_id=f"ev{k}-{i}", prompt_token_ids=prompt, max_tokens=s.max_tokens,
                                   arrival_s=float(t + rng.uniform(0, 1.0)), task_family=fam))
            t, k = t + s.sweep_every_s, k + 1
        t, k = 0.0, 0
        while True:  # multi-turn state queries (Poisson)
            t += float(rng.exponential(1.0 / s.state_rate_per_s))
            if t >= s.horizon_s:
                break
            fam, prompt = self.prompt(rng)
            hist = tuple(int(x) for x in rng.integers(1, s.vocab, int(rng.integers(*s.state_history))))
            out.append(Request(request_id=f"sq{k}", prompt_token_ids=prompt + hist, type=RequestType.STATE_QUERY,
                               max_tokens=s.state_max_tokens, arrival_s=t, task_family=fam))
            k += 1
        t, k = s.replay_every_s / 3, 0
        while t < s.horizon_s:  # replay items: prefill-only re-scoring of old trajectories
            for i in range(s.replay_size):
                fam, prompt = self.prompt(rng)
                old = tuple(int(x) for x in rng.integers(1, s.vocab, int(rng.integers(*s.replay_len))))
                out.append(Request(request_id=f"rp{k}-{i}", prompt_token_ids=prompt + old, type=RequestType.REPLAY,
                                   max_tokens=0, arrival_s=float(t + rng.uniform(0, 0.5)), task_family=fam))
            t, k = t + s.replay_every_s, k + 1
        for i in range(s.burst_size):  # a burst of evaluation reward queries
            tail = tuple(int(x) for x in rng.integers(1, s.vocab, s.reward_tail))
            out.append(Request(request_id=f"burst{i}", prompt_token_ids=self.reward_sys + tail, type=RequestType.REWARD,
                               max_tokens=1, arrival_s=float(s.burst_at_s + rng.uniform(0, 0.5)), task_family="eval"))
        return sorted(out, key=lambda r: r.arrival_s)


class TrainerSource:
    """Closed-loop on-policy trainer + open-loop background (a ``RequestSource``).

    Each step submits ``prompts_per_step + over_sample_prompts`` GRPO groups and trains on the
    first ``prompts_per_step`` groups whose samples and rewards are all done (over-sampling, as
    in DAPO-style dynamic sampling); the other groups' queued requests are cancelled and their
    running ones are ignored. ``consumed`` records the task families of each trained batch.
    """

    def __init__(self, stream: Stream):
        self.st = stream
        self.bg = stream.background()
        self.bi = 0
        self.step = 0
        self.t_submit = 0.0
        self.train_end: float | None = None
        self.waits: list[float] = []
        self.consumed: list[list[str]] = []
        self.end_s = 0.0
        self.outbox: list[Request] = []
        self._cancel: list[str] = []
        self._start_step(0.0)

    def _start_step(self, t: float) -> None:
        batch = self.st.critical_batch(self.step, t)
        self.state, self.t_submit = "rollout", t
        self.batch = {r.request_id: r for r in batch}
        self.group_of = {r.request_id: r.request_id.rsplit("-k", 1)[0] for r in batch}
        self.open: dict[str, set[str]] = {}
        for r in batch:
            self.open.setdefault(self.group_of[r.request_id], set()).add(r.request_id)
        self.family = {self.group_of[r.request_id]: r.task_family for r in batch}
        self.done_groups: list[str] = []
        self.outbox.extend(batch)

    def poll(self, now_s: float) -> list[Request]:
        out, self.outbox = self.outbox, []
        while self.bi < len(self.bg) and self.bg[self.bi].arrival_s <= now_s:
            out.append(self.bg[self.bi])
            self.bi += 1
        if self.state == "training" and self.train_end is not None and now_s >= self.train_end:
            self.step += 1
            self.end_s = self.train_end
            if self.step < self.st.s.steps:
                self._start_step(self.train_end)
                out.extend(self.outbox)
                self.outbox = []
            else:
                self.state = "finished"
        return out

    def cancelled(self) -> list[str]:
        out, self._cancel = self._cancel, []
        return out

    def next_event_s(self) -> float | None:
        cands = []
        if self.outbox:
            cands.append(0.0)
        if self.bi < len(self.bg):
            cands.append(self.bg[self.bi].arrival_s)
        if self.state == "training" and self.train_end is not None:
            cands.append(self.train_end)
        return min(cands) if cands else None

    def on_complete(self, c: Completion, now_s: float) -> None:
        rid = c.request_id
        gen_id = rid[3:] if rid.startswith("rw-") else rid
        g = self.group_of.get(gen_id) if self.state == "rollout" else None
        if g is None or g not in self.open or rid not in self.open[g]:
            return  # background, or a sample of a group the trainer no longer needs
        self.open[g].discard(rid)
        if not rid.startswith("rw-"):
            rw = self.st.reward_for(self.batch[gen_id], c, now_s, critical=True)
            self.open[g].add(rw.request_id)
            self.outbox.append(rw)
        if not self.open[g]:
            del self.open[g]
            self.done_groups.append(g)
            if len(self.done_groups) == self.st.s.prompts_per_step:
                self.waits.append(now_s - self.t_submit)
                self.consumed.append([self.family[x] for x in self.done_groups])
                self._cancel = [r for ids in self.open.values() for r in ids]
                self.open = {}
                self.state, self.train_end = "training", now_s + self.st.s.train_s

    def trainer_waiting(self) -> bool:
        return self.state == "rollout"

    def policy_version(self) -> int:
        return self.step

    def done(self) -> bool:
        return self.state == "finished" and self.bi >= len(self.bg) and not self.outbox


def _ratio(reused: int, computed: int) -> float:
    return reused / (reused + computed) if reused + computed else 0.0


def _norm_entropy(labels: list[str], k: int) -> float:
    if len(labels) < 2 or k < 2:
        return 0.0
    _, counts = np.unique(labels, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum() / math.log(k))


def run_policy(policy: str, spec: StreamSpec, engine_kind: str, seed: int, max_wall_s: float) -> dict:
    section = "cpu_engine" if engine_kind == "cpu" else "rollout_sched"
    cfg = load_rollout_sched_config(section=section)
    stream = Stream(spec, seed)
    sched = RolloutRequestScheduler(cfg, policy)
    if engine_kind == "cpu":
        engine = CPUEngine(vocab_size=spec.vocab, slice_tokens=cfg.slice_tokens, eos_token_id=0, seed=seed,
                           block_tokens=cfg.prefix_block_tokens)
    else:
        engine = SimulatedEngine(cfg.slice_tokens, output_len=stream.out_len, output_tokens=stream.out_tokens, seed=seed)
    src = TrainerSource(stream)
    t0 = time.monotonic()
    stats = serve(sched, engine, src, max_windows=2_000_000, max_wall_s=max_wall_s)
    wall = time.monotonic() - t0
    log = sched.dispatch_log
    makespan = max(stats.end_s, 1e-9)
    samples = sum(1 for d in log if d.type in (RequestType.GENERATION, RequestType.STATE_QUERY))
    short_waits = [d.wait_s for d in log if d.short]
    gens = [d.task_family for d in log if d.type is RequestType.GENERATION]
    chunks = [gens[i : i + DIVERSITY_CHUNK] for i in range(0, len(gens) - DIVERSITY_CHUNK + 1, DIVERSITY_CHUNK)]
    dispatch_div = [_norm_entropy(c, spec.families) for c in chunks]
    k = min(spec.families, spec.prompts_per_step)
    div = [_norm_entropy(fams, k) for fams in src.consumed]
    early = div[: max(1, len(div) // 3)]
    m = sched.metrics()
    crit_waits = [d.wait_s for d in log if d.critical]
    return {
        "sample_throughput": samples / makespan,
        "trainer_idle_ratio": sum(src.waits) / makespan,
        "prefix_hit_ratio": m["prefix_hit_ratio"],
        "short_p99_wait_s": float(np.percentile(short_waits, 99)) if short_waits else 0.0,
        "diversity": float(np.mean(div)) if div else 0.0,
        "index_bytes": int(m["index_peak_bytes"]),
        # context
        "diversity_early": float(np.mean(early)) if div else 0.0,
        "dispatch_diversity": float(np.mean(dispatch_div)) if dispatch_div else 0.0,
        "critical_p99_wait_s": float(np.percentile(crit_waits, 99)) if crit_waits else 0.0,
        "trainer_wait_s": sum(src.waits),
        "steps_done": len(src.waits),
        "makespan_s": makespan,
        "mean_step_s": makespan / max(1, len(src.waits)),
        "engine_compute_busy_ratio": (engine.prefill_tokens + engine.decode_tokens) * engine.cost.prefill_s_per_token / makespan
        if engine_kind == "sim" else None,
        "engine_prefill_reused_ratio": _ratio(engine.prefill_saved_tokens, engine.prefill_tokens) if engine_kind == "sim"
        else _ratio(engine.prefill_tokens_reused, engine.prefill_tokens_computed),
        "samples": samples,
        "short_requests": len(short_waits),
        "dispatched": m["dispatched"],
        "index_bytes_final": m["index_bytes"],
        "index_evicted_nodes": m["index_evicted_nodes"],
        "index_expired_nodes": m["index_expired_nodes"],
        "index_merged_tails": m["index_merged_tails"],
        "coldstart_switched_at_step": m["coldstart_switched_at_step"] if sched.policy.adaptive else None,
        "coldstart_output_entropy": m["coldstart_output_entropy"],
        "windows": stats.windows,
        "stopped_by": stats.stopped_by,
        "bench_wall_s": wall,
    }


def decision_latency(queue_sizes=(1000, 10000), seed: int = 0, windows: int = 5) -> dict:
    """Wall time of one ``next_batch`` (stage 1 + stage 2) on a queue of N requests, ms: median and
    max over windows (the first window looks up every prefix hit; later ones use the cache)."""
    cfg = load_rollout_sched_config()
    stream = Stream(SIM_QUICK, seed)
    rng = np.random.default_rng(seed)
    out: dict = {}
    for n in queue_sizes:
        reqs = []
        for i in range(n):
            fam, prompt = stream.prompt(rng)
            reqs.append(Request(request_id=f"q{i}", prompt_token_ids=prompt, max_tokens=512, task_family=fam,
                                critical=bool(i % 7 == 0), arrival_s=i * 1e-3))
        out[str(n)] = {}
        for p in POLICIES:
            s = RolloutRequestScheduler(cfg, p)
            for r in reqs:
                s.submit(r)
            times = []
            for w in range(windows):
                t0 = time.perf_counter()
                batch = s.next_batch(float(n) * 1e-3 + w)
                times.append((time.perf_counter() - t0) * 1e3)
                for r in batch:
                    s.on_complete(r.request_id, (), 0.0)
            out[str(n)][p] = {"next_batch_ms_median": float(np.median(times)), "next_batch_ms_max": float(np.max(times))}
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(METRIC_KEYS)
    rows = [k for k in ("simulated", "cpu_engine") if k in results]
    fig, axes = plt.subplots(len(rows), len(keys), figsize=(3.1 * len(keys), 2.8 * len(rows)), squeeze=False)
    colors = {"fifo": "#999999", "prefix": "#4c72b0", "mixed": "#dd8452"}
    for i, row in enumerate(rows):
        for j, k in enumerate(keys):
            ax = axes[i][j]
            vals = [results[row][p][k] for p in POLICIES]
            ax.bar(POLICIES, vals, color=[colors[p] for p in POLICIES])
            ax.set_title(f"{row}: {k}", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="simulated case only, smaller stream (< 1 min)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU-engine run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_rollout_sched.json")
    args = ap.parse_args(argv)
    spec = SIM_QUICK if args.quick else SIM_FULL
    results: dict = {"simulated": {}, "config": {"sim_stream": asdict(spec), "seed": args.seed, "quick": args.quick}}
    for p in POLICIES:
        results["simulated"][p] = run_policy(p, spec, "sim", args.seed, max_wall_s=300)
        print(f"sim  {p:7s}", {k: round(v, 4) if isinstance(v, float) else v for k, v in results["simulated"][p].items()}, flush=True)
    if not args.quick and not args.no_cpu:
        results["cpu_engine"] = {}
        results["config"]["cpu_stream"] = asdict(CPU_SPEC)
        for p in POLICIES:
            results["cpu_engine"][p] = run_policy(p, CPU_SPEC, "cpu", args.seed, max_wall_s=120)
            print(f"cpu  {p:7s}", {k: round(v, 4) if isinstance(v, float) else v for k, v in results["cpu_engine"][p].items()}, flush=True)
    if not args.quick:
        # transparency: the A/B/C at other background loads (evaluation sweep size per 20 s)
        results["load_sweep"] = {}
        for size in (32, 64, 96, 128):
            lspec = replace(spec, sweep_size=size, steps=min(spec.steps, 10), horizon_s=min(spec.horizon_s, 220.0))
            row = {p: run_policy(p, lspec, "sim", args.seed, max_wall_s=300) for p in POLICIES}
            results["load_sweep"][f"sweep_{size}"] = {
                p: {k: row[p][k] for k in (*METRIC_KEYS, "engine_compute_busy_ratio")} for p in POLICIES
            }
            print(f"load sweep {size}:", {p: round(row[p]["trainer_idle_ratio"], 3) for p in POLICIES}, flush=True)
    results["decision_latency_ms"] = decision_latency((1000,) if args.quick else (1000, 10000))
    print("decision latency:", results["decision_latency_ms"], flush=True)
    sim = results["simulated"]
    results["checks"] = {
        "mixed_beats_fifo_trainer_idle": sim["mixed"]["trainer_idle_ratio"] < sim["fifo"]["trainer_idle_ratio"],
        "mixed_beats_fifo_short_p99": sim["mixed"]["short_p99_wait_s"] < sim["fifo"]["short_p99_wait_s"],
        "mixed_beats_prefix_diversity": sim["mixed"]["diversity"] > sim["prefix"]["diversity"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    plot(results, args.out.with_suffix(".png"))
    print("checks:", results["checks"])
    print("wrote", args.out, "and", args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
