"""Clients of the rollout service over HTTP, on the admission API's app (``serve_api`` fixture):

- the example GRPO trainer outside RollMux (``examples/rollout_service_trainer.py``) trains through
  the rollout ingress, pushes its weights after every step, and every replica then serves exactly
  the trainer's weights (digest equal); the run is bit-identical to the same trainer generating in
  this process with the same seeds (tokens of every step, final weights);
- the official ``openai`` client, as an agent framework calls the OpenAI-style routes: a plain
  completion and chat (no RollMux field) served at the service's current policy version, also after
  the version advanced; ``stream=True`` chunks; ``models.list()``; errors that name the field;
- bad uploads over HTTP: a chunk over ``weights_chunk_bytes`` (413), not raw bytes (415).
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def svc(serve_api):
    from actors.rollout.service import ensure_rollout_service, service_name

    h = ensure_rollout_service(service_name(serve_api.scheduler_name))
    h.ready_sync(timeout_s=300)
    return h


def test_trainer_through_the_service_is_bit_identical_to_in_process(serve_api, svc):
    import torch

    import examples.rollout_service_trainer as ex
    from actors.rollout.engine import tiny_llama
    from serve_api.trainer_client import TrainerClient

    cfg = ex.TrainConfig(steps=2, prompts=3, group=4, max_tokens=12)
    c = TrainerClient(serve_api.base_url, serve_api.token, timeout_s=300, ingress=True)
    assert c.base_url != serve_api.base_url  # the rollout ingress, not Serve's proxy
    over_http = ex.train(ex.HttpRollouts(c), cfg)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = tiny_llama()
    in_process = ex.train(ex.InProcessRollouts(model), cfg, model)
    assert all(s["served_equal"] for s in over_http["steps"])  # every replica served the trainer's weights
    assert [s["outputs_sha256"] for s in over_http["steps"]] == [s["outputs_sha256"] for s in in_process["steps"]]
    assert [s["digest"] for s in over_http["steps"]] == [s["digest"] for s in in_process["steps"]]
    assert over_http["final_digest"] == in_process["final_digest"]
    assert len({s["digest"] for s in over_http["steps"]}) == cfg.steps  # it trained: the weights moved each step
    w = c.weights()
    assert w["weights_sha256"] == over_http["final_digest"] and w["weight_version"] == over_http["first_version"] + 2
    assert {r["weights_sha256"] for r in w["replicas"]} == {over_http["final_digest"]}


def test_openai_client_calls_the_routes_unchanged(serve_api, svc):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=serve_api.base_url + "/v1", api_key=serve_api.token, max_retries=0, timeout=120)
    h = httpx.Client(base_url=serve_api.base_url, headers={"Authorization": f"Bearer {serve_api.token}"}, timeout=60)

    def plain():
        r = c.completions.create(model="rollmux", prompt="2+2=", max_tokens=8)
        return r.choices[0].finish_reason, r.model_extra["rollmux"]["policy_version"]

    assert plain()[0] in ("stop", "length")
    chat = c.chat.completions.create(model="rollmux", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason in ("stop", "length")
    chunks = list(c.chat.completions.create(model="rollmux", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=8, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason in ("stop", "length")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == (h.get(f"/v1/rollouts/{chunks[0].id}").json()["text"])  # the streamed text is the result's
    assert [m.id for m in c.models.list()] == ["rollmux"]
    v = h.get("/v1/stats").json()["policy_version"]
    assert h.post("/v1/policy", json={"version": v + 3}).status_code == 200
    reason, served_at = plain()
    assert served_at == v + 3  # no RollMux field: served at the current version, and the answer says which
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    assert "model" in str(e.value) and "rollmux" in str(e.value)
    with pytest.raises(openai.UnprocessableEntityError) as e:
        c.completions.create(model="rollmux", prompt="x", max_tokens=2, n=2)
    assert "'n'" in str(e.value) or "n:" in str(e.value)


def test_bad_upload_over_http_names_the_problem(serve_api, svc):
    h = httpx.Client(base_url=serve_api.base_url, headers={"Authorization": f"Bearer {serve_api.token}"}, timeout=60)
    w = h.get("/v1/weights").json()
    nxt = 0 if w["weight_version"] is None else w["weight_version"] + 1
    up = h.post("/v1/weights/uploads", json={"weight_version": nxt, "size_bytes": 100, "sha256": "a" * 64})
    assert up.status_code == 201, up.text
    uid, chunk = up.json()["upload_id"], up.json()["chunk_bytes"]
    r = h.put(f"/v1/weights/uploads/{uid}/chunks/0", content=b"x" * 100, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/octet-stream" in r.json()["detail"]
    r = h.put(f"/v1/weights/uploads/{uid}/chunks/0", content=b"x" * (chunk + 1),
              headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 413 and "weights_chunk_bytes" in r.json()["detail"]
    r = h.put(f"/v1/weights/uploads/{uid}/chunks/3", content=b"x", headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "index"
    r = h.post(f"/v1/weights/uploads/{uid}:commit", json={})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "size_bytes"  # nothing received: truncated
    big = h.post("/v1/weights/uploads", json={"weight_version": nxt, "size_bytes": 1 << 40, "sha256": "a" * 64})
    assert big.status_code == 413 and big.json()["errors"][0]["field"] == "size_bytes"
    assert h.delete(f"/v1/weights/uploads/{uid}").status_code == 200
    assert h.get("/v1/weights").json()["weight_version"] == w["weight_version"]  # nothing changed
    paths = h.get("/openapi.json").json()["paths"]
    assert {"/v1/weights/uploads", "/v1/weights/update_from_disk", "/v1/weights", "/v1/models",
            "/v1/rollouts:ingress"} <= set(paths)
