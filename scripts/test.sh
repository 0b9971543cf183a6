#!/usr/bin/env bash
# Sets up if needed, then runs the whole suite with ctest; exits non-zero on any failure.
#   scripts/test.sh                 everything (GPU tests skip cleanly without a GPU)
#   scripts/test.sh -L gpu          only the tests labelled gpu (extra args go to ctest)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure --timeout 300 -j "$(nproc)" "$@"
