"""The HTTP admission API (serve_app.py) on the real Ray Serve app and the real GlobalScheduler actor.

Cluster: ``configs/cluster_local.yaml`` (2 rollout + 2 training nodes of 1 "GPU" and 4 GB host
memory; 0.05 USD/h per node). One job of 1+1 GPUs alone costs 0.10 USD/h (RollMux Alg. 1: an
isolated group pays its full price; direct packing pays 0).
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from factories import wait_until

NODE_USD_PER_H = 0.05  # configs/gpus.yaml "CPU" x 1 GPU per node


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def spec(job_id: str, **kw) -> dict:
    """A tiny job that fits the local cluster (1+1 GPUs, measured worst-case phase times)."""
    base = {"job_id": job_id, "model_params_b": 0.01, "num_prompts": 8, "max_response_tokens": 256,
            "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": 2.0, "mem_roll_gb": 1.0, "mem_train_gb": 1.0,
            "measured": {"t_roll_s": 10.0, "t_train_s": 10.0, "t_sync_s": 0.0}}
    base.update(kw)
    return base


@pytest.fixture(scope="module")
def api(serve_api):
    with httpx.Client(base_url=serve_api.base_url, timeout=60.0) as c:
        c.headers["Authorization"] = f"Bearer {serve_api.token}"
        yield c


@pytest.fixture(scope="module")
def anon(serve_api):
    with httpx.Client(base_url=serve_api.base_url, timeout=60.0) as c:
        yield c


@pytest.fixture
def clean(api):
    """Each test starts and ends with no active job on the test scheduler."""
    def depart_all():
        for j in api.get("/v1/jobs").json():
            if j["state"] in ("admitted", "running", "queued"):
                assert api.delete(f"/v1/jobs/{j['job_id']}").status_code == 200
    depart_all()
    yield
    depart_all()


def _active(api) -> list[str]:
    return sorted(j["job_id"] for j in api.get("/v1/jobs").json() if j["state"] in ("admitted", "running"))


@pytest.mark.ray
def test_openapi_docs_and_health(anon, serve_api):
    spec_ = anon.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs:dry-run", "/v1/jobs/{job_id}", "/v1/groups", "/healthz"} <= set(spec_["paths"])
    assert "bearer" in str(spec_["components"]["securitySchemes"]).lower()
    docs = anon.get("/docs")
    assert docs.status_code == 200 and "/static/swagger/swagger-ui-bundle.js" in docs.text  # no CDN
    js = anon.get("/static/swagger/swagger-ui-bundle.js")
    assert js.status_code == 200 and "SwaggerUIBundle" in js.text
    h = anon.get("/healthz")
    assert h.status_code == 200 and h.json()["ok"] is True
    assert h.json()["name"] == serve_api.scheduler_name  # reached the named actor of this session


@pytest.mark.ray
def test_admit_returns_group_placement_cost_and_slowdowns(api, clean):
    a = _id("adm")
    r = api.post("/v1/jobs", json=spec(a))
    assert r.status_code == 201, r.text
    d = r.json()
    assert d["admitted"] is True and d["dry_run"] is False and d["job_id"] == a
    assert d["group_id"]
    assert len(d["placement"]["rollout_nodes"]) == 1 and d["placement"]["rollout_nodes"][0] in ("rollout-0", "rollout-1")
    assert len(d["placement"]["train_nodes"]) == 1 and d["placement"]["train_nodes"][0] in ("train-0", "train-1")
    assert d["marginal_cost_usd_per_h"] == pytest.approx(2 * NODE_USD_PER_H)  # new isolated group: 1 + 1 nodes
    assert d["predicted_slowdowns"] == {a: pytest.approx(1.0)}
    assert d["explanation"]["code"] == "ok" and d["explanation"]["strategy"] == "isolated"
    # a second small job packs into the first one's dependency bubble: same nodes, zero marginal cost
    b = _id("adm")
    r2 = api.post("/v1/jobs", json=spec(b))
    assert r2.status_code == 201, r2.text
    d2 = r2.json()
    assert d2["group_id"] == d["group_id"] and d2["explanation"]["strategy"] == "direct"
    assert d2["marginal_cost_usd_per_h"] == pytest.approx(0.0)
    assert set(d2["predicted_slowdowns"]) == {a, b}
    assert all(1.0 <= s <= 2.0 for s in d2["predicted_slowdowns"].values())  # within both SLOs
    job = api.get(f"/v1/jobs/{a}").json()
    assert job["state"] == "admitted" and job["group_id"] == d["group_id"] and job["slo"] == 2.0
    assert job["predicted"]["t_solo_s"] == pytest.approx(20.0) and job["iterations_done"] == 0
    groups = {g["group_id"]: g for g in api.get("/v1/groups").json()}
    g = groups[d["group_id"]]
    assert sorted(g["members"]) == sorted([a, b])
    assert g["cost_usd_per_h"] == pytest.approx(2 * NODE_USD_PER_H)
    assert g["t_cycle_s"] == pytest.approx(20.0) and g["slack_s"] == pytest.approx(g["t_cycle_s"] - g["t_load_s"])


@pytest.mark.ray
def test_dry_run_decides_without_changing_state(api, clean):
    before_jobs, before_groups = _active(api), api.get("/v1/groups").json()
    j = _id("dry")
    r = api.post("/v1/jobs:dry-run", json=spec(j))
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["admitted"] is True and d["dry_run"] is True and d["marginal_cost_usd_per_h"] == pytest.approx(0.1)
    assert api.get(f"/v1/jobs/{j}").status_code == 404
    assert _active(api) == before_jobs and api.get("/v1/groups").json() == before_groups
    # a refusal in dry-run mirrors the real call's 409
    big = api.post("/v1/jobs:dry-run", json=spec(_id("dry"), mem_roll_gb=100.0))
    assert big.status_code == 409 and big.json()["decision"]["dry_run"] is True


@pytest.mark.ray
def test_refusals_are_409_with_reason(api, clean):
    # state larger than any node: never
    r = api.post("/v1/jobs", json=spec(_id("big"), mem_roll_gb=100.0))
    assert r.status_code == 409
    assert r.json()["error"] == "not_admitted:never" and "mem_roll_gb" in r.json()["detail"]
    # more GPUs than the pool has: never
    r = api.post("/v1/jobs", json=spec(_id("wide"), num_train_gpus=3))
    assert r.status_code == 409 and "num_train_gpus=3" in r.json()["detail"]
    # cluster out of GPUs: jobs whose state fills a node (3 of 4 GB) cannot share; 2+2 nodes hold two
    fat = [spec(_id("fat"), mem_roll_gb=3.0, mem_train_gb=3.0) for _ in range(3)]
    assert [api.post("/v1/jobs", json=s).status_code for s in fat] == [201, 201, 409]
    last = api.post("/v1/jobs", json=fat[2])
    assert last.json()["error"] == "not_admitted:retry_later" and "out of GPUs" in last.json()["detail"]
    # departure releases the nodes: the refused job now fits
    dep = api.delete(f"/v1/jobs/{fat[0]['job_id']}")
    assert dep.status_code == 200 and dep.json()["group_dissolved"] is True and len(dep.json()["released_nodes"]) == 2
    assert api.post("/v1/jobs", json=fat[2]).status_code == 201


@pytest.mark.ray
def test_duplicate_job_id_is_409(api, clean):
    j = _id("dup")
    first = api.post("/v1/jobs", json=spec(j))
    assert first.status_code == 201
    again = api.post("/v1/jobs", json=spec(j))  # a retry of the same spec: 200, the original decision
    assert again.status_code == 200 and again.json()["group_id"] == first.json()["group_id"]
    r = api.post("/v1/jobs", json=spec(j, slo=3.0))  # another spec under the live id
    assert r.status_code == 409 and r.json()["error"] == "duplicate_job_id" and j in r.json()["detail"]
    assert _active(api).count(j) == 1


@pytest.mark.ray
def test_delete_departs_and_groups_shrink_or_dissolve(api, clean):
    a, b = _id("del"), _id("del")
    ga = api.post("/v1/jobs", json=spec(a)).json()["group_id"]
    assert api.post("/v1/jobs", json=spec(b)).json()["group_id"] == ga
    r = api.delete(f"/v1/jobs/{a}")  # no driver ever ran it: withdrawn
    assert r.status_code == 200 and r.json() == {"job_id": a, "state": "cancelled", "released_nodes": [],
                                                 "group_dissolved": False, "dissolved_groups": [], "moves": []}
    again = api.delete(f"/v1/jobs/{a}")  # a second departure changes nothing and says why
    assert again.status_code == 409 and again.json() == {"error": "already_ended", "detail": f"job {a!r} is already cancelled"}
    g = {x["group_id"]: x for x in api.get("/v1/groups").json()}[ga]
    assert g["members"] == [b]  # the group shrank
    assert api.get(f"/v1/jobs/{a}").json()["state"] == "cancelled"
    r = api.delete(f"/v1/jobs/{b}")
    assert r.status_code == 200 and r.json()["group_dissolved"] is True and len(r.json()["released_nodes"]) == 2
    assert r.json()["dissolved_groups"] == [ga]
    rec = api.get(f"/v1/jobs/{b}").json()
    assert rec["state"] == "cancelled" and set(rec["placement"]) == {"rollout_nodes", "train_nodes"} and rec["moves"] == []
    assert ga not in {x["group_id"] for x in api.get("/v1/groups").json()}
    assert api.delete(f"/v1/jobs/{_id('nosuch')}").status_code == 404
    assert api.get(f"/v1/jobs/{_id('nosuch')}").json()["error"] == "not_found"


@pytest.mark.ray
def test_token_required_for_admission_and_departure(anon, api, serve_api, clean):
    j = _id("auth")
    assert anon.post("/v1/jobs", json=spec(j)).status_code == 401
    r = anon.post("/v1/jobs", json=spec(j), headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
    assert anon.post("/v1/jobs", json=spec(j), headers={"Authorization": f"Basic {serve_api.token}"}).status_code == 401
    assert anon.post("/v1/jobs:dry-run", json=spec(j)).status_code == 401
    assert anon.post("/v1/jobs", json={"junk": 1}).status_code == 401  # auth is checked before the body
    assert api.get(f"/v1/jobs/{j}").status_code == 404  # nothing was admitted
    assert api.post("/v1/jobs", json=spec(j)).status_code == 201
    assert anon.delete(f"/v1/jobs/{j}").status_code == 401
    assert api.get(f"/v1/jobs/{j}").json()["state"] == "admitted"
    assert anon.get("/v1/jobs").status_code == 200 and anon.get("/v1/groups").status_code == 200  # open reads


@pytest.mark.parametrize("body,field", [
    (lambda j: spec(j, slo=0.5), "slo"),
    (lambda j: {k: v for k, v in spec(j).items() if k != "model_params_b"}, "model_params_b"),
    (lambda j: spec(j, num_rollout_gpus=0), "num_rollout_gpus"),
    (lambda j: {**spec(j), "job_id": "bad id!"}, "job_id"),
    (lambda j: spec(j, colour="red"), "colour"),
    (lambda j: spec(j, measured={"t_roll_s": -1, "t_train_s": 1}), "measured.t_roll_s"),
])
@pytest.mark.ray
def test_malformed_spec_is_422_naming_the_field(api, body, field):
    r = api.post("/v1/jobs", json=body(_id("bad")))
    assert r.status_code == 422, r.text
    d = r.json()
    assert d["error"] == "invalid_request" and field in [e["field"] for e in d["errors"]] and field in d["detail"]


@pytest.mark.ray
def test_non_json_body_is_422_not_500(api):
    r = api.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"


@pytest.mark.ray
def test_replicas_find_the_scheduler_again_after_it_restarts(api, serve_api, clean):
    import ray

    j = _id("restart")
    assert api.post("/v1/jobs", json=spec(j)).status_code == 201
    ray.kill(serve_api.scheduler, no_restart=False)  # max_restarts=-1: Ray restarts it, state from the checkpoint
    codes = []

    def restored() -> bool:
        r = api.get("/healthz")
        codes.append(r.status_code)
        return r.status_code == 200 and bool(r.json().get("restored"))

    try:
        wait_until(restored, timeout_s=90, interval_s=0.5, what="API answers from the restored scheduler")
    except TimeoutError:
        pass
    assert codes[-1] == 200 and set(codes) <= {200, 503}, codes  # unavailable is a 503, never a 500
    job = api.get(f"/v1/jobs/{j}")
    assert job.status_code == 200 and job.json()["state"] == "admitted"  # restored from the checkpoint
    assert api.delete(f"/v1/jobs/{j}").status_code == 200


def _scrape_all_nodes() -> tuple[str, list[str]]:
    """Concatenated Prometheus text of every node's metrics export port (Ray binds the node IP)."""
    import ray

    text, urls = "", []
    for n in ray.nodes():
        if n.get("Alive") and n.get("MetricsExportPort"):
            url = f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
            urls.append(url)
            try:
                text += httpx.get(url, timeout=10).text
            except httpx.HTTPError:
                pass
    return text, urls


