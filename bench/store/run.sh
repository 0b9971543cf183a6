#!/usr/bin/env bash
# Store benchmarks, ddprun's store server against PyTorch 1.13's and 2.6's, in one run:
#   1. store-load: N clients connect, ADD a counter, WAIT for a release key the last one
#      SETs (time until all released; lower is better). N = 64, 1024, 4096. Also the CPU
#      time the server process spent on the run (all its threads; torch's server runs in a
#      python process whose main thread sleeps). Generation 1 against torch 1.13's server,
#      generation 2 against torch 2.6's.
#   2. ../shared/anchors/tcpstore_bench.py: PyTorch's own client processes doing set+get
#      (ops/s; higher is better), torch 1.13's clients and torch 2.6's.
#   3. First contact: the same store-load barrier, but each measurement against a server
#      started for it (nothing accepted before): N clients (FRESH_CLIENTS, default 4096 and
#      16000) connect at once, so the listen backlog decides whether SYNs are dropped and
#      retried after 1 s. Servers are started before the clock starts; only store-load is
#      timed. Clients come from 127.0.0.1 .. 127.0.0.K, K = ceil(N / 8000) (store-load
#      --sources: one address leaves connect() about 14k quick ports). A run gives up after
#      FRESH_TIMEOUT_S (60); a failed one is left out of the median ("fail" if all failed).
# torch 2.6 is Debian 13's, in the chroot of scripts/torch2-chroot.sh (tests/torch2/python3;
# root): its server there is the legacy one (no libuv in Debian's build, see
# tests/torch2/nolibuv/sitecustomize.py). Without the chroot those columns are skipped.
# Each measurement is repeated REPS times (default 3), interleaving the servers; the tables
# show medians and ratios.
#
#   bench/store/run.sh [BUILD_DIR]        (default: build; needs store-load, ddp-store-server)
#   REPS=5 CLIENTS="64 4096" bench/store/run.sh build-store
#   TORCH2=0 bench/store/run.sh           (torch 1.13 only)
#   PARTS=fresh FRESH_CLIENTS="4096 16000" bench/store/run.sh build   (first contact only;
#                                          PARTS is any of "load anchor fresh", default all)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
reps=${REPS:-3}
clients=${CLIENTS:-"64 1024 4096"}
fresh_clients=${FRESH_CLIENTS:-"4096 16000"}
parts=" ${PARTS:-load anchor fresh} "
py=/usr/bin/python3
anchor=${ANCHOR:-$root/../shared/anchors/tcpstore_bench.py}
load=$build/bin/store-load
server=$build/bin/ddp-store-server
for f in "$load" "$server" "$anchor"; do
  [ -e "$f" ] || { echo "run.sh: missing $f (build the store-load and ddp-store-server targets)" >&2; exit 1; }
done

tmp=$(mktemp -d)
pids=()
fresh_pid=""
cleanup() {
  for p in "${pids[@]}" $fresh_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

wait_port() {  # FILE -> prints the N of its "port=N" line (a torch server imports torch first)
  for _ in $(seq 1 1200); do
    if grep -q '^port=' "$1" 2>/dev/null; then sed -n 's/^port=//p' "$1" | head -1; return; fi
    sleep 0.05
  done
  echo "run.sh: no port=N line in $1" >&2; exit 1
}

"$server" --host 127.0.0.1 >"$tmp/ddp.out" 2>"$tmp/ddp.err" &
ddp_pid=$!
pids+=($!)
torch_server='
import datetime, time, torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=300), wait_for_workers=False)
print("port=%d" % s.port, flush=True)
time.sleep(1e9)'
"$py" -c "$torch_server" >"$tmp/torch.out" 2>"$tmp/torch.err" &
torch_pid=$!
pids+=($!)
ddp_port=$(wait_port "$tmp/ddp.out")
torch_port=$(wait_port "$tmp/torch.out")

# torch 2.6 (the chroot): its server, and its python for the anchor's clients.
py2=$root/tests/torch2/python3
targets="torch1 ddp1 ddp2"
if [[ ${TORCH2:-1} != 0 ]] && [[ $(id -u) -eq 0 ]] && "$root/scripts/torch2-chroot.sh" status >/dev/null; then
  export DDP_TORCH2_BIND=$(dirname "$anchor")
  "$py2" -c "$torch_server" >"$tmp/torch2.out" 2>"$tmp/torch2.err" &
  torch2_pid=$!   # the chroot's python itself: the wrapper execs into it
  pids+=($!)
  torch2_port=$(wait_port "$tmp/torch2.out")
  targets="torch1 ddp1 torch2 ddp2"
else
  echo "# no torch 2.6 anchor (TORCH2=0, not root, or no chroot: scripts/torch2-chroot.sh)" >&2
