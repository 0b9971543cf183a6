#!/usr/bin/env bash
# The etcd backend's primitives (state CAS, append, add, watch wake-up, a round of N agents,
# lease ends) on a fresh etcd member that the benchmark starts on a free loopback port, next
# to ddprun's TCP store in the same run. Prints a markdown table (medians, p90, ratios).
#   bench/etcd/run.sh [BUILD_DIR] [-- etcd-bench args: --reps 200 --agents 8,64 --members 1]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
shift || true
[ "${1:-}" = "--" ] && shift
bin=$build/bin/etcd-bench
[ -x "$bin" ] || { echo "run.sh: missing $bin (build the etcd-bench target)" >&2; exit 1; }
command -v etcd >/dev/null || { echo "run.sh: no etcd (apt-get install etcd-server)" >&2; exit 1; }
exec "$bin" "$@"
