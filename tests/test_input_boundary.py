"""The hard input boundary: every number finite and bounded, strict types, addressable ids, 413/415,
errors naming the field and what it allows; non-finite values are infeasible inside the policy too.

The HTTP app runs in-process (FastAPI TestClient) over an in-process GlobalScheduler on the paper's
cluster (no Ray, no controllers).
"""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from actors.scheduler.global_scheduler import GlobalSchedulerImpl
from actors.scheduler.kv import MemoryKV
from rollmux import admission, models, profiler
from rollmux.admission import InterGroupScheduler, SchedulerConfig
from rollmux.config import CONFIG_DIR, ServeConfig, load_cluster
from rollmux.models import JobSpec, PhaseProfile
from rollmux.rollout_sched import config as rs_config
from rollmux.rollout_sched.requests import Request
from rollmux.traces import TraceWindow
from examples.grpo.config import ModelConfig, RunConfig
from serve_app import AppSettings, _sha256, create_app
from factories import InProcessScheduler, unit_kw

TOKEN = "t" * 32
AUTH = {"Authorization": "Bearer " + TOKEN}
JSON = {**AUTH, "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def paper():
    return load_cluster(CONFIG_DIR / "cluster_paper.yaml")


@pytest.fixture
def app(paper):
    g = GlobalSchedulerImpl(paper, kv=MemoryKV(), **unit_kw())

    with TestClient(create_app(AppSettings(token_sha256=_sha256(TOKEN), max_request_bytes=4096),
                               client=InProcessScheduler(g))) as c:
        yield c


def _post(c, body: str, headers=JSON):
    return c.post("/v1/jobs", headers=headers, content=body)


def _all_finite(x) -> bool:
    if isinstance(x, bool) or x is None:
        return x is not None
    if isinstance(x, (int, float)):
        return math.isfinite(x)
    if isinstance(x, dict):
        return all(_all_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_all_finite(v) for v in x if not isinstance(v, str))
    return True


# --------------------------------------------------------------------------- the HTTP face
def test_an_infinite_phase_time_is_422_naming_the_field_and_nothing_is_admitted(app):
    r = _post(app, '{"job_id": "inf", "model_params_b": 7, "measured": {"t_roll_s": 1e400, "t_train_s": 60, "t_sync_s": 3}}')
    assert r.status_code == 422, r.text
    d = r.json()
    assert [e["field"] for e in d["errors"]] == ["measured.t_roll_s"]
    assert "finite" in d["detail"] and "0.001 <= t_roll_s <= 604800 s" in d["detail"]
    assert app.get("/v1/groups").json() == [] and app.get("/v1/jobs").json() == []


@pytest.mark.parametrize("body,field,says", [
    ('{"job_id": "a", "model_params_b": 7, "slo": NaN}', "slo", "1 <= slo <= 100"),
    ('{"job_id": "a", "model_params_b": 7, "slo": Infinity}', "slo", "finite"),
    ('{"job_id": "a", "model_params_b": 7, "slo": -Infinity}', "slo", "finite"),
    ('{"job_id": "a", "model_params_b": 7, "slo": "2"}', "slo", "not a string"),
    ('{"job_id": "a", "model_params_b": 7, "num_train_gpus": true}', "num_train_gpus", "not a string or boolean"),
    ('{"job_id": "a", "model_params_b": 7, "num_train_gpus": 8.0}', "num_train_gpus", "integer"),
    ('{"job_id": "a", "model_params_b": 7, "num_train_gpus": "8"}', "num_train_gpus", "0 < num_train_gpus <= 65536 GPUs"),
    ('{"job_id": "a", "model_params_b": 1e300}', "model_params_b", "1e-06 <= model_params_b <= 2000 B params"),
    # the floors: no job has a model of 5e-324 B parameters or phases of 5e-324 s
    ('{"job_id": "a", "model_params_b": 5e-324}', "model_params_b", "1e-06 <= model_params_b <= 2000 B params"),
    ('{"job_id": "a", "model_params_b": 7, "measured": {"t_roll_s": 5e-324, "t_train_s": 1}}',
     "measured.t_roll_s", "0.001 <= t_roll_s <= 604800 s"),
    ('{"job_id": "a", "model_params_b": 7, "measured": {"t_roll_s": 1, "t_train_s": 0.0009}}',
     "measured.t_train_s", "0.001 <= t_train_s <= 604800 s"),
    ('{"job_id": "a", "model_params_b": 7, "measured": {"t_roll_s": 1, "t_train_s": 1, "t_sync_s": 1e-300}}',
     "measured.t_sync_s", "0 (no sync) or at least the floor of 0.001 s"),
    ('{"job_id": "a", "model_params_b": 7, "mem_train_gb": 1e308}', "mem_train_gb", "<= 65536 GB"),
    ('{"job_id": "a", "model_params_b": 7, "max_response_tokens": 100000000000000000000}', "max_response_tokens", "tokens"),
    ('{"job_id": "a", "model_params_b": 7, "measured": {"t_roll_s": 1, "t_train_s": 1, "t_sync_s": NaN}}',
     "measured.t_sync_s", "0 <= t_sync_s <= 604800 s"),
    ('{"job_id": "a", "model_params_b": 7, "multi_turn": 1}', "multi_turn", "true or false"),
    ('{"job_id": "a", "model_params_b": 7, "zero_stage": 4}', "zero_stage", "0 <= zero_stage <= 3"),
    ('{"job_id": "a", "model_params_b": 7, "train_precision": "fp8"}', "train_precision", "bf16_mixed"),
    ('{"job_id": "..", "model_params_b": 7}', "job_id", "[A-Za-z0-9]"),
    ('{"job_id": "a/b", "model_params_b": 7}', "job_id", "[A-Za-z0-9]"),
    ('{"job_id": "' + "a" * 129 + '", "model_params_b": 7}', "job_id", "128"),
    ('{"job_id": "a", "model_params_b": 7, "measured": {"t_roll_s": 1, "t_train_s": 1, "x": 1}}', "measured.x", "t_roll_s"),
    ('{"job_id": "a", "model_params_b": 7, "priority_class": "a b"}', "priority_class", "[A-Za-z]"),
    ('{"job_id": "a", "model_params_b": 7, "priority_class": 1}', "priority_class", "string"),
    ('{"job_id": "a", "model_params_b": 7, "tenant": "' + "t" * 65 + '"}', "tenant", "64"),
    ('{"job_id": "a", "model_params_b": 7, "preemptible": "no"}', "preemptible", "true or false"),
    ('{"job_id": "a", "model_params_b": 7, "max_staleness": 17}', "max_staleness", "0 <= max_staleness <= 16"),
    ('{"job_id": "a", "model_params_b": 7, "staleness_mode": "eventual"}', "staleness_mode", "exact"),
    ('{"job_id": "a", "model_params_b": 7, "measured": {"t_roll_s": 1, "t_train_s": 1, "max_staleness": 1}}',
     "measured.max_staleness", "declare the staleness bound on the job"),
    ('{"job_id": "a", "model_params_b": 7,', "body", "malformed JSON"),
    ('[1, 2]', "body", "object"),
])
def test_each_bad_field_is_422_naming_it_and_what_it_allows(app, body, field, says):
    r = _post(app, body)
    assert r.status_code == 422, r.text
    d = r.json()
    assert d["error"] == "invalid_request" and field in [e["field"] for e in d["errors"]], d
    assert f"{field}: " in d["detail"] and says in d["detail"], d["detail"]


def test_malformed_json_names_the_body_not_an_offset(app):
    d = _post(app, '{"job_id": "a", "model_params_b": 7,').json()
    assert [e["field"] for e in d["errors"]] == ["body"] and "at character" in d["detail"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None, "multipart/form-data"])
