#!/usr/bin/env bash
# The whole suite N times in a row (default 3) with two CPU hogs running beside it: no
# test's verdict may depend on how loaded or slow the machine is (README, "Tests").
#   scripts/stress-test.sh [N] [ctest args...]      (or: scripts/test.sh --stress ...)
# The hogs are Debian's stress-ng --cpu 2 (installed on demand), else two shell busy
# loops. Each runs in its own process group, which is stopped however this script ends.
# It stops at the first run that fails, and saves the output of the tests that failed in
# build/stress-failed-<time>.log (a later ctest run rewrites ctest's own record of it).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  runs=$1
  shift
fi

scripts/setup.sh  # build before the hogs start
if ! command -v stress-ng >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "stress: installing stress-ng" >&2
  (export DEBIAN_FRONTEND=noninteractive
   $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq --no-install-recommends stress-ng >/dev/null) ||
    echo "stress: stress-ng unavailable: two busy loops instead" >&2
fi

hogs=()
stop_hogs() {
  for g in ${hogs[@]+"${hogs[@]}"}; do kill -TERM -- "-$g" 2>/dev/null || true; done
  for g in ${hogs[@]+"${hogs[@]}"}; do wait "$g" 2>/dev/null || true; done
  hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT
trap 'stop_hogs; exit 143' TERM
# setsid: a background child of this script is no group leader, so setsid makes it one
# without forking, and $! is the id of its process group.
if command -v stress-ng >/dev/null; then
  setsid stress-ng --cpu 2 --quiet &
  hogs+=($!)
  echo "stress: stress-ng --cpu 2 (process group $!)"
else
  for _ in 1 2; do
    setsid sh -c 'while :; do :; done' &
    hogs+=($!)
  done
  echo "stress: two busy loops (process groups ${hogs[*]})"
fi

# The output of the tests that failed in the run that just ended, from ctest's record of
# every test's output (build/Testing/Temporary/LastTest.log, which the next run rewrites),
# into build/stress-failed-<time>.log.
save_failed_output() {
  local dir=build/Testing/Temporary out
  out="build/stress-failed-$(date +%Y%m%d-%H%M%S).log"
  if [ ! "$dir/LastTestsFailed.log" -nt "$stamp" ] || [ ! -f "$dir/LastTest.log" ]; then
    echo "stress: no test failed (the build or the set-up did): see the output above" >&2
    return
  fi
  awk 'NR == FNR { n = $0; sub(/^[0-9]+:/, "", n); failed[n] = 1; next }
       /^[0-9]+\/[0-9]+ Testing: / { n = $0; sub(/^[0-9]+\/[0-9]+ Testing: /, "", n); keep = (n in failed) }
       keep { print }
       keep && /^".*" time elapsed:/ { keep = 0; print "" }' "$dir/LastTestsFailed.log" "$dir/LastTest.log" >"$out"
  echo "stress: the failed tests ($(paste -sd' ' "$dir/LastTestsFailed.log")) and their output: $out" >&2
}

stamp=$(mktemp)
trap 'stop_hogs; rm -f "$stamp"' EXIT
times=()
for ((i = 1; i <= runs; i++)); do
  t0=$(date +%s)
  touch "$stamp"
  if ! scripts/test.sh "$@"; then
    echo "stress: run $i of $runs FAILED after $(($(date +%s) - t0)) s (passed before: ${times[*]:-none})" >&2
    save_failed_output
    exit 1
  fi
  times+=("$(($(date +%s) - t0))s")
  echo "stress: run $i of $runs passed in ${times[-1]}"
done
echo "stress: $runs of $runs runs passed beside two CPU hogs; wall times: ${times[*]}"
