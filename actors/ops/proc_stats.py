"""Memory and CPU of the Ray processes this process started (a local cluster's raylets, GCS,
actors), grouped by what they run: the benchmarks' record of the control plane's footprint.

Ray titles an actor's worker process ``ray::<ActorClass>`` (``ray::<ActorClass>.<method>`` while a
call runs), idle pool workers ``ray::IDLE``; the cluster's own daemons keep their executable names
(``raylet``, ``gcs_server``, ...). Only descendants of this process are counted, so other Ray
clusters on the same machine are not. Uses ``psutil`` (a Ray dependency).
"""

from __future__ import annotations

import os
from typing import Optional


def _kind(p) -> str:
    """The process's kind: the actor class (``RolloutWorkerImpl``), ``IDLE``, or the daemon's name."""
    try:
        cmd = p.cmdline()
    except Exception:
        return "?"
    head = cmd[0] if cmd else p.name()
    if head.startswith("ray::"):
        return head[5:].split(".")[0] or "ray"
    for tool in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env", "agent"):
        if any(tool in c for c in cmd[:3]):
            return tool.removesuffix(".py")
    return os.path.basename(head)[:40]


def ray_process_stats(root_pid: Optional[int] = None, *, uss: bool = False) -> dict:
    """Per kind of descendant process of ``root_pid`` (default: this process):
    ``{kind: {"processes", "rss_mb_total", "rss_mb_max", "cpu_s_total", ["uss_mb_total"]}}`` plus
    ``"_all"`` (every descendant) and ``"_self"`` (``root_pid`` itself: the driver).
    ``uss``: also the unique set size (memory only that process holds; slower)."""
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    out: dict = {}

    def add(kind: str, p) -> None:
        try:
            with p.oneshot():
                rss = p.memory_info().rss / 2**20
                cpu = sum(p.cpu_times()[:2])
                u = p.memory_full_info().uss / 2**20 if uss else None
        except Exception:
            return
        e = out.setdefault(kind, {"processes": 0, "rss_mb_total": 0.0, "rss_mb_max": 0.0, "cpu_s_total": 0.0})
        e["processes"] += 1
        e["rss_mb_total"] = round(e["rss_mb_total"] + rss, 1)
        e["rss_mb_max"] = round(max(e["rss_mb_max"], rss), 1)
        e["cpu_s_total"] = round(e["cpu_s_total"] + cpu, 2)
        if u is not None:
            e["uss_mb_total"] = round(e.get("uss_mb_total", 0.0) + u, 1)

    for p in root.children(recursive=True):
        k = _kind(p)
        add(k, p)
        add("_all", p)
    add("_self", root)
    return out