def test_a_body_that_is_not_json_is_415(app, ctype):
    headers = dict(AUTH) if ctype is None else {**AUTH, "Content-Type": ctype}
    r = app.post("/v1/jobs", headers=headers, content=b'{"job_id": "a", "model_params_b": 7}')
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
    assert "application/json" in r.json()["detail"]
    r = app.post("/v1/jobs:dry-run", headers={**AUTH, "Content-Type": "application/json; charset=utf-8"},
                 content=b'{"job_id": "a", "model_params_b": 7}')
    assert r.status_code == 200, r.text


def test_a_body_over_the_size_limit_is_413(app):
    big = json.dumps({"job_id": "a", "model_params_b": 7, "pad": "x" * 5000})
    r = _post(app, big)
    assert r.status_code == 413 and r.json()["error"] == "request_too_large" and "4096 bytes" in r.json()["detail"]

    def chunks():  # streamed without Content-Length: counted while read
        for _ in range(10):
            yield b" " * 1000

    r = app.post("/v1/jobs", headers=JSON, content=chunks())
    assert r.status_code == 413
    r = _post(app, json.dumps({"job_id": "a", "model_params_b": 7}) + " " * 3000)  # under the limit
    assert r.status_code == 201


def test_every_admitted_id_is_addressable(app):
    for jid in ("a", "A.b_c-9", "9" * 128):
        assert _post(app, json.dumps({"job_id": jid, "model_params_b": 7})).status_code == 201
        assert app.get(f"/v1/jobs/{jid}").json()["job_id"] == jid
        assert app.delete(f"/v1/jobs/{jid}", headers=AUTH).status_code == 200
    assert app.get("/v1/jobs/a%20b").status_code == 422  # not an id: named as such, not a 404 lookup


