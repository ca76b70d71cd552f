#!/usr/bin/env bash
# GPU check for an offline host with one CUDA GPU (run from anywhere; works in the repository root).
#
#   bash scripts/gpu_check.sh --build-bundle             # here, where pip works: the wheel bundle (<= 64 MiB)
#   bash scripts/gpu_check.sh --dry-run --out DIR        # here (CPU): build the bundle, check it and the plan
#   bash scripts/gpu_check.sh --out DIR                  # on the GPU host: unpack the bundle, run the checks
#
# The host it is sized for: Python 3.12, torch 2.11 (CUDA 13), cupy-cuda13x 14.2, transformers 5.17,
# no pydantic / Ray / DeepSpeed / pyarrow / pandas / vLLM, no package index, <= 64 MiB brought along
# besides the repository. Copy the repository with its .cache/gpu_bundle/ (~53 MB: DeepSpeed built
# here as a wheel, pydantic and its parts, TRL + accelerate + datasets + pyarrow (slimmed) + pandas,
# ...; see scripts/gpu_bundle.py). Nothing is installed: the wheels the host lacks are unpacked into
# .cache/gpu_deps/ and put on PYTHONPATH with the repository, the host's torch and cupy are used, no
# check needs Ray. Each check runs in its own process with its own timeout (scripts/gpu_checks.py),
# deterministic algorithms on; a check whose packages are missing is NOT RUN (the others run); the
# ~1B DeepSpeed switch timing runs last and writes its stages as they end. Results go only to DIR
# (--out, or $GPU_CHECK_OUT; required): DIR/gpu_check.json (rewritten after every check) and one
# gpu_check_<name>.json per check. The last line is "ok" (exit 0) or "not ok: <failed>", then
# "; NOT RUN: <checks>" when any did not run. < 8 minutes.
# Options: --bundle DIR (default .cache/gpu_bundle, env GPU_CHECK_BUNDLE), --checks a,b (a subset),
# env PYTHON (the interpreter; default python3, or .venv/bin/python for --dry-run / --build-bundle),
# env GPU_CHECK_TMP (where the ~1B checkpoint is written; ~16 GB).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DRY=0; BUILD=0; ARGS=()
OUT="${GPU_CHECK_OUT:-}"
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
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$OUT" ] && [ "$BUILD" = 0 ]; then
  echo "gpu_check.sh: --out DIR (or GPU_CHECK_OUT) is required: the results go where you say" >&2
  exit 2
fi
if [ "$DRY" = 1 ] || [ "$BUILD" = 1 ]; then
  PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
  # (a fresh clone has no .cache/: the log's folder must exist before the redirection)
  mkdir -p "$(dirname "$BUNDLE")"
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
PYTHONPATH=. exec timeout 560 "$PY" scripts/gpu_check.py --bundle "$BUNDLE" --out "$OUT" "${ARGS[@]+"${ARGS[@]}"}"
