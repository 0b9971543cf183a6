"""Records each attempt; rank 0 fails with CODE until attempt SUCCEED_AT (-1: always).

usage: restart.py DIR SUCCEED_AT CODE
Other ranks sleep (300 s) in failing attempts (ddprun stops them) and exit 0 in the good one.
"""
import os
import sys
import time

d, succeed_at, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(d, f"attempts_{rank}"), "a") as f:
    f.write(f"{attempt} {os.environ['TORCHELASTIC_MAX_RESTARTS']}\n")
failing = succeed_at < 0 or attempt < succeed_at
if not failing:
    sys.exit(0)
if rank == 0:
    time.sleep(0.2)
    print(f"rank 0 failing attempt {attempt}", file=sys.stderr)
    sys.exit(code)
time.sleep(300)

