"""Cluster operation commands of the ``rollmux`` CLI: ``up``, ``down``, ``submit``, ``status``, ``urls``, ``env``.

``rollmux up`` starts a local Ray head (``ray start --head --block``, dashboard and metrics on
127.0.0.1) in Ray's token mode (the Ray token is passed to every process it starts), one Ray node
per pool node of a bounded cluster spec (custom resources ``rollmux_node:<id>`` /
``rollmux_pool:<pool>``), the ``GlobalScheduler`` actor and the Serve admission app (HTTP on
127.0.0.1:8000 by default); it returns once ``/healthz`` answers. ``rollmux up --address A``
deploys only the scheduler and the app onto the running Ray cluster ``A``. Every process it starts
is recorded (pid, process-group id, start time) in ``<state_dir>/state.json``; ``rollmux down``
signals exactly those process groups and nothing else (on a cluster it did not start: deletes the
app and RollMux's named actors). The state directory of the last ``up`` is recorded in
``~/.rollmux/current`` (``$ROLLMUX_CURRENT``), so later commands find the stack without
``--state-dir``; ``down`` keeps the record, so a plain ``up`` restarts that stack (and restores
its checkpoint). The scheduler's settings: ``--scheduler-config`` / ``$ROLLMUX_SCHEDULER_CONFIG``
(default ``configs/scheduler.yaml``), validated before anything starts.
Configuration: ``configs/serve.yaml`` (:class:`rollmux.config.ServeConfig`), ``ROLLMUX_*``
environment, flags. Ray is imported only inside the commands.

This module does not import the HTTP app: the CLI is assembled at the top of the import graph
(:mod:`rollmux_cli`), which registers these commands with the app's ``deploy`` function
(:func:`register`).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer
from rich.table import Table

from actors.ops.cli_stack import (  # noqa: F401  (_ephemeral_range: the tests read it here)
    console, PROM_TARGETS, EXPOSE_FLAG, MAX_LOCAL_POOL_NODES, _CFG_HELP, _fail, _config, _state_path,
    _read_state, _write_state, _record_current, _last_state_dir, _resolve, _non_loopback_addresses,
    _ray_auth_env, _port_free, _ephemeral_range, _free_port, _alive, _ray_temp_dir, _ray_node_dir, _ray_cli, _spawn,
    _wait_port, _stop, _write_prometheus_targets, _install_grafana_dashboard, _print_urls, _env_lines, _http,
    _fmt,
)
from actors.ops.ray_dirs import HEAD_KEY, UnsafeDirError
from rollmux.config import ConfigError, ServeConfig, load_cluster, load_job
from rollmux.nodes import HEAD_RESOURCE, NODE_RESOURCE_UNITS, node_id, node_resource, pool_resource

if TYPE_CHECKING:
    from rollmux.admission import SchedulerConfig
    from rollmux.answers import SchedulerHealth

#: ``deploy(cfg, token) -> base URL`` of the HTTP admission app, given by :func:`register`.
_DEPLOY: Optional[Callable[[ServeConfig, str], str]] = None


# ----------------------------------------------------------------------------- commands
def up(
    config: Optional[Path] = typer.Option(None, "--config", help=_CFG_HELP),
    host: Optional[str] = typer.Option(None, help="HTTP host (default 127.0.0.1)"),
    port: Optional[int] = typer.Option(None, help="HTTP port (default 8000)"),
    cluster_spec: Optional[Path] = typer.Option(None, "--cluster-spec", help="cluster YAML for the scheduler "
                                                "(default configs/cluster_local.yaml)"),
    scheduler_config: Optional[Path] = typer.Option(None, "--scheduler-config", help="scheduler settings YAML: tenant "
                                                    "quotas, priority classes, queue, preemption (default "
                                                    "configs/scheduler.yaml, or $ROLLMUX_SCHEDULER_CONFIG)"),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="state, token and checkpoint directory"),
    address: Optional[str] = typer.Option(None, "--address", help="deploy the scheduler and the API onto this running "
                                          "Ray cluster (GCS host:port, or 'auto'; run on its head node) instead of starting one"),
    ray_port: Optional[int] = typer.Option(None, "--ray-port", help="GCS port of the Ray head (default 6390)"),
    dashboard_port: Optional[int] = typer.Option(None, "--dashboard-port", help="Ray dashboard and job submission "
                                                 "port on 127.0.0.1 (default 8265)"),
    metrics_export_port: Optional[int] = typer.Option(None, "--metrics-export-port", help="Prometheus metrics port "
                                                      "of the Ray head (default 8080)"),
    open_read_routes: Optional[bool] = typer.Option(None, "--open-read-routes/--protect-read-routes",
                                                    help="GET routes answer without the API token (default: open)"),
    pool_nodes: Optional[bool] = typer.Option(None, "--pool-nodes/--no-pool-nodes", help="start one Ray node per pool "
                                              "node of the cluster spec (default: on)"),
    ray_auth: Optional[str] = typer.Option(None, "--ray-auth", help="Ray's own authentication: token (default) | disabled"),
    expose: bool = typer.Option(False, EXPOSE_FLAG, help="with --ray-auth disabled on a host with a non-loopback address: "
                                "accept that anyone who reaches this host's Ray ports (GCS, Ray Client, dashboard agent "
                                "job API, workers) can run commands as this user and call the scheduler directly"),
    timeout_s: float = typer.Option(300.0, "--timeout-s", help="bound on the whole start-up"),
) -> None:
    """Start a local Ray head (token mode), the GlobalScheduler and the HTTP admission API; wait for /healthz.

    With ``--address``: deploy the scheduler and the API onto a running Ray cluster instead."""
    given = dict(host=host, port=port, cluster_spec=cluster_spec, ray_port=ray_port, dashboard_port=dashboard_port,
                 metrics_export_port=metrics_export_port, open_read_routes=open_read_routes, start_pool_nodes=pool_nodes,
                 ray_auth=ray_auth, ray_address=address, scheduler_config=scheduler_config)
    cfg = _config(config, state_dir=state_dir, **given)
    last = _last_state_dir()
    if state_dir is None and "state_dir" not in cfg.model_fields_set and last not in (None, cfg.state_dir):
        # no state dir chosen (flag, $ROLLMUX_STATE_DIR, serve config): the last `up`'s stack, stopped
        # or not, so that `up --state-dir X; down; up` restores X's checkpoint
        cfg = _config(config, state_dir=last, **given)
        console.print(f"state dir {last} (the last `rollmux up`'s; --state-dir chooses another)")
    state = _read_state(cfg)
    if state and (any(_alive(r) for r in state.get("processes", [])) or state.get("mode") == "attached"):
        console.print(f"[yellow]RollMux is already up[/] (state {_state_path(cfg)}); `rollmux down` stops it.")
        _record_current(cfg.state_dir)
        _print_urls(cfg, state)
        return
    if cfg.ray_auth == "token" and os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        console.print("[yellow]RAY_AUTH_MODE=disabled in this environment is ignored: `rollmux up` uses Ray's token "
                      "mode unless told --ray-auth disabled (or ROLLMUX_RAY_AUTH=disabled)[/]")
    if cfg.ray_address is None and cfg.ray_auth == "disabled":
        exposed = _non_loopback_addresses()
        if exposed and not expose:
            _fail(f"--ray-auth disabled: Ray would listen without authentication on {', '.join(exposed)}; anyone who "
                  "reaches those addresses could run commands as this user through the GCS, Ray Client or dashboard "
                  "agent job API ports and call the scheduler's admit/depart directly. Use --ray-auth token (the "
                  f"default), or add {EXPOSE_FLAG} to accept that exposure", 2)
    ports = [] if cfg.ray_address else [("ray_port", cfg.ray_port), ("dashboard_port", cfg.dashboard_port),
                                         ("metrics_export_port", cfg.metrics_export_port)]
    for what, p in [("port", cfg.port), *ports]:
        if not _port_free(p):
            _fail(f"{what} {p} on 127.0.0.1 is already in use; choose another (--{what.replace('_', '-')} or ROLLMUX_{what.upper()})", 2)
    from rollmux.admission import load_scheduler_config

    try:
        cluster = load_cluster(cfg.cluster_spec)
        settings = load_scheduler_config(cfg.scheduler_config)  # validated before anything starts
    except ConfigError as e:
        _fail(str(e), 2)
    _check_checkpoint(cfg)
    token = cfg.resolve_token()
    generated = token is None
    if generated:
        token = secrets.token_urlsafe(32)
        cfg.token_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(cfg.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")

    env, ray_token = _ray_auth_env(cfg, cfg.ray_auth, dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
                                   generate=cfg.ray_address is None)
    # `rollmux down` tears the whole local cluster down: no need for Ray's 30 s drain on SIGTERM
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "RAY_AUTH_TOKEN_PATH") if k in env})
    if cfg.ray_address:
        _up_attached(cfg, cluster, settings, token, ray_token, timeout_s)
        if generated:
            console.print(f"generated a new API token in {cfg.token_path} (mode 0600)")
        return
    try:  # every Ray node gets a private temp dir of its own below one 0700 root
        _ray_node_dir(cfg, HEAD_KEY)
    except UnsafeDirError as e:
        _fail(str(e), 2)
    address = f"127.0.0.1:{cfg.ray_port}"
    client_port = _free_port()
    logs = cfg.state_dir / "logs"
    state = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": "local", "ray_address": address,
        "ray_auth": cfg.ray_auth, "ray_token": ray_token, "base_url": cfg.base_url, "processes": [],
        "dashboard_url": f"http://127.0.0.1:{cfg.dashboard_port}",
        "metrics_url": f"http://127.0.0.1:{cfg.metrics_export_port}/metrics",
        "ray_client_address": f"ray://127.0.0.1:{client_port}",
        "config": cfg.model_dump(mode="json", exclude={"token"}), "scheduler_config_sha256": settings.sha256(),
    }
    deadline = time.monotonic() + timeout_s
    try:
        with console.status("starting the Ray head ...") as st:
            head = _spawn(_ray_cli() + [
                "start", "--head", "--block", f"--port={cfg.ray_port}", "--node-ip-address=127.0.0.1",
                "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={cfg.dashboard_port}",
                f"--metrics-export-port={cfg.metrics_export_port}", f"--num-cpus={cfg.head_cpus}",
                f"--dashboard-agent-listen-port={_free_port()}", f"--ray-client-server-port={client_port}",
                f"--resources={json.dumps({HEAD_RESOURCE: 1.0})}", "--disable-usage-stats", f"--temp-dir={_ray_node_dir(cfg, HEAD_KEY)}",
            ], logs / "ray-head.log", env)
            state["processes"].append({**head, "what": "ray head"})
            _write_state(cfg, state)
            _wait_port(cfg.ray_port, head, max(5.0, deadline - time.monotonic()), "the Ray head")
            st.update("connecting to the Ray head ...")
            _connect(cfg, address)
            n_pool = sum(cluster.pool(p).num_nodes or 0 for p in ("rollout", "train"))  # type: ignore[arg-type]
            bounded = all(cluster.pool(p).num_nodes for p in ("rollout", "train"))  # type: ignore[arg-type]
            if cfg.start_pool_nodes and bounded and n_pool > MAX_LOCAL_POOL_NODES:
                console.print(f"[yellow]not starting {n_pool} local pool nodes (> {MAX_LOCAL_POOL_NODES}); "
                              "the scheduler plans for the spec, jobs need a real cluster[/]")
            if cfg.start_pool_nodes and bounded and n_pool <= MAX_LOCAL_POOL_NODES:
                for pool in ("rollout", "train"):
                    for i in range(cluster.pool(pool).num_nodes):  # type: ignore[arg-type]
                        nid = node_id(pool, i)  # type: ignore[arg-type]
                        st.update(f"starting Ray node {nid} ...")
                        _start_pool_node(cfg, state, address, nid, pool, cluster.pool(pool).node.gpus_per_node,  # type: ignore[arg-type]
                                         logs, env, deadline)
            st.update("starting the GlobalScheduler and the Serve app ...")
            _start_scheduler_and_app(cfg, cluster, settings, token, deadline)
            st.update(f"waiting for {cfg.base_url}/healthz ...")
            _wait_healthy(cfg, deadline)
    except typer.Exit:
        _disconnect()
        _stop(state["processes"])
        _state_path(cfg).unlink(missing_ok=True)
        raise
    except Exception as e:  # start-up failed: stop what we started, clean message
        _disconnect()
        _stop(state["processes"])
        _state_path(cfg).unlink(missing_ok=True)
        _fail(f"start-up failed: {type(e).__name__}: {e}")
    _write_prometheus_targets(cfg, state)
    _install_grafana_dashboard(cfg)
    _record_current(cfg.state_dir)
    n_up = sum(_alive(r) for r in state["processes"])
    console.print(f"[bold green]RollMux is up[/]: {n_up} Ray node(s), scheduler and API ready; Ray auth: {cfg.ray_auth}.")
    if generated:
        console.print(f"generated a new API token in {cfg.token_path} (mode 0600)")
    _print_urls(cfg, state)


def _check_checkpoint(cfg: ServeConfig) -> None:
    """Read the scheduler checkpoint ``up`` will restore, before anything starts: a damaged one
    exits with the scheduler's own refusal (where it is, how to recover) instead of a scheduler
    actor that dies at start-up."""
    from actors.naming import SCHEDULER_NAME
    from actors.scheduler.checkpoint import Checkpoint, CheckpointError
    from actors.scheduler.kv import FileKV

    if not cfg.checkpoint.is_dir():
        return
    try:
        Checkpoint(FileKV(cfg.checkpoint), cfg.scheduler_name or SCHEDULER_NAME).load()
    except CheckpointError as e:
        _fail(str(e), 2)


def _up_attached(cfg: ServeConfig, cluster, settings: SchedulerConfig, token: str, ray_token: Optional[str],
                 timeout_s: float) -> None:
    """``rollmux up --address``: the scheduler and the Serve app on a Ray cluster started elsewhere.

    Checks that the cluster's nodes carry ``rollmux_node:<id>`` for every node of a bounded spec
    (a warning lists the missing ones: the scheduler may place jobs there, and they wait). Starts
    no process; records the deployment so that ``down`` removes the app and RollMux's actors."""
    deadline = time.monotonic() + timeout_s
    state = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": "attached",
             "ray_address": cfg.ray_address, "ray_auth": cfg.ray_auth, "ray_token": ray_token,
             "base_url": cfg.base_url, "processes": [], "config": cfg.model_dump(mode="json", exclude={"token"}),
             "scheduler_config_sha256": settings.sha256()}
    try:
        with console.status(f"connecting to the Ray cluster at {cfg.ray_address} ..."):
            _connect(cfg, cfg.ray_address)  # type: ignore[arg-type]
            import ray

            have = {k for n in ray.nodes() if n.get("Alive") for k in n.get("Resources", {})}
            want = [node_id(p, i) for p in ("rollout", "train") for i in range(cluster.pool(p).num_nodes or 0)]  # type: ignore[arg-type]
            missing = [nid for nid in want if node_resource(nid) not in have]
            try:
                ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
                state["serve_was_running"] = True
            except ValueError:
                state["serve_was_running"] = False
            state["dashboard_url"] = _dashboard_url()
            _start_scheduler_and_app(cfg, cluster, settings, token, deadline)
        _write_state(cfg, state)
        _wait_healthy(cfg, deadline)
    except typer.Exit:
        _disconnect()
        raise
    except Exception as e:
        _disconnect()
        _fail(f"deploying onto {cfg.ray_address} failed: {type(e).__name__}: {e}")
    _record_current(cfg.state_dir)
    console.print(f"[bold green]RollMux is up[/] on the Ray cluster at {cfg.ray_address}: scheduler and API ready.")
    if missing:
        console.print(f"[yellow]no Ray node carries {', '.join(node_resource(n) for n in missing)}: jobs placed "
                      "there wait until such a node joins (see docs/OPERATIONS.md, 'Real clusters')[/]")
    _print_urls(cfg, state)


