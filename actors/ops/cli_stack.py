"""The local stack behind the ``rollmux`` operation commands: state file, processes, ports, URLs.

What ``rollmux up`` records and ``rollmux down`` reads: every process it starts (pid,
process-group id, start time) in ``<state_dir>/state.json``, the state directory of the last
``up``, kept after ``down`` (``~/.rollmux/current``, ``$ROLLMUX_CURRENT``), Ray's token-mode environment, free ports
outside the kernel's ephemeral range, the stack's URLs and Prometheus targets, and the CLI's
error exit (:func:`_fail`). The commands themselves are :mod:`actors.ops.cli_ops`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from rollmux.config import ConfigError, ServeConfig, load_serve_config

console = Console()
err_console = Console(stderr=True)

STATE_FILE = "state.json"
PROM_TARGETS = "prometheus_targets.json"
CURRENT_ENV = "ROLLMUX_CURRENT"  # file naming the state directory of the last `rollmux up`
EXPOSE_FLAG = "--expose-unauthenticated-ray"
MAX_LOCAL_POOL_NODES = 16  # `rollmux up` starts at most this many local Ray nodes for pool nodes
_CFG_HELP = "serve config YAML (default: configs/serve.yaml or $ROLLMUX_SERVE_CONFIG)"


# ----------------------------------------------------------------------------- helpers
def _fail(msg: str, code: int = 1) -> None:
    err_console.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(code)


def _config(path: Optional[Path], **overrides: Any) -> ServeConfig:
    try:
        return load_serve_config(path, overrides)
    except ConfigError as e:
        _fail(str(e), 2)
        raise  # unreachable


def _state_path(cfg: ServeConfig) -> Path:
    return cfg.state_dir / STATE_FILE


def _read_state(cfg: ServeConfig) -> Optional[dict]:
    p = _state_path(cfg)
    try:
        return json.loads(p.read_text()) if p.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _write_state(cfg: ServeConfig, state: dict) -> None:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = _state_path(cfg).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(_state_path(cfg))


def _current_path() -> Path:
    return Path(os.environ.get(CURRENT_ENV) or "~/.rollmux/current").expanduser()


def _record_current(state_dir: Path) -> None:
    p = _current_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(str(state_dir.absolute()) + "\n")


def _last_state_dir() -> Optional[Path]:
    """The state directory of the last ``rollmux up`` (running or stopped: ``down`` keeps the
    record, so a plain ``up`` restarts that stack and restores its checkpoint), None if none."""
    try:
        p = Path(_current_path().read_text().strip())
    except OSError:
        return None
    return p if p.is_absolute() and p.is_dir() else None


def _resolve(config: Optional[Path], state_dir: Optional[Path], **overrides: Any) -> tuple[ServeConfig, Optional[dict]]:
    """Settings and state of the stack a command addresses: ``--state-dir`` / ``$ROLLMUX_STATE_DIR``,
    else the one recorded by the last ``rollmux up`` (``$ROLLMUX_CURRENT``), else the configured
    default. A recorded stack's settings (port, token files, app and scheduler names) are the ones
    ``up`` ran with; explicit flags still win."""
    if state_dir is None and not os.environ.get("ROLLMUX_STATE_DIR"):
        try:
            recorded = Path(_current_path().read_text().strip())
            if (recorded / STATE_FILE).is_file():
                state_dir = recorded
        except OSError:
            pass
    cfg = _config(config, state_dir=state_dir, **overrides)
    state = _read_state(cfg)
    if state and isinstance(state.get("config"), dict):
        try:
            cfg = ServeConfig.model_validate({**state["config"], **{k: v for k, v in overrides.items() if v is not None}})
        except ValueError as e:
            _fail(f"{_state_path(cfg)}: {e}", 2)
    return cfg, state


def _non_loopback_addresses() -> list[str]:
    """Addresses of this host (or network namespace) other than loopback, on interfaces that are up.

    Ray 2.60 binds its GCS, raylet and worker gRPC ports to every address (``*``) and its Ray
    Client and dashboard-agent ports to the node's routable address, so any address listed here
    reaches them."""
    import ipaddress

    import psutil

    stats = psutil.net_if_stats()
    out = []
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                if not ipaddress.ip_address(a.address.split("%")[0]).is_loopback:
                    out.append(f"{a.address} ({name})")
    return out


def _ray_auth_env(cfg: ServeConfig, mode: str, env: dict, generate: bool) -> tuple[dict, Optional[str]]:
    """Environment for Ray processes and clients in ``mode``; returns it and the token's source.

    Token mode: ``$RAY_AUTH_TOKEN`` or ``$RAY_AUTH_TOKEN_PATH`` when set, else ``cfg.ray_token_path``
    (generated, mode 0600, when ``generate`` and missing). Raises typer.Exit without a token."""
    env = dict(env, RAY_AUTH_MODE=mode)
    if mode != "token":
        return env, None
    if env.get("RAY_AUTH_TOKEN"):
        return env, "$RAY_AUTH_TOKEN"
    if env.get("RAY_AUTH_TOKEN_PATH"):
        if not _ray_token_available(env):
            _fail(f"RAY_AUTH_TOKEN_PATH={env['RAY_AUTH_TOKEN_PATH']} is not a non-empty token file", 2)
        return env, str(Path(env["RAY_AUTH_TOKEN_PATH"]).absolute())
    path = cfg.ray_token_path
    if not (path.is_file() and path.read_text().strip()):
        if not generate:
            return env, None  # Ray's own default (~/.ray/auth_token) applies
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    env["RAY_AUTH_TOKEN_PATH"] = str(path)
    return env, str(path)


def _proc_start_ticks(pid: int) -> Optional[int]:
    """Start time of ``pid`` (clock ticks since boot, /proc/<pid>/stat field 22); None if gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux default 32768-60999)."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


