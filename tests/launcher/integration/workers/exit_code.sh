#!/bin/sh
# Exits with $1 after a line on stderr (rank 1 only; the others exit 0 at once).
if [ "$RANK" = "1" ]; then
  sleep 0.3
  echo "rank 1 giving up" >&2
  exit "$1"
fi
exit 0