def _dashboard_url() -> Optional[str]:
    try:
        from ray._private.worker import _global_node

        url = _global_node.webui_url if _global_node is not None else None  # type: ignore[union-attr]
        return None if not url else url if url.startswith("http") else f"http://{url}"
    except Exception:
        return None


def _connect(cfg: ServeConfig, address: str) -> None:
    import ray

    from actors.naming import NAMESPACE

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")


def _disconnect() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def _alive_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


def _start_pool_node(cfg: ServeConfig, state: dict, address: str, nid: str, pool: str, cpus: int, logs: Path,
                     env: dict, deadline: float, attempts: int = 2) -> None:
    """Start one pool node (``ray start --address ... --block``) and wait until it registers.

    One at a time: on a small, busy machine several raylets starting together can time out. A
    node whose process dies during start-up is retried once. Exits with a message otherwise."""
    res = {node_resource(nid): NODE_RESOURCE_UNITS, pool_resource(pool): 1.0}  # type: ignore[arg-type]
    node_dir = _ray_node_dir(cfg, nid)  # its own session dir: runtime-env packages unpacked per node
    for attempt in range(attempts):
        before = _alive_nodes()
        metrics_port = _free_port()
        rec = _spawn(_ray_cli() + [
            "start", f"--address={address}", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
            f"--resources={json.dumps(res)}", "--disable-usage-stats", f"--temp-dir={node_dir}",
            f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={metrics_port}",
        ], logs / f"ray-{nid}.log", env)
        state["processes"].append({**rec, "what": f"ray node {nid}"})
        _write_state(cfg, state)
        while time.monotonic() < deadline and _alive(rec):
            if _alive_nodes() > before:
                state.setdefault("node_metrics", {})[nid] = f"http://127.0.0.1:{metrics_port}/metrics"
                _write_state(cfg, state)
                return
            time.sleep(0.5)
        if time.monotonic() >= deadline:
            break
    _fail(f"Ray node {nid} did not join the cluster; see {logs / f'ray-{nid}.log'}")


