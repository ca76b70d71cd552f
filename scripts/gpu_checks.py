#!/usr/bin/env python
"""The checks ``scripts/gpu_check.sh`` runs on a GPU host, one per process (``python
scripts/gpu_checks.py NAME --out DIR``: writes ``DIR/gpu_check_NAME.json``, exit 0 when it passed).

Every check imports only torch, the bundle's packages and this repository's Ray-free modules
(backends, the phase API in plain mode, the integrations, collectives): none needs Ray. The
plan (which checks run on this host, and why the others do not) is :func:`plan`.

- ``env``: CUDA device, versions, ``nvidia-smi``.
- ``deepspeed_zero2_cuda``: ZeRO-2 steps on CUDA through RollMux's DeepSpeed backend, with
  ``offload_states`` / ``reload_states`` between them (bit-identical to the same steps without
  offload), then a ~1B-parameter model's warm switch (optimizer state host <-> GPU) against its
  cold start (builder + ``deepspeed.initialize`` + checkpoint read back from disk; the
  checkpoint's pages are dropped from the page cache first): the paper's warm-vs-cold ratio.
- ``hf_rollout_cuda``: the HF rollout backend on CUDA: seeded generation, offload / load
  round trip, reproducible.
- ``trl_adapter_cuda``: examples/trl_grpo/train.py on CUDA as plain TRL and through the RollMux
  wrapper (plain mode), deterministic algorithms on: same SHA-256 of the weights after every
  step; the permits' records show the model offloaded / reloaded around every phase.
- ``nccl_one_rank``: cupy-NCCL loads, a one-rank communicator all-reduces and broadcasts.
- ``vllm_cuda`` (only where vLLM is installed): sleep / wake, a weight update through the
  worker extension's payload, the production attention path, ``close()``.
- ``nccl_two_gpu`` (only with two GPUs): a 1 -> 1 sync plan over cupy-NCCL, bit for bit.
- ``coexec_vllm_deepspeed`` (only with Ray and vLLM): scripts/gpu_coexec.py, two GRPO jobs
  co-executed on vLLM + DeepSpeed against the first one solo, SHA-256 after every iteration.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: name -> (timeout_s, what it needs). Timeouts of the checks planned on the reference host (one
#: GPU, no vLLM, no Ray) sum to less than the 5-minute budget with the install step.
CHECKS: dict[str, tuple[int, str]] = {
    "env": (15, "a CUDA device"),
    "deepspeed_zero2_cuda": (125, "a CUDA device with ~25 GB free and ~20 GB of free disk"),
    "hf_rollout_cuda": (25, "a CUDA device"),
    "trl_adapter_cuda": (80, "a CUDA device, pyarrow and pandas on the host"),
    "nccl_one_rank": (20, "cupy-cuda13x with its NCCL library"),
    "vllm_cuda": (180, "vLLM 0.33 on the host"),
    "nccl_two_gpu": (60, "two CUDA devices"),
    "coexec_vllm_deepspeed": (300, "Ray and vLLM on the host"),
}
BUDGET_S = 300
INSTALL_S = 20  # unpacking the bundle (the runner's own step)
ONE_B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
             intermediate_size=5632, vocab_size=32000)  # ~1.0e9 parameters (Llama layout)


def _have(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def probe() -> dict:
    """What this host has (no CUDA initialisation beyond counting devices)."""
    out = {"python": sys.version.split()[0], "cuda_devices": 0, "torch": None}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as e:  # pragma: no cover - a host without torch
        out["torch_error"] = f"{type(e).__name__}: {e}"
    for m in ("vllm", "ray", "pyarrow", "pandas", "cupy", "deepspeed", "pydantic", "trl"):
        out[m] = _have(m)
    return out


def plan(host: dict, host_problems: dict | None = None) -> list[dict]:
    """The checks for ``host`` (:func:`probe`): each ``{name, timeout_s, planned, reason}``;
    ``planned=False`` is NOT RUN with the reason (it never counts as a pass). ``host_problems``:
    check -> why the host's packages cannot run it (from the bundle's host requirements)."""
    rows = []
    gpus = int(host.get("cuda_devices") or 0)
    for name, (timeout_s, needs) in CHECKS.items():
        planned, reason = True, needs
        if name == "vllm_cuda" and not host.get("vllm"):
            planned, reason = False, ("vLLM is not installed on this host (a 336 MB wheel plus torch 2.14: "
                                      "beyond what the bundle can carry)")
        elif name == "coexec_vllm_deepspeed" and not (host.get("ray") and host.get("vllm")):
            planned, reason = False, ("two jobs co-executed on vLLM + DeepSpeed under RollMux need Ray (79 MB) and "
                                      "vLLM, which this host does not have (scripts/gpu_coexec.py runs it where they are)")
        elif name == "nccl_two_gpu" and gpus < 2:
            planned, reason = False, f"needs two CUDA devices (NCCL: one rank per GPU); this host has {gpus}"
        elif (host_problems or {}).get(name):
            reason = f"{needs}; cannot run here: {host_problems[name]}"
        rows.append({"name": name, "timeout_s": timeout_s, "planned": planned, "reason": reason})
    return rows


def _sha(sd: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].detach().cpu().contiguous().reshape(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


# ---- checks -------------------------------------------------------------------------------------

def check_env() -> dict:
    import torch

    assert torch.cuda.is_available(), "torch sees no CUDA device"
    p = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=10) if _which("nvidia-smi") else None
    from importlib import metadata

    vers = {}
    for d in ("torch", "transformers", "deepspeed", "pydantic", "trl", "accelerate", "datasets", "cupy-cuda13x", "vllm"):
        try:
            vers[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            vers[d] = None
    return {"device": p.name, "total_gb": round(p.total_memory / 2**30, 1), "devices": torch.cuda.device_count(),
            "cuda": torch.version.cuda, "versions": vers, "nvidia_smi": smi.stdout.strip() if smi else None}


def _which(cmd: str) -> bool:
    from shutil import which

    return which(cmd) is not None


def _tiny():
    from examples.grpo.config import ModelConfig
    from examples.grpo.model import build_model

    return build_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                   max_position_embeddings=32), 0)


def check_deepspeed_zero2_cuda() -> dict:
    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    from actors.backends.deepspeed_train import DeepSpeedTrainBackend

    seq = torch.randint(3, 15, (4, 12), generator=torch.Generator().manual_seed(0))

    def steps(offload_between: bool) -> tuple[str, list]:
        t = DeepSpeedTrainBackend(_tiny(), lr=1e-2, stage=2, micro_batch=4)
        assert t.device.startswith("cuda"), t.device
        seen, shas = [], []
        for i in range(3):
            t.backward_step(t.forward(seq).logsumexp(-1).mean())
            shas.append(_sha(t.weights()))
            if offload_between:
                before = torch.cuda.memory_allocated()
                t.offload()
                seen.append({"offloaded": sorted(t.offloaded_states()), "freed_bytes": before - torch.cuda.memory_allocated()})
                t.load()
                assert not t.offloaded_states()
        t.close()
        return shas[-1], seen if offload_between else shas

    with_off, seen = steps(True)
    plain, shas = steps(False)
    assert len(set(shas)) == 3, "every ZeRO-2 step changes the weights"
    assert with_off == plain, "offload_states / reload_states between steps changed the result"
    assert all("optim_states" in s["offloaded"] and s["freed_bytes"] > 0 for s in seen), seen
    return {"tiny": {"steps": 3, "offload_reload_bit_identical": True, "offloads": seen}, "one_b": _switch_times_1b()}


def _drop_cache(folder: Path) -> int:
    n = 0
    for f in folder.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd) if os.access(f, os.W_OK) else None
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            n += f.stat().st_size
    return n


def _switch_times_1b() -> dict:
    """Warm switch (``offload_states`` / ``reload_states``, host memory <-> GPU) vs cold start
    (builder + ``deepspeed.initialize`` + ``load_checkpoint`` from disk) of a ~1B model, ZeRO-2."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from actors.backends.deepspeed_train import DeepSpeedTrainBackend

    cfg = LlamaConfig(**ONE_B, max_position_embeddings=256, tie_word_embeddings=False)

    def builder():
        with torch.device("cuda"):
            torch.manual_seed(0)
            return LlamaForCausalLM(cfg)

    seq = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    eng = DeepSpeedTrainBackend(builder(), lr=1e-5, stage=2, micro_batch=1)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in eng.engine.module.parameters())
    eng.backward_step(eng.forward(seq).float().logsumexp(-1).mean())  # optimizer state exists now
    torch.cuda.synchronize()
    gpu_before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    eng.offload()
    torch.cuda.synchronize()
    offload_s = time.perf_counter() - t0
    gpu_offloaded = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    eng.load()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    ck = Path(tempfile.mkdtemp(prefix="rollmux-gpu-check-ckpt-", dir=os.environ.get("GPU_CHECK_TMP")))
    try:
        t0 = time.perf_counter()
        eng.engine.save_checkpoint(str(ck), tag="t")
        save_s = time.perf_counter() - t0
        ck_bytes = _drop_cache(ck)
        ref = _sha({k: v for k, v in list(eng.weights().items())[:4]})
        eng.close()
        del eng
        gc.collect()
        torch.cuda.empty_cache()
        t0 = time.perf_counter()
        cold = DeepSpeedTrainBackend(builder(), lr=1e-5, stage=2, micro_batch=1)
        t1 = time.perf_counter()
        cold.engine.load_checkpoint(str(ck), tag="t")
        torch.cuda.synchronize()
        cold_s = time.perf_counter() - t0
        load_s = time.perf_counter() - t1
        assert _sha({k: v for k, v in list(cold.weights().items())[:4]}) == ref, "the cold start lost the weights"
        cold.close()
    finally:
        for f in sorted(ck.rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        ck.rmdir()
    return {"params": params, "build_s": round(build_s, 3), "gpu_state_gb": round(gpu_before / 2**30, 2),
            "gpu_after_offload_gb": round(gpu_offloaded / 2**30, 2), "offload_s": round(offload_s, 3),
            "warm_switch_s": round(warm_s, 3), "checkpoint_gb": round(ck_bytes / 2**30, 2),
            "checkpoint_save_s": round(save_s, 2), "cold_start_s": round(cold_s, 3),
            "cold_checkpoint_read_s": round(load_s, 3), "cold_over_warm": round(cold_s / max(warm_s, 1e-9), 1)}


def check_hf_rollout_cuda() -> dict:
    import torch

    from actors.backends import make_rollout_backend
    from examples.grpo.tokenizer import CharTokenizer

    tok = CharTokenizer()
    prompts = tok.encode_batch(["3>", "7>", "1>", "0>"])
    b = make_rollout_backend("hf", _tiny(), device="cuda")

    def gen(seed):
        return b.generate(prompts, max_new_tokens=8, temperature=1.0, seed=seed, eos_id=tok.eos_id, pad_id=tok.pad_id)

    a = gen(1)
    b.offload()
    assert next(b.model.parameters()).device.type == "cpu"
    b.load()
    assert next(b.model.parameters()).device.type == "cuda"
    assert torch.equal(a, gen(1)) and not torch.equal(a, gen(2))
    return {"shape": list(a.shape), "offload_load_round_trip": True}


def check_trl_adapter_cuda() -> dict:
    out = {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
               CUBLAS_WORKSPACE_CONFIG=":4096:8", TOKENIZERS_PARALLELISM="false")
    for k in ("ROLLMUX_ATTACH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # one process each: no torch.distributed world, no scheduler
    with tempfile.TemporaryDirectory(prefix="rollmux-gpu-check-trl-") as d:
        runs = {}
        for kind, pre in (("plain", []), ("rollmux", ["-m", "rollmux.integrations.trl"])):
            dig, tl = Path(d) / f"{kind}.json", Path(d) / f"{kind}-timeline.json"
            cmd = [sys.executable, *pre, str(ROOT / "examples" / "trl_grpo" / "train.py"), "--steps", "4",
                   "--device", "cuda", "--deterministic", "--output-dir", str(Path(d) / kind), "--digests-out", str(dig)]
            p = subprocess.run(cmd, env=dict(env, ROLLMUX_TIMELINE_OUT=str(tl)), capture_output=True, text=True,
                               timeout=38, cwd=ROOT)
            assert p.returncode == 0, f"{kind} run failed:\n{p.stderr[-2000:]}"
            runs[kind] = json.loads(dig.read_text())
            if kind == "rollmux":
                out["timeline"] = json.loads(tl.read_text())["timeline"]
    assert runs["rollmux"]["trainer"] == "RollMuxGRPOTrainer" and runs["plain"]["trainer"] == "GRPOTrainer"
    assert all(r["device"].startswith("cuda") for r in runs.values()), {k: r["device"] for k, r in runs.items()}
    same = runs["rollmux"]["digests"] == runs["plain"]["digests"]
    tl = out.pop("timeline")
    phases = [r["phase"] for r in tl]
    assert phases == ["rollout", "train", "sync"] * 4, phases
    moved = [r for r in tl if r["phase"] != "sync"]
    assert all(r["switch"] == "warm" and r["ok"] for r in moved), "auto offload should move the model on CUDA"
    assert same, "the RollMux run's weights differ from plain TRL's (deterministic algorithms on)"
    return {"steps": 4, "bit_identical": same, "final_sha256": runs["plain"]["digests"][-1],
            "mean_reload_s": round(sum(r["switch_s"] for r in moved) / len(moved), 4),
            "mean_offload_s": round(sum(r["offload_s"] for r in moved) / len(moved), 4)}


def check_nccl_one_rank() -> dict:
    import torch
    from cupy.cuda import nccl

    from collectives.nccl_executor import available

    ok, why = available()
    assert ok, why
    torch.cuda.set_device(0)
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream
    comm.allReduce(x.data_ptr(), y.data_ptr(), x.numel(), nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream)
    z = torch.full((16,), 7.0, device="cuda")
    comm.bcast(z.data_ptr(), z.numel(), nccl.NCCL_FLOAT32, 0, stream)
    torch.cuda.synchronize()
    assert torch.equal(x, y) and bool((z == 7).all())
    comm.destroy()
    return {"nccl_version": nccl.get_version(), "allreduce_ok": True, "bcast_ok": True}


def check_vllm_cuda() -> dict:
    import torch

    from actors.backends import make_rollout_backend
    from examples.grpo.config import ModelConfig
    from examples.grpo.model import build_model
    from examples.grpo.tokenizer import CharTokenizer

    tok = CharTokenizer()
    prompts = tok.encode_batch(["3>", "7>", "1>", "0>"])
    prod = ModelConfig(hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512, max_position_embeddings=64)
    b = make_rollout_backend("vllm", build_model(prod, 0).to(torch.bfloat16), dtype="bfloat16",
                             gpu_memory_utilization=0.1, kv_cache_memory_bytes=64 << 20, ignore_eos=True)

    def gen(seed):
        return b.generate(prompts, max_new_tokens=16, temperature=1.0, seed=seed, eos_id=tok.eos_id, pad_id=tok.pad_id)

    a = gen(3)
    assert bool((a[:, prompts.shape[1]:] != tok.pad_id).all()), "ignore_eos: every row to its cap"
    b.offload()
    b.load()
    assert torch.equal(a, gen(3))
    b.load_weights(build_model(prod, 1).to(torch.bfloat16).state_dict())  # through the payload rows
    assert not torch.equal(a, gen(3))
    b.close()
    return {"sleep_wake": True, "weight_update": True, "closed": b.closed}


def _nccl_peer(role, addr, q):  # pragma: no cover - two-GPU hosts
    import torch

    from collectives import open_endpoint
    from rollmux.sync_plan import TensorMeta, build_plan

    torch.cuda.set_device(0 if role == "train" else 1)
    metas = [TensorMeta("a", (257, 129), "bfloat16", 257 * 129 * 2), TensorMeta("b", (1000,), "float32", 4000)]
    plan = build_plan(metas, 1, 1, bucket_bytes=8192)
    g = torch.Generator().manual_seed(5)
    sd = {"a": torch.randn(257, 129, generator=g).to(torch.bfloat16).cuda(), "b": torch.randn(1000, generator=g).cuda()}
    ep = open_endpoint(plan, role, 0, backend="nccl", addr=addr, job_id="gpu-check", timeout_s=30)
    if role == "train":
        ep.send(sd)
        q.put((role, _sha(sd)))
    else:
        live = {k: torch.zeros_like(v) for k, v in sd.items()}
        q.put((role, _sha(ep.receive(live))))
    ep.close()


def check_nccl_two_gpu() -> dict:  # pragma: no cover - two-GPU hosts
    import multiprocessing as mp

    from collectives import host_store

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    _store, addr = host_store("127.0.0.1", timeout_s=30)
    ps = [ctx.Process(target=_nccl_peer, args=(r, addr, q)) for r in ("train", "rollout")]
    for p in ps:
        p.start()
    got = dict(q.get(timeout=50) for _ in ps)
    for p in ps:
        p.join(timeout=10)
    assert got["train"] == got["rollout"], got
    return {"plan": "1 -> 1", "bit_identical": True}


def check_coexec_vllm_deepspeed() -> dict:  # pragma: no cover - hosts with Ray and vLLM
    with tempfile.TemporaryDirectory(prefix="rollmux-gpu-check-coexec-") as d:
        out = Path(d) / "coexec.json"
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_coexec.py"), "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=290)
        res = json.loads(out.read_text()) if out.is_file() else {"ok": False, "error": p.stderr[-2000:]}
    assert res.get("ok"), res
    return res


RUN: dict[str, Callable[[], dict]] = {
    "env": check_env, "deepspeed_zero2_cuda": check_deepspeed_zero2_cuda, "hf_rollout_cuda": check_hf_rollout_cuda,
    "trl_adapter_cuda": check_trl_adapter_cuda, "nccl_one_rank": check_nccl_one_rank, "vllm_cuda": check_vllm_cuda,
    "nccl_two_gpu": check_nccl_two_gpu, "coexec_vllm_deepspeed": check_coexec_vllm_deepspeed,
}


def plan_checks() -> dict:
    """What ``--dry-run`` can verify of each check on a CPU machine: the ~1B model really is ~1B
    parameters (counted on the meta device), the TRL script takes the flags the check passes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in LlamaForCausalLM(LlamaConfig(**ONE_B, tie_word_embeddings=False)).parameters())
    assert 0.9e9 <= n <= 1.2e9, n
    src = (ROOT / "examples" / "trl_grpo" / "train.py").read_text()
    assert all(f in src for f in ("--device", "--deterministic", "--digests-out", "--output-dir", "--steps"))
    assert set(RUN) == set(CHECKS)
    return {"one_b_params": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run one GPU check")
    ap.add_argument("name", choices=sorted(RUN))
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rec: dict = {"name": a.name}
    try:
        rec["details"] = RUN[a.name]()
        rec["status"] = "pass"
    except BaseException as e:  # recorded: the runner reports it
        rec["status"] = "fail"
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc()[-4000:]
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"gpu_check_{a.name}.json").write_text(json.dumps(rec, indent=2, default=str))
    return 0 if rec["status"] == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(main())