fi

cpu_ns() {  # PID -> on-CPU nanoseconds of all its threads
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s+=$1} END {printf "%.0f\n", s}'
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "fail"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a=="fail"||b=="fail"||b==0) print "n/a"; else printf "%.1fx", a/b}'; }
faster() { local r; r=$(ratio "$1" "$2"); [[ $r == n/a ]] && echo "n/a" || echo "$r faster"; }

has() { [[ $parts == *" $1 "* ]]; }

declare -A res cpu
if has load; then
echo "# store-load (ddp :$ddp_port, torch :$torch_port), $reps repetitions" >&2
for n in $clients; do
  for r in $(seq 1 "$reps"); do
    for target in $targets; do
      case $target in
        torch1) port=$torch_port gen=1 pid=$torch_pid ;;
        torch2) port=$torch2_port gen=2 pid=$torch2_pid ;;
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
  for target in $targets; do
    res[$target-$n]=$(median 2>/dev/null <"$tmp/load-$target-$n" || echo fail)
    cpu[$target-$n]=$(median 2>/dev/null <"$tmp/cpu-$target-$n" || echo fail)
  done
done
fi

ops() { sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1/p'; }
if has anchor; then
echo "# tcpstore_bench.py (16 PyTorch client processes, set+get), $reps repetitions" >&2
for r in $(seq 1 "$reps"); do
  t=$("$py" "$anchor" 2>&1 | tail -1)
  echo "  torch 1.13 clients, torch 1.13 server: $t" >&2
  ops <<<"$t" >>"$tmp/anchor-torch"
  d=$("$py" "$anchor" --connect "127.0.0.1:$ddp_port" 2>&1 | tail -1)
  echo "  torch 1.13 clients, ddp server:        $d" >&2
  ops <<<"$d" >>"$tmp/anchor-ddp"
  if [[ -n ${torch2_pid:-} ]]; then
    t=$("$py2" "$anchor" 2>&1 | tail -1)
    echo "  torch 2.6 clients, torch 2.6 server:   $t" >&2
    ops <<<"$t" >>"$tmp/anchor2-torch"
    d=$("$py2" "$anchor" --connect "127.0.0.1:$ddp_port" 2>&1 | tail -1)
    echo "  torch 2.6 clients, ddp server:         $d" >&2
    ops <<<"$d" >>"$tmp/anchor2-ddp"
  fi
done
fi

# First contact: TARGET N -> fresh_line (store-load's line against a server started for it)
# and fresh_cpu (the server's CPU ms during that run, not counting its start).
fresh_run() {
  local target=$1 n=$2 out=$tmp/fresh.out gen=1 port
  local sources=$(( (n + 7999) / 8000 ))  # past ~14k clients of one address, connect() itself crawls
  : >"$out"
  case $target in
    ddp1|ddp2) "$server" --host 127.0.0.1 >"$out" 2>"$tmp/fresh.err" & ;;
    torch1) "$py" -c "$torch_server" >"$out" 2>"$tmp/fresh.err" & ;;
    torch2) "$py2" -c "$torch_server" >"$out" 2>"$tmp/fresh.err" & ;;
  esac
  fresh_pid=$!
  [[ $target == *2 ]] && gen=2
  port=$(wait_port "$out") || port=""
  fresh_line="no server: $(tail -c 300 "$tmp/fresh.err")"
  fresh_cpu=""
  if [ -n "$port" ]; then
    local c0 c1
    c0=$(cpu_ns "$fresh_pid")
    fresh_line=$("$load" --gen "$gen" --host 127.0.0.1 --port "$port" --clients "$n" --sources "$sources" \
                 --timeout-s "${FRESH_TIMEOUT_S:-60}" 2>&1 || true)
    c1=$(cpu_ns "$fresh_pid")
    fresh_cpu=$(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.1f", (b-a)/1e6}')
  fi
  kill "$fresh_pid" 2>/dev/null || true
  wait "$fresh_pid" 2>/dev/null || true
  fresh_pid=""
}

