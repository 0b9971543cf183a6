#!/usr/bin/env bash
# Sets up if needed, then runs the whole suite with ctest; exits non-zero on any failure.
#   scripts/test.sh                 everything (GPU tests skip cleanly without a GPU)
#   scripts/test.sh -L gpu          only the tests labelled gpu (extra args go to ctest)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# PyTorch 2.x for the *.torch2 tests: built once per machine, then cached (root only; without
# it those tests are reported as skipped).
if [[ $(id -u) -eq 0 ]]; then
  scripts/torch2-chroot.sh >/dev/null
else
  echo "test.sh: not root: no torch 2.x chroot, the *.torch2 tests will be skipped" >&2
fi
cd build
ctest --output-on-failure --timeout 300 -j "$(nproc)" "$@"
