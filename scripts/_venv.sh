# Sourced by quickstart.sh and test.sh: create (once) and reuse the virtual environment at .venv.
# Re-installs only when pyproject.toml changes (stamp holds its hash).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[rollmux] creating virtual environment at .venv"
  "$PY" -m venv .venv
fi
STAMP=.venv/.rollmux-installed
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[rollmux] installing dependencies into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # pip byte-compiles what it installs (~70 s of one core): keep it. Where PYTHONDONTWRITEBYTECODE is
  # set (as on this project's hosts) nothing else writes .pyc files, and every Ray worker and test
  # subprocess would compile its imports again (a full suite ran 1,374 s instead of about 1,000).
  # The CPU build of torch first: a bare 'torch' requirement would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q "torch>=2.3,<=2.14.1" --index-url https://download.pytorch.org/whl/cpu
  .venv/bin/python -m pip install -q -e ".[dev,trl]"
  # DeepSpeed (a main dependency) JIT-builds a shared-memory comm op on CPU with ninja (installed
  # above) and a C++ compiler: say so now rather than at the first DeepSpeed job.
  command -v "${CXX:-c++}" >/dev/null 2>&1 || echo "[rollmux] warning: no C++ compiler (c++/g++): DeepSpeed jobs on CPU need one (e.g. apt-get install g++)" >&2
  echo "$WANT" > "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
# Local clusters started by our scripts and tests run in Ray's token mode with a fresh token each
# (actors.ops.local_cluster.use_ephemeral_ray_token) unless RAY_AUTH_MODE is set; `rollmux up` too.
export RAY_USAGE_STATS_ENABLED=0
