#!/usr/bin/env bash
# GPU check for an offline host with one CUDA GPU (run from anywhere; works in the repository root).
#
#   bash scripts/gpu_check.sh --build-bundle        # here, where pip works: the wheel bundle (<= 32 MB)
#   bash scripts/gpu_check.sh --dry-run [--out DIR] # here (CPU): build the bundle, check it and the plan
#   bash scripts/gpu_check.sh [--out DIR]           # on the GPU host: unpack the bundle, run the checks
#
# The host it is sized for: Python 3.12, torch 2.11 (CUDA 13), cupy-cuda13x 14.2, transformers 5.17,
# no pydantic / Ray / DeepSpeed / vLLM, no package index. Copy the repository with its
# .cache/gpu_bundle/ (8 MB: DeepSpeed built here as a wheel, pydantic and its parts, hjson, msgpack,
# ninja, psutil, py-cpuinfo, einops, TRL + accelerate + datasets; see scripts/gpu_bundle.py). Nothing
# is installed: the wheels the host lacks are unpacked into .cache/gpu_deps/ and put on PYTHONPATH
# with the repository (no project install), the host's torch and cupy are used, no check needs Ray.
# Each check runs in its own process with its own timeout (scripts/gpu_checks.py): the env probe,
# DeepSpeed ZeRO-2 on CUDA with offload/reload and the warm vs cold switch times of a ~1B model,
# the HF rollout backend, the TRL adapter (bit-identical to plain TRL), a one-rank cupy-NCCL smoke
# test; vLLM (not installable offline) and two-GPU NCCL are NOT RUN with the reason. Results:
# DIR/gpu_check.json (+ one gpu_check_<name>.json per check); DIR from --out, else $GPU_CHECK_OUT,
# else results/. Prints "ok" (exit 0) only when every planned check ran and passed; < 5 minutes.
# Options: --bundle DIR (default .cache/gpu_bundle, env GPU_CHECK_BUNDLE), --checks a,b (a subset),
# env PYTHON (the interpreter; default python3, or .venv/bin/python for --dry-run / --build-bundle).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DRY=0; BUILD=0; ARGS=()
OUT="${GPU_CHECK_OUT:-results}"
BUNDLE="${GPU_CHECK_BUNDLE:-.cache/gpu_bundle}"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --build-bundle) BUILD=1 ;;
    --out) OUT="$2"; shift ;;
    --out=*) OUT="${1#*=}" ;;
    --bundle) BUNDLE="$2"; shift ;;
    --bundle=*) BUNDLE="${1#*=}" ;;
    --checks) ARGS+=(--checks "$2"); shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$DRY" = 1 ] || [ "$BUILD" = 1 ]; then
  PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
  if ! timeout 900 "$PY" scripts/gpu_bundle.py build "$BUNDLE" > "$BUNDLE.build.log" 2>&1; then
    echo "gpu_check.sh: building the wheel bundle failed (needs pip and a package index): see $BUNDLE.build.log" >&2
    tail -5 "$BUNDLE.build.log" >&2
    exit 3
  fi
  if [ "$DRY" = 0 ]; then
    "$PY" scripts/gpu_bundle.py check "$BUNDLE"
    exit $?
  fi
  PYTHONPATH=. exec timeout 600 "$PY" scripts/gpu_check.py --dry-run --bundle "$BUNDLE" --out "$OUT"
fi
PY="${PYTHON:-python3}"
PYTHONPATH=. exec timeout 330 "$PY" scripts/gpu_check.py --bundle "$BUNDLE" --out "$OUT" "${ARGS[@]+"${ARGS[@]}"}"
