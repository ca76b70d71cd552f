#!/usr/bin/env python
"""The user's GRPO script: an ordinary RL loop on the RollMux phase API.

Run solo (plain Python, no scheduler):
    python scripts/grpo_job.py --config configs/jobs/grpo_balanced.yaml
Submit to a RollMux cluster (the job registers itself with the GlobalScheduler):
    ray job submit --address ... --working-dir . --runtime-env-json '{"env_vars": {"ROLLMUX_ATTACH": "1"}}' \\
        -- python scripts/grpo_job.py --config configs/jobs/grpo_balanced.yaml

Writes a JSON result (``--out``): per-iteration metrics, ``final_reward``, ``weights_sha256``,
``timeline`` (this job's phase records), ``mode`` (plain | scheduled). A one-line message (no traceback) and
exit code 2 on bad input (a missing or invalid job file), 1 on a failed job.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Tiny GRPO job on the RollMux phase API (solo or scheduled).")
    ap.add_argument("--config", required=True, help="job file, e.g. configs/jobs/grpo_balanced.yaml")
    ap.add_argument("--iterations", type=int, default=None, help="override run.iterations")
    ap.add_argument("--seed", type=int, default=None, help="override run.seed")
    ap.add_argument("--job-id", default=None, help="override job.job_id (unique id per submission)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--attach", dest="attach", action="store_true", default=None, help="require the RollMux scheduler")
    mode.add_argument("--solo", dest="attach", action="store_false", help="run plain, in this process")
    ap.add_argument("--switch", choices=("warm", "cold"), default="warm", help="phase switch kind (scheduled mode)")
    ap.add_argument("--out", default=None, help="write the result JSON here")
    ap.add_argument("--wait-for", default=None, metavar="PATH",
                    help="after admission, wait until PATH exists before the first phase (start barrier)")
    ap.add_argument("--wait-timeout-s", type=float, default=300.0)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--log-events", action="store_true", help="log runtime events (phase granted/done/failed)")
    return ap.parse_args(argv)


def on_event(event: dict) -> None:
    """Runtime hook: logs phase grants, completions and failures (progress events are frequent: skipped).

    In scheduled mode it runs where the phase runs (the pool worker's log)."""
    if event.get("event") != "progress":
        logging.getLogger("grpo_job").info("%s %s %s it=%s", event.get("job_id"), event.get("event"),
                                           event.get("phase", ""), event.get("iteration", ""))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.log_events:
        import rollmux

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        rollmux.runtime_hook(on_event)  # attached to the job created next
    from rollmux.config import ConfigError

    from examples.grpo.config import load_job_config

    try:
        cfg = load_job_config(args.config, iterations=args.iterations, seed=args.seed)
        if args.job_id:
            cfg = cfg.model_copy(update={"job": cfg.job.model_copy(update={"job_id": args.job_id})})
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # one compute thread per "GPU": OpenMP / MKL pools sized before torch starts them (Ray workers do the same)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(cfg.run.threads))
    from examples.grpo.job import run_job

    def show(m: dict) -> None:
        if not args.quiet:
            print(f"[{cfg.job.job_id}] it={m['iteration']:3d} reward={m['reward_mean']:.3f} "
                  f"loss={m['loss']:+.4f} len={m['response_len_mean']:.1f}", flush=True)

    def barrier() -> None:
        deadline = time.monotonic() + args.wait_timeout_s
        while not Path(args.wait_for).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"--wait-for {args.wait_for}: not created within {args.wait_timeout_s:.0f}s")
            time.sleep(0.05)

    result: dict = {"job_id": cfg.job.job_id, "config": str(args.config)}
    code = 0
    try:
        result.update(run_job(cfg, attach=args.attach, switch=args.switch, on_iteration=show,
                              ready=barrier if args.wait_for else None))
        result["ok"] = True
    except Exception as e:  # the phase API has reported the job failed and released its resources
        result.update(ok=False, error=f"{type(e).__name__}: {e}")
        print(f"error: job {cfg.job.job_id} failed: {result['error']}", file=sys.stderr)
        code = 1
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    if code == 0 and not args.quiet:
        print(f"[{cfg.job.job_id}] done: {result['iterations']} iterations, mode={result['mode']}, "
              f"reward {result['initial_reward']:.3f} -> {result['final_reward']:.3f}, wall {result['wall_s']:.1f}s")
    return code


if __name__ == "__main__":
    sys.exit(main())
