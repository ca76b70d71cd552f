"""Pure parts of the rollout service: request models, routing across replicas, the window
estimate, the JSON depth check, the metrics' idle ratio (no Ray)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors.rollout.metrics import idle_ratio, render_prometheus
from rollmux.rollout_sched.api import ReplicaStats, ServiceStats
from rollmux.rollout_sched.api import (
    ByteTokenizer, ChatBody, CompletionBody, Priority, RolloutIn, SubmitBatch, chat_prompt, openai_request,
)
from rollmux.rollout_sched.routing import ReplicaLoad, expected_window, route
from serve_api.boundary import json_body_problem
from serve_api.rollout_boundary import check_body, is_rollout_path


def test_a_lone_request_is_a_batch_of_one_and_flags_follow_priority():
    b = SubmitBatch.model_validate({"prompt": "hé", "critical": True})
    assert len(b.requests) == 1 and b.requests[0].token_ids() == [104, 195, 169]
    assert b.requests[0].flags() == (True, False)
    assert RolloutIn(prompt="x", critical=True, priority=Priority.BACKGROUND).flags() == (False, True)
    assert RolloutIn(prompt="x", critical=True, background=True).flags() == (True, False)
    assert ByteTokenizer.decode(ByteTokenizer.encode("hé")) == "hé"


@pytest.mark.parametrize("body,field", [
    ({}, "requests.0"), ({"prompt": "x", "prompt_token_ids": [1]}, "requests.0"),
    ({"prompt": "x", "max_tokens": 0}, "requests.0"), ({"prompt": "x", "task_family": "a b"}, "requests.0.task_family"),
    ({"prompt": "x", "open_session": True, "session_id": "s"}, "requests.0"),
    ({"requests": []}, "requests"), ({"prompt": "x", "max_tokens": 1.5}, "requests.0.max_tokens"),
])
def test_bad_requests_name_their_field(body, field):
    with pytest.raises(ValidationError) as e:
        SubmitBatch.model_validate(body)
    locs = [".".join(str(p) for p in err["loc"]) for err in e.value.errors()]
    assert any(loc.startswith(field) for loc in locs), locs


def test_replay_may_have_no_generation_budget():
    assert RolloutIn(task_type="replay", prompt="x", max_tokens=0).max_tokens == 0


def test_openai_bodies_become_generations():
    r = openai_request(CompletionBody(prompt=[5, 6], max_tokens=3, priority="critical", policy_version=2))
    assert r.token_ids() == [5, 6] and r.flags() == (True, False) and r.policy_version == 2
    chat = ChatBody(messages=[{"role": "user", "content": "hi"}])
    assert chat_prompt(chat.messages) == "<|user|>\nhi\n<|assistant|>\n"
    assert openai_request(CompletionBody(prompt="x")).policy_version is None  # the service's current one
    assert CompletionBody(prompt="x", stream=True).stream  # served: server-sent chunks
    streamed = openai_request(CompletionBody(prompt="x", stream=True, temperature=0, ignore_eos=True))
    assert streamed.stream_tokens and streamed.temperature == 0 and streamed.ignore_eos
    assert not openai_request(CompletionBody(prompt="x")).stream_tokens
    with pytest.raises(ValidationError):
        CompletionBody(prompt="x", n=2)


def test_incremental_decode_joins_into_the_whole_decode():
    """A streamed generation's pieces join into its text, a character split across tokens coming
    with its last byte (and an invalid byte as the whole decode renders it)."""
    ids = list("né €x".encode()) + [0xFF, 0x41]
    dec = ByteTokenizer.incremental()
    pieces = [dec([i]) for i in ids] + [dec([], final=True)]
    assert "".join(pieces) == ByteTokenizer.decode(ids) and "é" in pieces and "€" in pieces


def _load(i, match, backlog, alive=True, cap=1000):
    return ReplicaLoad(i, alive, match, backlog, cap)


def test_route_prefers_the_longest_match_with_room():
    loads = [_load(0, 10, 0), _load(1, 50, 500), _load(2, 50, 100)]
    assert route(100, loads) == 2  # longest match; tie on match -> smaller backlog
    assert route(100, [_load(0, 10, 0), _load(1, 50, 1950)]) == 0  # no room on 1 (2 x capacity)
    assert route(100, [_load(0, 0, 300), _load(1, 0, 200)]) == 1  # no match: least loaded
    assert route(100, [_load(0, 50, 0, alive=False), _load(1, 0, 900)]) == 1  # dead replicas never
    assert route(100, [_load(0, 0, 0, alive=False)]) is None
    assert route(100, [_load(0, 0, 0), _load(1, 90, 0)], sticky=0) == 0  # a session stays
    assert route(100, [_load(0, 0, 0, alive=False), _load(1, 0, 0)], sticky=0) == 1
    assert route(100, [_load(0, 0, 5000), _load(1, 0, 3000)]) == 1  # all full: least loaded relative


def test_expected_window():
    assert expected_window(10, 1, 8) == 11 and expected_window(10, 9, 8) == 12
    assert expected_window(10, 40, 8, short=True, short_slots_per_window=4, shorts_ahead=4) == 12


def test_json_depth_and_body_checks():
    assert json_body_problem(b'{"a": [1, {"b": "[[[[[[["}]}', max_depth=3) is None  # brackets in strings skipped
    assert "nested deeper than 2" in json_body_problem(b'{"a": [1, {"b": "x"}]}', max_depth=2)
    assert check_body(b"[" * 17 + b"]" * 17)[1] == "json_invalid"
    assert check_body(b'{"x": NaN}')[1] == "finite_number"
    assert check_body(b"[" * 17 + b"]" * 17) is not None and check_body(b"[" * 16 + b"]" * 16) is None
    assert check_body(b'{"x": Infinity}') is not None and check_body(b'{"x": 1e400}') is not None
    assert check_body(b'{"x": "\\u00e9"}') is None and check_body(b'{"x": "\xc3"}') is not None
    assert check_body(b'{"x": ') is None  # malformed JSON is FastAPI's 422
    assert is_rollout_path("/v1/rollouts:stream") and is_rollout_path("/v1/rollouts/r-1")
    assert is_rollout_path("/v1/chat/completions") and not is_rollout_path("/v1/jobs")


def test_idle_ratio_per_step():
    # step 0: 0..10 s wall, critical work done at 4 s; step 1: 10..20 s, done at 12 s
    assert idle_ratio({0: 0.0, 1: 10.0}, {0: 4.0, 1: 12.0}, 20.0) == pytest.approx(6 / 20)
    assert idle_ratio({}, {}, 5.0) == 0.0
    assert idle_ratio({0: 0.0}, {}, 5.0) == 1.0  # still waiting on the step's critical results


def test_prometheus_series_are_bounded():
    rep = ReplicaStats(replica=0, alive=True, queued=3, running=1, windows=5, engine_busy_s=0.5, policy_version=3,
                       kv_in_use_tokens=64, prefix_hit_ratio=0.25, index_bytes=96, index_nodes=4)
    s = ServiceStats(sample_throughput_per_s=2.0, trainer_idle_ratio=0.5, prefix_hit_ratio=0.25, training_step_time_s=None,
                     last_training_step_time_s=None, diversity_score=1.0, index_bytes=96, policy_version=3,
                     weight_version=None, min_policy_version=None, queued=3,
                     running=1, queued_by_class={"critical": 1, "reusable": 0, "background": 2}, queue_capacity=8,
                     results_kept=0, sessions=0, counters={"submitted": 4}, submit_handling_ms_p50=None, replicas=[rep],
                     uptime_s=1.0, service_rss_bytes=1 << 20)
    text = render_prometheus(s).decode()
    assert "rollmux_rollout_trainer_idle_ratio 0.5" in text and 'rollmux_rollout_queued{cls="background"} 2.0' in text
    assert "training_step_time" not in text  # no figure yet: no series
    assert "# TYPE rollmux_rollout_requests_total counter" in text
    assert 'rollmux_rollout_requests_total{outcome="submitted"} 4.0' in text


def test_the_vllm_engine_needs_a_model():
    from rollmux.rollout_sched.service_config import ServiceConfig

    with pytest.raises(ValidationError, match="vllm_model"):
        ServiceConfig(engine="vllm")
    assert ServiceConfig(engine="vllm", vllm_model="Qwen/Qwen2.5-0.5B").engine == "vllm"
