#!/usr/bin/python3
"""Where the time of one c10d round of N agents goes (issue 19's targets).

  /usr/bin/python3 bench/rendezvous/phases.py [--agents 256,1024] [--runs 2] [--baseline OLD_DDPRUN]

N agents on loopback are started at once (build/bin/ddp-bench-spawn-n), as run.py starts
them, each with one worker that writes the time it started. From the start of the N agents:
when the first worker started (the round was complete and its first node knew it), the
median and the last worker (every node knew), and the last agent's exit (exit barrier,
leaving, the store's host waiting for everyone). With --baseline, the other binary's runs
are interleaved with this build's.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from run import DDPRUN, SPAWN_N, free_port  # run.py beside this file: the same agents, started the same way


def one_round(n, binary, tmp):
    """(first worker, median worker, last worker, last exit) in seconds from the start."""
    stamps = os.path.join(tmp, f"workers{n}")
    if os.path.exists(stamps):
        os.unlink(stamps)
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
    cmd = [SPAWN_N, str(n), binary, "--nnodes", str(n), "--rdzv_backend", "c10d", "--rdzv_endpoint",
           f"127.0.0.1:{free_port()}", "--rdzv_id", "phases", "--nproc-per-node", "1", "--no-python",
           "sh", "-c", f"date +%s.%N >> {stamps}"]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    end = time.time() - t0
    if int(r.stdout.split()[1]):
        raise RuntimeError(f"{binary} x{n}: {r.stdout.split()[1]} agents failed")
    with open(stamps) as f:
        w = sorted(float(line) - t0 for line in f)
    if len(w) != n:
        raise RuntimeError(f"{binary} x{n}: {len(w)} workers started")
    return w[0], w[len(w) // 2], w[-1], end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", default="256,1024")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--baseline")
    a = ap.parse_args()
    binaries = [("ddprun", DDPRUN)] + ([("baseline", a.baseline)] if a.baseline else [])
    print("| agents | binary | first worker | median worker | last worker | last exit |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="ddprun_phases_") as tmp:
        for n in (int(x) for x in a.agents.split(",")):
            runs = {name: [] for name, _ in binaries}
            for _ in range(a.runs):
                for name, binary in binaries:
                    runs[name].append(one_round(n, binary, tmp))
            for name, _ in binaries:
                med = [statistics.median(r[i] for r in runs[name]) for i in range(4)]
                print(f"| {n} | {name} | " + " | ".join(f"{x:.2f} s" for x in med) + " |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
