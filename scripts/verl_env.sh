#!/usr/bin/env bash
# Create (once) the separate verl environment at .venv-verl (never the project's .venv: verl 0.9.1
# pins transformers >= 5.5.3, < 5.11; with the CPU build of torch 2.13 it is ~2.1 GB, about two
# minutes from a warm cache). verl imports on CPU but cannot train without GPUs;
# tests/test_verl_integration.py imports the adapter there against verl's real classes. Prints the
# Python to use (export ROLLMUX_VERL_PYTHON=<it> to point the tests at another environment).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv-verl/bin/python ]; then
  "$PY" -m venv .venv-verl
fi
.venv-verl/bin/python -c "import verl, sys; sys.exit(0 if verl.__version__ == '0.9.1' else 1)" 2>/dev/null \
  || .venv-verl/bin/python -m pip install -q "torch==2.13.0" "verl[verl-core]==0.9.1"
echo "$PWD/.venv-verl/bin/python"
