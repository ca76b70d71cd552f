"""Shared fixtures. At most one local Ray cluster is started per test session (``ray_cluster``);
the tests marked ``netns`` start their own stacks inside a network namespace they create.

The session's cluster runs in Ray's token mode with a fresh random token (Ray 2.60 binds its
GCS, raylet and worker ports to every address of the host): ``use_ephemeral_ray_token`` exports
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` before Ray is imported, unless
``RAY_AUTH_MODE`` is already set.

Nothing is left on disk: the session's cluster keeps everything (node temp dirs, Ray's session
files, the workers' temp files) in one private run dir that its teardown removes, and the session
fails at its end when any cluster started here left a run dir or a ``/tmp/ray/session_*`` behind
(:func:`actors.ops.local_cluster.leftovers`). pytest's own ``tmp_path`` dirs are kept for failed
tests only (``tmp_path_retention_policy``).
"""

from __future__ import annotations

import os

from actors.handles import SchedulerHandle
import pytest

from actors.ops.local_cluster import use_ephemeral_ray_token

use_ephemeral_ray_token()
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# tests/vllm_cpu/ runs in its own session and environment (scripts/test_vllm.sh sets this).
collect_ignore_glob = [] if os.environ.get("ROLLMUX_VLLM_SESSION") else ["vllm_cpu/*"]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def pytest_sessionfinish(session, exitstatus):
    """Fail the session when a local cluster started by it left files behind (checked after every
    fixture's teardown)."""
    from actors.ops.local_cluster import leftovers

    left = leftovers()
    if left:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = "local Ray cluster files left behind: " + ", ".join(map(str, left))
        if tr is not None:
            tr.write_line(msg, red=True, bold=True)
        else:  # pragma: no cover
            print(msg)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
def scaleout_cluster_spec(local_cluster_spec):
    """``cluster_local.yaml`` with one more rollout node (``rollout-2``): room for a rollout
    scale-out of a 2-rollout-node job beside a group on ``rollout-0``. The session's Ray cluster
    carries its nodes; schedulers built on ``local_cluster_spec`` never place on ``rollout-2``."""
    pool = local_cluster_spec.rollout_pool.model_copy(update={"num_nodes": local_cluster_spec.rollout_pool.num_nodes + 1})
    return local_cluster_spec.model_copy(update={"rollout_pool": pool})


@pytest.fixture(scope="session")
def ray_cluster(scaleout_cluster_spec):
    """The session's single local multi-node Ray cluster (head + one Ray node per pool node of
    :func:`scaleout_cluster_spec`)."""
    from actors.ops.local_cluster import start_local_cluster

    lc = start_local_cluster(scaleout_cluster_spec, head_cpus=2, node_cpus=1, object_store_mb=96)
    import ray

    import factories

    ray.cloudpickle.register_pickle_by_value(factories)  # the toy jobs' phases run on the workers
    yield lc
    lc.shutdown()


@pytest.fixture(scope="module")
def module_scheduler(ray_cluster, local_cluster_spec, request):
    """A GlobalScheduler of the test module's own on the session's cluster (named after the
    module), killed after the module; yields its name. Its jobs stay in the groups admission packs
    them into (``factories.FIXED_GROUPS``): the modules using it check what happens inside a group."""
    from factories import FIXED_GROUPS, own_scheduler

    with own_scheduler(local_cluster_spec, "test-" + request.module.__name__.rpartition(".")[2],
                       FIXED_GROUPS) as name:
        yield name


@pytest.fixture(scope="session")
def serve_api(ray_cluster, local_cluster_spec, tmp_path_factory):
    """The HTTP admission API (serve_app.py on Ray Serve, 127.0.0.1, a free port) over a GlobalScheduler
    of its own (unique name, so other tests' scheduler state is untouched). Yields a SimpleNamespace
    with ``base_url``, ``token``, ``scheduler`` (actor handle) and ``scheduler_name``.
    Teardown: departs its jobs, kills its scheduler and group controllers, shuts Serve down."""
    import socket
    import uuid
    from types import SimpleNamespace

    import ray
    from ray import serve

    import serve_app
    from actors.scheduler.global_scheduler import NAMESPACE, get_or_create_scheduler
    from rollmux.config import ServeConfig

    name = f"rollmux-serve-test-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path_factory.mktemp("serve_ckpt")
    sched = get_or_create_scheduler(local_cluster_spec, checkpoint_path=str(ckpt), name=name)
    SchedulerHandle(sched).health(timeout_s=120)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = uuid.uuid4().hex
    cfg = ServeConfig(port=port, scheduler_name=name, state_dir=ckpt, request_timeout_s=60,
                      app_name=f"rollmux-test-{name[-8:]}")
    base = serve_app.deploy(cfg, token)
    yield SimpleNamespace(base_url=base, token=token, scheduler=sched, scheduler_name=name, config=cfg)
    try:
        sched = ray.get_actor(name, namespace=NAMESPACE)
        ctrls = {g.controller for g in SchedulerHandle(sched).list_groups(timeout_s=60)}
        for j in SchedulerHandle(sched).list_jobs(timeout_s=60):
            ctrls.add(j.controller)
            SchedulerHandle(sched).depart(j.job_id, timeout_s=60)
        for c in filter(None, ctrls):
            try:
                ray.kill(ray.get_actor(c, namespace=NAMESPACE), no_restart=True)
            except ValueError:
                pass
        ray.kill(sched, no_restart=True)
    finally:
        serve.shutdown()