@pytest.mark.ray
def test_admission_metrics_appear_on_the_prometheus_endpoint(api, clean):
    j = _id("metrics")
    assert api.post("/v1/jobs", json=spec(j)).status_code == 201
    assert api.post("/v1/jobs", json=spec(_id("metrics"), mem_roll_gb=100.0)).status_code == 409
    want = ("ray_rollmux_admission_decisions_total", "ray_rollmux_admission_latency_ms_bucket",
            "ray_rollmux_group_cost_usd_per_h", "ray_rollmux_job_slo")
    seen = {"text": "", "urls": []}

    def scraped() -> bool:  # the actor flushes every 1 s; Ray exports every few seconds
        seen["text"], seen["urls"] = _scrape_all_nodes()
        return all(w in seen["text"] for w in want) and f'job_id="{j}"' in seen["text"]

    try:
        wait_until(scraped, timeout_s=90, interval_s=2, what="metrics on the endpoint")
    except TimeoutError:
        pass
    text, urls = seen["text"], seen["urls"]
    assert urls, "no node exports metrics"
    missing = [w for w in want if w not in text]
    assert not missing, f"{missing} not on {urls}"
    lines = [ln for ln in text.splitlines() if ln.startswith("ray_rollmux_admission_decisions_total{")]
    assert any('outcome="admitted"' in ln for ln in lines) and any('outcome="never"' in ln for ln in lines), lines
    assert any(ln.startswith("ray_rollmux_job_slo{") and f'job_id="{j}"' in ln and ln.rstrip().endswith(" 2.0")
               for ln in text.splitlines())