#: Ports every ``ray start`` of ``rollmux up`` keeps for itself by default: the Ray Client server
#: (10001) and the workers' range (``--min-worker-port`` 10002 .. ``--max-worker-port`` 19999). A port
#: handed to Ray inside it makes ``ray start`` refuse ("worker_ports is trying to use a port number
#: ... that is used by other components").
RAY_DEFAULT_RESERVED_PORTS = (10_001, 19_999)


def _free_port(tries: int = 200) -> int:
    """A port for a Ray process that binds it later (Ray takes port numbers, not sockets).

    Drawn outside the kernel's ephemeral range, so no outgoing connection on the host can be
    given it as its local port before Ray binds it, and outside Ray's own default client and worker
    ports (:data:`RAY_DEFAULT_RESERVED_PORTS`), which ``ray start`` would refuse; checked free on
    every address now. Only another program binding that same port in between can still take it.
    Raises OSError when no port is free after ``tries`` draws."""
    import random

    lo, hi = _ephemeral_range()
    rlo, rhi = RAY_DEFAULT_RESERVED_PORTS
    pool = [p for p in range(10_000, 65_000) if not lo <= p <= hi and not rlo <= p <= rhi]
    if not pool:
        raise OSError(f"no TCP port outside the ephemeral range {lo}-{hi} and Ray's ports {rlo}-{rhi}")
    rng = random.SystemRandom()
    for _ in range(tries):
        port = rng.choice(pool)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise OSError(f"no free TCP port outside the ephemeral range {lo}-{hi} and Ray's ports {rlo}-{rhi} "
                  f"after {tries} tries")


def _alive(rec: dict) -> bool:
    """True while the recorded process still exists and is the same process (pid not reused)."""
    ticks = _proc_start_ticks(rec["pid"])
    return ticks is not None and ticks == rec.get("start_ticks")


