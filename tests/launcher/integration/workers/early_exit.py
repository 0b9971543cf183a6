"""Rank 1 records its pid (DIR/pid_1) and exits 0 at once; rank 0 records its pid and exits 0
once DIR/go exists (60 s at most).

usage: early_exit.py DIR
"""
import os
import sys
import time

d, rank = sys.argv[1], int(os.environ["RANK"])
with open(os.path.join(d, f"pid_{rank}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(d, f"pid_{rank}.tmp"), os.path.join(d, f"pid_{rank}"))
deadline = time.monotonic() + 60
while rank == 0 and not os.path.exists(os.path.join(d, "go")) and time.monotonic() < deadline:
    time.sleep(0.02)
