#!/usr/bin/env python
"""Try every TCP port a RollMux stack listens on without credentials; print a JSON report.

Run by ``tests/test_ops_security.py`` INSIDE the network namespace that the test created (never
elsewhere): it lists the namespace's listening sockets (``ss -ltnH``; the namespace holds nothing
but the stack under test) and calls each port at the namespace's own address (ports bound to
every address or to that address) or at 127.0.0.1 (loopback-only ports):

* HTTP ports: ``POST /api/jobs/`` (Ray job submission, dashboard), ``POST /api/job_agent/jobs/``
  (the dashboard agent's job API) with an entrypoint that would create ``--marker``, and
  ``POST /v1/jobs`` (RollMux admission). Any 2xx answer is a violation.
* gRPC ports: every method of every Ray gRPC service (the generated ``ray.core.generated``
  stubs: GCS, raylet, core worker incl. ``PushTask`` = calling an actor, Ray Client, agents),
  with an empty request and no ``authorization`` metadata. ``UNAUTHENTICATED`` is the expected
  answer, ``UNIMPLEMENTED`` means "not this server"; anything else reached a handler (violation).
* drivers: ``ray.init`` on the GCS address (no token; a wrong token) and on the Ray Client
  address (no token) must not connect; with the token both connect and call the scheduler.

Positive controls with the right tokens (so that the probes can fail): the GCS answers
``GetAllNodeInfo``, a driver connects and calls the scheduler actor (a driver that failed is run
once more, its first answer kept under ``retried``), a job submitted to the dashboard runs and
creates ``--marker-ok``, and the API admits a job.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

PROBE_JOB = {"job_id": "probe-unauth", "model_params_b": 0.01, "num_prompts": 8, "max_response_tokens": 64,
             "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": 2.0}
# Answered without a token by every C++ gRPC server of Ray 2.60 (by design: read-only): liveness
# (SERVING / NOT_SERVING) and the list of service names. Neither runs code, submits or reads data.
PUBLIC_METHODS = ("/grpc.health.v1.Health/Check", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
DRIVER = """
import os, sys, ray
try:
    ray.init(address=sys.argv[1], namespace="rollmux", log_to_driver=False, logging_level="ERROR")
    if len(sys.argv) > 2:
        print("HEALTH", ray.get(ray.get_actor(sys.argv[2], namespace="rollmux").health.remote(), timeout=60).ok)
    print("CONNECTED", flush=True)
except BaseException as e:
    print("REFUSED", type(e).__name__, str(e)[:300].replace(chr(10), " "), flush=True)
"""


def listening() -> tuple[dict[int, set[str]], dict[int, str]]:
    """Listening TCP ports: ``{port: bound addresses}`` and ``{port: owning process names}``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ports: dict[int, set[str]] = {}
    procs: dict[int, str] = {}
    for line in out.splitlines():
        local = line.split()[3]
        addr, port = local.rsplit(":", 1)
        ports.setdefault(int(port), set()).add(addr.strip("[]").replace("::ffff:", "").split("%")[0])
        procs[int(port)] = ",".join(re.findall(r'\("([^"]+)"', line))
    return ports, procs


def grpc_methods() -> list[str]:
    import ray

    found = set()
    site = Path(ray.__file__).parent.parent
    for f in [*(site / "ray" / "core" / "generated").glob("*_pb2_grpc.py"), site / "ray" / "serve" / "generated" / "serve_pb2_grpc.py",
              *(site / "opentelemetry" / "proto" / "collector").glob("*/v1/*_pb2_grpc.py")]:
        found.update(re.findall(r"'(/(?:ray\.rpc|ray\.serve|opentelemetry\.proto)\.[\w.]+/\w+)'", f.read_text()))
    # services compiled into the C++ servers only (e.g. the object manager's Push / Pull)
    for f in (site / "ray" / "core" / "src" / "ray" / "raylet" / "raylet", site / "ray" / "core" / "src" / "ray" / "gcs" / "gcs_server",
              *site.joinpath("ray").glob("_raylet*.so")):
        if f.is_file():
            found.update(m.decode() for m in re.findall(rb"/ray\.rpc\.[A-Za-z]+Service/[A-Za-z]+(?=\x00)", f.read_bytes()))
    return sorted(found | set(PUBLIC_METHODS))


def http_kind(target: str) -> bool:
    import httpx

    try:
        httpx.get(f"http://{target}/", timeout=3.0)
        return True
    except httpx.HTTPError:
        return False


def http_probe(target: str, marker: str) -> dict:
    import httpx

    out = {}
    bodies = {"/api/jobs/": {"entrypoint": f"touch {marker}"},
              "/api/job_agent/jobs/": {"entrypoint": f"touch {marker}", "submission_id": f"probe-{target.rsplit(':', 1)[1]}"},
              "/v1/jobs": PROBE_JOB}
    for path, body in bodies.items():
        try:
            r = httpx.post(f"http://{target}{path}", json=body, timeout=10.0)
            out[path] = [r.status_code, r.text[:160]]
        except httpx.HTTPError as e:
            out[path] = [None, type(e).__name__]
    return out


