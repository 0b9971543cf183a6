"""One rank fails once every other rank is ready; the others sleep.

usage: fail_one.py DIR FAILING_RANK HOW [ignore-term]
HOW: exit:N (exit with N) or signal:N (kill itself with signal N).
Every rank writes DIR/ready_<rank> (after installing handlers) and DIR/pid_<rank>; the
failing rank writes time.monotonic() to DIR/failed_at just before it fails.
With ignore-term, the ranks that do not fail ignore SIGTERM.
The others sleep 300 s: far longer than any test waits for them to be stopped.
"""
import os
import signal
import sys
import time

d, failing, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ignore_term = "ignore-term" in sys.argv[4:]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(os.path.join(d, f"pid_{rank}"), "w") as f:
    f.write(str(os.getpid()))
if rank != failing and ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(d, f"ready_{rank}"), "w").close()
if rank != failing:
    time.sleep(300)
    sys.exit(0)
deadline = time.monotonic() + 60  # a hang guard: the others are ready within a second or so
while time.monotonic() < deadline and not all(os.path.exists(os.path.join(d, f"ready_{r}")) for r in range(world)):
    time.sleep(0.01)
kind, value = how.split(":")
sys.stdout.flush()
with open(os.path.join(d, "failed_at.tmp"), "w") as f:
    f.write(repr(time.monotonic()))
os.rename(os.path.join(d, "failed_at.tmp"), os.path.join(d, "failed_at"))
if kind == "exit":
    os._exit(int(value))
os.kill(os.getpid(), int(value))
time.sleep(10)
