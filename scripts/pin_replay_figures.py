#!/usr/bin/env python
"""Pin the figures of the default replay, so a speed-up cannot silently change a decision.

The default replay is ``rollmux simulate`` with every default (all policies, the first 200 jobs
of the window, ``configs/scheduler.yaml``) on the Philly extract the repository ships
(``data/philly_extract.csv``; no file outside the repository is needed). This script runs it
through the same functions as the command and writes every figure of its ``summary.json``
except the measured ones (``decision_latency_ms_*``, ``reopt_latency_ms_*``, wall-clock timings) to
``tests/data/replay_figures_extract.json``; ``tests/test_replay_figures.py`` replays the
group-forming policies and requires every figure to be *equal* (not approximately equal) to the
pinned one.

    python scripts/pin_replay_figures.py --check   # compare with the pinned figures (exit 1 on a difference)
    python scripts/pin_replay_figures.py --write   # re-pin: only when a decision changed on purpose

Re-pin (``--write``) in the same commit as a deliberate change of the policy, and say in the
commit message which figures moved and why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollmux.admission import load_scheduler_config  # noqa: E402
from rollmux.cli import DEFAULT_JOBS, DEFAULT_MAX_DURATION_S, DEFAULT_MIN_DURATION_S, DEFAULT_WINDOW_START_H  # noqa: E402
from rollmux.config import CONFIG_DIR, load_cluster  # noqa: E402
from rollmux.policies import POLICY_NAMES  # noqa: E402
from rollmux.traces import EXTRACT_TRACE, TraceWindow, load_trace  # noqa: E402
from rollmux.workloads import draw_jobs  # noqa: E402

PINNED = ROOT / "tests" / "data" / "replay_figures_extract.json"
#: summary.json keys that are measurements of this machine, not consequences of decisions.
MEASURED_PREFIXES = ("decision_latency_ms", "reopt_latency_ms", "global_plan_latency_ms")


def default_inputs():
    """(jobs, cluster, scheduler config) of the default replay on the extract."""
    cluster = load_cluster(CONFIG_DIR / "cluster_sim.yaml")
    cfg = load_scheduler_config()
    window = TraceWindow(start_hours=DEFAULT_WINDOW_START_H, max_jobs=DEFAULT_JOBS, min_duration_s=DEFAULT_MIN_DURATION_S,
                         max_duration_s=DEFAULT_MAX_DURATION_S)
    jobs = draw_jobs(load_trace(EXTRACT_TRACE, window), cluster, mix="mixed", seed=cfg.seed)
    return jobs, cluster, cfg


def figures(summary: dict) -> dict:
    """The decision-determined figures of a summary.json: per policy every metric except the
    measured ones, the cost ratios and the horizon."""
    return {
        "horizon_h": summary["meta"]["horizon_h"],
        "policies": {p: {k: v for k, v in m.items() if not k.startswith(MEASURED_PREFIXES)}
                     for p, m in summary["policies"].items()},
        "rollmux_cost_ratios": summary["rollmux_cost_ratios"],
    }


def differences(got: dict, want: dict, path: str = "") -> list[str]:
    """Every key path where ``got`` and ``want`` differ (exact comparison)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                out.append(f"{path}/{k}: {'missing' if k not in got else 'unexpected'}")
            else:
                out += differences(got[k], want[k], f"{path}/{k}")
        return out
    return [] if got == want else [f"{path}: {got!r} != pinned {want!r}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="re-pin the figures")
    g.add_argument("--check", action="store_true", help="compare with the pinned figures")
    args = ap.parse_args()
    from rollmux.sim.simulator import simulate

    jobs, cluster, cfg = default_inputs()
    t0 = time.perf_counter()
    res = simulate(jobs, cluster, POLICY_NAMES, seed=cfg.seed, config=cfg)
    print(f"replayed {len(jobs)} jobs through {len(POLICY_NAMES)} policies in {time.perf_counter() - t0:.1f} s")
    got = figures(res.summary)
    if args.write:
        PINNED.parent.mkdir(parents=True, exist_ok=True)
        PINNED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {PINNED}")
        return
    diff = differences(json.loads(json.dumps(got)), json.loads(PINNED.read_text()))
    for d in diff:
        print(d)
    print(f"{len(diff)} figure(s) differ from {PINNED.name}")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