def _start_scheduler_and_app(cfg: ServeConfig, cluster, settings: SchedulerConfig, token: str, deadline: float) -> None:
    """The GlobalScheduler (with ``settings``, unless it restores its checkpoint's), the Serve app
    and the rollout service. Exits when ``cfg.scheduler_config`` was given but the scheduler,
    restored from its checkpoint, runs with other settings (the file would be silently ignored)."""
    import ray

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle

    if _DEPLOY is None:
        _fail("the HTTP app is not wired into this CLI (use the `rollmux` command, rollmux_cli.app)")
    try:
        kw = {"name": cfg.scheduler_name} if cfg.scheduler_name else {}
        sched = SchedulerHandle(get_or_create_scheduler(cluster, checkpoint_path=str(cfg.checkpoint),
                                                        config=settings, **kw))
        _refuse_other_settings(cfg, sched.health(timeout_s=max(5.0, deadline - time.monotonic())), settings)
        _DEPLOY(cfg, token)
        from actors.rollout.service import ensure_rollout_service, service_name

        ensure_rollout_service(service_name(cfg.scheduler_name or "default")).ready_sync(  # /v1/rollouts behind the app
            timeout_s=max(30.0, deadline - time.monotonic()))
    finally:
        ray.shutdown()


def _refuse_other_settings(cfg: ServeConfig, health: SchedulerHealth, settings: SchedulerConfig) -> None:
    """Exit (2) when ``cfg.scheduler_config`` was given but the scheduler runs with other settings
    (``health.config_sha256``): it restored its checkpoint, whose settings it keeps."""
    if cfg.scheduler_config is not None and health.config_sha256 != settings.sha256():
        _fail(f"--scheduler-config {cfg.scheduler_config}: the scheduler restored its checkpoint ({cfg.checkpoint}), "
              "whose settings differ from this file's, and a restored scheduler keeps the checkpoint's settings. To "
              "run with this file: `rollmux down --purge` (drops the checkpoint and the admitted jobs' records), then "
              "`rollmux up --scheduler-config ...` again", 2)


