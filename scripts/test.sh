#!/usr/bin/env bash
# Sets up if needed, then runs the whole suite with ctest; exits non-zero on any failure.
#   scripts/test.sh                 everything (GPU tests skip cleanly without a GPU)
#   scripts/test.sh -L gpu          only the tests labelled gpu (extra args go to ctest)
#   scripts/test.sh --stress [N]    the whole suite N times (3) beside two CPU hogs
#                                   (scripts/stress-test.sh; extra args go to ctest)
#   DDP_TEST_TIMEOUT_SCALE=3 scripts/test.sh
#                                   every hang guard in the tests three times as long
#                                   (a slow machine; README, "Tests")
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--stress" ]; then
  shift
  exec scripts/stress-test.sh "$@"
fi
scale="${DDP_TEST_TIMEOUT_SCALE:-}"
if [ -n "$scale" ] && ! [[ "$scale" =~ ^[0-9]*\.?[0-9]*$ && "$scale" =~ [1-9] ]]; then
  echo "scripts/test.sh: DDP_TEST_TIMEOUT_SCALE='$scale': expected a positive number such as 2 or 1.5" >&2
  exit 2
fi
# ctest's per-test TIMEOUT limits take the factor at configure time (tests/CMakeLists.txt):
# configure again when it differs from this run's.
if [ -f build/CMakeCache.txt ] &&
   [ "$(sed -n 's/^DDP_TEST_TIMEOUT_SCALE:STRING=//p' build/CMakeCache.txt)" != "$scale" ]; then
  cmake build -DDDP_TEST_TIMEOUT_SCALE="$scale" >/dev/null
fi
scripts/setup.sh
timeout=$(awk -v s="${scale:-1}" 'BEGIN { t = 300 * s; printf "%d", (t == int(t)) ? t : int(t) + 1 }')

# PyTorch 2.x for the *.torch2 tests: built once per machine, then cached (root only; without
# it those tests are reported as skipped).
if [[ $(id -u) -eq 0 ]]; then
  scripts/torch2-chroot.sh >/dev/null
else
  echo "test.sh: not root: no torch 2.x chroot, the *.torch2 tests will be skipped" >&2
fi
cd build
# Two tests more than cores: many tests mostly wait on timers (Slurm's scheduler, etcd's
# leases, hang guards), and the tests that need the CPU reserve it (PROCESSORS 2, RUN_SERIAL).
# At one more than cores the 2-core CI kept its cores 56-62% busy. --stress runs this same
# command beside two CPU hogs.
ctest --output-on-failure --timeout "$timeout" -j "$(( $(nproc) + 2 ))" "$@"
