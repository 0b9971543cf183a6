#!/bin/sh
# Leaves an orphaned grandchild (re-parented away from this worker, holding its stdout and
# stderr open), records its pid in DIR/orphan_<rank>, prints a line and exits with CODE.
dir=$1
code=$2
( sleep 1000 & echo $! > "$dir/orphan_$RANK.tmp"; mv "$dir/orphan_$RANK.tmp" "$dir/orphan_$RANK" )
echo "worker $RANK done"
exit "$code"
