#!/usr/bin/env bash
# Set up (once) and run the whole test suite. GPU tests are skipped visibly where no GPU exists.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec .venv/bin/python -m pytest -q "$@"
