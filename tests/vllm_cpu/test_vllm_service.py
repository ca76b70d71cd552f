"""The rollout service with ``engine: vllm`` over HTTP: one replica whose engine is
:class:`actors.rollout.vllm_engine.VLLMEngine` on vLLM's CPU build (a tiny float32 Llama with the
service's 256-token vocabulary, saved locally), behind the same Serve app as the admission API.
Generations, a reward query and a replay item finish with their results; an over-long generation
is aborted by a cancel; a new policy version resets the engine's prefix cache and serving goes on."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.vllm_env, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("vllm_service_model")
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    import torch

    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def svc(serve_api, model_dir):
    from actors.rollout.service import ensure_rollout_service, service_name

    name = service_name(serve_api.scheduler_name)
    h = ensure_rollout_service(name, overrides={"engine": "vllm", "vllm_model": model_dir, "num_replicas": 1})
    lim = h.ready_sync(timeout_s=600)
    assert lim.num_replicas == 1 and lim.vocab_size == 256
    yield h
    h.shutdown_sync()


@pytest.fixture(scope="module")
def http(serve_api, svc):
    with httpx.Client(base_url=serve_api.base_url, headers={"Authorization": f"Bearer {serve_api.token}"},
                      timeout=300) as c:
        yield c


def _settled(http, rid: str) -> dict:
    from factories import wait_until

    return wait_until(lambda: (v := http.get(f"/v1/rollouts/{rid}").json())["status"] in ("finished", "cancelled",
                                                                                        "failed") and v,
                      timeout_s=300, interval_s=0.2, what=f"request {rid} settled")


def test_vllm_engine_serves_the_rollout_api(http, svc):
    prompt = list(range(1, 41))
    reqs = [{"prompt_token_ids": prompt[: 20 + i], "max_tokens": 12, "critical": True, "policy_version": 0}
            for i in range(4)]
    reqs += [{"task_type": "reward", "prompt_token_ids": [1, 2, 3, 4], "max_tokens": 1, "policy_version": 0},
             {"task_type": "replay", "prompt_token_ids": prompt[:16], "max_tokens": 0, "policy_version": 0},
             {"prompt_token_ids": prompt, "max_tokens": 256, "policy_version": 0}]  # over-sampled, cancelled
    r = http.post("/v1/rollouts", json={"requests": reqs})
    assert r.status_code == 202, r.text
    ids = [a["id"] for a in r.json()["requests"]]
    got = {}
    with http.stream("POST", "/v1/rollouts:stream", json={"ids": ids[:6], "timeout_s": 300}) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line:
                obj = json.loads(line)
                if obj.get("event") == "end":
                    break
                got[obj["id"]] = obj
    assert set(got) == set(ids[:6])
    gens = [got[i] for i in ids[:4]]
    assert all(g["status"] == "finished" and 1 <= len(g["output_token_ids"]) <= 12 for g in gens)
    assert all(max(g["output_token_ids"]) < 256 and g["finish_reason"] in ("stop", "length") for g in gens)
    assert any(g["finish_reason"] == "length" and len(g["output_token_ids"]) == 12 for g in gens)
    assert got[ids[4]]["status"] == "finished" and got[ids[4]]["score"] <= 0  # a log-probability
    assert got[ids[5]]["status"] == "finished" and got[ids[5]]["score"] <= 0
    c = http.post("/v1/rollouts:cancel", json={"ids": [ids[6]]}).json()
    assert c["aborted"] + c["dropped"] + c["already_ended"] == [ids[6]]
    if c["aborted"] + c["dropped"]:
        assert http.get(f"/v1/rollouts/{ids[6]}").json()["status"] == "cancelled"
    # a new policy version: the replica resets vLLM's prefix cache; serving goes on
    p = http.post("/v1/policy", json={"version": 1})
    assert p.status_code == 200 and p.json()["version"] == 1
    r = http.post("/v1/rollouts", json={"prompt_token_ids": prompt[:20], "max_tokens": 4, "policy_version": 1})
    assert r.status_code == 202, r.text
    v = _settled(http, r.json()["requests"][0]["id"])
    assert v["status"] == "finished" and 1 <= len(v["output_token_ids"]) <= 4
    st = http.get("/v1/stats").json()
    assert st["counters"]["submitted"] >= 8


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of a transformers model (argmax at every step, no stop token)."""
    import torch

    seq = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[0, len(prompt):].tolist()


