#!/usr/bin/env bash
# Store benchmarks, ddprun's store server against PyTorch 1.13's, in one run:
#   1. store-load: N clients connect, ADD a counter, WAIT for a release key the last one
#      SETs (time until all released; lower is better). N = 64, 1024, 4096. Also the CPU
#      time the server process spent on the run (all its threads; torch's server runs in a
#      python process whose main thread sleeps).
#   2. ../shared/anchors/tcpstore_bench.py: PyTorch's own client processes doing set+get
#      (ops/s; higher is better).
# Each measurement is repeated REPS times (default 3), interleaving the servers; the table
# shows medians and ratios.
#
#   bench/store/run.sh [BUILD_DIR]        (default: build; needs store-load, ddp-store-server)
#   REPS=5 CLIENTS="64 4096" bench/store/run.sh build-store
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
reps=${REPS:-3}
clients=${CLIENTS:-"64 1024 4096"}
py=/usr/bin/python3
anchor=${ANCHOR:-$root/../shared/anchors/tcpstore_bench.py}
load=$build/bin/store-load
server=$build/bin/ddp-store-server
for f in "$load" "$server" "$anchor"; do
  [ -e "$f" ] || { echo "run.sh: missing $f (build the store-load and ddp-store-server targets)" >&2; exit 1; }
done

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

wait_port() {  # FILE -> prints the N of its "port=N" line
  for _ in $(seq 1 200); do
    if grep -q '^port=' "$1" 2>/dev/null; then sed -n 's/^port=//p' "$1" | head -1; return; fi
    sleep 0.05
  done
  echo "run.sh: no port=N line in $1" >&2; exit 1
}

"$server" --host 127.0.0.1 >"$tmp/ddp.out" 2>"$tmp/ddp.err" &
ddp_pid=$!
pids+=($!)
"$py" -c '
import datetime, time, torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=300), wait_for_workers=False)
print("port=%d" % s.port, flush=True)
time.sleep(1e9)' >"$tmp/torch.out" 2>"$tmp/torch.err" &
torch_pid=$!
pids+=($!)
ddp_port=$(wait_port "$tmp/ddp.out")
torch_port=$(wait_port "$tmp/torch.out")

cpu_ns() {  # PID -> on-CPU nanoseconds of all its threads
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s+=$1} END {printf "%.0f\n", s}'
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "fail"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a=="fail"||b=="fail"||b==0) print "n/a"; else printf "%.1fx", a/b}'; }

declare -A res cpu
echo "# store-load (ddp :$ddp_port, torch :$torch_port), $reps repetitions" >&2
for n in $clients; do
  for r in $(seq 1 "$reps"); do
    for target in torch1 ddp1 ddp2; do
      case $target in
        torch1) port=$torch_port gen=1 pid=$torch_pid ;;
        ddp1) port=$ddp_port gen=1 pid=$ddp_pid ;;
        ddp2) port=$ddp_port gen=2 pid=$ddp_pid ;;
      esac
      c0=$(cpu_ns "$pid")
      line=$("$load" --gen "$gen" --host 127.0.0.1 --port "$port" --clients "$n" --timeout-s 120 2>&1 || true)
      c1=$(cpu_ns "$pid")
      cpu_ms=$(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.1f", (b-a)/1e6}')
      echo "  $target n=$n: $line server_cpu_ms=$cpu_ms" >&2
      ms=$(sed -n 's/.*total_ms=\([0-9.]*\).*/\1/p' <<<"$line")
      if [ -n "$ms" ]; then
        echo "$ms" >>"$tmp/load-$target-$n"
        echo "$cpu_ms" >>"$tmp/cpu-$target-$n"
      fi
      sleep 0.2
    done
  done
  for target in torch1 ddp1 ddp2; do
    res[$target-$n]=$(median <"$tmp/load-$target-$n" 2>/dev/null || echo fail)
    cpu[$target-$n]=$(median <"$tmp/cpu-$target-$n" 2>/dev/null || echo fail)
  done
done

echo "# tcpstore_bench.py (16 PyTorch client processes, set+get), $reps repetitions" >&2
for r in $(seq 1 "$reps"); do
  t=$("$py" "$anchor" 2>&1 | tail -1)
  echo "  torch: $t" >&2
  sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1/p' <<<"$t" >>"$tmp/anchor-torch"
  d=$("$py" "$anchor" --connect "127.0.0.1:$ddp_port" 2>&1 | tail -1)
  echo "  ddp:   $d" >&2
  sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1/p' <<<"$d" >>"$tmp/anchor-ddp"
done
anchor_torch=$(median <"$tmp/anchor-torch")
anchor_ddp=$(median <"$tmp/anchor-ddp")

echo
echo "| benchmark | PyTorch 1.13 server | ddp-store-server | ddp vs torch | server CPU ms, torch | server CPU ms, ddp | CPU ratio |"
echo "|---|---|---|---|---|---|---|"
for n in $clients; do
  echo "| store-load, $n clients, gen 1: all released (ms) | ${res[torch1-$n]} | ${res[ddp1-$n]} | $(ratio "${res[torch1-$n]}" "${res[ddp1-$n]}") faster | ${cpu[torch1-$n]} | ${cpu[ddp1-$n]} | $(ratio "${cpu[torch1-$n]}" "${cpu[ddp1-$n]}") less |"
  echo "| store-load, $n clients, gen 2: all released (ms) | (torch 1.13: gen 1 only) | ${res[ddp2-$n]} | $(ratio "${res[torch1-$n]}" "${res[ddp2-$n]}") faster | | ${cpu[ddp2-$n]} | $(ratio "${cpu[torch1-$n]}" "${cpu[ddp2-$n]}") less |"
done
echo "| tcpstore_bench.py, 16 torch clients (set+get ops/s) | $anchor_torch | $anchor_ddp | $(ratio "$anchor_ddp" "$anchor_torch") | | | |"
echo
echo "Medians of $reps runs; $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)."
