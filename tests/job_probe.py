#!/usr/bin/env python
"""A tiny Ray job for ``tests/test_local_jobs.py``, submitted with ``ray job submit --working-dir .``.

The driver imports torch from its unpacked working directory (the job supervisor's node), then
runs one task on every pool node (``rollmux_node:<id>``) that imports torch and a module of the
working directory there and holds the node for ``--hold-s`` seconds, so that back-to-back jobs
overlap. Prints one JSON line: ``{"driver_cwd", "tasks": {node id: {"cwd", "torch"}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold-s", type=float, default=1.0)
    args = ap.parse_args()
    import ray

    ray.init(logging_level="ERROR", log_to_driver=False)
    nodes = sorted(k.split(":", 1)[1] for n in ray.nodes() if n.get("Alive")
                   for k in n.get("Resources", {}) if k.startswith("rollmux_node:"))

    @ray.remote(num_cpus=0, max_retries=0)
    def probe(hold_s: float) -> dict:
        import torch as t

        import rollmux.models  # noqa: F401  (a module of the working directory)

        time.sleep(hold_s)
        return {"cwd": os.getcwd(), "torch": float(t.ones(3).sum())}

    refs = {nid: probe.options(resources={f"rollmux_node:{nid}": 1}).remote(args.hold_s) for nid in nodes}
    tasks = {nid: ray.get(r, timeout=300) for nid, r in refs.items()}
    print(json.dumps({"driver_cwd": os.getcwd(), "driver_torch": float(torch.ones(2).sum()), "tasks": tasks}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