def _wait_healthy(cfg: ServeConfig, deadline: float) -> None:
    import httpx

    last = "no answer"
    deadline = max(deadline, time.monotonic() + 60.0)  # the app was just deployed: give its proxy a minute
    while time.monotonic() < deadline:
        try:
            r = httpx.get(cfg.base_url + "/healthz", timeout=5.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        time.sleep(0.5)
    _fail(f"{cfg.base_url}/healthz did not answer 200 in time ({last})")


def down(
    config: Optional[Path] = typer.Option(None, "--config", help=_CFG_HELP),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="default: the stack the last `rollmux up` started"),
    grace_s: float = typer.Option(20.0, "--grace-s", help="seconds to wait after SIGTERM before SIGKILL"),
    purge: bool = typer.Option(False, "--purge", help="also delete the scheduler checkpoint and Ray's session files"),
) -> None:
    """Stop every process `rollmux up` started (recorded in <state_dir>/state.json), nothing else.

    After ``up --address``: delete the API app and RollMux's actors from that cluster, leave the
    cluster running. The scheduler checkpoint is kept (the next `up` restores admitted jobs) unless
    ``--purge``."""
    import shutil

    cfg, state = _resolve(config, state_dir)
    if not state:
        console.print(f"nothing to stop (no state file at {_state_path(cfg)})")
    elif state.get("mode") == "attached":
        for line in _undeploy(cfg, state):
            console.print(line)
        _state_path(cfg).unlink(missing_ok=True)
        console.print(f"[bold]RollMux is down[/] (the Ray cluster at {state.get('ray_address')} keeps running).")
    else:
        recs = list(reversed(state.get("processes", [])))  # pool nodes first, then the head
        for line in _stop(recs, grace_s):
            console.print(line)
        _state_path(cfg).unlink(missing_ok=True)
        console.print("[bold]RollMux is down.[/]")
    if purge:
        for d in (cfg.checkpoint, _ray_temp_dir(cfg), cfg.state_dir / "logs"):
            shutil.rmtree(d, ignore_errors=True)
        (cfg.state_dir / PROM_TARGETS).unlink(missing_ok=True)  # it names ports of the stopped nodes
        console.print(f"purged {cfg.checkpoint}, {_ray_temp_dir(cfg)}, the logs and {PROM_TARGETS}")


