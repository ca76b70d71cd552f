"""RollMux's vLLM engines generating for real (vLLM's CPU build, float32): the rollout backend
(generate, seeded reproducibility, the exact-length run, sleep / wake on a platform without sleep
mode, the streamed in-place weight update checked against transformers, the prefix cache reset on
an update, close) and :class:`actors.rollout.vllm_engine.VLLMEngine` (add_request / step / abort
under the mixed-request scheduler) on the same engine: one engine start for the module."""

from __future__ import annotations

import pytest
import torch

from examples.grpo.config import ModelConfig
from examples.grpo.model import build_model
from examples.grpo.tokenizer import CharTokenizer

pytestmark = pytest.mark.timeout(600)

TOK = CharTokenizer()
# head size 32: vLLM's CPU attention takes 32, 64, 80, ... (16 fails at the first forward pass)
SHAPE = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position_embeddings=256)
PROMPTS = TOK.encode_batch(["3>", "7>", "1>", "0>"])
N = 8


@pytest.fixture(scope="module")
def backend():
    from actors.backends import make_rollout_backend

    b = make_rollout_backend("vllm", build_model(SHAPE, 0), max_num_seqs=16)
    yield b
    b.close()


def gen(b, seed: int, prompts=PROMPTS, n: int = N, temperature: float = 1.0) -> torch.Tensor:
    return b.generate(prompts, max_new_tokens=n, temperature=temperature, seed=seed, eos_id=TOK.eos_id,
                      pad_id=TOK.pad_id)


def greedy(b, prompts=PROMPTS, n: int = N) -> torch.Tensor:
    """The engine's greedy tokens, every row to ``n`` (no stop token: compared with :func:`hf_greedy`)."""
    b.ignore_eos = True
    try:
        return gen(b, 0, prompts=prompts, n=n, temperature=0.0)
    finally:
        b.ignore_eos = False


