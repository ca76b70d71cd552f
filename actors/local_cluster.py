"""Start a multi-node local Ray cluster whose nodes mirror a :class:`rollmux.models.ClusterSpec`.

Each rollout / training node of the spec becomes a real Ray node (``ray.cluster_utils.Cluster``)
carrying ``rollmux_node:<id>`` and ``rollmux_pool:<pool>`` custom resources, so placements made
by the policy are honoured by Ray without code changes on a real (or KubeRay) cluster. With
``pool_nodes_per_ray_node=k`` one Ray node carries the resources of ``k`` pool nodes (emulated
accelerators: 64 pool nodes need not be 64 raylets; each pool node still gets its own worker
actor, pinned by its own resource).

Ray 2.60 binds its GCS, raylet and worker ports to every address of the host, so these clusters
run in Ray's token mode too (:func:`use_ephemeral_ray_token`) unless ``RAY_AUTH_MODE`` is set.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from dataclasses import dataclass, field
from typing import Optional

from rollmux.models import ClusterSpec
from rollmux.nodes import HEAD_RESOURCE, NODE_RESOURCE_UNITS, node_id, node_resource, pool_resource

from actors import NAMESPACE  # noqa: E402  (re-exported)


def use_ephemeral_ray_token() -> Optional[Path]:
    """Put this process (and everything it starts) in Ray's token mode with a fresh random token.

    When ``RAY_AUTH_MODE`` is unset: writes a 256-bit token to a private (0700) temp dir, sets
    ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` in ``os.environ`` (inherited by Ray's
    processes, drivers and subprocesses) and deletes the file at exit. Call it before Ray is
    imported. Returns the token file, or ``None`` when ``RAY_AUTH_MODE`` was already set (an
    explicit choice is kept). Never touches ``~/.ray``.
    """
    if os.environ.get("RAY_AUTH_MODE"):
        return None
    d = Path(tempfile.mkdtemp(prefix="rollmux-raytoken-"))
    path = d / "auth_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(path))
    atexit.register(shutil.rmtree, d, True)
    return path


@dataclass
class LocalCluster:
    """Handle on a started local cluster; ``shutdown()`` stops every node it started."""

    address: str
    cluster: object = field(repr=False)
    node_ids: list[str] = field(default_factory=list)

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()  # type: ignore[attr-defined]


def cpu_pinning(spec: ClusterSpec, cpus: Optional[list[int]] = None) -> dict[str, list[int]]:
    """``{node id: [cpu]}``: the pool nodes interleaved (rollout-0, train-0, rollout-1, ...) over
    ``cpus`` (default: this process's CPU affinity) round-robin. Raises ValueError for an
    unbounded pool or no CPUs."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
    if not cpus:
        raise ValueError("cpu_pinning: no CPUs to pin to")
    pools = []
    for pool in ("rollout", "train"):
        p = spec.pool(pool)  # type: ignore[arg-type]
        if p.num_nodes is None:
            raise ValueError(f"{pool} pool of {spec.name!r} is unbounded; a local cluster needs num_nodes")
        pools.append([node_id(pool, i) for i in range(p.num_nodes)])  # type: ignore[arg-type]
    order = [n for i in range(max(len(x) for x in pools)) for x in pools if i < len(x) for n in [x[i]]]
    return {n: [cpus[k % len(cpus)]] for k, n in enumerate(order)}


def start_local_cluster(
    spec: ClusterSpec,
    *,
    head_cpus: int = 2,
    node_cpus: int = 1,
    object_store_mb: int = 96,
    include_dashboard: bool = False,
    connect: bool = True,
    head_extra: Optional[dict] = None,
    node_gpus: float = 0,
    pin_cpus: bool = False,
    pool_nodes_per_ray_node: int = 1,
    worker_niceness: Optional[int] = None,
) -> LocalCluster:
    """Start a head node plus one Ray node per pool node of ``spec`` and (optionally) connect.

    Args:
        spec: cluster spec; each pool must have a bounded ``num_nodes``.
        head_cpus: CPUs of the head (scheduler, controllers, driver, Serve).
        node_cpus: logical CPUs per pool node (1 worker thread per "GPU").
        object_store_mb: object store per node, MiB.
        pin_cpus: pin each pool node's worker process to its own CPU (:func:`cpu_pinning`, passed
            to the node's processes as env ``ROLLMUX_CPU_PIN``), so that a node's compute is its
            own; with fewer CPUs than nodes, nodes share CPUs round-robin (first rollout and first
            training node on different CPUs).
        node_gpus: GPUs each pool node declares (a single-GPU host: 1 on every node, all of them
            the same device ``0``; workers then request ``ROLLMUX_WORKER_GPUS`` of it).
        pool_nodes_per_ray_node: how many pool nodes (of one pool) one Ray node carries (each with
            its own ``rollmux_node:<id>`` resource; ``rollmux_pool:<pool>`` counts them). 1: one
            Ray node per pool node. ``node_cpus`` / ``node_gpus`` are per Ray node.
        worker_niceness: the nice value of the cluster's worker processes (Ray's default 15 lets
            any other load on the machine delay them; emulated accelerators, whose phases are
            timed waits, pass 0). None: Ray's default (or env ``RAY_worker_niceness``).
    Raises:
        ValueError: a pool has ``num_nodes=None``; ``pool_nodes_per_ray_node`` < 1.
    """
    if pool_nodes_per_ray_node < 1:
        raise ValueError(f"pool_nodes_per_ray_node must be >= 1, got {pool_nodes_per_ray_node}")
    use_ephemeral_ray_token()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster

    if worker_niceness is not None:  # read by the raylets this process starts
        os.environ["RAY_worker_niceness"] = str(int(worker_niceness))
    if pin_cpus:
        import json

        os.environ["ROLLMUX_CPU_PIN"] = json.dumps(cpu_pinning(spec))
    head_args = {
        "num_cpus": head_cpus,
        "object_store_memory": object_store_mb * 2**20,
        "include_dashboard": include_dashboard,
        "resources": {HEAD_RESOURCE: 1.0},
    }
    head_args.update(head_extra or {})
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    ids: list[str] = []
    for pool in ("rollout", "train"):
        p = spec.pool(pool)  # type: ignore[arg-type]
        if p.num_nodes is None:
            raise ValueError(f"{pool} pool of {spec.name!r} is unbounded; a local cluster needs num_nodes")
        k = pool_nodes_per_ray_node
        for first in range(0, p.num_nodes, k):
            nids = [node_id(pool, i) for i in range(first, min(p.num_nodes, first + k))]  # type: ignore[arg-type]
            res = {node_resource(n): NODE_RESOURCE_UNITS for n in nids}
            res[pool_resource(pool)] = float(len(nids))  # type: ignore[arg-type]
            cluster.add_node(num_cpus=node_cpus, num_gpus=node_gpus, object_store_memory=object_store_mb * 2**20,
                             resources=res)
            ids.extend(nids)
    cluster.wait_for_nodes()
    if connect:
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    return LocalCluster(address=cluster.address, cluster=cluster, node_ids=ids)
