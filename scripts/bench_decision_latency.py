#!/usr/bin/env python
"""Admission decision latency vs active jobs (the analogue of RollMux §7.5 Table 5).

For each policy (rollmux = Alg. 1, random, most-idle) and each size N in 10, 100, 1,000, 10,000
(``--quick``: up to 1,000), the scheduler state is built by admitting N jobs drawn from the
``mixed`` workload (unbounded simulation cluster); then ``--probes`` further jobs are timed with
``decide()`` (a decision without state change), using the decision's own ``latency_ms``.
Above ``--direct-max`` jobs (default 1,000) the state is built by admitting ``--direct-max`` jobs
and replicating the resulting groups (fresh job, group and node ids, phase times perturbed by
< 0.1% so that the memoised round-robin simulations of replicas are not shared) and restoring it
with ``InterGroupScheduler.restore``: admitting 10,000 jobs one by one is quadratic.

The exact optimum (CP-SAT set partitioning over all feasible candidate groups,
:class:`rollmux.baselines.OptimalPartition`, empty layout cache) is timed on 4..32 active jobs.

For RollMux, the latency of a departure (``depart`` + departure re-packing, ``repack``) is
timed too, on ``--probes`` random active jobs (row policy ``rollmux-departure+repack``).

Percentiles come from enough samples to mean something: every row reports ``samples``; ``p90_ms``
needs at least 100 and ``p99_ms`` at least 1,000 samples, otherwise it is ``null`` (a p99 of 40
samples would just be their maximum, reported as ``max_ms``; ``scripts/_bench.py``). Admission rows time ``--probes``
(default 1,000) decisions; a departure row departs a random job and re-admits it (untimed) so
the state keeps its size; the optimum's rows time ``--opt-reps`` solves (p50 and max only).

Writes ``results/bench_decision_latency.json``: a list of
``{policy, active_jobs, samples, p50_ms, p90_ms, p99_ms, max_ms, load_avg_1_5_15_min, nice, ...}``
(the host's load average when the row was measured and the process's niceness: on a shared host
other work inflates the tail). Not a test: numbers depend on the machine.

    python scripts/bench_decision_latency.py --quick   # up to 1,000 active jobs, ~3 min on 2 cores
    python scripts/bench_decision_latency.py           # up to 10,000 active jobs, ~10 min
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollmux.admission import InterGroupScheduler  # noqa: E402
from rollmux.baselines import OptimalPartition  # noqa: E402
from rollmux.config import CONFIG_DIR, load_cluster  # noqa: E402
from rollmux.traces import TraceJob  # noqa: E402
from rollmux.workloads import draw_jobs  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from _bench import percentiles  # noqa: E402


def _host() -> dict:
    """Load average (1, 5, 15 min) of the host now and this process's niceness."""
    return {"load_avg_1_5_15_min": [round(x, 2) for x in os.getloadavg()], "nice": os.nice(0)}


def _jobs(n: int, seed: int, prefix: str):
    return draw_jobs([TraceJob(i, 0.0, 3600.0, 8) for i in range(n)], CLUSTER, mix="mixed", seed=seed, id_prefix=prefix)


def _replicate(snap: dict, copies: int, rng: random.Random) -> dict:
    """``copies`` disjoint copies of a snapshot's groups (renamed ids, perturbed times)."""
    out = dict(snap, groups=[], next_group=0)
    offs = {"rollout": 0, "train": 0}
    width = {p: 1 + max((int(n.rpartition("-")[2]) for g in snap["groups"] for n in g[f"{p}_nodes"]), default=0)
             for p in ("rollout", "train")}
    for c in range(copies):
        ren = {p: (lambda n, p=p: f"{p}-{int(n.rpartition('-')[2]) + offs[p]}") for p in ("rollout", "train")}
        for g in snap["groups"]:
            g2 = {"group_id": f"c{c}-{g['group_id']}",
                  "rollout_nodes": [ren["rollout"](n) for n in g["rollout_nodes"]],
                  "train_nodes": [ren["train"](n) for n in g["train_nodes"]], "members": []}
            for m in g["members"]:
                m2 = json.loads(json.dumps(m))
                jid = f"c{c}-{m['spec']['job_id']}"
                m2["spec"]["job_id"] = m2["placement"]["job_id"] = jid
                f = 1.0 + rng.uniform(0, 1e-3)
                for k in ("t_roll_s", "t_train_s"):
                    m2["profile"][k] *= f
                    if m2["spec"].get("measured"):
                        m2["spec"]["measured"][k] *= f
                m2["placement"]["rollout_nodes"] = [ren["rollout"](n) for n in m["placement"]["rollout_nodes"]]
                m2["placement"]["train_nodes"] = [ren["train"](n) for n in m["placement"]["train_nodes"]]
                g2["members"].append(m2)
            out["groups"].append(g2)
        offs = {p: offs[p] + width[p] for p in offs}
    out["next_group"] = 10**9
    return out


