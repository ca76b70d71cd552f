"""Shared fixtures. At most one local Ray cluster is started per test session (``ray_cluster``)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="GPU test: no CUDA device on this machine (runs on a GPU host only)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def local_cluster_spec():
    from rollmux.config import CONFIG_DIR, load_cluster

    return load_cluster(CONFIG_DIR / "cluster_local.yaml")


@pytest.fixture(scope="session")
def ray_cluster(local_cluster_spec):
    """The session's single local multi-node Ray cluster (head + one Ray node per pool node)."""
    from actors.local_cluster import start_local_cluster

    lc = start_local_cluster(local_cluster_spec, head_cpus=2, node_cpus=1, object_store_mb=96)
    yield lc
    lc.shutdown()