# ----------------------------------------------------------------------------- configuration and CLI
def test_serve_config_precedence_and_errors(tmp_path):
    from rollmux.config import ConfigError, load_serve_config

    y = tmp_path / "serve.yaml"
    y.write_text("port: 8100\nopen_read_routes: true\nstate_dir: /tmp/rollmux-x\n")
    cfg = load_serve_config(y, env={})
    assert (cfg.host, cfg.port, cfg.open_read_routes) == ("127.0.0.1", 8100, True)
    cfg = load_serve_config(y, env={"ROLLMUX_PORT": "8200", "ROLLMUX_OPEN_READ_ROUTES": "false"})
    assert (cfg.port, cfg.open_read_routes) == (8200, False)
    cfg = load_serve_config(y, {"port": 8300, "host": None}, env={"ROLLMUX_PORT": "8200"})
    assert cfg.port == 8300 and cfg.base_url == "http://127.0.0.1:8300"
    assert cfg.token_path.parent.name == "rollmux-x" and cfg.cluster_spec.is_absolute()
    with pytest.raises(ConfigError, match="port"):
        load_serve_config(y, env={"ROLLMUX_PORT": "eighty"})
    y.write_text("prot: 1\n")
    with pytest.raises(ConfigError, match="prot"):
        load_serve_config(y, env={})