def _undeploy(cfg: ServeConfig, state: dict) -> list[str]:
    """Delete the Serve app ``up --address`` deployed (and Serve itself if it started it) and kill
    every named actor in RollMux's namespace (scheduler, group controllers, workers)."""
    env, _ = _ray_auth_env(cfg, state.get("ray_auth", cfg.ray_auth), dict(os.environ), generate=False)
    if state.get("ray_token", "") and str(state["ray_token"]).startswith("/"):
        env.setdefault("RAY_AUTH_TOKEN_PATH", state["ray_token"])
    os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH") if k in env})
    out = []
    try:
        _connect(cfg, state["ray_address"])
        import ray
        from ray import serve

        from actors import NAMESPACE

        serve.delete(cfg.app_name)
        out.append(f"Serve app {cfg.app_name!r}: deleted")
        if not state.get("serve_was_running", True):
            serve.shutdown()
            out.append("Serve: shut down (`up` had started it)")
        for a in ray.util.list_named_actors(all_namespaces=True):
            if a.get("namespace") == NAMESPACE:
                try:
                    ray.kill(ray.get_actor(a["name"], namespace=NAMESPACE), no_restart=True)
                    out.append(f"actor {a['name']}: killed")
                except ValueError:
                    pass
    except Exception as e:
        _fail(f"cannot reach the Ray cluster at {state.get('ray_address')} to undeploy: {type(e).__name__}: {e}")
    finally:
        _disconnect()
    return out


