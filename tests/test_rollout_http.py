"""The rollout service over HTTP (serve_app.py + serve_api/rollouts.py + actors/rollout/service.py),
on the same Serve app and port as the admission API, two CPU engine replicas.

A multi-step trainer loop (submit a batch, stream, cancel the leftovers after over-sampling,
advance the policy version) with its results, cancellation, version expiry of prefix hits and the
metrics; the input boundary (every refused body names its field, nothing is enqueued); the
bounded queue (429 + Retry-After); a stream client that disconnects.
"""

from __future__ import annotations

import time

import httpx
import pytest

from rollmux.rollout_sched.service_config import ServiceConfig

pytestmark = pytest.mark.ray

SYSTEM = "You are a careful solver. Think step by step and answer briefly. " * 2


@pytest.fixture(scope="module")
def svc(serve_api):
    from actors.rollout.service import ensure_rollout_service, service_name

    h = ensure_rollout_service(service_name(serve_api.scheduler_name))
    lim = h.ready_sync(timeout_s=300)
    assert lim.num_replicas == 2 and lim.vocab_size == 256
    return h


@pytest.fixture(scope="module")
def http(serve_api, svc):
    with httpx.Client(base_url=serve_api.base_url, headers={"Authorization": f"Bearer {serve_api.token}"},
                      timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def v0(http):
    """The policy version the module starts from: the service is shared with other modules (the
    clients' tests advance it), so this module's versions count from where they left it."""
    return http.get("/v1/stats").json()["policy_version"]


def _stream(http, ids, n_stop=None):
    """Results of ``ids`` in finishing order (stop reading after ``n_stop`` generation results)."""
    out = []
    with http.stream("POST", "/v1/rollouts:stream", json={"ids": ids, "timeout_s": 120}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("application/x-ndjson")
        import json

        for line in r.iter_lines():
            if not line:
                continue
            obj = json.loads(line)
            if obj.get("event") == "end":
                out.append(obj)
                break
            out.append(obj)
            if n_stop is not None and sum(1 for o in out if o.get("task_type") == "generation") >= n_stop:
                break
    return out


def _settle(http, ids, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        views = [http.get(f"/v1/rollouts/{i}").json() for i in ids]
        if all(v["status"] in ("finished", "cancelled", "failed") for v in views):
            return views
        time.sleep(0.2)
    raise AssertionError(f"not settled: {[v['status'] for v in views]}")


def test_trainer_loop_over_http(http, svc, v0):
    sampled = 0
    long_cut = 0
    for step in range(3):
        fams = ["math", "code"]
        reqs = [{"prompt": SYSTEM + f"[{fams[i % 2]}] question {step}-{i}?", "max_tokens": 24, "critical": True,
                 "policy_version": v0 + step, "task_family": fams[i % 2], "logprobs": i == 0} for i in range(8)]
        # one over-sampled long generation (32 windows): still running when the trainer has its 4 samples
        reqs[7]["max_tokens"] = 256
        reqs += [{"task_type": "reward", "prompt_token_ids": [1, 2, 3, 4 + step], "max_tokens": 1, "critical": True,
                  "policy_version": v0 + step},
                 {"task_type": "replay", "prompt": "an old trajectory", "max_tokens": 0, "policy_version": v0 + step}]
        r = http.post("/v1/rollouts", json={"requests": reqs})
        assert r.status_code == 202, r.text
        acc = r.json()["requests"]
        assert len(acc) == 10 and all(a["status"] == "queued" and a["queue_position"] >= 1 for a in acc)
        assert all(a["expected_window"] >= 1 and a["replica"] in (0, 1) for a in acc)
        ids = [a["id"] for a in acc]
        assert len(set(ids)) == 10
        # over-sampling: train on the first 4 generations, cancel the rest
        got = _stream(http, ids, n_stop=4)
        gens = [g for g in got if g.get("task_type") == "generation"]
        assert len(gens) == 4
        for g in gens:
            assert g["status"] == "finished" and 1 <= len(g["output_token_ids"]) <= 24
            assert g["finish_reason"] in ("stop", "length") and isinstance(g["text"], str)
            t = g["timings"]
            assert t["submitted_s"] <= t["dispatched_s"] <= t["finished_s"]
            if g["logprobs"] is not None:
                assert len(g["logprobs"]) == len(g["output_token_ids"]) and all(x <= 0 for x in g["logprobs"])
        sampled += len(gens)
        left = [i for i in ids if i not in {g["id"] for g in got}]
        c = http.post("/v1/rollouts:cancel", json={"ids": left}).json()
        # the long generation is cut unless it ended before the cancel (timing: then it was streamed or ended)
        long_cut += ids[7] in c["dropped"] + c["aborted"]
        assert sorted(c["dropped"] + c["aborted"] + c["already_ended"]) == sorted(left) and not c["unknown"]
        for i in c["dropped"] + c["aborted"]:
            v = http.get(f"/v1/rollouts/{i}").json()
            assert v["status"] == "cancelled" and v["finish_reason"] == "cancelled"
        if c["dropped"] + c["aborted"]:
            assert http.delete(f"/v1/rollouts/{(c['dropped'] + c['aborted'])[0]}").status_code == 409
        p = http.post("/v1/policy", json={"version": v0 + step + 1})
        assert p.status_code == 200 and p.json()["version"] == v0 + step + 1 and p.json()["previous_version"] == v0 + step
    assert long_cut >= 1  # over-sampling cut a running long generation at least once in three steps
    # requests of a version older than the minimum are refused; so is an older policy
    r = http.post("/v1/rollouts", json={"prompt": "late", "policy_version": v0})
    assert r.status_code == 409 and r.json()["error"] == "stale_policy_version" and "policy_version" in r.json()["detail"]
    assert http.post("/v1/policy", json={"version": v0}).status_code == 409

    # prefix hits: a repeated prompt matches once its first copy ran; a new version expires the entry
    prompt = SYSTEM + "shared prefix probe"
    a = http.post("/v1/rollouts", json={"prompt": prompt, "max_tokens": 4, "policy_version": v0 + 3}).json()["requests"][0]
    _settle(http, [a["id"]])
    b = http.post("/v1/rollouts", json={"prompt": prompt, "max_tokens": 4, "policy_version": v0 + 3}).json()["requests"][0]
    assert b["replica"] == a["replica"] and b["matched_prefix_tokens"] == len(prompt.encode()) - 1
    _settle(http, [b["id"]])
    assert http.post("/v1/policy", json={"version": v0 + 4}).json()["prefix_entries_dropped"] > 0
    c = http.post("/v1/rollouts", json={"prompt": prompt, "max_tokens": 4, "policy_version": v0 + 4}).json()["requests"][0]
    assert c["matched_prefix_tokens"] == 0
    _settle(http, [c["id"]])

    s = http.get("/v1/stats").json()
    assert s["sample_throughput_per_s"] > 0 and 0 < s["trainer_idle_ratio"] <= 1
    assert 0 < s["prefix_hit_ratio"] < 1 and s["training_step_time_s"] > 0
    assert 0 < s["diversity_score"] <= 1 and s["index_bytes"] > 0
    assert s["counters"]["cancelled"] >= 1 and s["counters"]["samples"] >= sampled
    assert s["policy_version"] == v0 + 4 and len(s["replicas"]) == 2 and all(r["alive"] for r in s["replicas"])
    prom = http.get("/v1/stats/prometheus")
    assert prom.status_code == 200
    for name in ("sample_throughput_per_s", "trainer_idle_ratio", "prefix_hit_ratio", "training_step_time_seconds",
                 "diversity_score", "index_bytes"):
        assert f"rollmux_rollout_{name} " in prom.text, name
    assert 'rollmux_rollout_replica_alive{replica="1"} 1.0' in prom.text


def test_sessions_and_openai_routes(http, svc, v0):
    first = http.post("/v1/rollouts", json={"prompt": "user: hi\n", "max_tokens": 6, "open_session": True,
                                            "policy_version": v0 + 4}).json()["requests"][0]
    sid = first["session_id"]
    assert sid == first["id"]
    v1 = _settle(http, [first["id"]])[0]
    second = http.post("/v1/rollouts", json={"prompt": "user: more\n", "max_tokens": 6, "session_id": sid,
                                             "policy_version": v0 + 4}).json()["requests"][0]
    # the later turn reuses the session's history (prompt + output of turn 1) on the same replica
    assert second["replica"] == first["replica"]
    assert second["matched_prefix_tokens"] >= len(b"user: hi\n") - 1
    assert _settle(http, [second["id"]])[0]["status"] == "finished" and v1["status"] == "finished"
    # the same results as server-sent events
    with http.stream("POST", "/v1/rollouts:stream", json={"session_id": sid, "format": "sse"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    assert text.count("event: result") == 2 and text.rstrip().splitlines()[-2] == "event: end"
    r = http.post("/v1/completions", json={"prompt": "1+1=", "max_tokens": 5, "priority": "critical",
                                           "policy_version": v0 + 4, "logprobs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["rollmux"]["priority"] == "critical"
    assert 1 <= body["usage"]["completion_tokens"] <= 5 and body["usage"]["prompt_tokens"] == 4
    assert len(body["choices"][0]["logprobs"]["token_logprobs"]) == body["usage"]["completion_tokens"]
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
                                                "policy_version": v0 + 4})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def _submitted(svc) -> int:
    return svc.stats_sync().counters["submitted"]


BAD = [  # (body or raw bytes, content type, status, what the detail names)
    ({"prompt": "x", "task_type": "translate"}, "application/json", 422, "requests.0.task_type"),
    ({"prompt": ""}, "application/json", 422, "requests.0.prompt"),
    ({"prompt_token_ids": []}, "application/json", 422, "requests.0.prompt_token_ids"),
    ({"prompt_token_ids": [1, 256]}, "application/json", 422, "requests.0.prompt_token_ids"),
    ({"prompt_token_ids": [1, -1]}, "application/json", 422, "prompt_token_ids"),
    ({"prompt": "x", "max_tokens": 257}, "application/json", 422, "requests.0.max_tokens"),
    ({"prompt": "x" * 1900, "max_tokens": 256}, "application/json", 422, "requests.0.max_tokens"),
    ({"prompt": "x", "policy_version": -1}, "application/json", 422, "requests.0.policy_version"),
    ({"prompt": "x", "policy_version": 1 << 31}, "application/json", 422, "requests.0.policy_version"),
    ({"prompt": "x", "session_id": "nope"}, "application/json", 422, "requests.0.session_id"),
    ({"prompt": "x", "colour": "red"}, "application/json", 422, "requests.0.colour"),
    ({"requests": [{"prompt": "x"}] * 513}, "application/json", 422, "requests"),
    ({"requests": [{"prompt": "ok"}, {"prompt": "x", "max_tokens": 0}]}, "application/json", 422, "requests.1"),
    (b'{"prompt": "x", "max_tokens": NaN}', "application/json", 422, "body"),
    (b'{"prompt": "x", "max_tokens": 1e999}', "application/json", 422, "body"),
    (b'{"prompt": "\xff\xfe"}', "application/json", 422, "UTF-8"),
    (b"[" * 1000 + b"]" * 1000, "application/json", 422, "nested"),
    (b'{"prompt": "x"', "application/json", 422, "body"),
    (b"x" * (5 << 20), "application/json", 413, "bytes"),
    (b'{"prompt": "x"}', "text/plain", 415, "Content-Type"),
]


@pytest.mark.parametrize("body,ctype,status,names", BAD, ids=[f"{i}-{c[2]}" for i, c in enumerate(BAD)])
def test_bad_input_is_refused_and_nothing_enqueued(http, svc, body, ctype, status, names):
    before = _submitted(svc)
    raw = body if isinstance(body, bytes) else __import__("json").dumps(body).encode()
    r = http.post("/v1/rollouts", content=raw, headers={"Content-Type": ctype})
    assert r.status_code == status, r.text[:300]
    err = r.json()
    assert isinstance(err["error"], str) and names in err["detail"] + str(err.get("errors", "")), err
    assert "Traceback" not in r.text
    assert _submitted(svc) == before


FIELDS = [  # (route, body, the exact field of the first error)
    ("/v1/rollouts", {"requests": [{"prompt": "ok"}, {"prompt": "x", "max_tokens": 0}]}, "requests.1.max_tokens"),
    ("/v1/rollouts", {"prompt": "x", "prompt_token_ids": [1]}, "requests.0.prompt"),
    ("/v1/rollouts", {"prompt": "x", "open_session": True, "session_id": "s-1"}, "requests.0.session_id"),
    ("/v1/rollouts", {"prompt": "x", "colour": "red"}, "requests.0.colour"),
    ("/v1/rollouts:stream", {"ids": ["ok", "bad id!"]}, "ids.1"),
    ("/v1/rollouts:stream", {}, "ids"),
    ("/v1/policy", {"version": 5, "min_version": 6}, "min_version"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
    ("/v1/weights/uploads", {"weight_version": 1, "size_bytes": 100, "sha256": "xyz"}, "sha256"),
]


@pytest.mark.parametrize("route,body,field", FIELDS, ids=[f[2] for f in FIELDS])
def test_each_refusal_names_its_field(http, route, body, field):
    r = http.post(route, json=body)
    assert r.status_code == 422, r.text[:300]
    err = r.json()["errors"][0]
    assert err["field"] == field, err
    if err["type"] == "extra_forbidden":  # the route's own fields are listed, not the job spec's
        assert "prompt_token_ids" in err["msg"].split("allowed fields: ")[1].split(", "), err


def test_other_routes_refuse_bad_input(http, svc):
    assert http.post("/v1/policy", json={"version": -1}).status_code == 422
    assert http.post("/v1/policy", json={"version": 5, "min_version": 6}).status_code == 422
    assert http.post("/v1/rollouts:cancel", json={"ids": []}).status_code == 422
    assert http.post("/v1/rollouts:stream", json={"ids": ["r-unknown"]}).status_code == 404
    assert http.post("/v1/rollouts:stream", json={}).status_code == 422
    assert http.get("/v1/rollouts/r-unknown").status_code == 404
    assert http.delete("/v1/rollouts/r-unknown").status_code == 404
    r = http.post("/v1/completions", json={"prompt": "x", "model": "gpt-x"})
    assert r.status_code == 404 and r.json()["error"] == "model_not_found" and "model" in r.json()["detail"]
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 422 and "messages.0.role" in r.text
    noauth = httpx.post(str(http.base_url) + "/v1/rollouts", json={"prompt": "x"})
    assert noauth.status_code == 401


def test_full_queue_gets_429_and_nothing_enqueued(http, svc, v0):
    svc.configure_sync(ServiceConfig(queue_capacity=3))
    try:
        before = _submitted(svc)
        r = http.post("/v1/rollouts", json={"requests": [{"prompt": "q", "max_tokens": 4, "policy_version": v0 + 4}] * 4})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1 and r.json()["error"] == "queue_full"
        assert _submitted(svc) == before
    finally:
        svc.configure_sync(ServiceConfig(queue_capacity=4096))


def test_disconnected_stream_client_has_its_requests_cancelled(http, svc, v0):
    svc.configure_sync(ServiceConfig(disconnect_grace_s=0.5))
    try:
        reqs = [{"prompt": f"long job {i}", "max_tokens": 256, "background": True, "policy_version": v0 + 4}
                for i in range(40)]
        ids = [a["id"] for a in http.post("/v1/rollouts", json={"requests": reqs}).json()["requests"]]
        with http.stream("POST", "/v1/rollouts:stream", json={"ids": ids, "timeout_s": 600}) as r:
            assert r.status_code == 200
        # the client went away without reading: within the grace period (+ a poll) the rest is cancelled
        views = _settle(http, ids, timeout_s=30)
        cancelled = [v for v in views if v["status"] == "cancelled"]
        assert cancelled and all(v["error"] == "stream client disconnected" for v in cancelled)
        assert svc.stats_sync().counters["lease_cancelled"] >= len(cancelled)
    finally:
        svc.configure_sync(ServiceConfig(disconnect_grace_s=5.0))


def test_tokens_are_streamed_while_the_generation_runs(http, svc):
    """``stream: true`` (OpenAI chunks) and ``/v1/rollouts:stream`` with ``tokens: true`` send a
    generation's tokens as the engine produces them: when the first chunk arrives the request is
    still running (its view says so and holds no output yet), later chunks carry further pieces,
    and the pieces join into the final result."""
    import json

    svc.configure_sync(ServiceConfig(max_tokens_limit=1000))
    try:
        body = {"model": "rollmux", "prompt": "count:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        pieces, first_view = [], None
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ch = json.loads(line[6:])
                assert "error" not in ch, ch
                if ch["choices"][0]["text"]:
                    pieces.append(ch["choices"][0]["text"])
                    if first_view is None:
                        first_view = http.get(f"/v1/rollouts/{ch['id']}").json()
                rid = ch["id"]
        assert first_view["status"] == "running" and first_view["output_token_ids"] == []
        final = http.get(f"/v1/rollouts/{rid}").json()
        assert final["status"] == "finished" and len(final["output_token_ids"]) == 1000
        assert len(pieces) > 1 and "".join(pieces) == final["text"]

        sub = http.post("/v1/rollouts", json={"prompt": "count:", "max_tokens": 1000, "ignore_eos": True,
                                              "stream_tokens": True})
        rid = sub.json()["requests"][0]["id"]
        events, first_view = [], None
        with http.stream("POST", "/v1/rollouts:stream", json={"ids": [rid], "tokens": True, "timeout_s": 120}) as r:
            for line in r.iter_lines():
                if line:
                    events.append(obj := json.loads(line))
                    if obj.get("event") == "tokens" and first_view is None:
                        first_view = http.get(f"/v1/rollouts/{rid}").json()
        toks = [e for e in events if e.get("event") == "tokens"]
        assert first_view["status"] == "running" and first_view["output_token_ids"] == []
        assert len(toks) > 1 and [e["offset"] for e in toks] == [sum(len(e["tokens"]) for e in toks[:i])
                                                                 for i in range(len(toks))]
        result, end = events[-2], events[-1]
        assert end["event"] == "end" and end["delivered"] == 1 and result["id"] == rid
        assert [t for e in toks for t in e["tokens"]] == result["output_token_ids"] and len(result["output_token_ids"]) == 1000
    finally:
        svc.configure_sync(ServiceConfig(max_tokens_limit=256))


def test_a_restarted_service_is_found_again(http, svc, serve_api):
    """The service actor replaced under the app (e.g. a new policy): reads find the new one at once;
    a write answers 202, or 503 with Retry-After once (never resent: it may have reached the old one)."""
    from actors.rollout.service import ensure_rollout_service, service_name

    svc.shutdown_sync()
    h = ensure_rollout_service(service_name(serve_api.scheduler_name), overrides={"policy": "fifo"})
    assert h.ready_sync(timeout_s=300).policy == "fifo"
    r = http.post("/v1/rollouts", json={"prompt": "after restart", "max_tokens": 2})
    assert r.status_code in (202, 503), r.text
    if r.status_code == 503:
        assert r.json()["error"] == "rollout_service_unavailable" and int(r.headers["Retry-After"]) >= 1
    assert http.get("/v1/stats").json()["counters"]["submitted"] <= 1
    r = http.post("/v1/rollouts", json={"prompt": "after restart", "max_tokens": 2})
    assert r.status_code == 202, r.text
    assert _settle(http, [r.json()["requests"][0]["id"]])[0]["status"] == "finished"