declare -A fres fcon fcpu runs
if has fresh; then
echo "# first contact: a fresh server per run, $reps repetitions" >&2
for n in $fresh_clients; do
  for r in $(seq 1 "$reps"); do
    for target in $targets; do
      fresh_run "$target" "$n"
      echo "  fresh $target n=$n: $fresh_line server_cpu_ms=$fresh_cpu" >&2
      ms=$(sed -n 's/.*total_ms=\([0-9.]*\).*/\1/p' <<<"$fresh_line")
      cms=$(sed -n 's/.*connect_ms=\([0-9.]*\).*/\1/p' <<<"$fresh_line")
      if [ -n "$ms" ]; then
        echo "$ms" >>"$tmp/fresh-$target-$n"
        echo "$cms" >>"$tmp/fcon-$target-$n"
        echo "$fresh_cpu" >>"$tmp/fcpu-$target-$n"
      fi
      sleep 0.5
    done
  done
  for target in $targets; do
    fres[$target-$n]=$(median 2>/dev/null <"$tmp/fresh-$target-$n" || echo fail)
    fcon[$target-$n]=$(median 2>/dev/null <"$tmp/fcon-$target-$n" || echo fail)
    fcpu[$target-$n]=$(median 2>/dev/null <"$tmp/fcpu-$target-$n" || echo fail)
    runs[$target-$n]=$(wc -l 2>/dev/null <"$tmp/fresh-$target-$n" || echo 0)
  done
done
fi

if has load || has anchor; then
echo
echo "| benchmark | PyTorch 1.13 server | ddp-store-server | ddp vs torch | server CPU ms, torch | server CPU ms, ddp | CPU ratio |"
echo "|---|---|---|---|---|---|---|"
if has load; then
for n in $clients; do
  echo "| store-load, $n clients, gen 1: all released (ms) | ${res[torch1-$n]} | ${res[ddp1-$n]} | $(ratio "${res[torch1-$n]}" "${res[ddp1-$n]}") faster | ${cpu[torch1-$n]} | ${cpu[ddp1-$n]} | $(ratio "${cpu[torch1-$n]}" "${cpu[ddp1-$n]}") less |"
  echo "| store-load, $n clients, gen 2: all released (ms) | (torch 1.13: gen 1 only) | ${res[ddp2-$n]} | $(ratio "${res[torch1-$n]}" "${res[ddp2-$n]}") faster | | ${cpu[ddp2-$n]} | $(ratio "${cpu[torch1-$n]}" "${cpu[ddp2-$n]}") less |"
done
fi
if has anchor; then
  anchor_torch=$(median <"$tmp/anchor-torch")
  anchor_ddp=$(median <"$tmp/anchor-ddp")
  echo "| tcpstore_bench.py, 16 torch clients (set+get ops/s) | $anchor_torch | $anchor_ddp | $(ratio "$anchor_ddp" "$anchor_torch") | | | |"
fi
if [[ -n ${torch2_pid:-} ]]; then
  echo
  echo "| benchmark | PyTorch 2.6 server (chroot) | ddp-store-server | ddp vs torch 2.6 | server CPU ms, torch 2.6 | server CPU ms, ddp | CPU ratio |"
  echo "|---|---|---|---|---|---|---|"
  if has load; then
  for n in $clients; do
    echo "| store-load, $n clients, gen 2: all released (ms) | ${res[torch2-$n]} | ${res[ddp2-$n]} | $(ratio "${res[torch2-$n]}" "${res[ddp2-$n]}") faster | ${cpu[torch2-$n]} | ${cpu[ddp2-$n]} | $(ratio "${cpu[torch2-$n]}" "${cpu[ddp2-$n]}") less |"
  done
  fi
  if has anchor; then
    anchor2_torch=$(median <"$tmp/anchor2-torch")
    anchor2_ddp=$(median <"$tmp/anchor2-ddp")
    echo "| tcpstore_bench.py, 16 torch 2.6 clients (set+get ops/s) | $anchor2_torch | $anchor2_ddp | $(ratio "$anchor2_ddp" "$anchor2_torch") | | | |"
  fi
fi
fi
if has fresh; then
  echo
  echo "| first contact: N clients connect at once to a fresh server, ADD + WAIT | PyTorch server | ddp-store-server | ddp vs torch | all connected (ms), torch / ddp | server CPU ms, torch / ddp | runs that finished, torch / ddp |"
  echo "|---|---|---|---|---|---|---|"
  row() {  # LABEL TORCH_TARGET DDP_TARGET N
    local t=$2-$4 d=$3-$4
    echo "| $1 | ${fres[$t]} | ${fres[$d]} | $(faster "${fres[$t]}" "${fres[$d]}") | ${fcon[$t]} / ${fcon[$d]} | ${fcpu[$t]} / ${fcpu[$d]} | ${runs[$t]} / ${runs[$d]} of $reps |"
  }
  for n in $fresh_clients; do
    row "$n clients, gen 1, torch 1.13: all released (ms)" torch1 ddp1 "$n"
    if [[ -n ${torch2_pid:-} ]]; then
      row "$n clients, gen 2, torch 2.6 (chroot): all released (ms)" torch2 ddp2 "$n"
    else
      row "$n clients, gen 2 (ddp) against torch 1.13's gen 1: all released (ms)" torch1 ddp2 "$n"
    fi
  done
fi
echo
echo "Medians of $reps runs; $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)."
