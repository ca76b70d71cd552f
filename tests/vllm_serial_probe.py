#!/usr/bin/env python
"""Round-trip a weight update through vLLM's own serializer; print a JSON report.

Run by ``tests/test_weight_payload.py`` with the Python of a separate vLLM 0.33 environment
(never the project's .venv: vLLM brings torch 2.14 and pins transformers), with the repository
root on ``PYTHONPATH``. It encodes the utility request ``LLM.collective_rpc`` sends to the engine
core, ``(client, call_id, "collective_rpc", (method, timeout, args, kwargs))``, with
``vllm.v1.serial_utils.MsgpackEncoder`` and decodes it as the engine core's input thread does
(``MsgpackDecoder()`` without a type), for

* the old payload, ``[(name, tensor)]``: what arrives in the worker and whether ``.to`` works
  on it (the first weight update's ``AttributeError``);
* the payload of :func:`actors.backends.weight_payload.encode_weights`, rebuilt by
  :class:`actors.backends.vllm_rollout.WeightUpdateExtension` (a fake model runner records
  the tensors its ``load_weights`` gets): equal to the sent tensors, bit for bit?
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> int:
    import vllm
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from actors.backends.vllm_rollout import WeightUpdateExtension
    from actors.backends.weight_payload import encode_weights

    g = torch.Generator().manual_seed(0)
    weights = {
        "small.f32": torch.randn(4, generator=g),  # 16 B: inlined by the encoder
        "big.f32": torch.randn(64, 32, generator=g),  # >= 256 B: an out-of-band buffer
        "big.bf16": torch.randn(300, generator=g).to(torch.bfloat16),
        "ids.i64": torch.arange(70),
        "scalar": torch.tensor(3.5),
        "strided": torch.randn(16, 16, generator=g).t(),
    }

    def round_trip(args):
        enc, dec = MsgpackEncoder(), MsgpackDecoder()
        bufs = enc.encode((0, 7, "collective_rpc", ("rollmux_load_weights", None, args, None)))
        _client, _call, _method, (name, _timeout, got_args, _kw) = dec.decode(bufs)
        return name, got_args, len(bufs)

    out: dict = {"vllm": vllm.__version__, "torch": torch.__version__}
    # the old payload: tensors inside the argument list
    _, args, nbufs = round_trip(([(k, v) for k, v in weights.items()],))
    item = args[0][1]
    out["old"] = {"frames": nbufs, "item_type": type(item[1]).__name__, "item": repr(item[1])[:120]}
    try:
        item[1].to("cpu")
        out["old"]["to_error"] = None
    except AttributeError as e:
        out["old"]["to_error"] = f"AttributeError: {e}"

    # the new payload, rebuilt by the worker extension
    class FakeModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))
            self.got: list = []

        def load_weights(self, weights):
            self.got.extend(weights)

    ext = WeightUpdateExtension()
    ext.model_runner = type("Runner", (), {"model": FakeModel()})()
    _, args, nbufs = round_trip((encode_weights(weights),))
    n = ext.rollmux_load_weights(args[0])
    got = dict(ext.model_runner.model.got)
    out["new"] = {"frames": nbufs, "loaded": n, "names": sorted(got),
                  "equal": {k: bool(got[k].dtype == v.dtype and got[k].shape == v.shape
                                    and torch.equal(got[k].view(torch.uint8) if got[k].dim() else got[k].reshape(1).view(torch.uint8),
                                                    v.contiguous().view(torch.uint8) if v.dim() else v.reshape(1).view(torch.uint8)))
                            for k, v in weights.items()}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
