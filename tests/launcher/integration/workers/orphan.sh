#!/bin/sh
# A worker that starts a grandchild and records both pids: DIR/w_<rank>, DIR/gc_<rank>.
dir=$1
sleep 1000 &
echo $! > "$dir/gc_$RANK.tmp" && mv "$dir/gc_$RANK.tmp" "$dir/gc_$RANK"
echo $$ > "$dir/w_$RANK.tmp" && mv "$dir/w_$RANK.tmp" "$dir/w_$RANK"
wait
