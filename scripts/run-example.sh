#!/usr/bin/env bash
# Sets up if needed, then runs the example job: data-parallel SGD of a linear model
# (examples/train_linear, libddp's CPU all-reduce) on 4 workers under ddprun.
#   scripts/run-example.sh            extra arguments go to train_linear
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x build/bin/ddprun ] || [ ! -x build/bin/train_linear ]; then
  scripts/setup.sh
fi
exec build/bin/ddprun --standalone --nproc-per-node 4 build/bin/train_linear "$@"
