"""Metrics of the rollout service: ``GET /v1/stats`` (JSON) and its Prometheus series.

The six service metrics (docs/ROLLOUT_SERVICE.md "Metrics"):

=====================================  ======================================================================
``sample_throughput_per_s``            generation + state-query samples finished / s since the first submit
``trainer_idle_ratio``                 per training step (policy version): time from its first critical
                                       submit to its last critical result, over the step's wall time (first
                                       critical submit to the next step's); summed over steps
``prefix_hit_ratio``                   prefix-index hit tokens / prompt tokens at dispatch, all replicas
``training_step_time_s``               mean interval between policy updates (``POST /v1/policy``), s
``diversity_score``                    normalised entropy of the task families of the last 256 dispatched
                                       generations (1 = even mix, 0 = one family)
``index_bytes``                        memory figure of the prefix indexes, bytes (all replicas)
=====================================  ======================================================================

Prometheus: :func:`render_prometheus` writes them as gauges named ``rollmux_rollout_<metric>``
(no labels) plus per-replica (``replica`` = 0..num_replicas-1) and per-class / per-status
series: every label set is bounded by the configuration, never by the requests.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from rollmux.rollout_sched.api import ServiceStats

PREFIX = "rollmux_rollout_"


def _entropy(labels: list[str]) -> float:
    counts: dict[str, int] = {}
    for f in labels:
        counts[f] = counts.get(f, 0) + 1
    if len(counts) <= 1:
        return 0.0
    n = len(labels)
    h = -sum(c / n * math.log(c / n) for c in counts.values())
    return h / math.log(len(counts))


def idle_ratio(first: dict[int, float], last: dict[int, float], now_s: float) -> float:
    """Trainer idle ratio from per-step (version) first critical submit / last critical result times."""
    vs = sorted(first)
    idle = wall = 0.0
    for k, v in enumerate(vs):
        end = first[vs[k + 1]] if k + 1 < len(vs) else now_s
        w = max(0.0, end - first[v])
        wall += w
        idle += min(w, max(0.0, last.get(v, end) - first[v]))
    return idle / wall if wall > 0 else 0.0


def service_stats(svc: Any) -> ServiceStats:
    """The stats of a :class:`actors.rollout.service.RolloutService` (read on its event loop)."""
    now = svc._now()
    reps = []
    hit = prompt = 0
    by_class = {"critical": 0, "reusable": 0, "background": 0}
    for r in svc.replicas:
        m = r.sched.metrics()
        hit += m["hit_tokens"]
        prompt += m["prompt_tokens"]
        for k in by_class:
            by_class[k] += m[f"queue_{k}"]
        reps.append({"replica": r.index, "alive": r.alive, "queued": m["queue_len"], "running": m["running"],
                     "windows": r.windows, "engine_busy_s": round(r.engine_s, 6), "policy_version": r.version,
                     "kv_in_use_tokens": m["kv_in_use_tokens"], "prefix_hit_ratio": m["prefix_hit_ratio"],
                     "index_bytes": m["index_bytes"], "index_nodes": m["index_nodes"],
                     "coldstart_phase": m.get("coldstart_phase"), "weights_version": r.weights_version,
                     "weights_sha256": r.weights_sha256})
    span = now - svc._first_submit if svc._first_submit is not None else 0.0
    pt = list(svc._policy_times)
    steps = [b - a for a, b in zip(pt, pt[1:])]
    status = {"queued": 0, "running": 0}
    for rec in list(svc.recs.values()):
        status[rec.status.value] = status.get(rec.status.value, 0) + 1
    overhead = list(svc._submit_ms)
    return ServiceStats.model_validate({
        "sample_throughput_per_s": svc.counters["samples"] / span if span > 0 else 0.0,
        "trainer_idle_ratio": idle_ratio(svc._step_first, svc._step_last, now),
        "prefix_hit_ratio": hit / prompt if prompt else 0.0,
        "training_step_time_s": statistics.fmean(steps) if steps else None,
        "last_training_step_time_s": steps[-1] if steps else None,
        "diversity_score": _entropy(list(svc._families)),
        "index_bytes": sum(r["index_bytes"] for r in reps),
        "policy_version": svc.version,
        "weight_version": svc.updater.latest.version if svc.updater.latest is not None else None,
        "min_policy_version": svc.min_version,
        "queued": status["queued"],
        "running": status["running"],
        "queued_by_class": by_class,
        "queue_capacity": svc.svc.queue_capacity,
        "results_kept": len(svc.done),
        "sessions": len(svc.sessions),
        "counters": dict(svc.counters),
        "submit_handling_ms_p50": statistics.median(overhead) if overhead else None,
        "replicas": reps,
        "uptime_s": now,
        "service_rss_bytes": _rss(),
    })


def _rss() -> int:
    """Resident memory of this (the service's) process, bytes."""
    import psutil

    return int(psutil.Process().memory_info().rss)


class _Fixed:
    """A collector of metric families computed once (a counter read from the service's snapshot)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return iter(self.families)


def render_prometheus(figures: ServiceStats) -> bytes:
    """Prometheus text exposition of ``figures`` (:func:`service_stats`), bounded label sets."""
    stats = figures.model_dump()  # the JSON form the series read
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client.core import CounterMetricFamily

    reg = CollectorRegistry()

    def g(name: str, doc: str, value: Any, labels: tuple = (), **lv: Any) -> None:
        if value is None:
            return
        gauge = gauges.get(name) or Gauge(PREFIX + name, doc, labels, registry=reg)
        gauges[name] = gauge
        (gauge.labels(**lv) if labels else gauge).set(float(value))

    gauges: dict[str, Any] = {}
    g("sample_throughput_per_s", "generation + state-query samples finished per second", stats["sample_throughput_per_s"])
    g("trainer_idle_ratio", "trainer wait on critical results / step wall time", stats["trainer_idle_ratio"])
    g("prefix_hit_ratio", "prefix hit tokens / prompt tokens at dispatch", stats["prefix_hit_ratio"])
    g("training_step_time_seconds", "mean interval between policy updates, s", stats["training_step_time_s"])
    g("diversity_score", "normalised entropy of recent task families", stats["diversity_score"])
    g("index_bytes", "prefix index memory figure, bytes", stats["index_bytes"])
    g("policy_version", "current policy version", stats["policy_version"])
    g("weight_version", "latest complete weights version (POST /v1/weights...)", stats.get("weight_version"))
    for k, v in stats["queued_by_class"].items():
        g("queued", "requests queued per priority class", v, ("cls",), cls=k)
    g("running", "requests running", stats["running"])
    requests = CounterMetricFamily(PREFIX + "requests", "requests per outcome since the service started",
                                   labels=["outcome"])  # exposed as ..._requests_total, TYPE counter
    for k, v in stats["counters"].items():
        requests.add_metric([k], float(v))
    reg.register(_Fixed([requests]))
    for r in stats["replicas"]:
        i = str(r["replica"])
        g("replica_alive", "engine replica answers (1) or died (0)", 1 if r["alive"] else 0, ("replica",), replica=i)
        g("replica_queued", "requests queued on the replica", r["queued"], ("replica",), replica=i)
        g("replica_running", "requests running on the replica", r["running"], ("replica",), replica=i)
        g("replica_index_bytes", "prefix index bytes of the replica", r["index_bytes"], ("replica",), replica=i)
        g("replica_prefix_hit_ratio", "prefix hit ratio of the replica", r["prefix_hit_ratio"], ("replica",), replica=i)
        g("replica_weights_version", "weights version the replica serves", r.get("weights_version"), ("replica",),
          replica=i)
    return generate_latest(reg)
