"""Figures of a run from its recorded phase timeline (used by the runtime demo and the switch bench).

A timeline record is a dict with ``job_id, phase, pool, node, iteration, start, end`` (epoch
seconds) and, from RollMux's workers, ``switch`` (``warm`` | ``cold`` | ``resident``) and
``switch_s`` (state start-up seconds). Busy fraction of a pool: :func:`rollmux.occupancy.occupancy`
on the records (the union of busy intervals per node, GPU-weighted when records carry ``gpus``)
over the pool's nodes x span, warm-up and drain included; the rest is dependency bubble (RollMux §2).
"""

from __future__ import annotations

import statistics
from typing import Iterable, Optional


def span(records: list[dict]) -> tuple[float, float]:
    """(first start, last end) of the records, epoch seconds. Raises ValueError when empty."""
    if not records:
        raise ValueError("no timeline records")
    return min(r["start"] for r in records), max(r["end"] for r in records)


def _occupancy(records: list[dict], num_nodes: dict[str, int], window: tuple[float, float]) -> dict:
    """:func:`rollmux.occupancy.occupancy` of timeline dicts; nodes without records count idle."""
    from rollmux.occupancy import occupancy

    recs = [dict(pool=r.get("pool", "train"), node=str(r.get("node")), start_s=r["start"], end_s=r["end"],
                 gpus=r.get("gpus")) for r in records]
    nodes: dict[str, dict[str, float]] = {}
    for pool, n in num_nodes.items():
        names = sorted({x["node"] for x in recs if x["pool"] == pool})
        names += [f"_idle-{i}" for i in range(max(0, n - len(names)))]
        nodes[pool] = {x: 1.0 for x in names}
    return occupancy(recs, nodes, window=window)


def busy_seconds(records: Iterable[dict], pool: str) -> float:
    """Node-seconds ``pool`` was busy: the union of its records per node (sync counts on the
    training pool, where it runs)."""
    records = list(records)
    if not records:
        return 0.0
    n = {pool: len({str(r.get("node")) for r in records if r.get("pool", "train") == pool})}
    return _occupancy(records, n, span(records))[pool].busy_gpu_s if n[pool] else 0.0


def clip(records: list[dict], t0: float, t1: float) -> list[dict]:
    """Records cut to the window ``[t0, t1]`` (parts outside dropped)."""
    out = []
    for r in records:
        a, b = max(r["start"], t0), min(r["end"], t1)
        if b > a:
            out.append(dict(r, start=a, end=b))
    return out


def steady_start(per_job: dict[str, list[dict]]) -> float:
    """When every job has finished its iteration 0 (cold start: state built, worker warmed up)."""
    return max(max(r["end"] for r in recs if r["iteration"] == min(x["iteration"] for x in recs))
               for recs in per_job.values())


def coexec_utilisation(records: list[dict], num_rollout_nodes: int, num_train_nodes: int,
                       window: Optional[tuple[float, float]] = None) -> dict:
    """Makespan and each pool's busy / bubble fraction of one co-execution group's run
    (within ``window`` when given, e.g. the steady state after every job's cold start)."""
    if window is not None:
        records = clip(records, *window)
    t0, t1 = window or span(records)
    mk = t1 - t0
    out = {"makespan_s": mk, "node_seconds": mk * (num_rollout_nodes + num_train_nodes)}
    occ = _occupancy(records, {"rollout": num_rollout_nodes, "train": num_train_nodes}, (t0, t1))
    for pool in ("rollout", "train"):
        b = occ[pool].busy_ratio
        out[f"{pool}_busy_fraction"], out[f"{pool}_bubble_fraction"] = b, 1.0 - b
    return out


def solo_utilisation(per_job: dict[str, list[dict]], steady: bool = False) -> dict:
    """Solo-D: each job alone on its own rollout + training node, all jobs in parallel.

    ``makespan_s`` = the longest job; a pool's busy fraction = its phase-seconds over the
    node-seconds it holds (one node per job for that job's whole run). ``steady``: each job's
    run after its own iteration 0 (cold start excluded).
    """
    if steady:
        per_job = {j: clip(recs, steady_start({j: recs}), span(recs)[1]) for j, recs in per_job.items()}
    walls = {j: span(recs)[1] - span(recs)[0] for j, recs in per_job.items()}
    held = sum(walls.values())
    out = {"makespan_s": max(walls.values()), "node_seconds": 2 * held}
    occs = [_occupancy(recs, {"rollout": 1, "train": 1}, span(recs)) for recs in per_job.values()]
    for pool in ("rollout", "train"):
        b = sum(o[pool].busy_gpu_s for o in occs) / held if held > 0 else 0.0
        out[f"{pool}_busy_fraction"], out[f"{pool}_bubble_fraction"] = b, 1.0 - b
    return out


def iteration_time_s(records: list[dict], skip_first: bool = True) -> float:
    """Mean time per iteration of one job: from the end of iteration 0 (cold start excluded)
    to the end of its last phase, over the remaining iterations (all iterations when there is one).
    """
    its = sorted({r["iteration"] for r in records})
    last_end = max(r["end"] for r in records)
    if skip_first and len(its) > 1:
        end0 = max(r["end"] for r in records if r["iteration"] == its[0])
        return (last_end - end0) / (len(its) - 1)
    return (last_end - min(r["start"] for r in records)) / len(its)


def switch_median_s(records: Iterable[dict], kind: str, phases=("rollout", "train")) -> Optional[float]:
    """Median start-up latency (``switch_s``) of phases that started ``kind`` (warm | cold)."""
    xs = [r["switch_s"] for r in records if r.get("switch") == kind and r.get("phase") in phases
          and r.get("switch_s") is not None]
    return statistics.median(xs) if xs else None


def gantt_records(records: list[dict], node_of=None):
    """Timeline dicts -> :class:`rollmux.intra_group.PhaseRecord` (seconds from the first start)."""
    from rollmux.intra_group import PhaseRecord

    t0 = span(records)[0]
    return [PhaseRecord(job_id=r["job_id"], phase=r["phase"], pool=r.get("pool", "train"),
                        node=node_of(r) if node_of else r["node"], iteration=int(r["iteration"] or 0),
                        start_s=r["start"] - t0, end_s=r["end"] - t0) for r in records]
