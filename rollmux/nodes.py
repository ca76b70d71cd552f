"""Node naming shared by the policy (which names nodes) and the runtime (which honours names).

A node id is ``"<pool>-<index>"``, e.g. ``"rollout-0"``, ``"train-3"``. On Ray, the node carries
the custom resource :func:`node_resource` (capacity :data:`NODE_RESOURCE_UNITS`) so that actors
can be pinned to exactly that node, and :func:`pool_resource` naming its pool.
"""

from __future__ import annotations

from rollmux.models import PoolName

NODE_RESOURCE_UNITS = 1000.0
# Custom resource carried by the head node: control-plane actors and Serve replicas pin to it.
HEAD_RESOURCE = "rollmux_head"


def node_id(pool: PoolName, index: int) -> str:
    """Id of the ``index``-th node of ``pool``. Raises ValueError on a negative index."""
    if index < 0:
        raise ValueError(f"node index must be >= 0, got {index}")
    return f"{pool}-{index}"


def pool_of(node: str) -> PoolName:
    """Pool of a node id. Raises ValueError for an id not made by :func:`node_id`."""
    pool, _, idx = node.rpartition("-")
    if pool not in ("rollout", "train") or not idx.isdigit():
        raise ValueError(f"not a RollMux node id: {node!r}")
    return pool  # type: ignore[return-value]


def node_index(node: str) -> int:
    pool_of(node)
    return int(node.rpartition("-")[2])


def node_resource(node: str) -> str:
    """Ray custom-resource name that identifies node ``node`` (e.g. ``rollmux_node:rollout-0``)."""
    return f"rollmux_node:{node}"


def pool_resource(pool: PoolName) -> str:
    return f"rollmux_pool:{pool}"
