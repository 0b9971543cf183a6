#!/bin/sh
# test_c10d's "the next round ends while this node still stops the last one's workers".
# $1: a directory for stamps. Round 0: node rank 0's worker takes 3 s to stop after
# SIGTERM, and every other node's worker fails once rank 0's is up. Round 1: node rank 0's
# worker runs 60 s unless stopped, and every other node's fails at once (stamp fail_<round>).
# Stamps appear whole (mv), or not at all when the worker is stopped while it writes one.
d=$1
stamp() { date +%s.%N > "$d/$1.tmp" && mv "$d/$1.tmp" "$d/$1"; }
r=$TORCHELASTIC_RESTART_COUNT
if [ "$GROUP_RANK" = 0 ]; then
  if [ "$r" = 0 ]; then
    trap 'sleep 3; exit 0' TERM
    : > "$d/up"
    sleep 60 &
    wait
    exit 0
  fi
  stamp "started_$r"
  exec sleep 60
fi
if [ "$r" = 0 ]; then
  i=0
  while [ ! -e "$d/up" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
fi
stamp "fail_$r"
exit 1
