"""The vLLM weight payload: [name, dtype, shape, bytes] rows survive an untyped msgpack round trip
(the engine core's decoding of ``collective_rpc`` arguments) and are rebuilt bit for bit by the
worker extension.

CI runs the codec through msgspec (the library vLLM's serializer is built on) and the extension
with a fake model runner. The round trip through vLLM 0.33's own ``MsgpackEncoder`` /
``MsgpackDecoder`` runs when the separate vLLM environment exists (``scripts/vllm_env.sh``;
``ROLLMUX_VLLM_PYTHON`` names another one) and is skipped, saying so, where it does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from actors.backends.vllm_rollout import WeightUpdateExtension
from actors.backends.weight_payload import decode_weights, encode_weights, payload_bytes

ROOT = Path(__file__).resolve().parents[1]
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


def test_worker_extension_rebuilds_the_tensors_it_hands_to_the_model():
    class FakeModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))
            self.got: list = []

        def load_weights(self, weights):
            self.got.extend(weights)

    ext = WeightUpdateExtension()
    ext.model_runner = type("Runner", (), {"model": FakeModel()})()
    w = weights()
    n = ext.rollmux_load_weights(utility_round_trip((encode_weights(w),))[0])
    got = dict(ext.model_runner.model.got)
    assert n == len(w) and set(got) == set(w)
    assert all(same_bits(got[k], w[k]) for k in w)


def vllm_python() -> Path | None:
    for c in (os.environ.get("ROLLMUX_VLLM_PYTHON"), ROOT / ".venv-vllm" / "bin" / "python"):
        if c and Path(c).is_file():
            return Path(c)
    return None


@pytest.mark.vllm_env
@pytest.mark.timeout(300)
def test_round_trip_through_vllm_033_serializer_reproduces_the_bug_and_the_fix():
    py = vllm_python()
    if py is None:
        pytest.skip("no vLLM 0.33 environment (bash scripts/vllm_env.sh creates .venv-vllm; or set "
                    "ROLLMUX_VLLM_PYTHON): the round trip through vLLM's own serializer did NOT run")
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_LOGGING_LEVEL="ERROR")
    p = subprocess.run([str(py), str(ROOT / "tests" / "vllm_serial_probe.py")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["vllm"].startswith("0.33.")
    # the bug: a tensor inside the argument list arrives as a [dtype, shape, buffer index] list
    assert out["old"]["item_type"] == "list" and out["old"]["frames"] > 1
    assert out["old"]["to_error"] == "AttributeError: 'list' object has no attribute 'to'"
    # the fix: one frame of plain rows, every tensor rebuilt bit for bit in the extension
    assert out["new"]["frames"] == 1 and out["new"]["loaded"] == 6 and all(out["new"]["equal"].values())
