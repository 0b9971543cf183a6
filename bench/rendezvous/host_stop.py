#!/usr/bin/python3
"""The store's host stopping while the first round forms (issue 19): a c10d job of
`--nnodes 3` on loopback, of which two agents start (the store's host, `is_host=1`, and one
other); once both wait for the third, the host gets SIGTERM. Measured: from the signal to
the exit of each agent (the other one exits 1, saying that the host stopped). Runs
interleave ddprun and, with --baseline, another ddprun binary in the same run.

  /usr/bin/python3 bench/rendezvous/host_stop.py [--runs 10] [--baseline OLD_DDPRUN]

Prints a markdown table of the medians and maxima, and the ratio of the medians.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
from ports import free_port  # noqa: E402
DDPRUN = os.path.join(ROOT, "build", "bin", "ddprun")


def once(binary, settle):
    """Seconds from the host's SIGTERM to the host's exit and to the other agent's exit."""
    port = free_port()
    args = [binary, "--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "bench", "--nproc-per-node", "1", "--no-python", "true"]
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    host = subprocess.Popen(args + ["--rdzv-conf", "is_host=1"], **quiet)
    time.sleep(0.3)
    other = subprocess.Popen(args + ["--rdzv-conf", "is_host=0"], **quiet)
    time.sleep(settle)  # both wait for the third node
    t0 = time.monotonic()
    host.send_signal(signal.SIGTERM)
    host.wait(timeout=60)
    t_host = time.monotonic() - t0
    other.wait(timeout=60)
    t_other = time.monotonic() - t0
    if (host.returncode, other.returncode) != (128 + signal.SIGTERM, 1):
        raise RuntimeError(f"{binary}: exit codes {host.returncode}, {other.returncode} (expected 143, 1)")
    return t_host, t_other


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--baseline", help="another ddprun binary measured beside build/bin/ddprun")
    a = ap.parse_args()
    binaries = {"ddprun": DDPRUN}
    if a.baseline:
        binaries["baseline"] = a.baseline
    res = {name: [] for name in binaries}
    for i in range(a.runs):
        settle = 1.5 + 0.1 * (i % 5)  # the signal at different points of the host's wait
        for name, b in binaries.items():
            res[name].append(once(b, settle))
    print("| binary | runs | host exit: median | max | other agent's exit: median | max |")
    print("|---|---|---|---|---|---|")
    for name, r in res.items():
        h, o = [x[0] for x in r], [x[1] for x in r]
        print(f"| {name} | {len(r)} | {statistics.median(h) * 1e3:.0f} ms | {max(h) * 1e3:.0f} ms "
              f"| {statistics.median(o) * 1e3:.0f} ms | {max(o) * 1e3:.0f} ms |")
    if a.baseline:
        ratio = statistics.median(x[1] for x in res["baseline"]) / statistics.median(x[1] for x in res["ddprun"])
        print(f"\nbaseline / ddprun, medians of the last exit: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
