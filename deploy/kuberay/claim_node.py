#!/usr/bin/env python
"""Start a KubeRay worker pod as RollMux pool node ``<pool>-<i>`` (the lowest index still free).

A KubeRay worker group gives every replica the same ``rayStartParams``, but the scheduler pins
work to single nodes through a per-node custom resource ``rollmux_node:<pool>-<i>`` (capacity
1000) plus ``rollmux_pool:<pool>``. This wrapper, the container command of every worker pod of
``raycluster.yaml`` (annotation ``ray.io/overwrite-container-cmd``):

1. waits a random 0-``--jitter-s`` seconds, lists the cluster's alive nodes through the head's
   state API (``ray.util.state.list_nodes``; Ray's token is taken from ``RAY_AUTH_TOKEN``),
2. picks the lowest index in ``[0, --num-nodes)`` that no alive node carries,
3. runs KubeRay's generated ``ray start`` command (``$KUBERAY_GEN_RAY_START_CMD``) with
   ``--resources`` for that node, then checks again: when two pods claimed the same index, the
   one whose Ray node id sorts higher stops and exits 1 (Kubernetes restarts it; it claims again).
   The pod is recognised by its IP (``$MY_POD_IP``, set by KubeRay).

Exit codes: 0 never (it blocks with Ray), 1 lost a race / Ray exited, 2 every index is taken.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import socket
import subprocess
import sys
import time
from typing import Iterable, Optional

NODE_RESOURCE_UNITS = 1000.0  # same as rollmux.nodes.NODE_RESOURCE_UNITS (this file runs without the repo on sys.path)


def taken_indices(pool: str, node_resources: Iterable[dict]) -> set[int]:
    """Indices ``i`` such that some node's resources include ``rollmux_node:<pool>-<i>``."""
    prefix = f"rollmux_node:{pool}-"
    out = set()
    for res in node_resources:
        for k in res:
            if k.startswith(prefix) and k[len(prefix):].isdigit():
                out.add(int(k[len(prefix):]))
    return out


def pick_index(pool: str, num_nodes: int, node_resources: Iterable[dict]) -> Optional[int]:
    """Lowest free index of ``pool`` in ``[0, num_nodes)``, or ``None`` when all are taken."""
    taken = taken_indices(pool, node_resources)
    return next((i for i in range(num_nodes) if i not in taken), None)


def resources_flag(pool: str, index: int) -> str:
    """The ``--resources`` flag of pool node ``<pool>-<index>`` (node and pool resources)."""
    return "--resources=" + shlex.quote(json.dumps({f"rollmux_node:{pool}-{index}": NODE_RESOURCE_UNITS,
                                                    f"rollmux_pool:{pool}": 1.0}))


def loses_race(me: str, my_ip: str, nodes: Iterable[tuple[str, str, dict]]) -> bool:
    """True when another alive node claims resource ``me`` too and has the smaller Ray node id.

    ``nodes``: ``(node_id, node_ip, resources)`` of the alive nodes."""
    claimants = sorted((nid, ip) for nid, ip, res in nodes if me in res)
    return len(claimants) > 1 and claimants[0][1] != my_ip


def _alive_nodes(address: str) -> list[tuple[str, str, dict]]:
    from ray.util.state import list_nodes

    return [(n.node_id, n.node_ip, n.resources_total or {}) for n in list_nodes(address=address, detail=True, limit=10_000)
            if n.state == "ALIVE"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pool", choices=("rollout", "train"), required=True)
    ap.add_argument("--num-nodes", type=int, required=True, help="the pool's num_nodes in the cluster spec")
    ap.add_argument("--dashboard", default=os.environ.get("RAY_DASHBOARD_ADDRESS", ""),
                    help="http://<head service>:8265 (default $RAY_DASHBOARD_ADDRESS)")
    ap.add_argument("--jitter-s", type=float, default=10.0)
    a = ap.parse_args(argv)
    cmd = os.environ.get("KUBERAY_GEN_RAY_START_CMD")
    if not cmd or not a.dashboard:
        print("claim_node: needs $KUBERAY_GEN_RAY_START_CMD (KubeRay) and --dashboard", file=sys.stderr)
        return 2
    deadline = time.monotonic() + 600
    while True:  # the head may not answer yet
        try:
            time.sleep(random.uniform(0, a.jitter_s))
            nodes = _alive_nodes(a.dashboard)
            break
        except Exception as e:  # noqa: BLE001 - any failure to reach the head: retry until the deadline
            if time.monotonic() > deadline:
                print(f"claim_node: head not reachable: {e}", file=sys.stderr)
                return 1
    index = pick_index(a.pool, a.num_nodes, (r for _, _, r in nodes))
    if index is None:
        print(f"claim_node: all {a.num_nodes} {a.pool} node ids are taken", file=sys.stderr)
        return 2
    me = f"rollmux_node:{a.pool}-{index}"
    my_ip = os.environ.get("MY_POD_IP") or socket.gethostbyname(socket.gethostname())
    print(f"claim_node: this pod ({my_ip}) is RollMux node {a.pool}-{index}", flush=True)
    ray = subprocess.Popen(["/bin/bash", "-lc", f"{cmd} {resources_flag(a.pool, index)}"])
    time.sleep(15)
    try:
        lost = loses_race(me, my_ip, _alive_nodes(a.dashboard))
    except Exception:  # noqa: BLE001 - cannot check: keep the claim
        lost = False
    if lost:
        print(f"claim_node: {me} was claimed by an earlier node too; restarting to claim another", file=sys.stderr)
        ray.terminate()
        subprocess.run(["ray", "stop", "--force"], check=False)
        return 1
    return ray.wait()


if __name__ == "__main__":
    sys.exit(main())