def test_training_gpu_memory_refusal_shows_the_numbers(app):
    r = _post(app, '{"job_id": "big", "model_params_b": 70, "num_train_gpus": 8}')
    assert r.status_code == 409 and r.json()["error"] == "not_admitted:never"
    detail = r.json()["detail"]
    assert "training GPU memory" in detail and "140.0 GB per training GPU" in detail and "80.0 GB" in detail
    assert "1120 GB vs 640 GB" in detail
    assert _post(app, '{"job_id": "big", "model_params_b": 70, "num_train_gpus": 16}').status_code == 201


# random specs, including non-finite and huge values: never a 5xx, never an unbounded group table
_NUM = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
    st.sampled_from([0, 1, 8, 16, 1e-300, 1e300, 2000, 2000.0001, 604800, 604801, "8", True, None]))
_SPEC = st.fixed_dictionaries(
    {"job_id": st.from_regex(r"\A[a-z0-9]{1,8}\Z")},
    optional={k: _NUM for k in ("model_params_b", "num_prompts", "responses_per_prompt", "prompt_tokens",
                                 "max_response_tokens", "num_rollout_gpus", "num_train_gpus", "slo",
                                 "mem_roll_gb", "mem_train_gb", "zero_stage")}
    | {"measured": st.fixed_dictionaries({"t_roll_s": _NUM, "t_train_s": _NUM}, optional={"t_sync_s": _NUM})},
)


@given(specs=st.lists(_SPEC, min_size=1, max_size=4))
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_random_specs_keep_the_group_table_finite(app, specs):
    for s in specs:
        r = _post(app, json.dumps(s))  # json.dumps writes NaN / Infinity tokens for non-finite floats
        assert r.status_code in (201, 409, 422), (s, r.status_code, r.text[:300])
        if r.status_code == 201:
            assert _all_finite(r.json()["predicted_slowdowns"]) and _all_finite(r.json()["marginal_cost_usd_per_h"])
        rg = app.get("/v1/groups", headers=AUTH)  # with the token: open reads are rate-limited per client
        assert rg.status_code == 200, rg.text[:300]
        for g in rg.json():
            for k in ("cost_usd_per_h", "t_cycle_s", "t_load_s", "slack_s"):
                assert isinstance(g[k], (int, float)) and math.isfinite(g[k]), (k, g)
    for j in app.get("/v1/jobs", headers=AUTH).json():
        if j["state"] in ("admitted", "running"):
            app.delete(f"/v1/jobs/{j['job_id']}", headers=AUTH)


