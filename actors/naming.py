"""Names and Ray bootstrap of the RollMux actors: the leaf every runtime module imports.

Imports nothing from ``actors/`` (a leaf of the import graph, so the scheduler, controllers,
workers, driver client, CLI and HTTP app can all import it without circles):

- :data:`NAMESPACE`: the Ray namespace of every RollMux actor;
- actor names: :data:`SCHEDULER_NAME`, :func:`controller_name`, :func:`worker_name`; the key a
  worker hosts a job under, scoped by its scheduler: :func:`hosted_key`;
- :func:`ensure_ray`: connect this process to the cluster; :func:`control_plane_resources`:
  pin control-plane actors to the head node; :func:`get_actor`: a named actor's handle.
"""

from __future__ import annotations

import os
from typing import Optional

from rollmux.nodes import HEAD_RESOURCE

#: Ray namespace of every RollMux actor (scheduler, group controllers, workers).
NAMESPACE = "rollmux"
#: Name of the singleton GlobalScheduler actor (detached).
SCHEDULER_NAME = "rollmux-global-scheduler"


def controller_name(group_id: str, scheduler_name: Optional[str] = None) -> str:
    """Actor name of a group's controller: ``rollmux-group-<n>`` for policy group id ``group-<n>``
    (``rollmux-group-<gid>`` otherwise); a non-default scheduler's name replaces ``rollmux``."""
    prefix = scheduler_name if scheduler_name and scheduler_name != SCHEDULER_NAME else "rollmux"
    return f"{prefix}-{group_id}" if group_id.startswith("group-") else f"{prefix}-group-{group_id}"


def worker_name(node: str) -> str:
    """Actor name of the worker hosting jobs on ``node``."""
    return f"rollmux-worker-{node}"


def hosted_key(job_id: str, scheduler_name: Optional[str] = None) -> str:
    """The key a worker hosts ``job_id`` under: the job id for the default GlobalScheduler,
    ``<job_id>@<scheduler name>`` for another one, so two schedulers sharing a host (and its
    workers) never see or drop each other's job state, even for equal job ids."""
    if not scheduler_name or scheduler_name == SCHEDULER_NAME:
        return job_id
    return f"{job_id}@{scheduler_name}"


def ensure_ray(address: Optional[str] = None) -> None:
    """Connect this process to Ray (``address`` / ``RAY_ADDRESS`` / ``"auto"``) in namespace ``rollmux``."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", namespace=NAMESPACE,
                 log_to_driver=False)


def control_plane_resources() -> dict[str, float]:
    """Custom resources that pin control-plane actors (scheduler, group controllers) to the head.

    The head node started by ``rollmux up`` / ``start_local_cluster`` carries ``rollmux_head``;
    pinning the control plane there puts its metrics on the head's Prometheus endpoint. Returns
    ``{}`` on clusters without that resource (e.g. a plain ``ray start`` cluster).
    """
    import ray

    return {HEAD_RESOURCE: 0.001} if ray.cluster_resources().get(HEAD_RESOURCE) else {}


def get_actor(name: str):
    """Handle of the RollMux actor ``name``. Raises ValueError when it does not exist."""
    import ray

    return ray.get_actor(name, namespace=NAMESPACE)


def get_scheduler(name: Optional[str] = None):
    """Handle of the running GlobalScheduler (connects to Ray first). Raises ValueError when it
    does not exist."""
    ensure_ray()
    return get_actor(name or SCHEDULER_NAME)
