#!/usr/bin/python3
"""An expired torchelastic file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1), ddprun against
torchrun 1.13 in the same run, interleaved: 2 ranks; rank 1 arms a 1 s timer through torch's
FileTimerClient and then hangs (tests/launcher/integration/workers/file_timer.py).

  /usr/bin/python3 bench/launcher/file_timer.py [--runs 5]

Per launcher: the median time from the timer's expiry (armed + 1 s, written by the worker as
it arms) to the launcher's exit, its exit code, and whether rank 0 (which sleeps 300 s) was
still alive after the launcher exited.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests/launcher/integration/workers/file_timer.py")
TORCHRUN = os.path.join(ROOT, "..", "shared", "anchors", "torchrun113.py")


def once(cmd):
    d = tempfile.mkdtemp(prefix="ddp_timer_bench_")
    env = dict(os.environ, TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=os.path.join(d, "fifo"),
               PYTHON_EXEC="/usr/bin/python3", DDP_TIMER_ARMED=os.path.join(d, "armed"))
    p = subprocess.run(cmd + [WORKER, d, "hang", "1"], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600)
    ended = time.time()
    with open(os.path.join(d, "armed")) as f:
        expiry = float(f.read()) + 1
    with open(os.path.join(d, "pid_0")) as f:
        pid0 = int(f.read())
    try:
        os.kill(pid0, 0)
        orphan = True
        os.kill(pid0, 9)
    except ProcessLookupError:
        orphan = False
    return ended - expiry, p.returncode, orphan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    sides = {"ddprun": [os.path.join(ROOT, "build/bin/ddprun"), "--nproc-per-node", "2"],
             "torchrun 1.13": ["/usr/bin/python3", TORCHRUN, "--nproc_per_node", "2"]}
    got = {k: [] for k in sides}
    for _ in range(a.runs):
        for k, cmd in sides.items():
            got[k].append(once(cmd))
    print("| launcher | expiry to exit (median of %d) | exit code | rank 0 left running |" % a.runs)
    print("|---|---|---|---|")
    for k, runs in got.items():
        med = statistics.median(r[0] for r in runs)
        print(f"| {k} | {med:.2f} s | {sorted({r[1] for r in runs})} | {sum(r[2] for r in runs)} of {a.runs} |")
    print(f"ratio torchrun/ddprun: {statistics.median(r[0] for r in got['torchrun 1.13']) / statistics.median(r[0] for r in got['ddprun']):.1f}x")


if __name__ == "__main__":
    sys.exit(main())