def _ray_temp_dir(cfg: ServeConfig) -> Path:
    """Root of this stack's Ray temp dirs (not created here). Ray's job supervisor finds "its"
    cluster through the temp dir's address file (default ``/tmp/ray``, shared by every cluster on
    the host): with private ones, ``ray job submit`` drivers attach to this cluster even when others
    run on the machine. Every Ray node of the stack gets its own temp dir below it
    (:func:`_ray_node_dir`), so that sibling nodes never share a session directory (and with it the
    runtime-env agent's unpacked ``working_dir`` packages, :mod:`actors.ops.ray_dirs`). Ray puts Unix
    sockets under them (at most 107 bytes in all): a state dir with a long path gets
    ``/tmp/rollmux-ray-<hash of the path>``, created 0700 and checked to be this user's."""
    from actors.ops.ray_dirs import short_root

    return short_root(cfg.state_dir / "ray")


def _ray_node_dir(cfg: ServeConfig, key: str) -> Path:
    """The private (0700) temp dir of one Ray node of the stack: ``<root>/head`` or ``<root>/<node id>``,
    under a root made 0700 (:func:`_ray_temp_dir`). Raises actors.ops.ray_dirs.UnsafeDirError when the
    root or the dir exists but is a symlink or another user's."""
    from actors.ops.ray_dirs import node_temp_dir, private_dir

    return node_temp_dir(private_dir(_ray_temp_dir(cfg)), key)


def _ray_token_available(env: dict) -> bool:
    """A Ray auth token exists: ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``."""
    if env.get("RAY_AUTH_TOKEN"):
        return True
    path = Path(env["RAY_AUTH_TOKEN_PATH"]) if env.get("RAY_AUTH_TOKEN_PATH") else Path.home() / ".ray" / "auth_token"
    return path.is_file() and bool(path.read_text().strip())


def _ray_cli() -> list[str]:
    exe = Path(sys.executable).with_name("ray")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


def _spawn(args: list[str], log_path: Path, env: dict) -> dict:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
    time.sleep(0.05)
    return {"pid": p.pid, "pgid": p.pid, "start_ticks": _proc_start_ticks(p.pid), "log": str(log_path)}