def grpc_probe(target: str, methods: list[str], metadata=None) -> dict[str, list[str]]:
    import grpc

    by_code: dict[str, list[str]] = {}
    with grpc.insecure_channel(target) as ch:
        for m in methods:
            try:
                ch.unary_unary(m)(b"", timeout=5.0, metadata=metadata)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            by_code.setdefault(code, []).append(m)
            if code == "UNAVAILABLE" and len(by_code) == 1 and len(by_code[code]) >= 3:
                break  # not a gRPC server
    return by_code


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns-ip", required=True)
    ap.add_argument("--gcs-port", type=int, required=True)
    ap.add_argument("--client-address", required=True, help="ray://host:port of the Ray Client server")
    ap.add_argument("--dashboard", required=True, help="host:port of the Ray dashboard")
    ap.add_argument("--api", required=True, help="host:port of the RollMux API")
    ap.add_argument("--ray-token-file", required=True)
    ap.add_argument("--api-token-file", required=True)
    ap.add_argument("--scheduler", default="rollmux-global-scheduler")
    ap.add_argument("--marker", required=True, help="file an unauthenticated job would create")
    ap.add_argument("--marker-ok", required=True, help="file the authenticated control job creates")
    a = ap.parse_args()
    import httpx

    ray_token = Path(a.ray_token_file).read_text().strip()
    api_token = Path(a.api_token_file).read_text().strip()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    gcs = f"{a.ns_ip}:{a.gcs_port}"
    client = a.client_address.replace("127.0.0.1", a.ns_ip)
    report: dict = {"ports": {}, "drivers": {}, "controls": {}}
    methods = grpc_methods()
    report["grpc_methods"] = len(methods)
    ports, procs = listening()
    for port, binds in sorted(ports.items()):
        exposed = bool(binds & {"*", "0.0.0.0", "::", a.ns_ip})
        target = f"{a.ns_ip if exposed else '127.0.0.1'}:{port}"
        rec: dict = {"binds": sorted(binds), "target": target, "exposed": exposed, "process": procs.get(port, "")}
        if http_kind(target):
            rec["kind"] = "http"
            rec["http"] = http_probe(target, a.marker)
        else:
            codes = grpc_probe(target, methods)
            rec["kind"] = "grpc" if set(codes) - {"UNAVAILABLE"} else "other" if port in listening()[0] else "gone"
            public = {m: c for c, ms in codes.items() for m in ms if m in PUBLIC_METHODS}
            codes = {c: [m for m in ms if m not in PUBLIC_METHODS] for c, ms in codes.items()}
            rec["grpc"] = {c: (len(ms) if c in ("UNAUTHENTICATED", "UNIMPLEMENTED") else ms[:20]) for c, ms in codes.items() if ms}
            rec["public"] = public
        report["ports"][str(port)] = rec
    # drivers (in parallel, they take a while to give up), after the port scan: their own ports are not the stack's
    # A refused driver retries until its connect budget runs out (Ray's defaults: ~20 GCS attempts
    # 1 s apart; Ray Client waits of 5, 10, 15 s): a few short attempts suffice for a refusal, since
    # an accepting server answers the first one in well under a second (the controls below connect
    # with Ray's default budgets).
    refused_budget = {"RAY_gcs_server_port_wait_time_s": "3", "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "2",
                      "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "2"}
    drivers = {
        "gcs_no_token": ([gcs], dict(base_env, RAY_AUTH_MODE="disabled", **refused_budget)),
        "gcs_wrong_token": ([gcs], dict(base_env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64, **refused_budget)),
        "client_no_token": ([client], dict(base_env, RAY_AUTH_MODE="disabled", **refused_budget)),
        "gcs_with_token": ([gcs, a.scheduler], dict(base_env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=a.ray_token_file)),
        "client_with_token": ([client, a.scheduler], dict(base_env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=a.ray_token_file)),
    }
    drv_procs = {k: subprocess.Popen([sys.executable, "-c", DRIVER, *args], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True) for k, (args, env) in drivers.items()}
    # positive controls
    auth = [("authorization", f"Bearer {ray_token}")]
    report["controls"]["gcs_get_all_node_info"] = sorted(grpc_probe(gcs, ["/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"], auth))
    r = httpx.post(f"http://{a.dashboard}/api/jobs/", json={"entrypoint": f"touch {a.marker_ok}"},
                   headers={"Authorization": f"Bearer {ray_token}"}, timeout=30.0)
    report["controls"]["job_submit"] = [r.status_code, r.text[:200]]
    r = httpx.post(f"http://{a.api}/v1/jobs", json=PROBE_JOB, headers={"Authorization": f"Bearer {api_token}"}, timeout=60.0)
    report["controls"]["api_admit"] = [r.status_code, r.text[:200]]
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline and not Path(a.marker_ok).exists():
        time.sleep(0.5)
    report["controls"]["job_ran"] = Path(a.marker_ok).exists()
    for k, p in drv_procs.items():
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()) + 60.0)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\nREFUSED timeout"
        report["drivers"][k] = out.strip()[-400:]
    # A positive control that failed is run once more, alone: on a loaded host the Ray Client
    # server that the head starts for each client sometimes exits during its start-up ("Starting
    # Ray client server failed"), which used to cost a re-run of the whole test (a fresh `up`).
    # The first answer is kept in the report; the refusals above are never retried.
    report["retried"] = {}
    for k in ("gcs_with_token", "client_with_token"):
        if "HEALTH True" not in report["drivers"][k]:
            report["retried"][k] = report["drivers"][k]
            args, env = drivers[k]
            try:
                out = subprocess.run([sys.executable, "-c", DRIVER, *args], env=env, capture_output=True, text=True,
                                     timeout=180).stdout
            except subprocess.TimeoutExpired:
                out = "REFUSED timeout"
            report["drivers"][k] = out.strip()[-400:]
    report["marker_created"] = Path(a.marker).exists()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
