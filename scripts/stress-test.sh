#!/usr/bin/env bash
# The whole suite N times in a row (default 3) with two CPU hogs running beside it: no
# test's verdict may depend on how loaded or slow the machine is (README, "Tests").
#   scripts/stress-test.sh [N] [ctest args...]      (or: scripts/test.sh --stress ...)
# The hogs are Debian's stress-ng --cpu 2 (installed on demand), else two shell busy
# loops. Each runs in its own process group, which is stopped however this script ends.
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

times=()
for ((i = 1; i <= runs; i++)); do
  t0=$(date +%s)
  if ! scripts/test.sh "$@"; then
    echo "stress: run $i of $runs FAILED after $(($(date +%s) - t0)) s (passed before: ${times[*]:-none})" >&2
    exit 1
  fi
  times+=("$(($(date +%s) - t0))s")
  echo "stress: run $i of $runs passed in ${times[-1]}"
done
echo "stress: $runs of $runs runs passed beside two CPU hogs; wall times: ${times[*]}"