def _wait_port(port: int, rec: dict, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(rec):
            _fail(f"{what} exited during start-up; see {rec['log']}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.25)
    _fail(f"{what} did not open 127.0.0.1:{port} within {timeout_s:g} s; see {rec['log']}")


def _stop(recs: list[dict], grace_s: float = 20.0) -> list[str]:
    """SIGTERM each recorded process group whose leader is still the recorded process (pid and
    start time match; ``ray start --block`` then stops its Ray processes), SIGKILL the groups
    still alive after ``grace_s``. Stale records are skipped. Returns a line per record."""
    live = [r for r in recs if _alive(r)]
    for rec in live:
        try:
            os.killpg(rec["pgid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(r) for r in live):
        time.sleep(0.25)
    out = []
    for rec in recs:
        if not any(rec is r for r in live):
            out.append(f"{rec['what']} (pid {rec['pid']}): not running")
            continue
        out.append(f"{rec['what']} (pid {rec['pid']}): {'killed' if _alive(rec) else 'stopped'}")
        try:  # the leader if it ignored SIGTERM, and Ray children of its group that outlived it
            os.killpg(rec["pgid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return out


def _urls(cfg: ServeConfig, state: Optional[dict]) -> dict[str, str]:
    s = state or {}
    return {
        "HTTP API": s.get("base_url", cfg.base_url),
        "OpenAPI docs": s.get("base_url", cfg.base_url) + "/docs",
        "Ray dashboard": s.get("dashboard_url", f"http://127.0.0.1:{cfg.dashboard_port}"),
        "Metrics (Prometheus)": s.get("metrics_url", f"http://127.0.0.1:{cfg.metrics_export_port}/metrics"),
        "Ray address": s.get("ray_address", f"127.0.0.1:{cfg.ray_port}"),
        "Job submission": s.get("dashboard_url", f"http://127.0.0.1:{cfg.dashboard_port}"),
        **({"Ray Client": s["ray_client_address"]} if s.get("ray_client_address") else {}),
        "API token file": str(cfg.token_path),
        "Ray auth": s.get("ray_auth", cfg.ray_auth) + (f" (token: {s['ray_token']})" if s.get("ray_token") else ""),
        **{f"Metrics (node {nid})": url for nid, url in s.get("node_metrics", {}).items()},
        **({"Prometheus targets": str(cfg.state_dir / PROM_TARGETS)} if s.get("node_metrics") else {}),
    }


def _write_prometheus_targets(cfg: ServeConfig, state: dict) -> None:
    """Prometheus ``file_sd_configs`` file with every node's metrics endpoint (RollMux's actors may
    run on any node; their metrics are exported by the node that hosts them)."""
    urls = [state["metrics_url"], *state.get("node_metrics", {}).values()]
    targets = [u.split("//", 1)[1].split("/", 1)[0] for u in urls]
    (cfg.state_dir / PROM_TARGETS).write_text(json.dumps([{"targets": targets, "labels": {"job": "rollmux"}}], indent=2))


GRAFANA_DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "rollmux_grafana_dashboard.json"


def _install_grafana_dashboard(cfg: ServeConfig) -> Optional[Path]:
    """Copy RollMux's Grafana dashboard next to the ones Ray generates for this session
    (``<ray temp>/session_latest/metrics/grafana/dashboards``), where a Grafana started with Ray's
    generated configuration loads it (uid ``rollmux``). Returns the copy, or None."""
    import shutil

    from actors.ops.ray_dirs import HEAD_KEY

    d = _ray_temp_dir(cfg) / HEAD_KEY / "session_latest" / "metrics" / "grafana" / "dashboards"
    if not (d.is_dir() and GRAFANA_DASHBOARD.is_file()):
        return None
    shutil.copy(GRAFANA_DASHBOARD, d / GRAFANA_DASHBOARD.name)
    return d / GRAFANA_DASHBOARD.name


def _print_urls(cfg: ServeConfig, state: Optional[dict]) -> None:
    t = Table(title="RollMux endpoints", show_header=False)
    for k, v in _urls(cfg, state).items():
        t.add_row(k, v)
    console.print(t)
    console.print("clients: " + "; ".join(_env_lines(cfg, state)) + f"   (or: eval \"$(rollmux env)\")")


def _env_lines(cfg: ServeConfig, state: Optional[dict]) -> list[str]:
    """Shell lines that give a client both tokens: the API's bearer token and Ray's token."""
    s = state or {}
    lines = [f"export {cfg.token_env}=\"$(cat {cfg.token_path})\""]
    mode = s.get("ray_auth", cfg.ray_auth)
    lines.append(f"export RAY_AUTH_MODE={mode}")
    if mode == "token" and s.get("ray_token", "").startswith("/"):
        lines.append(f"export RAY_AUTH_TOKEN_PATH={s['ray_token']}")
    if s.get("dashboard_url"):
        lines.append(f"export RAY_API_SERVER_ADDRESS={s['dashboard_url']}")
    return lines


def _client(cfg: ServeConfig, timeout_s: float = 30.0):
    import httpx

    token = cfg.resolve_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=cfg.base_url, headers=headers, timeout=timeout_s)


def _http(cfg: ServeConfig, method: str, path: str, **kw: Any):
    import httpx

    try:
        with _client(cfg) as c:
            return c.request(method, path, **kw)
    except httpx.HTTPError as e:
        _fail(f"cannot reach the RollMux API at {cfg.base_url} ({type(e).__name__}); is `rollmux up` running?")


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e4 else f"{x:,.0f}"
    if isinstance(x, (list, tuple)):
        return ",".join(map(str, x))
    return str(x)