def submit(
    spec: Path = typer.Argument(..., help="job spec YAML (configs/jobs/*.yaml; a top-level `job:` key is accepted)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="what-if: decide without admitting"),
    queue: bool = typer.Option(False, "--queue", help="on a bounded cluster, hold the job in the admission queue when it "
                               "does not fit now (admitted after a departure frees room) instead of refusing it"),
    config: Optional[Path] = typer.Option(None, "--config", help=_CFG_HELP),
    port: Optional[int] = typer.Option(None, help="HTTP port of the API"),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="default: the stack the last `rollmux up` started"),
) -> None:
    """Submit a job spec to the admission API (POST /v1/jobs) and print the decision (with
    ``--queue``: queued, with its place in line, when it does not fit now)."""
    cfg, _ = _resolve(config, state_dir, port=port)
    try:
        job = load_job(spec)
    except ConfigError as e:
        _fail(str(e), 2)
    if cfg.resolve_token() is None:
        _fail(f"no API token: set ${cfg.token_env} or create {cfg.token_path} (`rollmux up` does)", 2)
    r = _http(cfg, "POST", "/v1/jobs:dry-run" if dry_run else "/v1/jobs",
              json={**job.model_dump(mode="json"), **({"queue": True} if queue else {})})
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"detail": r.text}
    d = body.get("decision", body)
    t = Table(title=f"{'dry run: ' if dry_run else ''}job {job.job_id}: HTTP {r.status_code}", show_header=False)
    if r.status_code == 202:
        t.add_row("decision", f"[yellow]queued[/] at position {body.get('queue_position')}")
    elif r.status_code in (200, 201):
        t.add_row("decision", "[green]admissible[/]" if dry_run else "[green]admitted[/]")
    else:
        t.add_row("decision", f"[red]{body.get('error', 'refused')}[/]")
        t.add_row("reason", str(body.get("detail", "")))
    if isinstance(d, dict) and "explanation" in d:
        pl = d.get("placement") or {}
        t.add_row("group", _fmt(d.get("group_id")))
        t.add_row("strategy", _fmt(d["explanation"].get("strategy")))
        t.add_row("rollout nodes", _fmt(pl.get("rollout_nodes")))
        t.add_row("training nodes", _fmt(pl.get("train_nodes")))
        t.add_row("marginal cost", f"{_fmt(d.get('marginal_cost_usd_per_h'))} USD/h")
        for j, s in (d.get("predicted_slowdowns") or {}).items():
            t.add_row(f"slowdown {j}", f"{s:.3f}x")
        t.add_row("explanation", d["explanation"].get("reason", ""))
    console.print(t)
    if r.status_code not in (200, 201, 202):
        raise typer.Exit(1)


