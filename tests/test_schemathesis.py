"""Fuzz the admission API's OpenAPI spec (schemathesis) against the real Serve app: no request gets a 5xx.

Every operation of ``/openapi.json`` gets ``MAX_EXAMPLES`` generated requests in each generation
mode (positive: schema-valid; negative: schema-violating), sent with the bearer token to
127.0.0.1. Jobs the fuzzer manages to admit are departed again at once so the small local cluster
keeps room for the next cases. (schemathesis' ``from_fixture`` does not work with pytest 9, so
the strategies are driven by hypothesis directly.)
"""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

pytestmark = pytest.mark.ray

MAX_EXAMPLES = int(os.environ.get("ROLLMUX_FUZZ_EXAMPLES", "20"))  # per operation and mode
OPERATIONS = [
    ("/healthz", "GET"), ("/v1/jobs", "POST"), ("/v1/jobs:dry-run", "POST"), ("/v1/jobs", "GET"),
    ("/v1/jobs/{job_id}", "GET"), ("/v1/jobs/{job_id}", "DELETE"), ("/v1/groups", "GET"),
    # the rollout service on the same app
    ("/v1/rollouts", "POST"), ("/v1/rollouts/{request_id}", "GET"), ("/v1/rollouts/{request_id}", "DELETE"),
    ("/v1/rollouts:stream", "POST"), ("/v1/rollouts:cancel", "POST"), ("/v1/policy", "POST"), ("/v1/stats", "GET"),
    ("/v1/stats/prometheus", "GET"), ("/v1/completions", "POST"), ("/v1/chat/completions", "POST"),
    ("/v1/models", "GET"), ("/v1/models/{model}", "GET"), ("/v1/rollouts:ingress", "GET"),
    # weight updates (uploads that never complete; from disk without a weights_root: 403)
    ("/v1/weights", "GET"), ("/v1/weights/update_from_disk", "POST"), ("/v1/weights/uploads", "POST"),
    ("/v1/weights/uploads/{upload_id}", "DELETE"), ("/v1/weights/uploads/{upload_id}/chunks/{index}", "PUT"),
    ("/v1/weights/uploads/{upload_id}:commit", "POST"),
]


@pytest.fixture(scope="module")
def api_schema(serve_api):
    return schemathesis.openapi.from_url(serve_api.base_url + "/openapi.json", wait_for_schema=60)


def test_every_operation_is_fuzzed(api_schema):
    ops = {(op.ok().path, op.ok().method.upper()) for op in api_schema.get_all_operations()}
    assert ops == set(OPERATIONS)


# negative generation needs something to violate: operations with a body or path parameters
CASES = [(p, m, GenerationMode.POSITIVE) for p, m in OPERATIONS] + [
    (p, m, GenerationMode.NEGATIVE) for p, m in OPERATIONS if m in ("POST", "PUT", "DELETE") or "{" in p]


@pytest.mark.parametrize("path,method,mode", CASES, ids=[f"{m} {p} {g.value}" for p, m, g in CASES])
def test_no_5xx(api_schema, serve_api, path, method, mode):
    op = api_schema[path][method]
    auth = {"Authorization": f"Bearer {serve_api.token}"}
    seen: dict[int, int] = {}

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        # a negative case may violate only its Authorization header: send that as generated (else the
        # valid token would turn the case into a valid request); every other case carries the token
        own = case.headers or {}
        headers = {**auth, **own} if mode == GenerationMode.NEGATIVE and "Authorization" in own else {**own, **auth}
        resp = case.call(headers=headers, timeout=60)
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
        try:
            case.validate_response(resp, checks=[not_a_server_error])
            assert resp.status_code < 500, f"{method} {case.formatted_path}: {resp.status_code} {resp.text[:300]}"
            if resp.status_code >= 400:  # every error is JSON naming its kind and reason
                body = resp.json()
                assert isinstance(body.get("error"), str) and isinstance(body.get("detail"), str), body
        finally:
            if method == "POST" and path == "/v1/jobs" and resp.status_code == 201:
                httpx.delete(f"{serve_api.base_url}/v1/jobs/{resp.json()['job_id']}", headers=auth, timeout=60)
            if method == "POST" and path == "/v1/rollouts" and resp.status_code == 202:  # keep the engines free
                ids = [a["id"] for a in resp.json()["requests"]]
                httpx.post(f"{serve_api.base_url}/v1/rollouts:cancel", json={"ids": ids}, headers=auth, timeout=60)

    run()
    assert sum(seen.values()) >= 1
    if mode == GenerationMode.NEGATIVE and method == "POST":
        refused = {400, 401, 409, 413, 415, 422} | ({403, 404} if path.startswith("/v1/weights") else set())
        assert set(seen) <= refused, seen  # schema-violating bodies are refused, never accepted
