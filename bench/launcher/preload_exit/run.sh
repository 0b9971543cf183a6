#!/bin/bash
# How long a --preload torch job takes to end after its 2 workers' last line: from each
# script's last statement (a stamp it writes) to ddprun's exit, 5 runs. The script imports
# stdlib modules the warm process did not (released at the worker's exit since the
# preload fixes of 2026-12-06) and leaves a log file open.
# Usage: bench/launcher/preload_exit/run.sh DDPRUN [RUNS]   (PYTHON_EXEC defaults to /usr/bin/python3)
set -eu
ddprun=$1 runs=${2:-5} here=$(cd "$(dirname "$0")" && pwd) dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
for ((i = 0; i < runs; i++)); do
  rm -f "$dir"/t_* "$dir"/log_*
  "$ddprun" --standalone --nproc-per-node 2 --preload torch "$here/script.py" "$dir" > /dev/null 2>&1
  end=$("$PYTHON_EXEC" -c 'import time; print(time.time())')
  "$PYTHON_EXEC" -c "
import sys
d, end = sys.argv[1], float(sys.argv[2])
t = max(float(open(f'{d}/t_{r}').read()) for r in (0, 1))
print(f'{(end - t) * 1000:.0f} ms; log bytes', [len(open(f'{d}/log_{r}').read()) for r in (0, 1)])" "$dir" "$end"
done
