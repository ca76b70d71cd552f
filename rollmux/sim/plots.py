"""Figures of a simulation run (matplotlib, Agg backend: no display needed).

* :func:`plot_cost_over_time`: provisioning cost ($/h) over the replay, one step line per policy
  (the analogue of RollMux Fig. 13a / Fig. 15).
* :func:`plot_gantt`: one co-execution group's meta-iterations on both pools, one row per node,
  one colour per job (the analogue of RollMux Fig. 10, left).

Source: RollMux §7.2 (Fig. 10), §7.4 (Fig. 13), §7.5 (Fig. 15).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_cost_over_time(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    *,
    title: str = "Provisioning cost over the trace replay",
) -> Path:
    """Step plot of cost over time per policy.

    Args:
        series: ``{policy: (times_s, cost_usd_per_h)}``; cost ``c[i]`` holds from ``t[i]`` to
            ``t[i+1]`` (equal lengths).
        path: PNG to write (parent folders are created).

    Returns:
        The written path.

    Raises:
        ValueError: a series whose two sequences differ in length.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, (ts, cs) in series.items():
        if len(ts) != len(cs):
            raise ValueError(f"series {name!r}: {len(ts)} times but {len(cs)} costs")
        if not ts:
            continue
        ax.step([t / 3600.0 for t in ts], list(cs), where="post", label=name, linewidth=1.3)
    ax.set_xlabel("time since first arrival (h)")
    ax.set_ylabel("provisioning cost ($/h)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _node_key(node: str) -> tuple[int, int]:
    pool, _, idx = node.rpartition("-")
    return (0 if pool == "rollout" else 1, int(idx) if idx.isdigit() else 0)


def plot_gantt(records: Iterable, path: str | Path, *, title: str = "Co-execution group: meta-iterations") -> Path:
    """Gantt chart of a group's phases on its rollout and training nodes.

    Args:
        records: objects with ``job_id, phase, node, start_s, end_s`` attributes
            (e.g. :class:`rollmux.intra_group.PhaseRecord`); ``sync`` phases are drawn hatched.
        path: PNG to write.

    Returns:
        The written path.

    Raises:
        ValueError: no records.
    """
    recs = list(records)
    if not recs:
        raise ValueError("plot_gantt: no phase records to draw")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nodes = sorted({r.node for r in recs}, key=_node_key)
    jobs = list(dict.fromkeys(r.job_id for r in recs))
    cmap = plt.get_cmap("tab10")
    colour = {j: cmap(i % 10) for i, j in enumerate(jobs)}
    row = {n: i for i, n in enumerate(nodes)}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(nodes)))
    for r in recs:
        ax.barh(
            row[r.node],
            r.end_s - r.start_s,
            left=r.start_s,
            height=0.7,
            color=colour[r.job_id],
            edgecolor="black",
            linewidth=0.3,
            hatch="//" if r.phase == "sync" else None,
        )
    ax.set_yticks(range(len(nodes)))
    ax.set_yticklabels(nodes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[j]) for j in jobs]
    # legend below the axes, so that it never hides a phase bar
    ax.legend(handles, jobs, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22 - 0.5 / len(nodes)),
              ncol=min(5, len(jobs)), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
