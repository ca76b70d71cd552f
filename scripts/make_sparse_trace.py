#!/usr/bin/env python
"""Write a sparse plain trace (``arrival_s,duration_s,num_gpus``) from the repository's full
Philly trace: the one-GPU jobs of 1 h to 3 days (the simulator's default window), in arrival
order, every ``--every``-th of them, the first ``--jobs``. Few jobs are active at any instant, so
co-execution has few partners: the shape where per-job allocations matter. Writes
``tests/data/philly_sparse_1gpu.csv`` by default (the test data of ``tests/test_per_job_allocations.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rollmux.traces import DEFAULT_TRACE, read_raw  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=40, help="keep every N-th eligible job")
    ap.add_argument("--jobs", type=int, default=60, help="jobs written at most")
    ap.add_argument("--out", type=Path, default=Path("tests/data/philly_sparse_1gpu.csv"))
    args = ap.parse_args()
    raw = sorted(read_raw(DEFAULT_TRACE), key=lambda r: r[0])
    keep = [r for r in raw if r[2] == 1 and 3600.0 <= r[1] <= 3 * 86400.0][:: args.every][: args.jobs]
    t0 = keep[0][0]
    lines = ["arrival_s,duration_s,num_gpus"] + [f"{a - t0:.0f},{d:.0f},{g}" for a, d, g, _ in keep]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {len(keep)} jobs")


if __name__ == "__main__":
    main()
