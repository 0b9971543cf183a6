"""Writes where this rank may run: DIR/cpus_<rank>_<restart> holds the CPUs of its main
thread, of a thread it starts, and the kernel's Cpus_allowed_list, one line each.

usage: affinity.py DIR [FAIL_RANK]: FAIL_RANK exits 3 in the first attempt (a restart), once
every rank has written its file.
"""
import os
import sys
import threading
import time

d = sys.argv[1]
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
seen = []
t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
t.start()
t.join()
with open("/proc/self/status") as f:
    allowed = [line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list:")][0]
out = os.path.join(d, f"cpus_{rank}_{attempt}")
with open(out + ".tmp", "w") as f:
    f.write(f"{sorted(os.sched_getaffinity(0))}\n{seen[0]}\n{allowed}\n")
os.rename(out + ".tmp", out)  # whole: the failing rank goes on once it exists
if len(sys.argv) > 2 and int(sys.argv[2]) == rank and attempt == 0:
    world, deadline = int(os.environ["WORLD_SIZE"]), time.monotonic() + 60
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(d, f"cpus_{r}_0")) for r in range(world)):
        time.sleep(0.01)
    sys.exit(3)
