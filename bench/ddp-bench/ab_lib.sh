#!/bin/bash
# Two builds of libddp, interleaved, on the same ddp-bench command: the median time (us)
# per message size of each, and NEW / OLD.
#
#   bench/ddp-bench/ab_lib.sh OLD_LIB_DIR NEW_LIB_DIR RUNS ddp-bench-args...
#   e.g. bench/ddp-bench/ab_lib.sh /tmp/old/lib build/lib 7 --spawn 2 -b 4 -e 64K -f 16 --iters 3000
#
# Each LIB_DIR holds a libddp.so.0 (copy build/lib's before and after a change); it is put
# first on LD_LIBRARY_PATH, ahead of build/bin/ddp-bench's RUNPATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench="$here/../../build/bin/ddp-bench"
old=$1 new=$2 runs=$3
shift 3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$runs"); do
  for which in old new; do
    dir=$old
    [ "$which" = new ] && dir=$new
    LD_LIBRARY_PATH="$dir" timeout 600 "$bench" "$@" 2>&1 | awk -v w="$which" '/^ +[0-9]/{print w, $1, $4}' >> "$out"
  done
done
/usr/bin/env python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    which, size, t = line.split()
    d[(int(size), which)].append(float(t))
print("| bytes | old (us) | new (us) | new / old |\n|---|---|---|---|")
for size in sorted({k[0] for k in d}):
    o, n = statistics.median(d[(size, "old")]), statistics.median(d[(size, "new")])
    print(f"| {size} | {o:.2f} | {n:.2f} | {n / o:.2f}x |")
PY
