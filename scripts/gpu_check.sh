#!/usr/bin/env bash
# GPU check for a machine with one CUDA GPU (run from the repository root):
#   1. installs the `gpu` extra (vLLM, CuPy for CUDA 13) into the active Python environment;
#   2. runs the GPU-marked tests (vLLM sleep/wake + weight update through the worker extension,
#      DeepSpeed ZeRO on CUDA with offload_states/reload_states, cupy-NCCL sync executor, HF/torch
#      on CUDA), writing results/gpu_check_pytest.xml;
#   3. co-executes two tiny GRPO jobs on vLLM + DeepSpeed under RollMux and compares the first job's
#      weights (SHA-256, every iteration) with the same job solo: results/gpu_check_coexec.json.
# Writes results/gpu_check.json: {"install_rc", "pytest_rc", "coexec_rc", "nvidia_smi"}.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
mkdir -p results
"$PY" -m pip install -q -e ".[gpu,dev]"; install_rc=$?
"$PY" -m pytest -q -m gpu --junitxml=results/gpu_check_pytest.xml tests; pytest_rc=$?
"$PY" scripts/gpu_coexec.py --out results/gpu_check_coexec.json; coexec_rc=$?
smi=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
"$PY" - "$install_rc" "$pytest_rc" "$coexec_rc" "$smi" <<'PYEOF'
import json, sys
rc = dict(zip(("install_rc", "pytest_rc", "coexec_rc"), map(int, sys.argv[1:4])))
json.dump({**rc, "nvidia_smi": sys.argv[4], "ok": not any(rc.values())}, open("results/gpu_check.json", "w"), indent=2)
print(json.dumps(rc))
PYEOF
[ "$install_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ] && [ "$coexec_rc" -eq 0 ]
