"""Plain-python worker for the container tests (no torch): job.py MODE [options].
  hello   print the rank environment; --exit-rank R --exit-code C makes rank R fail
  term    print 'ready', wait for SIGTERM, count it, print lines, 'bye', exit 0
  usr1    print 'ready', wait for SIGUSR1, keep running a moment, print 'done', exit 0
  orphan  leave an orphaned grandchild ('sleep SECONDS'), keep running, exit 0
"""
import argparse
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("mode")
p.add_argument("--exit-rank", type=int, default=-1)
p.add_argument("--exit-code", type=int, default=0)
p.add_argument("--lines", type=int, default=200)
p.add_argument("--seconds", type=float, default=3.0)
a = p.parse_args()
rank = int(os.environ["RANK"])
say = lambda *m: print(*m, flush=True)

if a.mode == "hello":
    with open("/proc/1/cmdline", "rb") as f:
        pid1 = f.read().split(b"\0")[0].decode()
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")
    say("env " + " ".join(f"{k}={os.environ.get(k)}" for k in keys) + f" ppid={os.getppid()} pid1={pid1}")
    if rank == a.exit_rank:
        print(f"rank {rank} fails with {a.exit_code}", file=sys.stderr, flush=True)
        sys.exit(a.exit_code)
    time.sleep(0.3 if a.exit_rank >= 0 else 0)  # the failing rank goes first
    sys.exit(0)

if a.mode == "term":
    got = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    say("ready")
    while not got:
        time.sleep(0.02)
    say(f"got SIGTERM {len(got)}")
    for i in range(a.lines):  # output written during the grace period must reach the logs
        say(f"line {i} after SIGTERM")
    time.sleep(1.0)  # a second SIGTERM would arrive now
    say(f"bye sigterms={len(got)}")
    sys.exit(0)

if a.mode == "usr1":
    got = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    say("ready")
    while not got:
        time.sleep(0.02)
    say("got SIGUSR1")
    time.sleep(1.0)
    say("done")
    sys.exit(0)

if a.mode == "orphan":
    if rank == 0:
        # The child starts 'sleep' in its own session and exits at once: sleep is orphaned
        # and reparented to the subreaper (ddprun, PID 1 of the container).
        subprocess.run([sys.executable, "-c",
                        f"import subprocess; subprocess.Popen(['sleep', '{a.seconds}'], start_new_session=True)"],
                       check=True)
        say("orphan started")
    time.sleep(a.seconds + 3.0)
    say("done")
    sys.exit(0)

sys.exit(f"unknown mode {a.mode}")
