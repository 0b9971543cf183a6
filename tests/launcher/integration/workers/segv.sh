#!/bin/sh
# Writes to stderr, then crashes with SIGSEGV.
echo "loading shard 3" >&2
echo "about to crash in rank $RANK" >&2
kill -SEGV $$
sleep 5
