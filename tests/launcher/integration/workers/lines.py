"""Writes 'out <tag> r<RANK>' to stdout and 'err <tag> r<RANK>' to stderr, N times each."""
import os
import sys

tag = sys.argv[1] if len(sys.argv) > 1 else "x"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
rank = os.environ["RANK"]
for i in range(n):
    sys.stdout.write(f"out {tag} r{rank} {i}\n")
    sys.stdout.flush()
    sys.stderr.write(f"err {tag} r{rank} {i}\n")
    sys.stderr.flush()
