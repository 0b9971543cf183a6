#!/usr/bin/python3
"""Time from a stack-dump trigger to the last rank's stack on ddprun's output (docs/stacks.md),
for N Python ranks on one node (or, with --nodes 2, split over two static nodes on loopback,
the dump asked on node 1 and timed until both nodes have shown theirs, and until node 1 shows
where every rank of the job is, the other node's answer in), and in the same run
the anchor: the same ranks answering the
same signal (SIGURG) sent by this script directly, measured to the moment every rank's dump is
in its file (faulthandler's own time, with no launcher in between).

  /usr/bin/python3 bench/launcher/stacks.py [--ddprun build/bin/ddprun] [--ranks 8] [--runs 20] [--nodes 2]

Each run alternates: SIGQUIT to ddprun, timed until its "[ddprun] where each rank is" line
(printed after every rank's stack) is read from its stderr; then SIGURG to every worker,
timed until each worker's stack file ends with the main thread's outermost frame (the last
line of a dump, for these workers).
"""
import argparse
import glob
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "testlib"))
from ports import free_port  # noqa: E402

WORKER = """
import os, sys, time
def inner():
    time.sleep(3600)
def step():
    inner()
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
step()
"""


def read_lines(stream, seen, cond):
    for line in stream:
        with cond:
            seen.append((time.perf_counter(), line))
            cond.notify_all()


def wait_line(seen, cond, start, text, timeout=30):
    deadline = time.perf_counter() + timeout
    with cond:
        while True:
            for t, line in seen[start:]:
                if line.startswith(text):
                    return t
            if not cond.wait(timeout=max(0.0, deadline - time.perf_counter())):
                raise SystemExit(f"no {text!r} within {timeout} s")


def direct(pids, files):
    """SIGURG to every worker; seconds until every file holds a whole new dump."""
    sizes = [os.path.getsize(f) for f in files]
    t0 = time.perf_counter()
    for pid in pids:
        os.kill(pid, signal.SIGURG)
    pending = set(range(len(files)))
    while pending:
        for i in list(pending):
            with open(files[i], "rb") as f:
                f.seek(sizes[i])
                new = f.read()
            if new.endswith(b" in <module>\n"):  # the main thread's outermost frame: the dump's last line
                pending.discard(i)
        time.sleep(0.0005)
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddprun", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "ddprun"))
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--nodes", type=int, default=1, choices=[1, 2])
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddprun-stacks-bench-") as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        per_node = a.ranks // a.nodes
        if a.nodes == 1:
            lines = [["--standalone"]]
        else:
            port = free_port()
            lines = [["--nnodes", str(a.nodes), "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port",
                      str(port)] for n in range(a.nodes)]
        jobs, seen, cond = [], [], threading.Condition()
        for n, line in enumerate(lines):
            jobs.append(subprocess.Popen([a.ddprun, *line, "--nproc-per-node", str(per_node), "--log-dir",
                                          os.path.join(tmp, f"logs{n}"), script, tmp, str(n)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            seen.append([])
            threading.Thread(target=read_lines, args=(jobs[-1].stderr, seen[-1], cond), daemon=True).start()
        try:
            while len(glob.glob(os.path.join(tmp, "ready_*"))) < a.ranks:
                time.sleep(0.05)
            time.sleep(0.5)
            files = sorted(glob.glob(os.path.join(tmp, "logs*", "*", "attempt_0", "*", "stacks")))
            pids = [int(open(f).readline().split("pid=")[1]) for f in files]
            via, raw, whole = [], [], []
            for _ in range(a.runs):
                with cond:
                    starts = [len(x) for x in seen]
                t0 = time.perf_counter()
                jobs[-1].send_signal(signal.SIGQUIT)  # the last node asks
                via.append(max(wait_line(x, cond, st, "[ddprun] where each rank is") for x, st in zip(seen, starts)) - t0)
                if a.nodes > 1:  # the node that asked, once every other node's answer is in
                    whole.append(wait_line(seen[-1], cond, starts[-1], "[ddprun] where each rank of the job is") - t0)
                time.sleep(0.2)
                raw.append(direct(pids, files))
                time.sleep(0.2)
        finally:
            for job in jobs:
                job.kill()
                job.wait()
    ms = lambda v: f"{v * 1e3:.0f} ms"  # noqa: E731
    where = "one node" if a.nodes == 1 else f"{a.nodes} nodes, asked on the last"
    print(f"| {a.ranks} ranks, {where}, {a.runs} runs | median | max |")
    print("|---|---|---|")
    print(f"| SIGQUIT to ddprun -> every rank's stack on its node's stderr | {ms(statistics.median(via))} | {ms(max(via))} |")
    if whole:
        print(f"| SIGQUIT to ddprun -> the asking node shows where every rank of the job is | "
              f"{ms(statistics.median(whole))} | {ms(max(whole))} |")
    print(f"| anchor: SIGURG to each rank -> every dump in its file | {ms(statistics.median(raw))} | {ms(max(raw))} |")


if __name__ == "__main__":
    sys.exit(main())
