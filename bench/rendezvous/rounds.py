#!/usr/bin/python3
"""Cost and memory of a c10d or etcd job's rounds as it ages (issue 19): two agents on
loopback, `--rdzv-backend c10d|etcd --nnodes 2 --max-restarts N`, whose single worker
records the round (TORCHELASTIC_RESTART_COUNT) with a timestamp and exits 1, so every round
is a counted restart and the job runs N+1 rounds. Samples both agents' RSS (with c10d: the
store's host and the other) and the rendezvous's size (c10d: the bytes of its events and
requests logs in the store; etcd: the run's keys, in a one-member etcd started here) as the
rounds pass.

  /usr/bin/python3 bench/rendezvous/rounds.py [--rounds 1000] [--backend c10d|etcd] [--ddprun build/bin/ddprun]

Prints the median round time over the first and the last tenth of the rounds, their ratio,
and each agent's RSS and the rendezvous's size at the first and the last tenth.
"""
import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
from ports import free_port  # noqa: E402
WORKER = "echo \"$TORCHELASTIC_RESTART_COUNT $(date +%s.%N)\" >> \"$0/rounds.$GROUP_RANK\"; exit 1"


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def store_bytes(port, key):
    """The size of a key's value in ddprun's store (a raw generation-2 GET)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            k = key.encode()
            s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x03" + struct.pack("<Q", len(k)) + k)
            buf = b""
            while len(buf) < 8 or len(buf) < 8 + struct.unpack("<Q", buf[:8])[0]:
                more = s.recv(1 << 20)
                if not more:
                    return None
                buf += more
            return len(buf) - 8
    except OSError:
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


def run(ddprun, n, folder, guard_s, etcd=None):
    """etcd: a started etcd_cluster.EtcdCluster (else c10d on a free port)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["TMPDIR"] = folder
    run_id = f"rounds-{os.getpid()}"
    procs = []
    for addr, host in (("127.0.0.2", 1), ("127.0.0.3", 0)):
        if etcd:
            rdzv = ["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints(), "--rdzv-conf",
                    "last_call_timeout=0.3,keep_alive_interval=0.5,keep_alive_max_attempt=3"]
        else:
            rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", f"is_host={host}"]
        cmd = [ddprun, *rdzv, "--rdzv-id", run_id, "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", str(n),
               "--local-addr", addr, "--no-python", "sh", "-c", WORKER, folder]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.2)

    def size():
        if etcd:
            return len(etcd.keys(0, f"/ddprun/rdzv/{run_id}/"))
        sizes = [store_bytes(port, f"ddprun.rdzv.{run_id}/{log}") for log in ("events", "requests")]
        return None if None in sizes else sum(sizes)

    samples = []  # (round, rss host, rss other, rendezvous size)
    deadline = time.monotonic() + guard_s
    next_size = 0
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        seen = max(rounds_seen(folder), default=0)
        sz = None
        if seen >= next_size:  # a look at the rendezvous every 1% of the rounds
            sz, next_size = size(), seen + max(1, n // 100)
        samples.append((seen, rss_kb(procs[0].pid), rss_kb(procs[1].pid), sz))
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
    p.add_argument("--backend", choices=("c10d", "etcd"), default="c10d")
    a = p.parse_args()
    etcd = None
    if a.backend == "etcd":
        import etcd_cluster
        etcd = etcd_cluster.EtcdCluster(1)
    try:
        with tempfile.TemporaryDirectory(prefix="ddprun_rounds_") as folder:
            samples, times = run(a.ddprun, a.rounds, folder, a.guard, etcd)
    finally:
        if etcd:
            etcd.stop()
    if len(times) < a.rounds * 0.9:
        sys.exit(f"only {len(times)} of {a.rounds + 1} rounds were seen")
    steps = [b - a_ for a_, b in zip(times, times[1:])]
    tenth = max(1, len(steps) // 10)
    first, last = statistics.median(steps[:tenth]), statistics.median(steps[-tenth:])

    def at(frac, i):
        want = int(a.rounds * frac)
        got = [s[i] for s in samples if s[0] >= want and s[i] is not None]
        return got[0] if got else None

    what = "bytes of logs in the store" if a.backend == "c10d" else "keys of the run in etcd"
    print(f"| {a.backend}, {len(times)} rounds, 2 agents | first tenth {first * 1e3:.1f} ms/round | last tenth "
          f"{last * 1e3:.1f} ms/round | last/first {last / first:.2f}x |")
    print(f"| RSS at 10% / 90% of the rounds | node 0 {at(0.1, 1)} / {at(0.9, 1)} kB | node 1 {at(0.1, 2)} / "
          f"{at(0.9, 2)} kB | |")
    print(f"| {what}, 10% / 90% | {at(0.1, 3)} / {at(0.9, 3)} | | |")


if __name__ == "__main__":
    main()