def test_vllm_engine_serves_the_weights_a_trainer_pushes(serve_api, http, svc, model_dir):
    """A trainer's weights reach vLLM through its in-place reload. Pushed as an upload while a
    streamed generation runs (``pause_mode: keep``): the generation's tokens arrive before it ends,
    those sampled before the update carry the old version and the rest the new one; every replica
    then serves exactly the pushed weights (digest equal), and its greedy tokens are those of
    transformers holding them (not those of the old weights)."""
    import torch
    from transformers import LlamaForCausalLM

    from actors.rollout.weights import encode, state_digest
    from rollmux.rollout_sched.service_config import ServiceConfig
    from serve_api.trainer_client import TrainerClient

    old = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    torch.manual_seed(1)
    new = LlamaForCausalLM(old.config).eval()
    state = {k: v.contiguous() for k, v in new.state_dict().items()}
    prompt = list(range(1, 21))
    greedy = {"prompt_token_ids": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = http.post("/v1/rollouts", json=greedy)
    assert r.status_code == 202, r.text
    assert _settled(http, r.json()["requests"][0]["id"])["output_token_ids"] == _hf_greedy(old, prompt, 12)

    w0 = http.get("/v1/weights").json()
    version = (w0["weight_version"] or 0) + 2
    svc.configure_sync(ServiceConfig(max_tokens_limit=600))
    trainer = TrainerClient(serve_api.base_url, serve_api.token, timeout_s=300)
    try:
        sub = http.post("/v1/rollouts", json={"prompt_token_ids": prompt, "max_tokens": 600, "ignore_eos": True,
                                              "stream_tokens": True})
        rid = sub.json()["requests"][0]["id"]
        events, pushed = [], None
        with http.stream("POST", "/v1/rollouts:stream", json={"ids": [rid], "tokens": True, "timeout_s": 300}) as s:
            for line in s.iter_lines():
                if not line:
                    continue
                events.append(obj := json.loads(line))
                if obj.get("event") == "tokens" and pushed is None:
                    before = obj["offset"] + len(obj["tokens"])
                    pushed = trainer.push_weights(encode(state), version, pause_mode="keep")
    finally:
        svc.configure_sync(ServiceConfig(max_tokens_limit=256))
        trainer.close()
    digest = state_digest(state)
    assert pushed["weights_sha256"] == digest and {r["weights_sha256"] for r in pushed["replicas"]} == {digest}
    result = events[-2]
    assert events[-1]["event"] == "end" and result["id"] == rid and result["status"] == "finished"
    vs = result["token_versions"]
    k = vs.index(version)  # the first token sampled by the new weights
    assert len(vs) == 600 and k >= before and set(vs[:k]) == {vs[0]} and vs[0] != version and set(vs[k:]) == {version}
    toks = [t for e in events if e.get("event") == "tokens" for t in e["tokens"]]
    assert toks == result["output_token_ids"]

    r = http.post("/v1/rollouts", json=greedy)
    assert _settled(http, r.json()["requests"][0]["id"])["output_token_ids"] == _hf_greedy(new, prompt, 12)
    assert _hf_greedy(new, prompt, 12) != _hf_greedy(old, prompt, 12)  # the check can fail
    w = http.get("/v1/weights").json()
    assert w["weight_version"] == version and {r["weights_sha256"] for r in w["replicas"]} == {digest}