def hf_greedy(model: torch.nn.Module, prompts: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy tokens of a transformers model (argmax at every step, no stop token)."""
    seq = prompts.clone()
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    return seq


def test_generate_is_seeded_and_stop_rows_end_with_eos(backend):
    a = gen(backend, 3)
    P = PROMPTS.shape[1]
    assert a.shape == (4, P + N) and torch.equal(a[:, :P], PROMPTS)
    assert torch.equal(a, gen(backend, 3)) and not torch.equal(a, gen(backend, 4))
    gen(backend, 3)
    reasons = backend.last_finish_reasons
    assert set(reasons) <= {"stop", "length"} and len(reasons) == 4
    for row, why in zip(a[:, P:].tolist(), reasons):  # a row's length follows from its finish reason
        if why == "stop":
            k = row.index(TOK.eos_id)
            assert all(t == TOK.pad_id for t in row[k + 1:])
        else:
            assert TOK.eos_id not in row


def test_exact_length_run_is_checked_by_finish_reason_not_by_pad(backend):
    """``ignore_eos``: every row runs to its cap, which vLLM reports as ``finish_reason ==
    "length"``; the pad id is a token like any other for the engine (a row may contain it), so
    "no pad in the output" is not the check."""
    backend.ignore_eos = True
    try:
        out = gen(backend, 11, n=24)
        assert backend.last_finish_reasons == ["length"] * 4
        mins = torch.tensor([2, 5, 9, 24])
        backend.ignore_eos = False
        backend.generate(PROMPTS, max_new_tokens=24, temperature=1.0, seed=11, eos_id=TOK.eos_id,
                         pad_id=TOK.pad_id, min_new_tokens=mins)
        assert backend.last_finish_reasons[3] == "length"  # min == cap: runs to the cap
    finally:
        backend.ignore_eos = False
    assert out.shape == (4, PROMPTS.shape[1] + 24)


def test_sleep_and_wake_where_vllm_has_no_sleep_mode(backend):
    """vLLM's CPU platform refuses ``enable_sleep_mode``: offload / load count and leave the engine
    as it is (its memory is host memory); generation is unchanged across them."""
    assert backend.platform == "cpu" and backend.sleep_mode is False
    a = gen(backend, 5)
    n = backend.offloads
    backend.offload()
    backend.offload()  # idempotent while offloaded
    assert backend.asleep and backend.offloads == n + 1
    assert not backend.llm.llm_engine.is_sleeping()
    backend.load()
    assert not backend.asleep and torch.equal(a, gen(backend, 5))


def test_weight_update_makes_greedy_tokens_equal_to_transformers(backend):
    """After an update (streamed in several buckets through vLLM's in-place reload) the engine's
    greedy tokens equal those of a transformers model holding the same weights, and differ from
    the old weights' (so the check can fail)."""
    old, new = build_model(SHAPE, 0), build_model(SHAPE, 1)
    backend.load_weights(old.state_dict())
    before = greedy(backend, n=12)
    assert torch.equal(before, hf_greedy(old, PROMPTS, 12))
    backend.bucket_bytes = 16 << 10  # several buckets, the larger tensors in chunks: a layer over several calls
    try:
        backend.load_weights(new.state_dict())
    finally:
        backend.bucket_bytes = None
    after = greedy(backend, n=12)
    assert torch.equal(after, hf_greedy(new, PROMPTS, 12))
    assert not torch.equal(after, before)
    backend.offload()  # an update wakes an offloaded engine first
    backend.load_weights(old.state_dict())
    assert not backend.asleep and torch.equal(greedy(backend, n=12), before)


def test_weight_update_resets_the_prefix_cache(backend):
    """A prompt longer than one KV block is cached; after an update without the reset the engine
    reuses KV computed by the old weights (tokens differ from transformers'); with the reset
    (the default) nothing is reused and the tokens equal transformers'."""
    old, new = build_model(SHAPE, 0), build_model(SHAPE, 2)
    long = torch.tensor([[TOK.bos_id] + [TOK.digit_id(i % 10) for i in range(150)]])
    backend.load_weights(old.state_dict())
    greedy(backend, prompts=long)
    greedy(backend, prompts=long)
    assert backend.last_cached_tokens[0] >= 128  # one full block from the cache
    want = hf_greedy(new, long, N)
    backend.load_weights(new.state_dict(), reset_prefix_cache=False)
    stale = greedy(backend, prompts=long)
    assert backend.last_cached_tokens[0] >= 128 and not torch.equal(stale, want)
    backend.load_weights(new.state_dict())
    fresh = greedy(backend, prompts=long)
    assert backend.last_cached_tokens == [0] and torch.equal(fresh, want)


def test_vllm_engine_serves_a_mixed_stream_and_aborts(backend):
    """:class:`VLLMEngine` on the backend's engine: generation, reward and replay requests through
    the mixed-request scheduler (``serve``), then add_request / step / abort directly."""
    from actors.rollout.engine import ListSource, serve
    from actors.rollout.vllm_engine import VLLMEngine
    from rollmux.rollout_sched import Request, RolloutRequestScheduler, load_rollout_sched_config

    eng = VLLMEngine.from_engine(backend.llm.llm_engine, slice_steps=4, seed=0, ignore_eos=True)
    sched = RolloutRequestScheduler(load_rollout_sched_config(section="cpu_engine"), "mixed")
    digits = tuple(TOK.digit_id(i % 10) for i in range(40))
    reqs = [Request(request_id="g", prompt_token_ids=digits, max_tokens=32),
            Request(request_id="g2", prompt_token_ids=digits[:20], max_tokens=8),
            Request(request_id="r", prompt_token_ids=digits[:10], type="reward", max_tokens=1, arrival_s=0.0),
            Request(request_id="p", prompt_token_ids=digits[:30], type="replay", max_tokens=0)]
    src = ListSource(reqs)
    stats = serve(sched, eng, src, max_windows=500, max_wall_s=240)
    assert stats.stopped_by == "drained" and set(src.completions) == {"g", "g2", "r", "p"}
    assert len(src.completions["g"].output_token_ids) == 32 and len(src.completions["g2"].output_token_ids) == 8
    assert src.completions["r"].score is not None and src.completions["r"].score <= 0
    assert src.completions["p"].score is not None and src.completions["p"].score <= 0
    assert eng.running == 0
    # seeded per request id: the same request again gives the same tokens
    again = ListSource([Request(request_id="g2", prompt_token_ids=digits[:20], max_tokens=8)])
    serve(RolloutRequestScheduler(load_rollout_sched_config(section="cpu_engine"), "mixed"), eng, again,
          max_windows=100, max_wall_s=120)
    assert again.completions["g2"].output_token_ids == src.completions["g2"].output_token_ids
    # abort: a running request stops, reports nothing, and frees its slot
    eng.admit([Request(request_id="long", prompt_token_ids=digits, max_tokens=200),
               Request(request_id="short", prompt_token_ids=digits[:5], max_tokens=4)], {})
    done = eng.step()
    assert eng.running >= 1 and "long" not in {c.request_id for c in done}
    eng.abort(["long"])
    seen = {c.request_id for c in done}
    for _ in range(20):
        if not eng.running:
            break
        seen |= {c.request_id for c in eng.step()}
    assert eng.running == 0 and "short" in seen and "long" not in seen
    eng.on_weights_updated(1)  # resets the prefix cache (nothing running)


def test_payload_round_trips_through_vllms_own_serializer():
    """``collective_rpc`` arguments as the engine core receives them (vLLM's ``MsgpackEncoder`` /
    ``MsgpackDecoder``, decoded untyped): tensors arrive as ``[dtype, shape, buffer]`` lists (the
    first weight update's ``AttributeError``), payload rows arrive as one frame, bit for bit."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from actors.backends.weight_payload import decode_weights, encode_weights

    g = torch.Generator().manual_seed(0)
    w = {"small": torch.randn(4, generator=g), "big": torch.randn(64, 32, generator=g),
         "bf16": torch.randn(300, generator=g).to(torch.bfloat16), "ids": torch.arange(70),
         "scalar": torch.tensor(3.5), "strided": torch.randn(16, 16, generator=g).t()}

    def round_trip(args):
        bufs = MsgpackEncoder().encode((0, 7, "collective_rpc", ("rollmux_load_weights", None, args, None)))
        return MsgpackDecoder().decode(bufs)[3][2], len(bufs)

    old, frames = round_trip(([(k, v) for k, v in w.items()],))
    assert frames > 1 and isinstance(old[0][1][1], list)
    with pytest.raises(AttributeError, match="'list' object has no attribute 'to'"):
        old[0][1][1].to("cpu")
    new, frames = round_trip((encode_weights(w),))
    assert frames == 1
    got = dict(decode_weights(new[0]))
    for k, v in w.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k].view(-1).view(torch.uint8) if got[k].dim() else
                                                       got[k].reshape(1).view(torch.uint8),
                                                       v.contiguous().view(-1).view(torch.uint8) if v.dim() else
                                                       v.reshape(1).view(torch.uint8)), k


def test_close_shuts_the_engine_down(backend):
    import psutil

    def engine_procs():  # the engine's processes (multiprocessing's resource tracker is not one)
        return [p for p in psutil.Process().children(recursive=True)
                if not any("resource_tracker" in a for a in p.cmdline())]

    procs = engine_procs()
    assert procs, "the engine's worker process"
    backend.close()
    assert backend.closed and backend.llm is None
    backend.close()  # idempotent
    _gone, alive = psutil.wait_procs(procs, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