def status_rows(jobs: list[dict]) -> tuple[list[tuple], list[tuple]]:
    """``rollmux status``'s rows from ``GET /v1/jobs``: the jobs with a place in no queue
    ``(job, state, group, iterations, slowdown, SLO, error)``, and the admission queue in line
    order ``(#position, job, state, class, waited s)``, where a preempted job waiting to resume
    stands at its place ("preempted by <job>, waiting to resume")."""
    placed, waiting = [], []
    for j in jobs:
        pos = j.get("queue_position")
        if pos is None:
            placed.append((j["job_id"], j.get("state"), j.get("group_id"), j.get("iterations_done"), j.get("slowdown"),
                           j.get("slo"), j.get("error")))
            continue
        state = j.get("state")
        if state == "preempted" and j.get("preemptions"):  # by whom, waiting to resume
            state = f"preempted by {j['preemptions'][-1].get('by_job')}, waiting to resume"
        waiting.append((f"#{pos}", j["job_id"], state, j.get("priority_class"), round(j.get("waited_s") or 0.0)))
    waiting.sort(key=lambda r: int(r[0][1:]))
    return placed, waiting


def status(
    config: Optional[Path] = typer.Option(None, "--config", help=_CFG_HELP),
    port: Optional[int] = typer.Option(None, help="HTTP port of the API"),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="default: the stack the last `rollmux up` started"),
) -> None:
    """Co-execution groups and jobs (GET /v1/groups, /v1/jobs) as tables."""
    cfg, _ = _resolve(config, state_dir, port=port)
    h = _http(cfg, "GET", "/healthz")
    if h.status_code != 200:
        _fail(f"API unhealthy: HTTP {h.status_code} {h.text[:300]}")
    groups, jobs = _http(cfg, "GET", "/v1/groups"), _http(cfg, "GET", "/v1/jobs")
    for r in (groups, jobs):
        if r.status_code != 200:
            _fail(f"{r.request.url.path}: HTTP {r.status_code} {r.text[:300]}")
    tg = Table(title="co-execution groups")
    for c in ("group", "members", "rollout nodes", "training nodes", "USD/h", "T_cycle s", "T_load s", "slack s"):
        tg.add_column(c)
    for g in groups.json():
        tg.add_row(g["group_id"], _fmt(g.get("members")), _fmt(g.get("rollout_nodes")), _fmt(g.get("train_nodes")),
                   _fmt(g.get("cost_usd_per_h")), _fmt(g.get("t_cycle_s")), _fmt(g.get("t_load_s")), _fmt(g.get("slack_s")))
    placed, waiting = status_rows(jobs.json())
    tj = Table(title="jobs")
    for c in ("job", "state", "group", "iterations", "slowdown", "SLO", "error"):
        tj.add_column(c)
    for row in placed:
        tj.add_row(*(_fmt(v) for v in row))
    tq = Table(title="admission queue")
    for c in ("#", "job", "state", "class", "waited s"):
        tq.add_column(c)
    for row in waiting:
        tq.add_row(*(_fmt(v) for v in row))
    console.print(tg)
    console.print(tj)
    if waiting:
        console.print(tq)
    hj = h.json()
    console.print(f"scheduler {hj.get('name', '?')}: {'ok' if hj.get('ok') else 'NOT ok'}, active jobs: {hj.get('jobs', 0)}, "
                  f"groups: {hj.get('groups', 0)}, queued: {hj.get('queued', 0)}" + (" (restored from its checkpoint)" if hj.get("restored") else ""))


