#!/usr/bin/env bash
# ddp-bench (libddp CPU all_reduce, float32 sum) against the gloo anchor, 2 and 4 ranks, in
# one run so that both see the same machine load. Runs are interleaved and repeated; the
# summary gives per-size medians and the ratios recorded in docs/benchmarks-collectives.md.
#
#   bench/ddp-bench/run.sh [REPEATS]          (default 3)
#   BUILD=build-coll bench/ddp-bench/run.sh   (another build dir)
#   DDP_LAUNCHER=ddprun bench/ddp-bench/run.sh  (launch with build/bin/ddprun instead of
#                                                ddp-bench --spawn, which forks the ranks)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
REPEATS=${1:-3}
ANCHORS=${ANCHORS:-$(pwd)/../shared/anchors}
BENCH=$BUILD/bin/ddp-bench
[ -x "$BENCH" ] || { echo "run.sh: $BENCH not built (cmake --build $BUILD)" >&2; exit 1; }

launch() {
  local n=$1
  shift
  if [ "${DDP_LAUNCHER:-spawn}" = ddprun ]; then
    "$BUILD/bin/ddprun" --standalone --nproc-per-node "$n" "$BENCH" "$@" 2>/dev/null | sed 's/^\[rank0\]://'
  else
    "$BENCH" --spawn "$n" "$@"
  fi
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for n in 2 4; do
  for i in $(seq "$REPEATS"); do
    launch "$n" -b 1K -e 64M -f 4 --iters 20 --warmup 5 >"$out/ddp.$n.$i"
    /usr/bin/python3 "$ANCHORS/gloo_allreduce_bench.py" "$n" >"$out/gloo.$n.$i"
  done
done

/usr/bin/python3 - "$out" "$REPEATS" <<'PY'
import statistics, sys, glob, re
out, reps = sys.argv[1], int(sys.argv[2])
def ddp(n):
    rows = {}
    for f in glob.glob(f"{out}/ddp.{n}.*"):
        for line in open(f):
            if line.startswith("#") or not line.strip(): continue
            p = line.split()
            rows.setdefault(int(p[0]), []).append((float(p[3]), float(p[5]), int(p[6])))
    return rows
def gloo(n):
    rows = {}
    for f in glob.glob(f"{out}/gloo.{n}.*"):
        for line in open(f):
            m = re.search(r"bytes=\s*(\d+) time_us=\s*([\d.]+).*busbw=\s*([\d.]+)", line)
            if m: rows.setdefault(int(m[1]), []).append((float(m[2]), float(m[3])))
    return rows
print(f"medians of {reps} interleaved runs; float32 sum; busbw = algbw * 2(n-1)/n")
print("ratio = gloo time / ddp time (= ddp busbw / gloo busbw at equal size and ranks)")
print("| ranks | bytes | ddp time (us) | ddp busbw (GB/s) | gloo time (us) | gloo busbw (GB/s) | ratio | wrong |")
print("|---|---|---|---|---|---|---|---|")
for n in (2, 4):
    d, g = ddp(n), gloo(n)
    for b in sorted(d):
        dt = statistics.median(x[0] for x in d[b]); dbw = statistics.median(x[1] for x in d[b])
        wrong = sum(x[2] for x in d[b])
        if b in g:
            gt = statistics.median(x[0] for x in g[b]); gbw = statistics.median(x[1] for x in g[b])
            print(f"| {n} | {b} | {dt:.1f} | {dbw:.3f} | {gt:.1f} | {gbw:.3f} | {gt/dt:.1f}x | {wrong} |")
        else:
            print(f"| {n} | {b} | {dt:.1f} | {dbw:.3f} | | | | {wrong} |")
PY
