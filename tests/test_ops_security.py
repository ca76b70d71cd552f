"""`rollmux up` secure by default, and `rollmux up --address` onto a cluster started separately.

Both tests run inside a network namespace that this module creates (root and iproute2 needed;
skipped with the reason otherwise) and deletes afterwards. The namespace has loopback and one
veth address ``10.213.<k>.2`` with a default route through it, so Ray treats that address as the
host's routable one, exactly as on a machine others can reach; nothing outside the namespace is
ever contacted. Every process is stopped by ``rollmux down`` / by its recorded process group.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from factories import tiny_stack_spec

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.ray, pytest.mark.netns, pytest.mark.slow]

TINY_SPEC = tiny_stack_spec("ops-test")
JOB = "job:\n  job_id: {jid}\n  model_params_b: 0.01\n  num_prompts: 8\n  max_response_tokens: 64\n" \
      "  num_rollout_gpus: 1\n  num_train_gpus: 1\n  slo: 2.0\n"


class Netns:
    """A network namespace with lo and one veth address (both veth ends inside it)."""

    def __init__(self) -> None:
        k = os.getpid() % 200 + 20
        self.name = f"rmx-ops-{os.getpid()}"
        self.ip = f"10.213.{k}.2"
        sh = self.sh
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True, timeout=30)
        try:
            sh("ip", "-n", self.name, "link", "set", "lo", "up")
            sh("ip", "-n", self.name, "link", "add", "rmx0", "type", "veth", "peer", "name", "rmx1")
            sh("ip", "-n", self.name, "addr", "add", f"{self.ip}/24", "dev", "rmx0")
            sh("ip", "-n", self.name, "link", "set", "rmx0", "up")
            sh("ip", "-n", self.name, "link", "set", "rmx1", "up")
            sh("ip", "-n", self.name, "route", "add", "default", "dev", "rmx0")
        except Exception:
            self.delete()
            raise

    @staticmethod
    def sh(*cmd: str) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if r.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def run(self, args: list[str], env: dict, timeout: float, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.name, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, **kw)

    def popen(self, args: list[str], env: dict, log: Path) -> subprocess.Popen:
        with open(log, "wb") as f:
            return subprocess.Popen(["ip", "netns", "exec", self.name, *args], env=env, stdout=f,
                                    stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)

    def listeners(self) -> str:
        return subprocess.run(["ip", "netns", "exec", self.name, "ss", "-ltnH"], capture_output=True, text=True,
                              timeout=30).stdout

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def netns():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    if not shutil.which("ip") or not shutil.which("ss"):
        pytest.skip("needs iproute2 ('ip', 'ss') to create and inspect a network namespace")
    try:
        ns = Netns()
    except (subprocess.CalledProcessError, RuntimeError) as e:
        err = getattr(e, "stderr", b"") or str(e)
        pytest.skip(f"cannot create a network namespace here: {err!r}")
    yield ns
    ns.delete()


def _env(tmp: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "ROLLMUX_", "RAY_ADDRESS"))}
    env.update(PYTHONPATH=str(ROOT), ROLLMUX_CURRENT=str(tmp / "current"), RAY_USAGE_STATS_ENABLED="0",
               COLUMNS="200", **extra)
    return env


def _cli(ns: Netns, env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return ns.run([sys.executable, "-m", "rollmux_cli", *args], env, timeout)


# Known intermittent failures on a loaded 2-core host: the positive control's Ray Client server
# sometimes fails to start inside the namespace (the probe runs that control once more itself),
# and under a load of ~30 `up` itself can fail to start the stack. Re-run (same assertions) rather than hidden.
@pytest.mark.flaky(reruns=2, reruns_delay=5)
def test_fresh_up_accepts_no_unauthenticated_request(netns, tmp_path):
    sd = tmp_path / "stack"
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY_SPEC)
    env = _env(tmp_path)
    # disabled auth is refused before anything starts: the namespace has a routable address
    r = _cli(netns, env, "up", "--state-dir", str(sd), "--ray-auth", "disabled", timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert netns.ip in r.stdout + r.stderr and "--expose-unauthenticated-ray" in r.stdout + r.stderr
    assert not (sd / "state.json").exists() and netns.listeners().strip() == ""
    try:
        r = _cli(netns, env, "up", "--state-dir", str(sd), "--cluster-spec", str(spec), "--timeout-s", "240")
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout
        assert "Ray auth: token" in out and "RAY_AUTH_MODE=token" in out and f"RAY_AUTH_TOKEN_PATH={sd}" in out
        state = json.loads((sd / "state.json").read_text())
        assert state["ray_auth"] == "token" and state["ray_token"] == str(sd / "ray_auth_token")
        for f in ("ray_auth_token", "api_token"):
            assert (sd / f).stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "current").read_text().strip() == str(sd)
        from actors.ops.cli_ops import _ray_temp_dir
        from rollmux.config import ServeConfig

        grafana = _ray_temp_dir(ServeConfig(state_dir=sd)) / "head/session_latest/metrics/grafana/dashboards"
        assert (grafana / "rollmux_grafana_dashboard.json").is_file()  # next to Ray's generated dashboards
        r = netns.run([sys.executable, str(ROOT / "tests" / "ray_port_probe.py"), "--ns-ip", netns.ip,
                       "--gcs-port", state["ray_address"].rsplit(":", 1)[1], "--client-address", state["ray_client_address"],
                       "--dashboard", state["dashboard_url"].split("//")[1], "--api", state["base_url"].split("//")[1],
                       "--ray-token-file", str(sd / "ray_auth_token"), "--api-token-file", str(sd / "api_token"),
                       "--marker", str(tmp_path / "pwned"), "--marker-ok", str(tmp_path / "ran")], env, 420)
        assert r.returncode == 0, r.stderr[-3000:]
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        (tmp_path / "probe.json").write_text(json.dumps(rep, indent=1))
        ports = rep["ports"]
        exposed = [p for p, rec in ports.items() if rec["exposed"]]
        assert state["ray_address"].rsplit(":", 1)[1] in exposed  # Ray does listen on the routable address
        assert len(exposed) >= 5 and rep["grpc_methods"] > 100
        for p, rec in ports.items():
            if rec["kind"] == "http":
                for path, (code, body) in rec["http"].items():
                    assert code is None or not 200 <= code < 300, (p, path, code, body)
            elif rec["kind"] == "grpc":
                reached = set(rec["grpc"]) - {"UNAUTHENTICATED", "UNIMPLEMENTED"}
                assert not reached, (p, rec)
                assert rec["grpc"].get("UNAUTHENTICATED", 0) > 0, (p, rec)
                # answered without a token: only liveness and the service list (read-only)
                assert set(rec["public"]) <= {"/grpc.health.v1.Health/Check",
                                              "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}
            elif rec["kind"] == "gone":  # closed between the listing and the probe (a short-lived process)
                continue
            else:
                pytest.fail(f"port {p} {rec['binds']} is neither HTTP nor gRPC: {rec}")
        assert sum(rec["kind"] == "grpc" for rec in ports.values()) >= 5
        assert sum(rec["kind"] == "http" for rec in ports.values()) >= 3
        api = state["base_url"].rsplit(":", 1)[1]
        assert ports[api]["http"]["/v1/jobs"][0] == 401
        for k in ("gcs_no_token", "gcs_wrong_token", "client_no_token"):
            assert "CONNECTED" not in rep["drivers"][k] and "REFUSED" in rep["drivers"][k], (k, rep["drivers"][k])
        assert not rep["marker_created"]
        # positive controls: with the tokens the same endpoints work
        for k in ("gcs_with_token", "client_with_token"):
            assert "HEALTH True" in rep["drivers"][k], (k, rep["drivers"][k], rep["retried"].get(k))
        assert rep["controls"]["gcs_get_all_node_info"] == ["OK"]
        assert rep["controls"]["job_submit"][0] == 200 and rep["controls"]["job_ran"], rep["controls"]
        assert rep["controls"]["api_admit"][0] == 201, rep["controls"]
        # later commands find the stack without --state-dir
        r = _cli(netns, env, "status", timeout=120)
        assert r.returncode == 0 and "probe-unauth" in r.stdout, r.stdout + r.stderr
        r = _cli(netns, env, "env", timeout=60)
        assert r.returncode == 0 and f"export RAY_AUTH_TOKEN_PATH={sd}/ray_auth_token" in r.stdout
    finally:
        r = _cli(netns, env, "down", "--state-dir", str(sd), "--purge", timeout=180)
    assert r.returncode == 0 and "RollMux is down" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "current").read_text().strip() == str(sd)  # kept: a plain `up` restarts this stack
    deadline = time.monotonic() + 30
    while netns.listeners().strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert netns.listeners().strip() == ""


def _free_port_in(ns: Netns, env: dict) -> int:
    r = ns.run([sys.executable, "-c", "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"],
               env, 30)
    return int(r.stdout)


def test_up_address_deploys_onto_a_separately_started_cluster(netns, tmp_path):
    """A Ray cluster started by hand (`ray start`, token mode, rollmux_node/pool resources), then
    `rollmux up --address`: the API admits onto it; `down` removes the app and RollMux's actors and
    leaves the cluster running."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY_SPEC)
    token = tmp_path / "cluster_token"
    token.write_text("f" * 64 + "\n")
    token.chmod(0o600)
    env = _env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    gcs = _free_port_in(netns, env)
    res = {"rollmux_node:rollout-0": 1000, "rollmux_pool:rollout": 1, "rollmux_node:train-0": 1000,
           "rollmux_pool:train": 1, "rollmux_head": 1}
    ray_bin = str(Path(sys.executable).with_name("ray"))
    ray_tmp = Path(tempfile.mkdtemp(prefix="rmx-ops-", dir="/tmp"))  # short: Ray's Unix socket paths are <= 107 bytes
    head = netns.popen([ray_bin, "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
                        f"--resources={json.dumps(res)}", "--include-dashboard=false", "--disable-usage-stats",
                        f"--temp-dir={ray_tmp}", f"--ray-client-server-port={_free_port_in(netns, env)}"],
                       env, tmp_path / "head.log")
    sd = tmp_path / "stack"
    try:
        deadline = time.monotonic() + 120
        while f":{gcs} " not in netns.listeners() and time.monotonic() < deadline:
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-2000:]
            time.sleep(0.5)
        api_port = str(_free_port_in(netns, env))
        r = _cli(netns, env, "up", "--address", f"{netns.ip}:{gcs}", "--state-dir", str(sd), "--cluster-spec", str(spec),
                 "--port", api_port, "--timeout-s", "240")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"on the Ray cluster at {netns.ip}:{gcs}" in r.stdout and "no Ray node carries" not in r.stdout
        state = json.loads((sd / "state.json").read_text())
        assert state["mode"] == "attached" and state["processes"] == []
        job = tmp_path / "job.yaml"
        job.write_text(JOB.format(jid="attached-1"))
        r = _cli(netns, env, "submit", str(job), timeout=120)  # found through $ROLLMUX_CURRENT
        assert r.returncode == 0 and "admitted" in r.stdout and "rollout-0" in r.stdout, r.stdout + r.stderr
        r = _cli(netns, env, "status", timeout=120)
        assert r.returncode == 0 and "attached-1" in r.stdout and f":{api_port}" not in r.stderr
        r = _cli(netns, env, "down", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "keeps running" in r.stdout and "rollmux-global-scheduler: killed" in r.stdout
        assert head.poll() is None  # the cluster was not ours to stop
        check = ("import ray; ray.init(address='%s:%d', namespace='rollmux', logging_level='ERROR');"
                 "print('NAMED', sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True)"
                 " if a['namespace'] == 'rollmux'))" % (netns.ip, gcs))
        r = netns.run([sys.executable, "-c", check], env, 120)
        assert "NAMED []" in r.stdout, r.stdout + r.stderr
        assert f":{api_port} " not in netns.listeners()  # Serve (started by `up`) is gone too
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)
            try:
                head.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(head.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if (sd / "state.json").exists():
            _cli(netns, env, "down", "--state-dir", str(sd), timeout=120)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    deadline = time.monotonic() + 30
    while netns.listeners().strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert netns.listeners().strip() == ""
