"""The vLLM weight payload: [name, dtype, shape, bytes] rows survive an untyped msgpack round trip
(the engine core's decoding of ``collective_rpc`` arguments) and are rebuilt bit for bit by the
worker extension.

Here: the codec through msgspec (the library vLLM's serializer is built on), the streamed buckets,
and the extension with a fake model runner. The round trip through vLLM's own ``MsgpackEncoder`` /
``MsgpackDecoder`` and the update on a real engine run in the vLLM session
(``tests/vllm_cpu/test_vllm_backend.py``)."""

from __future__ import annotations

import pytest
import torch

from actors.backends.vllm_rollout import WeightUpdateExtension
from actors.backends.weight_payload import (
    MAX_BUCKET_BYTES, MIN_BUCKET_BYTES, Assembler, bucket_bytes_for, decode_weights, encode_weights, iter_buckets, payload_bytes,
)

msgspec = pytest.importorskip("msgspec", reason="msgspec (a dev dependency) is missing")


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(64, 32, generator=g),
        "tiny": torch.randn(3, generator=g),
        "bf16": torch.randn(300, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, 7, generator=g).half(),
        "i64": torch.arange(70),
        "mask": torch.rand(9, generator=g) > 0.5,
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(16, 16, generator=g).t(),
    }


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(
        a.contiguous().reshape(-1).view(torch.uint8).numpy()) == bytes(b.contiguous().reshape(-1).view(torch.uint8).numpy())


def utility_round_trip(args: tuple):
    """As ``collective_rpc`` travels to vLLM's engine core: a msgpack-encoded utility request,
    decoded without a type (tuples come back as lists)."""
    msg = (0, 7, "collective_rpc", ("rollmux_load_weights", None, args, None))
    _c, _id, _m, (_name, _timeout, got, _kw) = msgspec.msgpack.Decoder().decode(msgspec.msgpack.Encoder().encode(msg))
    return got


def test_payload_round_trips_through_untyped_msgpack_bit_for_bit():
    w = weights()
    rows = encode_weights(w)
    assert payload_bytes(rows) == sum(t.numel() * t.element_size() for t in w.values())
    got = utility_round_trip((rows,))[0]
    assert all(isinstance(r, list) and isinstance(r[3], bytes) for r in got)  # tuples -> lists, bytes stay bytes
    back = dict(decode_weights(got))
    assert list(back) == list(w)
    for k, t in w.items():
        assert same_bits(back[k], t), k
    back["f32"].add_(1)  # the rebuilt tensors own writable memory
    assert not torch.equal(back["f32"], w["f32"])


def test_tensors_in_the_arguments_do_not_survive_and_the_decoder_says_why():
    with pytest.raises(TypeError):  # plain msgpack cannot carry a tensor at all
        msgspec.msgpack.Encoder().encode([("w", torch.zeros(2))])
    # what vLLM's untyped decoding hands the worker for an old-style row: a [dtype, shape, data] list
    with pytest.raises(ValueError, match="expected \\[name, dtype, shape, bytes\\]"):
        decode_weights([["w", ["float32", [64, 32], 1]]])
    with pytest.raises(ValueError, match="not bytes"):
        decode_weights([["w", "float32", [2], ["float32", [2], 1]]])
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        decode_weights([["w", "float99", [1], b"\0" * 4]])
    with pytest.raises(ValueError, match="7 bytes for shape \\[2\\] of float32"):
        decode_weights([["w", "float32", [2], b"\0" * 7]])
    with pytest.raises(TypeError, match="'w' is a list"):
        encode_weights({"w": [1.0]})


class FakeExtension(WeightUpdateExtension):
    """The worker extension over a fake model runner: vLLM's reload hooks recorded, not run."""

    def __init__(self):
        class FakeModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.p = torch.nn.Parameter(torch.zeros(1))
                self.got: list = []

            def load_weights(self, weights):
                self.got.extend((k, v.clone()) for k, v in weights)

        self.model_runner = type("Runner", (), {"model": FakeModel()})()
        self.calls: list[str] = []

    def _rollmux_context(self):
        import contextlib

        return contextlib.nullcontext()

    def _rollmux_reload_begin(self, model):
        self.calls.append("begin")

    def _rollmux_reload_end(self, model):
        self.calls.append("end")


def test_worker_extension_rebuilds_the_tensors_it_hands_to_the_model():
    ext = FakeExtension()
    w = weights()
    n = ext.rollmux_load_weights(utility_round_trip((encode_weights(w),))[0])  # one call: begin, load, end
    got = dict(ext.model_runner.model.got)
    assert n == len(w) and set(got) == set(w) and ext.calls == ["begin", "end"]
    assert all(same_bits(got[k], w[k]) for k in w)


def test_a_streamed_update_is_one_reload_over_several_buckets():
    ext = FakeExtension()
    w = weights()
    buckets = list(iter_buckets(w, 2048))
    assert len(buckets) > 2 and list(dict.fromkeys(r[0] for b in buckets for r in b)) == list(w)  # order kept
    assert all(payload_bytes(b) <= 2048 for b in buckets)  # a bigger tensor travels in chunks
    chunks = [r for b in buckets for r in b if len(r) == 5]
    assert {r[0] for r in chunks} == {"f32"} and len(chunks) == 4  # 8 KiB in 2 KiB chunks
    assert ext.rollmux_begin_weights() == 0
    taken = [ext.rollmux_load_weights(utility_round_trip((b,))[0]) for b in buckets]
    assert taken == [len(b) for b in buckets]
    assert ext.rollmux_end_weights() == len(w) and ext.calls == ["begin", "end"]
    got = dict(ext.model_runner.model.got)
    assert all(same_bits(got[k], w[k]) for k in w)
    with pytest.raises(RuntimeError, match="without rollmux_begin_weights"):
        ext.rollmux_end_weights()
    # a chunked tensor missing a chunk: the update ends with an error naming it
    ext.rollmux_begin_weights()
    ext.rollmux_load_weights(utility_round_trip(([chunks[0]],))[0])
    with pytest.raises(RuntimeError, match="missing chunks: \\['f32'\\]"):
        ext.rollmux_end_weights()
    with pytest.raises(ValueError, match="does not fit its tensor"):
        Assembler().feed([["x", "float32", [2], b"\0" * 8, 1]])


def test_bucket_size_follows_the_model():
    assert bucket_bytes_for({"w": torch.zeros(10)}) == MIN_BUCKET_BYTES
    assert bucket_bytes_for({"w": torch.zeros(64 << 20, dtype=torch.uint8)}) == 2 << 20  # 1/32 of 64 MiB
    assert bucket_bytes_for({"w": torch.zeros(2 << 30, dtype=torch.uint8, device="meta")}) == MAX_BUCKET_BYTES
    with pytest.raises(ValueError, match="bucket_bytes"):
        next(iter_buckets({"w": torch.zeros(1)}, 0))
    # decoding without a copy: tensors over the received bytes, equal
    rows = encode_weights({"w": torch.arange(6.0)})
    (name, t), = decode_weights(rows, copy=False)
    assert torch.equal(t, torch.arange(6.0))
