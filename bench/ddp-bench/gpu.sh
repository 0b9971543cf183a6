#!/usr/bin/env bash
# On a machine with a GPU: libddp's NCCL all_reduce (ddp-bench under ddprun, world size 1)
# against a bare ncclAllReduce loop (nccl-raw-bench), same sizes, same run; prints the
# per-call overhead. Target: at most 2% at 1 MiB and above.
#   bench/ddp-bench/gpu.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${1:-build}
args=(-b 1K -e 256M -f 4)
for i in 1 2 3; do
  "$b/bin/nccl-raw-bench" "${args[@]}" -n 50 > "/tmp/ddp-gpu-raw.$i"
  "$b/bin/ddprun" --standalone --nproc-per-node 1 "$b/bin/ddp-bench" --backend nccl "${args[@]}" -n 50 -c 0 \
    2>/dev/null | sed 's/^\[rank0\]://' > "/tmp/ddp-gpu-ddp.$i"
done
/usr/bin/env python3 - <<'PY'
import statistics
def load(kind):
    runs = []
    for i in (1, 2, 3):
        d = {}
        for line in open(f"/tmp/ddp-gpu-{kind}.{i}"):
            if line.startswith("#") or not line.strip():
                continue
            f = line.split()
            d[int(f[0])] = float(f[3] if kind == "ddp" else f[2])
        runs.append(d)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}
raw, ddp = load("raw"), load("ddp")
print("| bytes | raw ncclAllReduce (us) | ddp all_reduce (us) | overhead |")
print("|---|---|---|---|")
for k in sorted(raw):
    if k in ddp:
        print(f"| {k} | {raw[k]:.2f} | {ddp[k]:.2f} | {100 * (ddp[k] / raw[k] - 1):+.1f}% |")
PY