def urls(
    config: Optional[Path] = typer.Option(None, "--config", help=_CFG_HELP),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="default: the stack the last `rollmux up` started"),
) -> None:
    """Where the HTTP API, OpenAPI docs, Ray dashboard and Prometheus metrics endpoint are."""
    cfg, state = _resolve(config, state_dir)
    if state is None:
        console.print("[yellow]not started by `rollmux up` here; showing configured addresses[/]")
    _print_urls(cfg, state)


def env(
    config: Optional[Path] = typer.Option(None, "--config", help=_CFG_HELP),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="default: the stack the last `rollmux up` started"),
) -> None:
    """Shell exports that give a client the API token and Ray's token: ``eval "$(rollmux env)"``."""
    cfg, state = _resolve(config, state_dir)
    if state is None:
        _fail(f"no running stack recorded (no state file at {_state_path(cfg)}); run `rollmux up` first", 1)
    print("\n".join(_env_lines(cfg, state)))


def register(app: typer.Typer, deploy: Callable[[ServeConfig, str], str]) -> None:
    """Add ``up``, ``down``, ``submit``, ``status``, ``urls`` and ``env`` to the ``rollmux`` typer app;
    ``deploy(cfg, token)`` starts the HTTP admission app (``serve_app.deploy``)."""
    global _DEPLOY
    _DEPLOY = deploy
    for fn in (up, down, submit, status, urls, env):
        app.command(fn.__name__)(fn)