def test_token_resolution_order(tmp_path):
    from rollmux.config import ServeConfig

    cfg = ServeConfig(state_dir=tmp_path)
    assert cfg.resolve_token(env={}) is None
    (tmp_path / "api_token").write_text("from-file\n")
    assert cfg.resolve_token(env={}) == "from-file"
    assert cfg.resolve_token(env={"ROLLMUX_API_TOKEN": "from-env"}) == "from-env"
    assert ServeConfig(state_dir=tmp_path, token="inline").resolve_token(env={"ROLLMUX_API_TOKEN": "x"}) == "inline"


def test_app_refuses_to_run_without_a_token():
    import serve_app
    from rollmux.config import ServeConfig

    with pytest.raises(ValueError, match="token"):
        serve_app.AppSettings.from_config(ServeConfig(), "")


def test_down_stops_only_recorded_processes(tmp_path):
    """`rollmux down` signals the process groups in its state file, checks pid identity, and
    leaves everything else alone."""
    import json
    import os
    import subprocess

    from typer.testing import CliRunner

    from actors.ops import cli_ops
    from rollmux_cli import app

    ours = cli_ops._spawn(["sleep", "60"], tmp_path / "a.log", dict(os.environ))
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # not recorded: must survive
    stale = {"pid": other.pid, "pgid": other.pid, "start_ticks": -1, "what": "stale record (pid reused)"}
    (tmp_path / "state.json").write_text(json.dumps({"processes": [{**ours, "what": "sleep"}, stale]}))
    try:
        r = CliRunner().invoke(app, ["down", "--state-dir", str(tmp_path), "--grace-s", "5"])
        assert r.exit_code == 0, r.output
        assert "sleep (pid" in r.output and "stopped" in r.output
        assert not cli_ops._alive({**ours})
        assert other.poll() is None  # the unrelated process is untouched
        assert not (tmp_path / "state.json").exists()
        (tmp_path / "checkpoint").mkdir()
        (tmp_path / "checkpoint" / "x.state.json").write_text("{}")
        r = CliRunner().invoke(app, ["down", "--state-dir", str(tmp_path)])
        assert r.exit_code == 0 and "nothing to stop" in r.output and (tmp_path / "checkpoint").exists()
        r = CliRunner().invoke(app, ["down", "--state-dir", str(tmp_path), "--purge"])
        assert r.exit_code == 0 and not (tmp_path / "checkpoint").exists() and (tmp_path / "a.log").exists()
    finally:
        other.kill()
        other.wait()