# --------------------------------------------------------------------------- the models
BOUNDED_MODELS = [JobSpec, PhaseProfile, models.GPUType, models.NodeSpec, models.PoolSpec, models.ClusterSpec,
                  ServeConfig, AppSettings, SchedulerConfig, TraceWindow, Request, rs_config.SchedProfile,
                  rs_config.ColdStartConfig, rs_config.BudgetConfig, rs_config.IndexConfig, rs_config.RolloutSchedConfig,
                  RunConfig, ModelConfig]


def _numeric_fields(model: type[BaseModel]):
    sch = model.model_json_schema()
    for name, prop in sch.get("properties", {}).items():
        opts = [prop] + list(prop.get("anyOf") or [])
        for o in opts:
            if o.get("type") in ("number", "integer"):
                yield name, o


@pytest.mark.parametrize("model", BOUNDED_MODELS, ids=lambda m: m.__name__)
def test_every_numeric_field_is_finite_and_bounded_on_both_sides(model):
    fields = list(_numeric_fields(model))
    for name, o in fields:
        assert "minimum" in o or "exclusiveMinimum" in o, f"{model.__name__}.{name} has no lower bound"
        assert "maximum" in o or "exclusiveMaximum" in o, f"{model.__name__}.{name} has no upper bound"
    floats = [name for name, o in fields if o["type"] == "number"]
    if floats:  # NaN / Infinity refused with "should be a finite number", not a misleading range message
        assert model.model_config.get("allow_inf_nan") is False, model.__name__


@pytest.mark.parametrize("bad", [{"t_roll_s": math.inf, "t_train_s": 1}, {"t_roll_s": math.nan, "t_train_s": 1},
                                 {"t_roll_s": 1, "t_train_s": 604801}, {"t_roll_s": "1", "t_train_s": 1}])
def test_phase_profile_refuses_non_finite_huge_and_string_times(bad):
    with pytest.raises(ValidationError):
        PhaseProfile.model_validate(bad)


def test_requests_of_the_rollout_scheduler_are_bounded():
    for bad in ({"arrival_s": math.inf}, {"arrival_s": math.nan}, {"max_tokens": 1 << 21},
                {"prompt_token_ids": (1, 1 << 40)}):
        with pytest.raises(ValidationError):
            Request.model_validate({"request_id": "r", "prompt_token_ids": (1, 2), **bad})


# --------------------------------------------------------------------------- defence in depth (rollmux/)
def test_a_non_finite_profile_is_refused_never_admitted(paper):
    s = InterGroupScheduler(paper)
    job = JobSpec(job_id="j", model_params_b=7)
    for t in (math.inf, math.nan):
        prof = PhaseProfile.model_construct(t_roll_s=t, t_train_s=60.0, t_sync_s=3.0)  # bypasses validation
        d = s.decide(job, prof)
        assert not d.admitted and d.code == "never" and "t_roll_s" in d.reason


def test_a_nan_slo_or_slowdown_is_infeasible_not_a_pass(paper):
    assert not admission.within(math.nan, 2.0) and not admission.within(1.0, math.nan)
    assert not admission.within(math.inf, 2.0) and admission.within(2.0, 2.0)
    assert admission.breaks_slo(math.nan, 1.0, 2.0) and admission.breaks_slo(1.0, 1.0, math.nan)
    assert admission.is_saturated(math.nan, 10.0) and admission.is_saturated(1.0, math.inf)
    assert not admission.is_saturated(1.0, 10.0)
    s = InterGroupScheduler(paper)
    first = JobSpec(job_id="a", model_params_b=7, measured=PhaseProfile(t_roll_s=100, t_train_s=100, t_sync_s=1))
    assert s.admit(first).admitted
    nan_slo = JobSpec.model_construct(**{**JobSpec(job_id="b", model_params_b=7).model_dump(), "slo": math.nan,
                                         "measured": PhaseProfile(t_roll_s=10, t_train_s=10, t_sync_s=1)})
    d = s.decide(nan_slo)
    assert d.strategy != "direct" and d.group_id is None  # never packed into a group on a NaN comparison
    for g in s.describe_groups():
        assert all(math.isfinite(g[k]) for k in ("t_cycle_s", "t_load_s", "slack_s", "cost_usd_per_h"))


