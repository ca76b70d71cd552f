#!/usr/bin/env bash
# Set up (once) and run the main job on a fresh machine:
#  1. replay a window of the real Microsoft Philly trace through all seven policies
#     (rollmux, solo-d, colocated, gavel+, random, most-idle, optimal) and print the table;
#  2. run the local Ray demo: three tiny GRPO jobs co-executed in one group vs solo.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
# rich tables: full width also when the output is piped to a file
export COLUMNS="${COLUMNS:-160}"
# the full Philly job log shipped in data/ (82,247 jobs, gzip); ROLLMUX_TRACE replays another file
TRACE="${ROLLMUX_TRACE:-$ROOT/data/philly-adaptdl-philly.csv.gz}"
echo "[rollmux] 1/2 trace replay: $TRACE"
rollmux simulate --trace "$TRACE" --mix mixed \
  --policies rollmux,solo-d,colocated,gavel+,random,most-idle,optimal \
  --seed 0 --out results/sim "$@"
echo "[rollmux] 2/2 local Ray runtime demo (three tiny GRPO jobs, co-executed vs solo)"
python scripts/demo_runtime.py --quick
