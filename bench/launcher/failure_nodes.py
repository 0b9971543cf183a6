#!/usr/bin/python3
"""What the job-wide view of a failure costs the node of its root cause (docs/stacks.md, "When a
worker fails"): two static nodes on loopback, 2 ranks each; rank 3 (node 1) exits 3 after
0.3 s while the others sleep. Timed: node 1's ddprun from its start to its exit, with stack
dumps (it asks node 0 for its ranks' stacks and waits for the answer before its summary) and,
interleaved in the same run, with --no-stack-dumps (the anchor: no stacks taken anywhere).

  /usr/bin/python3 bench/launcher/failure_nodes.py [--ddprun build/bin/ddprun] [--runs 15]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "testlib"))
from ports import free_port  # noqa: E402

WORKER = 'if [ "$RANK" = 3 ]; then sleep 0.3; exit 3; fi; sleep 30'


def run(ddprun, extra):
    """Node 1's seconds from start to exit, and whether its summary shows every rank of the job."""
    port = free_port()
    nodes = []
    for n in (0, 1):
        cmd = [ddprun, *extra, "--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port",
               str(port), "--nproc-per-node", "2", "--no-python", "sh", "-c", WORKER]
        nodes.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    t0 = time.monotonic()
    err1 = nodes[1].communicate(timeout=60)[1]
    took = time.monotonic() - t0
    nodes[0].communicate(timeout=60)
    if nodes[1].returncode != 3:
        sys.exit(f"node 1 exited {nodes[1].returncode}:\n{err1}")
    return took, "Where the other ranks of the job were" in err1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddprun", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "ddprun"))
    p.add_argument("--runs", type=int, default=15)
    a = p.parse_args()
    times = {"stack dumps (job-wide view)": [], "--no-stack-dumps (anchor)": []}
    for _ in range(a.runs):
        took, whole = run(a.ddprun, [])
        if not whole:
            sys.exit("node 1's summary did not show every rank of the job")
        times["stack dumps (job-wide view)"].append(took)
        times["--no-stack-dumps (anchor)"].append(run(a.ddprun, ["--no-stack-dumps"])[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k}: median {med[k] * 1000:.0f} ms, max {max(v) * 1000:.0f} ms ({len(v)} runs)")
    a_, b_ = med.values()
    print(f"added by the view: {(a_ - b_) * 1000:+.0f} ms (x{a_ / b_:.3f} of the anchor)")


if __name__ == "__main__":
    main()