# --------------------------------------------------------------------------- training-GPU memory
@pytest.mark.parametrize("params_b,gpus,precision,stage,gb", [
    (70, 8, "bf16_mixed", 3, 140.0),     # 16 B/param sharded over 8
    (70, 16, "bf16_mixed", 3, 70.0),
    (7, 8, "bf16_mixed", 0, 112.0),      # no sharding: everything on every GPU
    (7, 8, "bf16_mixed", 1, 28.0 + 84.0 / 8),
    (7, 8, "bf16_mixed", 2, 14.0 + 98.0 / 8),
    (7, 8, "fp32", 0, 112.0),
    (7, 8, "bf16", 3, 7.0),
])
def test_training_gpu_state_per_gpu(params_b, gpus, precision, stage, gb):
    job = JobSpec(job_id="j", model_params_b=params_b, num_train_gpus=gpus, train_precision=precision, zero_stage=stage)
    assert profiler.train_gpu_state_gb(job) == pytest.approx(gb)


def test_training_gpu_memory_filter_refuses_what_never_fits(paper):
    assert [f.name for f in admission.JOB_FILTERS] == ["finite", "train_gpu_memory"]
    v = admission.train_gpu_memory_filter(JobSpec(job_id="big", model_params_b=70, num_train_gpus=8), None, paper)
    assert (v.ok, v.plugin) == (False, "train_gpu_memory")
    assert v.numbers == {"state_gb_per_gpu": 140.0, "hbm_gb": 80.0, "state_gb_total": 1120.0, "hbm_gb_total": 640.0}
    s = InterGroupScheduler(paper)
    d = s.decide(JobSpec(job_id="big", model_params_b=70, num_train_gpus=8))
    assert not d.admitted and d.code == "never" and "140.0 GB per training GPU" in d.reason and "H800" in d.reason
    d = s.decide(JobSpec(job_id="z0", model_params_b=7, zero_stage=0))
    assert not d.admitted and "ZeRO-0" in d.reason and "higher zero_stage" in d.reason
    assert s.decide(JobSpec(job_id="ok", model_params_b=70, num_train_gpus=16)).admitted
    assert s.decide(JobSpec(job_id="ok2", model_params_b=32, num_train_gpus=8)).admitted  # 64 GB <= 80 GB


def test_a_refusal_names_the_deciding_filter_saturation_is_not_out_of_gpus():
    from rollmux.models import ClusterSpec

    c = load_cluster(CONFIG_DIR / "cluster_paper.yaml")
    small = ClusterSpec.model_validate({**c.model_dump(), "rollout_pool": {**c.rollout_pool.model_dump(), "num_nodes": 1},
                                        "train_pool": {**c.train_pool.model_dump(), "num_nodes": 1}})
    s = InterGroupScheduler(small, config=SchedulerConfig(saturation="paper"))
    # two jobs of 100 + 100 s on one rollout and one training node: each node is busy 200 s of a 200 s cycle
    # (saturated by the paper's rule T_load >= T_cycle)
    assert s.admit(JobSpec(job_id="a", model_params_b=7, measured=PhaseProfile(t_roll_s=100, t_train_s=100, t_sync_s=0))).admitted
    s.admit(JobSpec(job_id="b", model_params_b=7, slo=3.0, measured=PhaseProfile(t_roll_s=100, t_train_s=100, t_sync_s=0)))
    d = s.decide(JobSpec(job_id="c", model_params_b=7, slo=3.0, measured=PhaseProfile(t_roll_s=10, t_train_s=10, t_sync_s=0)))
    assert not d.admitted and d.code == "retry_later"
    assert "saturation: group-0" in d.reason  # the deciding filter of the existing group
    assert "a new group refused by capacity (cluster out of GPUs" in d.reason