def test_cli_reports_bad_config_without_traceback(tmp_path):
    from typer.testing import CliRunner

    from rollmux_cli import app

    r = CliRunner().invoke(app, ["urls", "--config", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "config file not found" in r.output and "Traceback" not in r.output
    bad = tmp_path / "job.yaml"
    bad.write_text("job: {job_id: x, model_params_b: -1}\n")
    r = CliRunner().invoke(app, ["submit", str(bad)], env={"ROLLMUX_API_TOKEN": "t"})
    assert r.exit_code == 2 and "model_params_b" in r.output and "Traceback" not in r.output


@pytest.mark.ray
def test_cli_submit_and_status_through_the_api(serve_api, tmp_path, clean):
    from typer.testing import CliRunner

    from rollmux_cli import app

    job = tmp_path / "job.yaml"
    jid = _id("cli")
    job.write_text("job:\n" + "".join(f"  {k}: {v}\n" for k, v in spec(jid, measured=None).items() if v is not None))
    env = {"ROLLMUX_PORT": str(serve_api.config.port), "ROLLMUX_API_TOKEN": serve_api.token,
           "ROLLMUX_STATE_DIR": str(tmp_path), "COLUMNS": "200"}
    r = CliRunner().invoke(app, ["submit", str(job), "--dry-run"], env=env)
    assert r.exit_code == 0 and "admissible" in r.output, r.output
    r = CliRunner().invoke(app, ["submit", str(job)], env=env)
    assert r.exit_code == 0 and "admitted" in r.output and "USD/h" in r.output, r.output
    r = CliRunner().invoke(app, ["submit", str(job)], env=env)  # a retry: the original decision, HTTP 200
    assert r.exit_code == 0 and "HTTP 200" in r.output, r.output
    job.write_text("job:\n" + "".join(f"  {k}: {v}\n" for k, v in spec(jid, measured=None, slo=3.0).items()
                                      if v is not None))
    r = CliRunner().invoke(app, ["submit", str(job)], env=env)
    assert r.exit_code == 1 and "duplicate_job_id" in r.output
    r = CliRunner().invoke(app, ["status"], env=env)
    assert r.exit_code == 0 and jid in r.output and "co-execution groups" in r.output, r.output
    assert "active jobs: " in r.output, r.output  # health counts the active jobs, not every row listed
    r = CliRunner().invoke(app, ["urls"], env=env)
    assert r.exit_code == 0 and f"http://127.0.0.1:{serve_api.config.port}/docs" in r.output


def test_up_refuses_a_busy_port_before_starting_anything(tmp_path):
    import socket

    from typer.testing import CliRunner

    from rollmux_cli import app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        busy = s.getsockname()[1]
        r = CliRunner().invoke(app, ["up", "--state-dir", str(tmp_path), "--dashboard-port", str(busy)])
    assert r.exit_code == 2, r.output
    assert f"dashboard_port {busy}" in r.output and "--dashboard-port" in r.output
    assert not (tmp_path / "state.json").exists() and not (tmp_path / "logs").exists()  # nothing was started


def test_up_validates_scheduler_config_and_checkpoint_before_starting_anything(tmp_path):
    """``rollmux up --scheduler-config`` (and ``$ROLLMUX_SCHEDULER_CONFIG``) is validated before
    anything starts, naming the key and how to write it; a damaged checkpoint is refused with the
    scheduler's own words; a plain ``up`` after ``up --state-dir X; down`` uses X (its checkpoint)."""
    from typer.testing import CliRunner

    from actors.ops.cli_stack import _free_port
    from rollmux.config import CONFIG_DIR
    from rollmux_cli import app

    sd = tmp_path / "x"
    sd.mkdir()
    ports = ["--port", str(_free_port()), "--ray-port", str(_free_port()), "--dashboard-port", str(_free_port()),
             "--metrics-export-port", str(_free_port())]
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join("per_job_allocations: false" if ln.startswith("per_job_allocations:") else ln
                             for ln in (CONFIG_DIR / "scheduler.yaml").read_text().splitlines()) + "\n")
    env = {"ROLLMUX_CURRENT": str(tmp_path / "current"), "ROLLMUX_STATE_DIR": "", "COLUMNS": "200"}
    r = CliRunner().invoke(app, ["up", "--state-dir", str(sd), *ports, "--scheduler-config", str(bad)], env=env)
    assert r.exit_code == 2 and "per_job_allocations" in r.output and "'off' or 'simulator'" in r.output, r.output
    r = CliRunner().invoke(app, ["up", "--state-dir", str(sd), *ports], env={**env, "ROLLMUX_SCHEDULER_CONFIG": str(bad)})
    assert r.exit_code == 2 and "per_job_allocations" in r.output, r.output
    (tmp_path / "current").write_text(f"{sd}\n")  # what `up --state-dir X` records; `down` keeps it
    r = CliRunner().invoke(app, ["up", *ports, "--scheduler-config", str(bad)], env=env)
    assert r.exit_code == 2 and f"state dir {sd} (the last `rollmux up`'s" in r.output, r.output
    (sd / "checkpoint").mkdir()
    (sd / "checkpoint" / "rollmux-global-scheduler.base.json").write_text("{not json")
    r = CliRunner().invoke(app, ["up", *ports], env=env)
    out = " ".join(r.output.split())  # (rich wraps long lines)
    assert r.exit_code == 2 and "refusing to start" in out and "rollmux down --purge" in out, r.output
    assert not (sd / "state.json").exists() and not (sd / "logs").exists()  # nothing was started


@pytest.mark.ray
def test_up_refuses_a_scheduler_config_its_restored_scheduler_does_not_run(serve_api, tmp_path):
    """The scheduler says which settings it runs with (``config_sha256``); ``up`` given a file with
    other settings than a restored scheduler keeps refuses it instead of ignoring it."""
    import typer

    from actors.handles import SchedulerHandle
    from actors.ops.cli_ops import _refuse_other_settings
    from rollmux.admission import load_scheduler_config

    health = SchedulerHandle(serve_api.scheduler).health()
    same = load_scheduler_config()  # what the test scheduler was started with
    assert health.config_sha256 == same.sha256()
    cfg = serve_api.config.model_copy(update={"scheduler_config": tmp_path / "s.yaml"})
    _refuse_other_settings(cfg, health, same)
    with pytest.raises(typer.Exit) as e:
        _refuse_other_settings(cfg, health, same.overridden(tenants={"team-a": {"rollout_gpus": 1, "train_gpus": 1}}))
    assert e.value.exit_code == 2
    _refuse_other_settings(serve_api.config, health, same.overridden(preemption=False))  # no file given: nothing to refuse


@pytest.mark.ray
def test_read_routes_can_be_protected(serve_api):
    """open_read_routes=false: the same app (in process, real scheduler actor) needs the token for GETs."""
    from fastapi.testclient import TestClient

    import serve_app
    from rollmux.config import ServeConfig

    cfg = ServeConfig(open_read_routes=False, scheduler_name=serve_api.scheduler_name)
    app = serve_app.create_app(serve_app.AppSettings.from_config(cfg, serve_api.token))
    with TestClient(app) as c:
        assert c.get("/v1/jobs").status_code == 401 and c.get("/v1/groups").status_code == 401
        auth = {"Authorization": f"Bearer {serve_api.token}"}
        assert c.get("/v1/groups", headers=auth).status_code == 200
        assert c.get("/healthz").json()["name"] == serve_api.scheduler_name  # health stays open


@pytest.mark.ray
def test_a_queued_job_is_admitted_over_http_after_a_departure_frees_room(api, clean):
    """``"queue": true`` on the bounded local cluster: a job that does not fit is held (202, its
    place in line, ``GET`` shows ``queued`` with its wait) and admitted by the departure that
    frees room; its record keeps the time it waited."""
    # 3 GB of host state per node: no two of these jobs share a node (4 GB per node)
    fill = spec(_id("fill"), num_rollout_gpus=2, num_train_gpus=2, mem_roll_gb=3.0, mem_train_gb=3.0)
    assert api.post("/v1/jobs", json=fill).status_code == 201
    wait = spec(_id("wait"), mem_roll_gb=3.0, mem_train_gb=3.0)
    r = api.post("/v1/jobs", json=wait)
    assert r.status_code == 409 and r.json()["error"] == "not_admitted:retry_later"
    r = api.post("/v1/jobs", json={**wait, "queue": True})
    assert r.status_code == 202, r.text
    assert r.json()["queued"] is True and r.json()["queue_position"] == 1 and r.json()["admitted"] is False
    j = api.get(f"/v1/jobs/{wait['job_id']}").json()
    assert j["state"] == "queued" and j["queue_position"] == 1 and j["waited_s"] >= 0
    assert [x["job_id"] for x in api.get("/v1/jobs").json() if x["state"] == "queued"] == [wait["job_id"]]
    r = api.delete(f"/v1/jobs/{fill['job_id']}")
    assert r.status_code == 200 and r.json()["admitted_from_queue"] == [wait["job_id"]]
    j = api.get(f"/v1/jobs/{wait['job_id']}").json()  # this replica's snapshot already holds the departure
    assert j["state"] == "admitted" and j["group_id"] and j["placement"]["rollout_nodes"] and j["waited_s"] > 0
    assert j.get("queue_position") is None


def test_ports_handed_to_ray_lie_outside_the_ephemeral_range(monkeypatch):
    """Ports that `rollmux up` passes to Ray (which binds them later) are never ones the kernel
    could give an outgoing connection meanwhile, and are free when chosen; a busy draw is skipped."""
    import socket

    from actors.ops import cli_ops

    lo, hi = cli_ops._ephemeral_range()
    ports = {cli_ops._free_port() for _ in range(200)}
    assert all(not lo <= p <= hi and 10_000 <= p < 65_000 for p in ports)
    # nor in Ray's own client/worker ports: `ray start` refuses a port it keeps for its workers
    # (10002-19999 by default), so a pool node given one never joined
    assert not any(10_001 <= p <= 19_999 for p in ports)
    with socket.socket() as held:
        held.bind(("", 0))
        busy = held.getsockname()[1]
        free = cli_ops._free_port()
        draws = iter([busy, busy, free])
        monkeypatch.setattr("random.SystemRandom.choice", lambda self, seq: next(draws))
        assert cli_ops._free_port() == free
