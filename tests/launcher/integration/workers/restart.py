"""Records each attempt; rank 0 fails with CODE until attempt SUCCEED_AT (-1: always).

usage: restart.py DIR SUCCEED_AT CODE
Rank 0 fails once every rank recorded the attempt (however slowly they start). Other ranks
sleep (300 s) in failing attempts (ddprun stops them) and exit 0 in the good one.
"""
import os
import sys
import time

d, succeed_at, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(d, f"attempts_{rank}"), "a") as f:
    f.write(f"{attempt} {os.environ['TORCHELASTIC_MAX_RESTARTS']}\n")
failing = succeed_at < 0 or attempt < succeed_at
if not failing:
    sys.exit(0)


def recorded(r):
    try:
        with open(os.path.join(d, f"attempts_{r}")) as f:
            return f.read().count("\n") > attempt
    except FileNotFoundError:
        return False


if rank == 0:
    deadline = time.monotonic() + 60  # a hang guard: the others start within a second or so
    while time.monotonic() < deadline and not all(recorded(r) for r in range(world)):
        time.sleep(0.01)
    print(f"rank 0 failing attempt {attempt}", file=sys.stderr)
    sys.exit(code)
time.sleep(300)