@pytest.mark.parametrize("body, says", [
    (b"[" * 1000 + b"]" * 1000, "nested deeper than 32 levels"),
    (b'{"job_id": "a", "model_params_b": 7, "x": ' + b"[" * 40 + b"]" * 40 + b"}", "nested deeper than 32 levels"),
    (b'{"job_id": "\xff\xfe", "model_params_b": 7}', "not valid UTF-8 (byte 12)"),
])
def test_deep_nesting_and_invalid_utf8_are_422_naming_the_body(app, body, says):
    r = app.post("/v1/jobs", headers=JSON, content=body)
    d = r.json()
    assert r.status_code == 422 and d["error"] == "invalid_request", d
    assert [e["field"] for e in d["errors"]] == ["body"] and says in d["detail"]
    assert app.get("/v1/jobs", headers=AUTH).json() == []  # nothing admitted


def test_unknown_job_is_404_from_the_replica_copy_without_asking_the_scheduler(paper):
    g = GlobalSchedulerImpl(paper, kv=MemoryKV(), **unit_kw())
    calls = []

    class Recording(InProcessScheduler):
        async def invoke(self, name, fn, *args):
            calls.append(name)
            return await super().invoke(name, fn, *args)

    with TestClient(create_app(AppSettings(token_sha256=_sha256(TOKEN)), client=Recording(g))) as c:
        assert c.post("/v1/jobs", headers=JSON, json={"job_id": "a", "model_params_b": 7}).status_code == 201
        assert c.get("/v1/jobs/a").status_code == 200
        before = list(calls)
        for i in range(20):
            r = c.get(f"/v1/jobs/nope-{i}")
            assert r.status_code == 404 and r.json()["error"] == "not_found"
        assert "get_job" not in calls and [x for x in calls[len(before):] if x != "snapshot_since"] == []


