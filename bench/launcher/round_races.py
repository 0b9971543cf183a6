#!/usr/bin/python3
"""Races between the rounds of a job that restarts fast, on a loaded machine: two agents on
loopback (127.0.0.2, 127.0.0.3) at one etcd member (--backend etcd, as the tests start
one) or at a c10d store that 127.0.0.2 hosts (--backend c10d), --nnodes 2; node rank 0's
worker succeeds at once and node rank 1's fails 10 ms later (the tests' fail_round.sh), so
every round is a counted restart; --max-restarts ROUNDS; HOGS busy loops share the CPUs.
Counts, per binary:
  - short rounds: rounds a node started with fewer nodes than the job's 2 (its join found
    the round complete after the other member had already run, failed and left it);
  - stuck jobs: jobs not over within --limit seconds (a node that read the next round's end
    while it still stopped the last round's workers never stopped the next one's).

  /usr/bin/python3 bench/launcher/round_races.py OLD_DDPRUN NEW_DDPRUN [--backend etcd] [--jobs 6]

The binaries take turns, job by job.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "testlib"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "common"))
from ports import free_port  # noqa: E402
import etcd_cluster  # noqa: E402

FAIL_ROUND = os.path.join(HERE, "..", "..", "tests", "launcher", "integration", "workers", "fail_round.sh")
CONF = "last_call_timeout=0.3,join_timeout=20,keep_alive_interval=0.5,keep_alive_max_attempt=3"


def stop(procs):
    """Ends the agents we started (by their recorded pids): SIGTERM, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def job(binary, rounds, limit, tmp, etcd):
    """(short rounds, stuck) for one job; etcd: the member's endpoint, else c10d."""
    port = free_port()
    rec = os.path.join(tmp, f"rounds{port}")
    procs, logs = [], []
    for addr, host in (("127.0.0.2", 1), ("127.0.0.3", 0)):
        log = os.path.join(tmp, f"{addr}_{port}.log")
        logs.append(log)
        where = ["etcd", etcd, CONF] if etcd else ["c10d", f"127.0.0.1:{port}", f"{CONF},is_host={host}"]
        with open(log, "wb") as err:
            procs.append(subprocess.Popen(
                [binary, "--log-level", "info", "--rdzv-backend", where[0], "--rdzv-endpoint", where[1],
                 "--rdzv-id", f"races{port}", "--nnodes", "2", "--nproc-per-node", "1", "--local-addr", addr,
                 "--rdzv-conf", where[2], "--max-restarts", str(rounds), "--no-python", "sh", FAIL_ROUND, rec],
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    stuck = any(p.poll() is None for p in procs)
    stop(procs)
    short = 0
    for log in logs:
        with open(log, errors="replace") as f:
            short += len(re.findall(r"rendezvous: round \d+ of job '[^']+': node rank \d+ of 1 ", f.read()))
    return short, stuck


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--jobs", type=int, default=6, help="jobs per binary")
    ap.add_argument("--rounds", type=int, default=300, help="rounds per job (--max-restarts)")
    ap.add_argument("--hogs", type=int, default=2, help="busy loops beside the job")
    ap.add_argument("--limit", type=float, default=120, help="seconds before a job counts as stuck")
    ap.add_argument("--backend", choices=["etcd", "c10d"], default="etcd")
    a = ap.parse_args()
    cluster = etcd_cluster.EtcdCluster(1) if a.backend == "etcd" else None
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.hogs)]
    totals = {b: [0, 0] for b in a.binaries}
    try:
        with tempfile.TemporaryDirectory(prefix="ddprun-round-races-") as tmp:
            for _ in range(a.jobs):
                for b in a.binaries:
                    short, stuck = job(b, a.rounds, a.limit, tmp, cluster.endpoints() if cluster else None)
                    totals[b][0] += short
                    totals[b][1] += stuck
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        if cluster:
            cluster.stop()
    for b in a.binaries:
        short, stuck = totals[b]
        print(f"{b}: {a.backend}, {a.jobs} jobs of {a.rounds} rounds: {short} short rounds, {stuck} stuck jobs")


if __name__ == "__main__":
    main()
