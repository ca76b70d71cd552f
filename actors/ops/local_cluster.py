"""Start a multi-node local Ray cluster whose nodes mirror a :class:`rollmux.models.ClusterSpec`.

Each rollout / training node of the spec becomes a real Ray node (``ray.cluster_utils.Cluster``)
carrying ``rollmux_node:<id>`` and ``rollmux_pool:<pool>`` custom resources, so placements made
by the policy are honoured by Ray without code changes on a real (or KubeRay) cluster. With
``pool_nodes_per_ray_node=k`` one Ray node carries the resources of ``k`` pool nodes (emulated
accelerators: 64 pool nodes need not be 64 raylets; each pool node still gets its own worker
actor, pinned by its own resource).

Ray 2.60 binds its GCS, raylet and worker ports to every address of the host, so these clusters
run in Ray's token mode too (:func:`use_ephemeral_ray_token`) unless ``RAY_AUTH_MODE`` is set.

Everything a cluster writes lives under one private run directory (``$TMPDIR/rmx-<random>``, mode
0700) that :meth:`LocalCluster.shutdown` (or, failing that, interpreter exit) removes: each Ray
node's own temp dir (``head``, ``<node id>``: separate session dirs, so sibling nodes never share
or delete each other's unpacked runtime-env packages, :mod:`actors.ops.ray_dirs`), Ray's address file
(``RAY_TMPDIR``) and the temp files of the workers (their ``TMPDIR``, e.g. default cold-start
checkpoints). Nothing is left in ``/tmp/ray``.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
import threading
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


#: Run directories of the clusters this process started and has not yet removed (a test session
#: checks at its end that none is left).
LIVE_RUN_DIRS: set[Path] = set()
_ENV_LOCK = threading.Lock()


@dataclass
class LocalCluster:
    """Handle on a started local cluster; ``shutdown()`` stops every node it started and removes
    its run directory ``run_dir`` (node temp dirs, session files, workers' temp files)."""

    address: str
    cluster: object = field(repr=False)
    node_ids: list[str] = field(default_factory=list)
    run_dir: Optional[Path] = None
    node_dirs: dict[str, Path] = field(default_factory=dict)  # "head" / pool node id -> its Ray node's temp dir

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        try:
            self.cluster.shutdown()  # type: ignore[attr-defined]
        finally:
            if self.run_dir is not None:
                remove_run_dir(self.run_dir)


def new_run_dir(parent: Optional[str] = None) -> Path:
    """A fresh private (0700) run directory ``<parent or $TMPDIR>/rmx-<random>``, short enough for
    Ray's socket paths (falls back to ``/tmp`` when ``parent`` is too long); removed at interpreter
    exit if :func:`remove_run_dir` was not called. Returns its path."""
    from actors.ops.ray_dirs import MAX_ROOT_CHARS

    base = parent or tempfile.gettempdir()
    if len(os.path.join(base, "rmx-12345678")) > MAX_ROOT_CHARS:
        base = "/tmp"
    d = Path(tempfile.mkdtemp(prefix="rmx-", dir=base))  # mode 0700, unique
    LIVE_RUN_DIRS.add(d)
    atexit.register(remove_run_dir, d)
    return d


def remove_run_dir(d: Path) -> None:
    """Delete a run directory made by :func:`new_run_dir` (idempotent)."""
    shutil.rmtree(d, ignore_errors=True)
    LIVE_RUN_DIRS.discard(Path(d))


def leftovers(pid: Optional[int] = None) -> list[Path]:
    """What clusters started by process ``pid`` (default: this one) left on disk: run dirs of
    :func:`new_run_dir` not yet removed, and Ray session dirs of a head started by that process in
    Ray's default temp dir (``$RAY_TMPDIR/ray`` or ``/tmp/ray``, ``session_*_<pid>``; a cluster
    started another way than :func:`start_local_cluster`). Empty when nothing is left."""
    from ray._common.utils import get_default_ray_temp_dir

    pid = os.getpid() if pid is None else pid
    out = sorted(d for d in LIVE_RUN_DIRS if d.exists())
    roots = {Path(get_default_ray_temp_dir()), Path("/tmp/ray")}
    out += sorted(p for r in roots for p in r.glob(f"session_*_{pid}") if p.is_dir() and not p.is_symlink())
    return out


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
            Ray node per pool node. ``node_cpus`` / ``node_gpus`` are per Ray node. Each Ray node
            has its own temp dir (``head``, then the id of its first pool node).
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

    from actors.ops.ray_dirs import HEAD_KEY, MAX_KEY_CHARS, node_temp_dir

    for pool in ("rollout", "train"):
        if spec.pool(pool).num_nodes is None:  # type: ignore[arg-type]
            raise ValueError(f"{pool} pool of {spec.name!r} is unbounded; a local cluster needs num_nodes")
    if worker_niceness is not None:  # read by the raylets this process starts
        os.environ["RAY_worker_niceness"] = str(int(worker_niceness))
    if pin_cpus:
        import json

        os.environ["ROLLMUX_CPU_PIN"] = json.dumps(cpu_pinning(spec))
    run_dir = new_run_dir()
    tmp = run_dir / "tmp"
    tmp.mkdir(mode=0o700)
    (run_dir / "ray").mkdir(mode=0o700)  # $RAY_TMPDIR/ray: Ray's default temp dir (address file)
    dirs = {HEAD_KEY: node_temp_dir(run_dir, HEAD_KEY)}
    head_args = {
        "num_cpus": head_cpus,
        "object_store_memory": object_store_mb * 2**20,
        "include_dashboard": include_dashboard,
        "resources": {HEAD_RESOURCE: 1.0},
        "temp_dir": str(dirs[HEAD_KEY]),
    }
    head_args.update(head_extra or {})
    ids: list[str] = []
    # the node processes (and the workers they start) inherit this environment: Ray's default temp
    # dir (its address file) and the workers' TMPDIR inside the run dir; restored once they run
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "TMPDIR")}
        os.environ.update(RAY_TMPDIR=str(run_dir), TMPDIR=str(tmp))
        try:
            cluster = Cluster(initialize_head=True, head_node_args=head_args)
            try:
                k = pool_nodes_per_ray_node
                for pool in ("rollout", "train"):
                    p = spec.pool(pool)  # type: ignore[arg-type]
                    for first in range(0, p.num_nodes, k):  # type: ignore[arg-type]
                        nids = [node_id(pool, i) for i in range(first, min(p.num_nodes, first + k))]  # type: ignore[arg-type]
                        res = {node_resource(n): NODE_RESOURCE_UNITS for n in nids}
                        res[pool_resource(pool)] = float(len(nids))  # type: ignore[arg-type]
                        key = nids[0] if len(nids[0]) <= MAX_KEY_CHARS else f"n{len(dirs)}"
                        d = node_temp_dir(run_dir, key)
                        dirs.update({n: d for n in nids})
                        cluster.add_node(num_cpus=node_cpus, num_gpus=node_gpus,
                                         object_store_memory=object_store_mb * 2**20, resources=res, temp_dir=str(d))
                        ids.extend(nids)
                cluster.wait_for_nodes()
            except BaseException:
                cluster.shutdown()
                raise
        except BaseException:
            remove_run_dir(run_dir)
            raise
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    lc = LocalCluster(address=cluster.address, cluster=cluster, node_ids=ids, run_dir=run_dir, node_dirs=dirs)
    if connect:
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    return lc
