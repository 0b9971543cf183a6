#!/bin/bash
# CPU a one-node c10d ddprun (it hosts the store; one lease, renewed every second) spends
# over 25 s of an idle `sleep` worker, summed over its threads (/proc/PID/task/*/schedstat).
# Usage: bench/store/lease_tick_cost.sh DDPRUN [PORT] [RUNS]; run it for two builds in turn.
set -eu
ddprun=$1 port=${2:-41779} runs=${3:-3}
for ((i = 0; i < runs; i++)); do
  "$ddprun" --nnodes 1 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
    --rdzv-id tick --rdzv-conf keep_alive_interval=1,keep_alive_max_attempt=3 --no-python sleep 30 \
    > /dev/null 2>&1 &
  pid=$!
  sleep 2
  cpu() { cat /proc/"$pid"/task/*/schedstat | awk '{s += $1} END {print s}'; }
  a=$(cpu); sleep 25; b=$(cpu)
  wait "$pid"
  echo "run $i: $(( (b - a) / 1000000 )) ms of CPU in 25 s"
done
