#!/usr/bin/python3
"""Cost and memory of a c10d job's rounds as it ages (issue 19): two agents on loopback,
`--rdzv-backend c10d --nnodes 2 --max-restarts N`, whose single worker records the round
(TORCHELASTIC_RESTART_COUNT) with a timestamp and exits 1, so every round is a counted
restart and the job runs N+1 rounds. Samples both agents' RSS (the store's host and the
other) as the rounds pass.

  /usr/bin/python3 bench/rendezvous/rounds.py [--rounds 1000] [--ddprun build/bin/ddprun]

Prints the median round time over the first and the last tenth of the rounds, their ratio,
and each agent's RSS at the first and the last tenth.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = "echo \"$TORCHELASTIC_RESTART_COUNT $(date +%s.%N)\" >> \"$0/rounds.$GROUP_RANK\"; exit 1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rounds_seen(folder):
    """{round: the first time a worker of it wrote} over both agents' workers (a worker that
    the other agent's failure stopped first may not have written)."""
    first = {}
    for g in (0, 1):
        try:
            with open(os.path.join(folder, f"rounds.{g}")) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2:
                        r, t = int(parts[0]), float(parts[1])
                        first[r] = min(t, first.get(r, t))
        except OSError:
            pass
    return first


def run(ddprun, n, folder, guard_s):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["TMPDIR"] = folder
    procs = []
    for addr, host in (("127.0.0.2", 1), ("127.0.0.3", 0)):
        cmd = [ddprun, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "rounds",
               "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", str(n), "--local-addr", addr,
               "--rdzv-conf", f"is_host={host}", "--no-python", "sh", "-c", WORKER, folder]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.2)
    samples = []  # (round, rss host, rss other)
    deadline = time.monotonic() + guard_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        seen = max(rounds_seen(folder), default=0)
        samples.append((seen, rss_kb(procs[0].pid), rss_kb(procs[1].pid)))
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    seen = rounds_seen(folder)
    return samples, [seen[r] for r in sorted(seen)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    p.add_argument("--guard", type=float, default=900, help="seconds before giving up")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddprun_rounds_") as folder:
        samples, times = run(a.ddprun, a.rounds, folder, a.guard)
    if len(times) < a.rounds * 0.9:
        sys.exit(f"only {len(times)} of {a.rounds + 1} rounds were seen")
    steps = [b - a_ for a_, b in zip(times, times[1:])]
    tenth = max(1, len(steps) // 10)
    first, last = statistics.median(steps[:tenth]), statistics.median(steps[-tenth:])

    def rss_at(frac):
        want = int(a.rounds * frac)
        got = [s for s in samples if s[0] >= want and s[1] and s[2]]
        return got[0][1:] if got else (None, None)

    r1, r9 = rss_at(0.1), rss_at(0.9)
    print(f"| {len(times)} rounds, 2 agents | first tenth {first * 1e3:.1f} ms/round | last tenth {last * 1e3:.1f} "
          f"ms/round | last/first {last / first:.2f}x |")
    print(f"| RSS at 10% / 90% of the rounds | host {r1[0]} / {r9[0]} kB | other {r1[1]} / {r9[1]} kB | |")


if __name__ == "__main__":
    main()
