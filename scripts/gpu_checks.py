#!/usr/bin/env python
"""The checks ``scripts/gpu_check.sh`` runs on a GPU host, one per process (``python
scripts/gpu_checks.py NAME --out DIR``: writes ``DIR/gpu_check_NAME.json``, exit 0 when it passed).

Every check imports only torch, the bundle's packages and this repository's Ray-free modules
(backends, the phase API in plain mode, the integrations, collectives): none needs Ray. The
plan (which checks run on this host, and why the others do not) is :func:`plan`.

- ``env``: CUDA device, versions, ``nvidia-smi``.
- ``deepspeed_zero2_cuda``: ZeRO-2 steps on CUDA through RollMux's DeepSpeed backend, deterministic
  algorithms on, with ``offload_states`` / ``reload_states`` between them: bit-identical to the
  same steps without offload; free device memory logged around every offload and reload.
- ``hf_rollout_cuda``: the HF rollout backend on CUDA: seeded generation, offload / load round
  trip (free memory logged), reproducible.
- ``cuda_sync``: trainer weights -> rollout on CUDA: a torch trainer's weights after a few steps,
  loaded into the HF rollout backend on CUDA, generate exactly what a transformers model holding
  them generates.
- ``trl_adapter_cuda``: examples/trl_grpo/train.py on CUDA as plain TRL and through the RollMux
  wrapper (plain mode), deterministic algorithms on: same SHA-256 of the weights after every
  step; the permits' records show the model offloaded / reloaded around every phase.
- ``nccl_one_rank``: the NCCL sync executor's own code on a one-rank communicator (one GPU cannot
  hold two ranks): grouped self send / recv and an all-reduce waited on by its bounded polling
  (``check_async_error`` each round), then ``abort`` from another thread while a receive without
  a sender is pending (``SyncAbortedError`` at once, ``ncclCommAbort``).
- ``vllm_cuda`` (only where vLLM is installed): sleep / wake, the exact-length run checked by
  ``finish_reason``, a streamed weight update through vLLM's in-place reload, ``close()``.
- ``nccl_two_gpu`` (only with two GPUs): a 1 -> 1 sync plan over cupy-NCCL, bit for bit.
- ``coexec_vllm_deepspeed`` (only with Ray and vLLM): scripts/gpu_coexec.py, two GRPO jobs
  co-executed on vLLM + DeepSpeed against the first one solo, SHA-256 after every iteration.
- ``deepspeed_switch_1b`` (last: the longest, ~16 GB written): a ~1B-parameter model's warm switch
  (optimizer state host <-> GPU) against its cold start (builder + ``deepspeed.initialize`` +
  checkpoint read back from disk, its pages dropped from the page cache first): the paper's
  warm-vs-cold ratio; each stage written to its result file as it ends.
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

#: name -> (timeout_s, what it needs, the modules it imports beyond torch). In run order: the
#: ~1B switch timing writes ~16 GB and takes longest, so it runs last (its stages are written as
#: they finish: a timeout keeps what was measured). A check whose modules are missing here is
#: NOT RUN, naming them; the others still run.
CHECKS: dict[str, tuple[int, str, tuple[str, ...]]] = {
    "env": (30, "a CUDA device", ()),
    "deepspeed_zero2_cuda": (60, "a CUDA device, DeepSpeed", ("deepspeed", "pydantic", "transformers")),
    "hf_rollout_cuda": (25, "a CUDA device", ("pydantic", "transformers")),
    "cuda_sync": (30, "a CUDA device", ("pydantic", "transformers")),
    "trl_adapter_cuda": (80, "a CUDA device, TRL with datasets (pyarrow, pandas)",
                         ("trl", "accelerate", "datasets", "pyarrow", "pandas", "pydantic")),
    "nccl_one_rank": (20, "cupy-cuda13x with its NCCL library", ("cupy",)),
    "vllm_cuda": (180, "vLLM 0.33 on the host", ("vllm", "pydantic")),
    "nccl_two_gpu": (60, "two CUDA devices", ("cupy",)),
    "coexec_vllm_deepspeed": (300, "Ray and vLLM on the host", ("ray", "vllm", "deepspeed")),
    "deepspeed_switch_1b": (170, "a CUDA device with ~25 GB free and ~20 GB of free disk", ("deepspeed", "transformers")),
}
#: The planned checks of the reference host with the install must end within this (the one call
#: that runs them: docs/GPU.md), seconds; the ~1B timing is in it.
BUDGET_S = 480
INSTALL_S = 20  # unpacking the bundle (the runner's own step)
#: What the reference host cannot run: NOT RUN there, with the reason.
REFERENCE_NOT_RUN = ("vllm_cuda", "nccl_two_gpu", "coexec_vllm_deepspeed")
ONE_B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
             intermediate_size=5632, vocab_size=32000)  # ~1.0e9 parameters (Llama layout)
#: Deterministic algorithms for every check (bit-identity checks): cuBLAS needs a fixed workspace.
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


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
    for m in sorted({m for _t, _n, mods in CHECKS.values() for m in mods}):
        out[m] = _have(m)
    return out


def plan(host: dict, host_problems: dict | None = None) -> list[dict]:
    """The checks for ``host`` (:func:`probe`): each ``{name, timeout_s, planned, reason}``;
    ``planned=False`` is NOT RUN with the reason (it never counts as a pass). A check is NOT RUN
    when a module it imports is missing (naming it) or ``host_problems`` (check -> why the host's
    packages cannot run it, from the bundle's requirements on host packages) names it; every
    other check is planned."""
    rows = []
    gpus = int(host.get("cuda_devices") or 0)
    for name, (timeout_s, needs, mods) in CHECKS.items():
        planned, reason = True, needs
        missing = [m for m in mods if host.get(m) is False]
        if name == "vllm_cuda" and not host.get("vllm"):
            planned, reason = False, ("vLLM is not installed on this host (a 336 MB wheel plus torch 2.14: "
                                      "beyond what the bundle can carry; tests/vllm_cpu/ runs the same engine "
                                      "code on vLLM's CPU build)")
        elif name == "coexec_vllm_deepspeed" and not (host.get("ray") and host.get("vllm")):
            planned, reason = False, ("two jobs co-executed on vLLM + DeepSpeed under RollMux need Ray (79 MB) and "
                                      "vLLM, which this host does not have (scripts/gpu_coexec.py runs it where they are)")
        elif name == "nccl_two_gpu" and gpus < 2:
            planned, reason = False, f"needs two CUDA devices (NCCL: one rank per GPU); this host has {gpus}"
        elif missing:
            planned, reason = False, f"{needs}; not installed here: {', '.join(missing)}"
        elif (host_problems or {}).get(name):
            planned, reason = False, f"{needs}; cannot run here: {host_problems[name]}"
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


#: Where a check writes what it measured so far (``main`` sets it): a check killed by its timeout
#: keeps its finished stages.
_PARTIAL: dict = {}


def _stage(key: str, value) -> None:
    """Record one finished stage of the running check and write the partial result now."""
    _PARTIAL.setdefault("stages", {})[key] = value
    out = _PARTIAL.get("_file")
    if out is not None:
        rec = {"name": _PARTIAL.get("_name"), "status": "running", "partial": _PARTIAL["stages"]}
        Path(out).write_text(json.dumps(rec, indent=2, default=str))


def _free_gb() -> float:
    """Free device memory (``cudaMemGetInfo``: all processes), GB."""
    import torch

    torch.cuda.synchronize()
    return round(torch.cuda.mem_get_info()[0] / 2**30, 3)


def _deterministic() -> None:
    import torch

    os.environ.update(DETERMINISTIC_ENV)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def check_deepspeed_zero2_cuda() -> dict:
    """ZeRO-2 steps on CUDA with ``offload_states`` / ``reload_states`` between them, deterministic
    algorithms on: bit-identical to the same steps without; free device memory logged around
    every offload and reload."""
    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    _deterministic()
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
                before, free0 = torch.cuda.memory_allocated(), _free_gb()
                t.offload()
                free1 = _free_gb()
                rec = {"offloaded": sorted(t.offloaded_states()), "freed_bytes": before - torch.cuda.memory_allocated(),
                       "free_gb": {"before_offload": free0, "after_offload": free1}}
                t.load()
                rec["free_gb"]["after_reload"] = _free_gb()
                seen.append(rec)
                assert not t.offloaded_states()
        t.close()
        return shas[-1], seen if offload_between else shas

    with_off, seen = steps(True)
    _stage("offload_between_steps", seen)
    plain, shas = steps(False)
    assert len(set(shas)) == 3, "every ZeRO-2 step changes the weights"
    assert with_off == plain, "offload_states / reload_states between steps changed the result"
    assert all("optim_states" in s["offloaded"] and s["freed_bytes"] > 0 for s in seen), seen
    return {"steps": 3, "deterministic_algorithms": True, "offload_reload_bit_identical": True, "offloads": seen}


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


def check_deepspeed_switch_1b() -> dict:
    """Warm switch (``offload_states`` / ``reload_states``, host memory <-> GPU) vs cold start
    (builder + ``deepspeed.initialize`` + ``load_checkpoint`` from disk, the checkpoint's pages
    dropped from the page cache) of a ~1B Llama, fp32, ZeRO-2: the paper's warm-vs-cold ratio.
    Each stage is written when it ends (a timeout keeps them); free device memory around each."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from actors.backends.deepspeed_train import DeepSpeedTrainBackend

    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    tmp_root = os.environ.get("GPU_CHECK_TMP") or tempfile.gettempdir()
    free_disk = shutil.disk_usage(tmp_root).free / 2**30
    _stage("free_disk_gb", round(free_disk, 1))
    assert free_disk >= 20, f"{tmp_root} has {free_disk:.1f} GB free; the checkpoint needs ~16 GB (set GPU_CHECK_TMP)"
    cfg = LlamaConfig(**ONE_B, max_position_embeddings=256, tie_word_embeddings=False)

    def builder():
        with torch.device("cuda"):
            torch.manual_seed(0)
            return LlamaForCausalLM(cfg)

    seq = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    eng = DeepSpeedTrainBackend(builder(), lr=1e-5, stage=2, micro_batch=1)
    _stage("build_s", round(time.perf_counter() - t0, 3))
    params = sum(p.numel() for p in eng.engine.module.parameters())
    _stage("params", params)
    eng.backward_step(eng.forward(seq).float().logsumexp(-1).mean())  # optimizer state exists now
    torch.cuda.synchronize()
    gpu_before, free0 = torch.cuda.memory_allocated(), _free_gb()
    t0 = time.perf_counter()
    eng.offload()
    torch.cuda.synchronize()
    _stage("offload_s", round(time.perf_counter() - t0, 3))
    gpu_offloaded, free1 = torch.cuda.memory_allocated(), _free_gb()
    t0 = time.perf_counter()
    eng.load()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    _stage("warm_switch_s", round(warm_s, 3))
    _stage("free_gb", {"before_offload": free0, "after_offload": free1, "after_reload": _free_gb()})
    _stage("gpu_state_gb", {"before_offload": round(gpu_before / 2**30, 2), "after_offload": round(gpu_offloaded / 2**30, 2)})
    ck = Path(tempfile.mkdtemp(prefix="rollmux-gpu-check-ckpt-", dir=tmp_root))
    try:
        t0 = time.perf_counter()
        eng.engine.save_checkpoint(str(ck), tag="t")
        _stage("checkpoint_save_s", round(time.perf_counter() - t0, 2))
        _stage("checkpoint_gb", round(_drop_cache(ck) / 2**30, 2))
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
        _stage("cold_start_s", round(cold_s, 3))
        _stage("cold_checkpoint_read_s", round(time.perf_counter() - t1, 3))
        assert _sha({k: v for k, v in list(cold.weights().items())[:4]}) == ref, "the cold start lost the weights"
        cold.close()
    finally:
        shutil.rmtree(ck, ignore_errors=True)
    return {**_PARTIAL.get("stages", {}), "cold_over_warm": round(cold_s / max(warm_s, 1e-9), 1)}


def check_hf_rollout_cuda() -> dict:
    import torch

    from actors.backends import make_rollout_backend
    from examples.grpo.tokenizer import CharTokenizer

    _deterministic()
    tok = CharTokenizer()
    prompts = tok.encode_batch(["3>", "7>", "1>", "0>"])
    b = make_rollout_backend("hf", _tiny(), device="cuda")

    def gen(seed):
        return b.generate(prompts, max_new_tokens=8, temperature=1.0, seed=seed, eos_id=tok.eos_id, pad_id=tok.pad_id)

    a = gen(1)
    free0 = _free_gb()
    b.offload()
    assert next(b.model.parameters()).device.type == "cpu"
    free1 = _free_gb()
    b.load()
    assert next(b.model.parameters()).device.type == "cuda"
    assert torch.equal(a, gen(1)) and not torch.equal(a, gen(2))
    return {"shape": list(a.shape), "offload_load_round_trip": True,
            "free_gb": {"before_offload": free0, "after_offload": free1, "after_reload": _free_gb()}}


def check_cuda_sync() -> dict:
    """Trainer weights -> rollout on CUDA: a torch train backend on CUDA takes a step, its weights
    (the sync phase's payload) go into an HF rollout backend on CUDA through ``load_weights``; the
    rollout generates exactly what a transformers model holding the trainer's weights generates,
    and differs from the pre-step weights' (so the check can fail)."""
    import torch

    from actors.backends import make_rollout_backend, make_train_backend
    from examples.grpo.tokenizer import CharTokenizer

    _deterministic()
    tok = CharTokenizer()
    prompts = tok.encode_batch(["3>", "7>", "1>", "0>"])
    trainer = make_train_backend("torch", _tiny(), lr=5e-2, device="cuda")
    roll = make_rollout_backend("hf", _tiny(), device="cuda")

    def gen(b):
        return b.generate(prompts, max_new_tokens=8, temperature=1.0, seed=7, eos_id=tok.eos_id, pad_id=tok.pad_id)

    before = gen(roll)
    for _ in range(3):
        trainer.backward_step(trainer.forward(before.cuda()).logsumexp(-1).mean())
    w = trainer.weights()
    roll.load_weights(w)
    ref = make_rollout_backend("hf", _tiny(), device="cuda")
    ref.model.load_state_dict({k: v.to("cuda") for k, v in w.items()})
    got, want = gen(roll), gen(ref)
    assert torch.equal(got, want), "the synced rollout generates differently from the trainer's weights"
    assert not torch.equal(got, before), "the update changed nothing (the check could not fail)"
    same = all(torch.equal(a.cpu(), w[k]) for k, a in roll.model.state_dict().items() if k in w)
    assert same, "the rollout's weights differ from the trainer's"
    return {"tensors": len(w), "generation_equal": True, "changed_by_training": True}


def check_trl_adapter_cuda() -> dict:
    out = {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
               TOKENIZERS_PARALLELISM="false", **DETERMINISTIC_ENV)
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
            _stage(kind, {"final_sha256": runs[kind]["digests"][-1]})
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


def _one_rank_executor():
    """An :class:`collectives.nccl_executor.NcclExecutor` whose world communicator has one rank
    (one GPU cannot hold two NCCL ranks): its own ``_isend`` / ``_irecv`` (to itself, inside an NCCL
    group), ``_wait`` (bounded polling with ``check_async_error``), ``abort`` and ``_abort``
    (``ncclCommAbort``) run unchanged; only the communicator set-up differs."""
    import torch
    import torch.distributed as dist
    from cupy.cuda import nccl

    from collectives.base import SyncExecutor
    from collectives.nccl_executor import NcclExecutor
    from rollmux.sync_plan import TensorMeta, build_plan

    class OneRank(NcclExecutor):
        def __init__(self, timeout_s: float):
            plan = build_plan([TensorMeta("w", (1024,), "float32", 4096)], 1, 1, bucket_bytes=4096)
            SyncExecutor.__init__(self, plan, "train", 0, job_id="gpu-check", timeout_s=timeout_s)
            self._dev = torch.device("cuda", torch.cuda.current_device())
            self._grouped = None
            self._store = dist.HashStore()
            with torch.cuda.device(self._dev):
                self._world = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
            self._roll = None
            self._s_world = torch.cuda.Stream(device=self._dev)
            self._s_roll = torch.cuda.Stream(device=self._dev)

    return OneRank


def check_nccl_one_rank() -> dict:
    """cupy-NCCL through the executor's own code: a grouped self send/recv waited on by its bounded
    polling (error polling each round), an all-reduce, then an abort from another thread while a
    receive with no sender is pending (``SyncAbortedError`` within a second, ``ncclCommAbort``)."""
    import threading

    import torch
    from cupy.cuda import nccl

    from collectives.nccl_executor import available
    from rollmux.sync_plan import SyncAbortedError

    ok, why = available()
    assert ok, why
    torch.cuda.set_device(0)
    ex = _one_rank_executor()(timeout_s=20)
    x = torch.arange(4096, dtype=torch.uint8, device="cuda")
    y = torch.zeros_like(x)
    ex._group_start()
    hs, hr = ex._isend(x, 0, 0), ex._irecv(y, 0, 0)
    ex._group_end()
    ex._wait(hs)
    ex._wait(hr)
    assert torch.equal(x, y), "self send/recv through the executor"
    s = ex._allreduce_sum(torch.tensor([3, 4], dtype=torch.int64))
    assert s.tolist() == [3, 4]
    _stage("send_recv_allreduce", True)
    ex2 = _one_rank_executor()(timeout_s=30)
    z = torch.zeros(64, dtype=torch.uint8, device="cuda")
    pending = ex2._irecv(z, 0, 0)  # no matching send: never completes by itself
    threading.Timer(0.5, ex2.abort, args=("gpu check: abort while waiting",)).start()
    t0 = time.perf_counter()
    try:
        ex2._wait(pending)
        raise AssertionError("the wait returned without a sender")
    except SyncAbortedError:
        waited = time.perf_counter() - t0
    assert ex2.abort_reason == "gpu check: abort while waiting", ex2.abort_reason
    ex2._abort()  # ncclCommAbort releases the pending receive
    assert ex2._world is None and waited < 5, waited
    ex.close()
    return {"nccl_version": nccl.get_version(), "self_send_recv": True, "allreduce": True,
            "abort_wait_s": round(waited, 3)}


def check_vllm_cuda() -> dict:
    """vLLM on CUDA: sleep / wake (free memory logged), the exact-length run checked by
    ``finish_reason`` and lengths (vLLM samples the pad id like any token), a streamed weight update
    through vLLM's in-place reload, greedy tokens equal to transformers', ``close()``."""
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

    def gen(seed, temperature=1.0):
        return b.generate(prompts, max_new_tokens=16, temperature=temperature, seed=seed, eos_id=tok.eos_id,
                          pad_id=tok.pad_id)

    a = gen(3)
    assert b.last_finish_reasons == ["length"] * 4, b.last_finish_reasons  # every row ran to its cap
    free0 = _free_gb()
    b.offload()
    free1 = _free_gb()
    b.load()
    free2 = _free_gb()
    assert free1 > free0 and free2 < free1, (free0, free1, free2)
    assert torch.equal(a, gen(3))
    new = build_model(prod, 1).to(torch.bfloat16)
    b.load_weights(new.state_dict())  # streamed rows, in-place reload, prefix cache reset
    assert not torch.equal(a, gen(3))
    g = gen(0, temperature=0.0)
    seq = prompts.cuda()
    ref = new.cuda()
    with torch.no_grad():
        for _ in range(16):
            seq = torch.cat([seq, ref(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    agree = float((g == seq.cpu()).float().mean())  # bf16 kernels differ: agreement, not equality
    b.close()
    return {"sleep_wake": True, "free_gb": {"awake": free0, "asleep": free1, "woken": free2},
            "weight_update": True, "greedy_agreement_with_transformers": round(agree, 3), "closed": b.closed}


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
    "cuda_sync": check_cuda_sync, "deepspeed_switch_1b": check_deepspeed_switch_1b,
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
    Path(a.out).mkdir(parents=True, exist_ok=True)
    _PARTIAL.update(_file=Path(a.out) / f"gpu_check_{a.name}.json", _name=a.name)
    try:
        rec["details"] = RUN[a.name]()
        rec["status"] = "pass"
    except BaseException as e:  # recorded: the runner reports it
        rec["status"] = "fail"
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc()[-4000:]
        if _PARTIAL.get("stages"):
            rec["partial"] = _PARTIAL["stages"]
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    (Path(a.out) / f"gpu_check_{a.name}.json").write_text(json.dumps(rec, indent=2, default=str))
    return 0 if rec["status"] == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(main())
