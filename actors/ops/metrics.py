"""RollMux runtime metrics on Ray's metrics API (exported in Prometheus format, ``ray_`` prefix).

Names (actors/ops/README.md "Metrics"):

==================================  =========  ============  ==========================================
name                                type       tags          meaning
==================================  =========  ============  ==========================================
rollmux_pool_busy_seconds           gauge      pool          busy node-seconds (GPU-seconds when records carry GPUs)
rollmux_pool_bubble_seconds         gauge      pool          idle (dependency-bubble) node-seconds
rollmux_pool_bubble_ratio           gauge      pool          bubble / (busy + bubble) over every group's lifetime
rollmux_job_slowdown                gauge      job_id        measured co-exec iteration / solo time (active jobs)
rollmux_job_slo                     gauge      job_id        the job's slowdown SLO (active jobs)
rollmux_job_iterations              gauge      job_id        iterations done (active jobs)
rollmux_group_cost_usd_per_h        gauge      group_id      Cost(G), USD/h (0 once dissolved, then dropped)
rollmux_admission_decisions_total   counter    outcome       admitted | retry_later | never | ...
rollmux_admission_latency_ms        histogram  -             policy decision latency, ms
rollmux_phase_switch_total          counter    kind          warm | cold | moved phase switches
rollmux_job_moves_total             counter    -             jobs moved by departure re-packing
rollmux_slo_actions_total           counter    action        SLO watch actions: move | move_neighbour | scale_out | isolate | slo_at_risk
rollmux_phase_switch_seconds        gauge      kind          last switch latency, s (warm | cold | moved)
rollmux_reconcile_seconds           gauge      loop          duration of the last reconcile pass, s
rollmux_queue_jobs                  gauge      queue         jobs held by the admission queue (queue="admission")
rollmux_queue_oldest_wait_seconds   gauge      queue         wait so far of the first job in line, s
rollmux_queue_wait_seconds          histogram  -             wait of each queued job when admitted, s
rollmux_preemptions_total           counter    class         jobs preempted (at their iteration boundary), by the victim's priority class
==================================  =========  ============  ==========================================

Updates are buffered and applied by a background thread every ``flush_interval_s`` so that the
admission hot path only appends to a deque (metric ingestion stays off the admission
path). Cumulative seconds are gauges holding running totals (exact names on the endpoint). Pool busy /
bubble figures come from each group's phase timeline through :func:`rollmux.occupancy.occupancy`
(the union of busy intervals per node, GPU-weighted when records carry ``gpus``, over the group's
whole lifetime: warm-up and drain count), computed on the flush thread, summed over groups.
Gauges are re-set from their last values every ``refresh_interval_s``: Ray's exporter drops a
gauge that was not recorded within about two export intervals, so a value set once (a job's SLO,
a group's cost) would otherwise vanish from the endpoint between Prometheus scrapes.

Series lifecycle: the per-job series (``rollmux_job_*{job_id}``) are recorded by ONE process, the
GlobalScheduler (GroupControllers report iterations to it; they record pool, switch and per-group
series only), so a ``sum()`` over the endpoint counts each job once. When a job ends
(:meth:`RollmuxMetrics.job_ended`) its series stop being refreshed and later updates for it are
ignored: Ray's exporter evicts a gauge observation that was not re-recorded within its TTL, so
the endpoint holds the active jobs' series only, not one per job ever admitted. A dissolved
group's cost gauge is set to 0 once, then dropped the same way.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("rollmux.metrics")

LATENCY_BOUNDARIES_MS = [0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]
WAIT_BOUNDARIES_S = [1, 10, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400]


class RollmuxMetrics:
    """Buffered recorder of the RollMux metrics. Safe to call from any thread of an actor.

    Args:
        flush_interval_s: period of the background flush; ``0`` flushes synchronously (tests).
        enabled: ``False`` records into ``totals`` only (no Ray metric objects).
        refresh_interval_s: period at which every gauge is re-recorded from ``totals``, s.
    """

    GAUGES = ("busy", "bubble", "bubble_ratio", "slowdown", "slo", "iters", "cost", "switch_s", "queue_jobs",
              "queue_oldest_s")
    JOB_GAUGES = ("slowdown", "slo", "iters")
    #: ended job ids remembered to ignore late updates (events from controllers may cross the end)
    ENDED_MEMORY = 100_000

    def __init__(self, flush_interval_s: float = 1.0, enabled: bool = True, refresh_interval_s: float = 5.0):
        self.enabled = enabled
        self.flush_interval_s = flush_interval_s
        self.refresh_interval_s = refresh_interval_s
        self._q: collections.deque[tuple[str, tuple]] = collections.deque(maxlen=100_000)
        self._m: Optional[dict[str, Any]] = None
        self.totals: dict[str, dict] = collections.defaultdict(dict)  # name -> {tag: value}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._timelines: dict[str, tuple] = {}  # group_id -> latest (records, nodes, window) to account
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if flush_interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name="rollmux-metrics", daemon=True)
            self._thread.start()

    # ---- recording API (cheap: append only; each pushes the bound method that applies it)
    def admission(self, outcome: str, latency_ms: float) -> None:
        self._push(self._admission, outcome, float(latency_ms))

    def job(self, job_id: str, *, slowdown: Optional[float] = None, slo: Optional[float] = None,
            iterations: Optional[int] = None) -> None:
        self._push(self._job, job_id, slowdown, slo, iterations)

    def job_ended(self, job_id: str, *, ignore_late: bool = True) -> None:
        """The job finished, failed or departed (or left this recorder's group): its per-job totals
        (slowdown, SLO, iterations, sync bytes) are dropped and its gauges no longer refreshed, so
        Ray's exporter drops them; with ``ignore_late`` later :meth:`job` updates for it are ignored
        (a GroupController passes False: a job moved away may come back)."""
        self._push(self._job_gone, job_id, bool(ignore_late))

    def group_cost(self, group_id: str, usd_per_h: float) -> None:
        self._push(self._group_cost, group_id, float(usd_per_h))

    def group_dissolved(self, group_id: str) -> None:
        """The group ceased to exist: its cost gauge reads 0, then is no longer refreshed (Ray's
        exporter drops it after about two export intervals, so dissolved groups do not pile up)."""
        self._push(self._group_gone, group_id)

    def job_moves(self, n: int) -> None:
        """``n`` jobs were moved by departure re-packing."""
        if n:
            self._push(self._moves, int(n))

    def slo_action(self, action: str) -> None:
        """The SLO watch took ``action`` (:data:`rollmux.admission.slo_watch.ACTIONS`)."""
        self._push(self._count, "slo_actions", "action", str(action))

    def pool_time(self, pool: str, busy_s: float = 0.0, bubble_s: float = 0.0) -> None:
        self._push(self._pool_time, pool, float(busy_s), float(bubble_s))

    def group_timeline(self, group_id: str, records: list, nodes: dict, window: tuple[float, float]) -> None:
        """Account a group's busy / bubble time from its phase records (cheap: the occupancy is
        computed on the flush thread, once per group per flush, from the latest call).

        Args:
            records: phase records (``pool``, ``node``, ``start_s``, ``end_s``, optional ``gpus``),
                seconds since the group started; the list is read, not kept past the flush.
            nodes: ``{pool: {node: GPUs}}`` the group held; window: ``(0, now)`` its lifetime so far, s.
        """
        with self._lock:
            self._timelines[group_id] = (records, nodes, window)
        self._push(self._timeline, group_id)

    def phase_switch(self, kind: str, seconds: float) -> None:
        self._push(self._switch, kind, float(seconds))

    def reconcile(self, seconds: float, loop: str = "controllers") -> None:
        """Duration of the last pass of a reconcile loop (the GlobalScheduler's), s."""
        self._push(self._gauge, "reconcile_s", "loop", loop, float(seconds))

    def queue(self, length: int, oldest_wait_s: float) -> None:
        """The admission queue now holds ``length`` jobs; the first in line has waited ``oldest_wait_s``."""
        self._push(self._queue, int(length), float(oldest_wait_s))

    def preemption(self, priority_class: str) -> None:
        """A job of ``priority_class`` was preempted for a higher class (:mod:`rollmux.preemption`)."""
        self._push(self._count, "preemptions", "class", str(priority_class))

    def queue_wait(self, wait_s: float) -> None:
        """A queued job was admitted after waiting ``wait_s`` seconds."""
        self._push(self._queue_wait, float(wait_s))

    def sync_cross_bytes(self, job_id: str, nbytes: int) -> None:
        """One weight sync of ``job_id`` sent ``nbytes`` across the pool boundary (counted by the
        sync executors / object-store transfers, not taken from the plan)."""
        self._push(self._sync_cross, job_id, int(nbytes))

    def _push(self, apply: Callable[..., None], *args: Any) -> None:
        self._q.append((apply, args))
        if self.flush_interval_s <= 0:
            self.flush()

    # ---- application (on the flush thread: one method per update)
    def _metrics(self) -> dict[str, Any]:
        if self._m is None:
            from ray.util.metrics import Counter, Gauge, Histogram

            g = lambda n, d, t: Gauge(n, description=d, tag_keys=(t,))  # noqa: E731
            self._m = {
                "busy": g("rollmux_pool_busy_seconds", "Cumulative seconds a pool's nodes ran phases", "pool"),
                "bubble": g("rollmux_pool_bubble_seconds", "Cumulative idle (bubble) seconds of a pool", "pool"),
                "bubble_ratio": g("rollmux_pool_bubble_ratio", "Idle (bubble) fraction of a pool's node-time", "pool"),
                "slowdown": g("rollmux_job_slowdown", "Measured co-execution slowdown vs solo", "job_id"),
                "slo": g("rollmux_job_slo", "Job slowdown SLO", "job_id"),
                "iters": g("rollmux_job_iterations", "Iterations done", "job_id"),
                "cost": g("rollmux_group_cost_usd_per_h", "Co-execution group cost, USD/h", "group_id"),
                "decisions": Counter("rollmux_admission_decisions_total", description="Admission decisions",
                                     tag_keys=("outcome",)),
                "latency": Histogram("rollmux_admission_latency_ms", description="Admission decision latency, ms",
                                     boundaries=LATENCY_BOUNDARIES_MS),
                "switches": Counter("rollmux_phase_switch_total", description="Phase switches",
                                    tag_keys=("kind",)),
                "switch_s": g("rollmux_phase_switch_seconds", "Last phase switch latency, s", "kind"),
                "moves": Counter("rollmux_job_moves_total", description="Jobs moved by departure re-packing"),
                "slo_actions": Counter("rollmux_slo_actions_total", description="SLO watch actions on measured phase times",
                                       tag_keys=("action",)),
                "reconcile_s": g("rollmux_reconcile_seconds", "Duration of the last reconcile pass, s", "loop"),
                "sync_cross": Counter("rollmux_sync_cross_bytes_total",
                                      description="Weight-sync bytes sent across the pool boundary", tag_keys=("job_id",)),
                "queue_jobs": g("rollmux_queue_jobs", "Jobs held by the admission queue", "queue"),
                "queue_oldest_s": g("rollmux_queue_oldest_wait_seconds", "Wait so far of the first queued job, s", "queue"),
                "queue_wait": Histogram("rollmux_queue_wait_seconds", description="Admission queue wait of admitted jobs, s",
                                        boundaries=WAIT_BOUNDARIES_S),
                "preemptions": Counter("rollmux_preemptions_total", description="Jobs preempted for a higher class, "
                                       "by the victim's priority class", tag_keys=("class",)),
                "sync_last": g("rollmux_sync_cross_bytes_last", "Bytes the last weight sync sent across the pool boundary",
                               "job_id"),
            }
        return self._m

    def flush(self) -> int:
        """Apply every buffered update; returns how many were applied."""
        n = 0
        while self._q:
            apply, args = self._q.popleft()
            try:
                apply(*args)
            except Exception:  # metrics must never break the control plane
                log.exception("metric update %s%r failed", apply.__name__, args)
            n += 1
        return n

    def _m_or_none(self) -> Optional[dict[str, Any]]:
        return self._metrics() if self.enabled else None

    def _admission(self, outcome: str, lat: float) -> None:
        t = self.totals
        t["decisions"][outcome] = t["decisions"].get(outcome, 0) + 1
        if m := self._m_or_none():
            m["decisions"].inc(1.0, tags={"outcome": outcome})
            m["latency"].observe(lat)

    def _job(self, job_id: str, slowdown: Optional[float], slo: Optional[float], iters: Optional[int]) -> None:
        if job_id in self._ended:
            return
        m = self._m_or_none()
        for key, v in (("slowdown", slowdown), ("slo", slo), ("iters", iters)):
            if v is not None:
                self.totals[key][job_id] = v
                if m:
                    m[key].set(float(v), tags={"job_id": job_id})

    def _job_gone(self, job_id: str, ignore_late: bool) -> None:
        for key in self.JOB_GAUGES + ("sync_cross_bytes", "sync_cross_last"):
            self.totals[key].pop(job_id, None)
        if not ignore_late:
            return
        self._ended[job_id] = None
        while len(self._ended) > self.ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _group_cost(self, gid: str, usd: float) -> None:
        self.totals["cost"][gid] = usd
        if m := self._m_or_none():
            m["cost"].set(usd, tags={"group_id": gid})

    def _group_gone(self, gid: str) -> None:
        self.totals["cost"].pop(gid, None)
        if m := self._m_or_none():
            m["cost"].set(0.0, tags={"group_id": gid})

    def _moves(self, n: int) -> None:
        self.totals["moves"] = self.totals.get("moves", 0) + n
        if m := self._m_or_none():
            m["moves"].inc(float(n))

    def _count(self, key: str, tag: str, label: str) -> None:
        """One event of counter ``key`` (``slo_actions``, ``preemptions``) with ``tag=label``."""
        counts = self.totals.setdefault(key, {})
        counts[label] = counts.get(label, 0) + 1
        if m := self._m_or_none():
            m[key].inc(1.0, tags={tag: label})

    def _gauge(self, key: str, tag: str, label: str, value: float) -> None:
        """Gauge ``key`` (``reconcile_s``) of ``tag=label`` set to ``value``."""
        self.totals[key][label] = value
        if m := self._m_or_none():
            m[key].set(value, tags={tag: label})

    def _pool_time(self, pool: str, busy: float, bubble: float) -> None:
        t = self.totals
        t["busy"][pool] = t["busy"].get(pool, 0.0) + busy
        t["bubble"][pool] = t["bubble"].get(pool, 0.0) + bubble
        if m := self._m_or_none():
            m["busy"].set(t["busy"][pool], tags={"pool": pool})
            m["bubble"].set(t["bubble"][pool], tags={"pool": pool})

    def _timeline(self, gid: str) -> None:
        from rollmux.occupancy import occupancy

        with self._lock:
            pending = self._timelines.pop(gid, None)
        if pending is None:  # already accounted by an earlier update of this flush
            return
        t, m = self.totals, self._m_or_none()
        records, nodes, window = pending
        occ = occupancy(list(records), nodes, window=window)
        t["occ"][gid] = {p: (o.busy_gpu_s, o.capacity_gpu_s) for p, o in occ.items()}
        for pool in occ:
            busy = sum(v[pool][0] for v in t["occ"].values())
            cap = sum(v[pool][1] for v in t["occ"].values())
            t["busy"][pool], t["bubble"][pool] = busy, cap - busy
            t["bubble_ratio"][pool] = (cap - busy) / cap if cap > 0 else 0.0
            if m:
                for key in ("busy", "bubble", "bubble_ratio"):
                    m[key].set(t[key][pool], tags={"pool": pool})

    def _sync_cross(self, job_id: str, nb: int) -> None:
        t = self.totals
        t["sync_cross_bytes"][job_id] = t["sync_cross_bytes"].get(job_id, 0) + nb
        t["sync_cross_last"][job_id] = nb
        if m := self._m_or_none():
            m["sync_cross"].inc(float(nb), tags={"job_id": job_id})
            m["sync_last"].set(float(nb), tags={"job_id": job_id})

    def _queue(self, n: int, oldest: float) -> None:
        t = self.totals
        t["queue_jobs"]["admission"], t["queue_oldest_s"]["admission"] = n, oldest
        if m := self._m_or_none():
            m["queue_jobs"].set(float(n), tags={"queue": "admission"})
            m["queue_oldest_s"].set(oldest, tags={"queue": "admission"})

    def _queue_wait(self, wait_s: float) -> None:
        t = self.totals
        t["queue_waits"] = t.get("queue_waits", 0) + 1
        t["queue_wait_total_s"] = t.get("queue_wait_total_s", 0.0) + wait_s
        if m := self._m_or_none():
            m["queue_wait"].observe(wait_s)

    def _switch(self, kind: str, s: float) -> None:
        t = self.totals
        t["switches"][kind] = t["switches"].get(kind, 0) + 1
        t["switch_s"][kind] = s
        if m := self._m_or_none():
            m["switches"].inc(1.0, tags={"kind": kind})
            m["switch_s"].set(s, tags={"kind": kind})

    def refresh(self) -> int:
        """Re-record every gauge at its last value (keeps it on the endpoint); returns the count."""
        if not self.enabled:
            return 0
        m, n = self._metrics(), 0
        tag = {"busy": "pool", "bubble": "pool", "bubble_ratio": "pool", "slowdown": "job_id", "slo": "job_id", "iters": "job_id",
               "cost": "group_id", "switch_s": "kind", "queue_jobs": "queue", "queue_oldest_s": "queue"}
        for key in self.GAUGES:
            for label, v in list(self.totals.get(key, {}).items()):
                try:
                    m[key].set(float(v), tags={tag[key]: label})
                    n += 1
                except Exception:  # metrics must never break the control plane
                    log.exception("gauge refresh %s{%s} failed", key, label)
        return n

    def _loop(self) -> None:
        import time

        last = time.monotonic()
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
                if time.monotonic() - last >= self.refresh_interval_s:
                    last = time.monotonic()
                    self.refresh()
            except Exception:  # the flush thread never dies silently: log and go on
                log.exception("metrics flush pass failed; continuing")

    def close(self) -> None:
        self._stop.set()
        self.flush()
