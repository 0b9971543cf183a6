#!/bin/sh
# Appends the round (TORCHELASTIC_RESTART_COUNT) to $1.<GROUP_RANK>. Node rank 0's worker
# then succeeds at once (its node passes the round's exit barrier) and every other fails
# 10 ms later: every round of the job is a counted restart that leaves exit logs behind
# (the state-growth tests run hundreds of them).
echo "$TORCHELASTIC_RESTART_COUNT" >> "$1.$GROUP_RANK"
[ "$GROUP_RANK" = 0 ] && exit 0
sleep 0.01
exit 1
