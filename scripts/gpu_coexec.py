#!/usr/bin/env python
"""GPU check: two tiny GRPO jobs on vLLM (rollout) + DeepSpeed ZeRO-2 (training) co-executed in
one RollMux group on a local Ray cluster, then the first job solo; writes JSON.

Checks, per iteration, that the co-executed job's trainer weights (SHA-256) equal the solo run's
(on-policy preserved, RollMux §5), records the switch kinds / times each phase paid, and checks the
sync transport ``sync_backend="auto"`` chose (NCCL when each worker holds its own GPU, else gloo). Needs a
CUDA GPU and the ``gpu`` extra; four pool workers share the GPU (``ROLLMUX_WORKER_GPUS=0.25``).

    python scripts/gpu_coexec.py --out results/gpu_check_coexec.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from actors.ops.local_cluster import use_ephemeral_ray_token  # noqa: E402

use_ephemeral_ray_token()  # Ray token mode with a fresh token unless RAY_AUTH_MODE is set
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("ROLLMUX_WORKER_GPUS", "0.25")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "results" / "gpu_check_coexec.json"))
    args = ap.parse_args(argv)

    import torch

    from actors.scheduler.global_scheduler import get_or_create_scheduler
    from actors.handles import SchedulerHandle
    from actors.ops.local_cluster import start_local_cluster
    from examples.grpo.config import ModelConfig, load_job_config
    from examples.grpo.job import run_job
    from rollmux.config import CONFIG_DIR, load_cluster

    out: dict = {"cuda": torch.cuda.is_available(), "ok": False}
    if not torch.cuda.is_available():
        out["error"] = "no CUDA device"
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
        return 2
    tiny = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=176)
    uid = uuid.uuid4().hex[:6]
    cfgs = []
    for name in ("grpo_rollout_heavy", "grpo_train_heavy"):
        c = load_job_config(CONFIG_DIR / "jobs" / f"{name}.yaml", iterations=args.iterations)
        run = c.run.model_copy(update={"rollout_backend": "vllm", "train_backend": "deepspeed", "device": "cuda",
                                       "max_new_tokens": min(c.run.max_new_tokens, 32),
                                       "min_new_tokens": min(c.run.min_new_tokens, 8), "num_prompts": 4,
                                       # a fixed KV cache: no start-up memory profile while the other
                                       # job's DeepSpeed worker frees buckets on the same GPU
                                       "vllm_kv_cache_bytes": 64 << 20})
        cfgs.append(c.model_copy(update={"job": c.job.model_copy(update={"job_id": f"{c.job.job_id}-gpu-{uid}"}),
                                         "run": run, "model": tiny}))
    spec = load_cluster(CONFIG_DIR / "cluster_local.yaml")
    lc = start_local_cluster(spec, head_cpus=2, node_cpus=1, object_store_mb=512, node_gpus=1)
    t0 = time.time()
    try:
        name = f"gpu-check-{uid}"
        sched = get_or_create_scheduler(spec, name=name)
        SchedulerHandle(sched).health(timeout_s=120)
        results: dict = {}
        barrier = threading.Barrier(len(cfgs), timeout=600)

        def go(cfg):
            try:
                results[cfg.job.job_id] = run_job(cfg, attach=True, scheduler_name=name, ready=barrier.wait)
            except BaseException as e:  # reported below
                results[cfg.job.job_id] = e
                barrier.abort()

        threads = [threading.Thread(target=go, args=(c,)) for c in cfgs]
        for t in threads:
            t.start()
            time.sleep(2.0)  # fixed admission order
        for t in threads:
            t.join(timeout=900)
        errors = {k: f"{type(v).__name__}: {v}" for k, v in results.items() if isinstance(v, BaseException)}
        out["errors"] = errors
        if not errors:
            co = results[cfgs[0].job.job_id]
            solo = run_job(cfgs[0], attach=False)
            a = [m["weights_sha256"] for m in co["history"]]
            b = [m["weights_sha256"] for m in solo["history"]]
            # sync transport (sync_backend="auto"): NCCL only when each worker holds its own GPU and
            # cupy-NCCL loads; workers sharing one GPU (ROLLMUX_WORKER_GPUS < 1) sync over gloo
            from collectives.nccl_executor import available

            syncs = [r for r in co["timeline"] if r.get("phase") == "sync"]
            own_gpu = float(os.environ.get("ROLLMUX_WORKER_GPUS", "1")) >= 1
            expected = "nccl" if own_gpu and available()[0] else "gloo"
            out.update(bit_identical=a == b, coexec_sha256=a, solo_sha256=b,
                       switches=sorted({(r.get("phase"), r.get("switch")) for r in co["timeline"]}),
                       group_ids=sorted({results[c.job.job_id]["info"]["group_id"] for c in cfgs}),
                       sync_backend=sorted({r.get("sync_backend") for r in syncs}), sync_backend_expected=expected,
                       sync_note=sorted({r.get("sync_note") or "" for r in syncs}))
            out["ok"] = bool(a == b) and out["sync_backend"] == [expected]
    finally:
        out["wall_s"] = round(time.time() - t0, 1)
        lc.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: out[k] for k in ("ok", "wall_s") if k in out}))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
