#!/usr/bin/env bash
# Create (once) the separate vLLM environment at .venv-vllm (never the project's .venv: vLLM 0.33
# brings torch 2.14 built for CUDA 13, ~9 GB installed, and pins transformers < 5.21). On a CPU
# machine it installs too; its vllm.v1.serial_utils runs on CPU, which is what
# tests/test_weight_payload.py checks the weight payload against. Prints the Python to use
# (export ROLLMUX_VLLM_PYTHON=<it> to point the tests at another environment).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv-vllm/bin/python ]; then
  "$PY" -m venv .venv-vllm
fi
.venv-vllm/bin/python -c "import vllm, sys; sys.exit(0 if vllm.__version__.startswith('0.33.') else 1)" 2>/dev/null \
  || .venv-vllm/bin/python -m pip install -q "vllm==0.33.*"
echo "$PWD/.venv-vllm/bin/python"