def bench_admission(policy: str, sizes, probes: int, direct_max: int, seed: int) -> list[dict]:
    rows = []
    base_sched, base_n = None, 0
    for n in sizes:
        t0 = time.perf_counter()
        if n <= direct_max:
            sched = InterGroupScheduler(CLUSTER, policy=policy, seed=seed)
            for j in _jobs(n, seed, "bench"):
                sched.admit(j.spec, j.profile)
            if n == direct_max or base_sched is None or n > base_n:
                base_sched, base_n = sched, n
            how = "admitted"
        else:
            copies = -(-n // base_n)
            snap = _replicate(base_sched.snapshot(), copies, random.Random(seed))
            sched = InterGroupScheduler.restore(CLUSTER, snap)
            how = f"{copies} replicas of {base_n} admitted jobs"
        build_s = time.perf_counter() - t0
        lat = []
        t_budget = time.perf_counter() + 300.0  # bound the probe loop in time, too
        for j in _jobs(probes, seed + 1, "probe"):
            d = sched.decide(j.spec, j.profile)
            lat.append(d.latency_ms)
            if time.perf_counter() > t_budget:
                break
        rows.append({"policy": policy, "active_jobs": len(sched.job_ids), **percentiles(lat),
                     "groups": len(sched.groups), "state": how, "build_s": round(build_s, 2), **_host()})
        print(json.dumps(rows[-1]), flush=True)
        if policy == "rollmux" and sched.config.repack_on_departure:
            rows.append(bench_departure(sched, probes, seed))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_departure(sched: InterGroupScheduler, probes: int, seed: int) -> dict:
    """Latency of a departure: ``depart`` + departure re-packing (``repack``) of a random active
    job, ``probes`` times, on a copy of ``sched``; after each timed departure the job is admitted
    again (untimed), so the state keeps its size."""
    rng = random.Random(seed + 2)
    sched = InterGroupScheduler.restore(sched.cluster, sched.snapshot())  # the caller's state stays intact
    n = len(sched.job_ids)
    lat, moves = [], 0
    t_budget = time.perf_counter() + 300.0
    for _ in range(probes):
        jid = rng.choice(sorted(sched.job_ids))
        m = sched.member(jid)
        t0 = time.perf_counter()
        gid = sched.group_of(jid).group_id
        sched.depart(jid)
        moves += len(sched.repack(gid))
        lat.append((time.perf_counter() - t0) * 1e3)
        sched.admit(m.spec, m.profile)
        if time.perf_counter() > t_budget:
            break
    return {"policy": "rollmux-departure+repack", "active_jobs": n, **percentiles(lat), "jobs_moved": moves, **_host()}


def bench_optimum(sizes, reps: int, seed: int) -> list[dict]:
    rows = []
    warm = _jobs(2, seed + 99, "warm")  # import and warm up CP-SAT outside the timings
    OptimalPartition(CLUSTER).solve([(j.spec, j.profile) for j in warm])
    for n in sizes:
        lat, cands, exact = [], [], True
        for r in range(reps):
            jobs = _jobs(n, seed + 100 + r, "opt")
            opt = OptimalPartition(CLUSTER, exact_max_jobs=max(sizes), time_limit_s=120.0)
            res = opt.solve([(j.spec, j.profile) for j in jobs])
            lat.append(res.solve_ms)
            cands.append(res.candidates)
            exact &= res.exact
        rows.append({"policy": "optimal-cpsat", "active_jobs": n, **percentiles(lat), "exact": exact,
                     "candidate_groups_mean": float(np.mean(cands)), **_host()})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="stop at 1,000 active jobs")
    ap.add_argument("--probes", type=int, default=1000, help="timed decisions (and departures) per size; >= 1,000 for a p99")
    ap.add_argument("--opt-reps", type=int, default=5, help="timed optimum solves per size (p50 and max only)")
    ap.add_argument("--direct-max", type=int, default=1000, help="largest state built by admitting jobs one by one")
    ap.add_argument("--policies", default="rollmux,random,most-idle")
    ap.add_argument("--opt-sizes", default="4,8,12,16,24,32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_decision_latency.json")
    args = ap.parse_args()
    sizes = [10, 100, 1000] + ([] if args.quick else [10000])
    rows = []
    for p in args.policies.split(","):
        rows += bench_admission(p.strip(), sizes, args.probes, args.direct_max, args.seed)
    rows += bench_optimum([int(x) for x in args.opt_sizes.split(",")], reps=args.opt_reps, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.out} ({platform.processor() or platform.machine()}, python {platform.python_version()})")


CLUSTER = load_cluster(CONFIG_DIR / "cluster_sim.yaml")

if __name__ == "__main__":
    main()