def test_open_reads_are_rate_limited_per_client_the_token_is_not(paper):
    g = GlobalSchedulerImpl(paper, kv=MemoryKV(), **unit_kw())
    app = create_app(AppSettings(token_sha256=_sha256(TOKEN), open_read_rate_per_s=0.01, open_read_burst=3),
                     client=InProcessScheduler(g))
    with TestClient(app) as c:
        codes = [c.get("/v1/jobs").status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        r = c.get("/v1/groups")
        assert r.status_code == 429 and r.json()["error"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
        assert "open_read_rate_per_s" in r.json()["detail"]
        assert all(c.get("/v1/jobs", headers=AUTH).status_code == 200 for _ in range(10))  # with the token: no limit


def test_client_rate_limit_refills_and_bounds_its_table():
    from serve_api.ratelimit import ClientRateLimit

    now = [0.0]
    lim = ClientRateLimit(2.0, 2, max_clients=3, clock=lambda: now[0])
    assert [lim.take("a") for _ in range(3)] == [0.0, 0.0, 0.5]
    assert lim.take("b") == 0.0  # another client has its own bucket
    now[0] = 0.5  # one token back for a
    assert lim.take("a") == 0.0 and lim.take("a") == 0.5
    for k in "cdef":
        lim.take(k)
    assert len(lim._buckets) == 3 and "a" not in lim._buckets and lim.refused == 2


def test_an_unknown_priority_class_is_422_naming_the_field_and_the_classes(app):
    for path in ("/v1/jobs", "/v1/jobs:dry-run"):
        r = app.post(path, headers=JSON, json={"job_id": "gold", "model_params_b": 7, "priority_class": "gold"})
        assert r.status_code == 422, r.text
        assert "priority_class" in r.json()["detail"] and "best-effort" in r.json()["detail"], r.json()
        (err,) = r.json()["errors"]  # as every other 422: the field it is about
        assert err["field"] == "priority_class" and "best-effort" in err["msg"], r.json()


def test_preemption_over_http_the_job_view_says_when_by_whom_and_what_it_lost(local):
    """On the local cluster (groups of one): a production job admitted over HTTP preempts the
    best-effort one; ``GET /v1/jobs/{id}`` shows the preemption, the queue listing the classes."""
    with local as c:
        spec = {"model_params_b": 0.001, "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": 1.0, "mem_roll_gb": 0.5,
                "mem_train_gb": 0.5, "measured": {"t_roll_s": 5.0, "t_train_s": 5.0, "t_sync_s": 0.0}}
        assert _post(c, json.dumps({**spec, "job_id": "be", "priority_class": "best-effort"})).status_code == 201
        assert _post(c, json.dumps({**spec, "job_id": "keep", "preemptible": False})).status_code == 201
        r = _post(c, json.dumps({**spec, "job_id": "prod", "priority_class": "production"}))
        assert r.status_code == 201 and r.json()["preempted"] == ["be"], r.text
        v = c.get("/v1/jobs/be", headers=AUTH).json()
        assert v["state"] == "preempted" and v["priority_class"] == "best-effort"
        assert v["preemptions"][0]["by_job"] == "prod" and v["preemptions"][0]["lost_gpu_h"] > 0
        r = _post(c, json.dumps({**spec, "job_id": "later", "priority_class": "best-effort", "queue": True}))
        assert r.status_code == 202, r.text
        listing = {j["job_id"]: j for j in c.get("/v1/jobs", headers=AUTH).json()}
        assert listing["prod"]["priority_class"] == "production" and listing["keep"]["priority_class"] == "research"
        assert listing["later"]["state"] == "queued" and listing["later"]["priority_class"] == "best-effort"
        assert sorted(listing) == ["be", "keep", "later", "prod"]  # the preempted job once, as its record


@pytest.fixture
def local():
    g = GlobalSchedulerImpl(load_cluster(CONFIG_DIR / "cluster_local.yaml"), kv=MemoryKV(), **unit_kw(),
                            max_group_size=1, config={"attach_timeout_s": 0.0})
    return TestClient(create_app(AppSettings(token_sha256=_sha256(TOKEN), max_request_bytes=4096),
                                 client=InProcessScheduler(g)))


def test_a_job_record_says_why_it_was_placed_where_it_runs():
    """A small job with a loose SLO (as a TRL job attached with ``ROLLMUX_SPEC={"slo": 3}``) kept
    out of the running job's group on the local cluster: its record says why (the rejected
    placements and their reasons), and no checkpoint-only field (``decision: null``) is answered."""
    g = GlobalSchedulerImpl(load_cluster(CONFIG_DIR / "cluster_local.yaml"), kv=MemoryKV(), **unit_kw())
    app = TestClient(create_app(AppSettings(token_sha256=_sha256(TOKEN), max_request_bytes=4096),
                                client=InProcessScheduler(g)))
    base = {"model_params_b": 0.01, "num_prompts": 8, "max_response_tokens": 256, "num_rollout_gpus": 1,
            "num_train_gpus": 1}
    assert _post(app, json.dumps({**base, "job_id": "demo-1", "slo": 1.5})).status_code == 201
    r = app.post("/v1/jobs?explain=full", headers=JSON, json={**base, "job_id": "trl", "slo": 3.0, "model_params_b": 0.0005})
    assert r.status_code == 201, r.text
    v = app.get("/v1/jobs/trl", headers=AUTH).json()
    a = v["admission"]
    assert "decision" not in v and "spec_sha256" not in v
    assert a["strategy"] == r.json()["explanation"]["strategy"] and a["group_id"] == v["group_id"] and a["reason"]
    demo = app.get("/v1/jobs/demo-1", headers=AUTH).json()["group_id"]
    assert a["strategy"] == "isolated" and v["group_id"] != demo  # kept out of demo-1's group, and why:
    assert a["rejected"] and all(x.startswith(f"{demo}/") for x in a["rejected"]), a
    assert any(": slo: trl: slowdown" in x and "> SLO 3.000" in x for x in a["rejected"]), a
    d = app.get("/v1/jobs/demo-1", headers=AUTH).json()["admission"]
    assert d["explain"] == "chosen" and d["rejected"] is None  # POST's default explains the chosen placement only
    assert all("decision" not in j for j in app.get("/v1/jobs", headers=AUTH).json())
