#!/usr/bin/env bash
# Set up (once) and run the whole test suite. GPU tests are skipped visibly where no GPU exists.
# With no arguments the vLLM tests follow in their own environment (scripts/test_vllm.sh); paths
# under tests/vllm_cpu/ go there too.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
case "${1:-}" in tests/vllm_cpu*) exec bash scripts/test_vllm.sh "$@" ;; esac
[ $# -gt 0 ] && exec .venv/bin/python -m pytest -q "$@"
set +e
.venv/bin/python -m pytest -q; rc=$?
bash scripts/test_vllm.sh || rc=$((rc ? rc : 1))
exit $rc
