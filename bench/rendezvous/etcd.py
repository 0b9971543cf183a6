#!/usr/bin/python3
"""The etcd rendezvous (issue 13) beside the c10d store, measured in the same run.

  /usr/bin/python3 bench/rendezvous/etcd.py [--runs 5] [--sizes 8,64] [--loss-runs 5] [--json out.json]

1. rendezvous: N agents on loopback with one `true` worker each (`--nnodes N`), from starting
   the N agents (build/bin/ddp-bench-spawn-n) to the last one's exit, through a one-member
   etcd (`--rdzv-backend etcd`, a member started here, tests/testlib/etcd_cluster.py) and
   through the c10d store (`--rdzv-backend c10d`, hosted by the agent at the endpoint).
2. rank-0 host loss: 3 agents (`--nnodes 2:3 --max-restarts 1`, one sleeping shell worker
   each, keep_alive_interval=0.5, keep_alive_max_attempt=3, last_call_timeout=0.3); node
   rank 0 (which hosts the round's worker store) is SIGKILLed with its worker; from the kill
   to the survivors' first new worker. etcd notices the loss when the node's lease expires
   (its ttl, in whole seconds: 2 s here); anchor: c10d with the rendezvous in a
   ddp-store-server of its own, which notices at once (the lost node's connection closes).
Prints markdown tables of medians and ratios.
"""
import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
import etcd_cluster  # noqa: E402
from ports import free_port  # noqa: E402

DDPRUN = os.path.join(ROOT, "build", "bin", "ddprun")
SPAWN_N = os.path.join(ROOT, "build", "bin", "ddp-bench-spawn-n")
STORE_SERVER = os.path.join(ROOT, "build", "bin", "ddp-store-server")
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
LOSS_CONF = "last_call_timeout=0.3,join_timeout=30,keep_alive_interval=0.5,keep_alive_max_attempt=3"


def rendezvous_once(n, backend, endpoint, run_id):
    cmd = [DDPRUN, "--nnodes", str(n), "--nproc-per-node", "1", "--rdzv-backend", backend, "--rdzv-endpoint",
           endpoint, "--rdzv-id", run_id, "--no-python", "true"]
    r = subprocess.run([SPAWN_N, str(n)] + cmd, env=ENV, capture_output=True, text=True, timeout=600)
    dt, failed = r.stdout.split()
    if int(failed):
        raise RuntimeError(f"{backend} x{n}: {failed} agents failed; rerun one by hand: {' '.join(cmd)}")
    return float(dt)


def loss_once(tmp, backend, endpoint, run_id):
    """Seconds from SIGKILL of node rank 0 (and its worker) to the survivors' first new worker."""
    rec = tempfile.mkdtemp(dir=tmp)
    script = f'echo "$(date +%s.%N) $$ $GROUP_RANK $MASTER_PORT $WORLD_SIZE" > {rec}/w$$; exec sleep 60'
    procs = []
    for k in range(3):
        cmd = [DDPRUN, "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "1", "--rdzv-backend", backend,
               "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--local-addr", f"127.0.0.{k + 2}", "--rdzv-conf",
               LOSS_CONF + (",is_host=0" if backend == "c10d" else ""), "--no-python", "sh", "-c", script]
        procs.append(subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))

    def workers():
        out = []
        for f in glob.glob(os.path.join(rec, "w*")):
            parts = open(f).read().split()
            if len(parts) == 5:
                out.append((float(parts[0]), int(parts[1]), parts[2], parts[3], parts[4]))
        return out

    try:
        deadline = time.monotonic() + 60
        while len([w for w in workers() if w[4] == "3"]) < 3:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{backend}: the first round did not start")
            time.sleep(0.02)
        first = [w for w in workers() if w[4] == "3"]
        rank0_worker = next(w for w in first if w[2] == "0")
        agent = procs[0]  # node ranks are sorted by address: 127.0.0.2 is rank 0
        t_kill = time.time()
        agent.send_signal(signal.SIGKILL)
        os.kill(rank0_worker[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            new = [w for w in workers() if w[4] == "2"]
            if new:
                return min(w[0] for w in new) - t_kill
            if time.monotonic() > deadline:
                raise RuntimeError(f"{backend}: the survivors did not re-form")
            time.sleep(0.01)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
        for w in workers():
            try:
                os.kill(w[1], signal.SIGKILL)
            except ProcessLookupError:
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="8,64")
    ap.add_argument("--loss-runs", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    for p in (DDPRUN, SPAWN_N, STORE_SERVER):
        if not os.access(p, os.X_OK):
            sys.exit(f"missing {p}: build first (scripts/setup.sh)")
    etcd = etcd_cluster.EtcdCluster(1)
    results = {"rendezvous": {}, "loss": {}}
    tmp = tempfile.mkdtemp(prefix="ddprun-bench-etcd-")
    n_run = 0
    try:
        for n in [int(x) for x in a.sizes.split(",")]:
            for backend in ("etcd", "c10d"):
                times = []
                for _ in range(a.runs):
                    n_run += 1
                    ep = etcd.endpoints() if backend == "etcd" else f"127.0.0.1:{free_port()}"
                    times.append(rendezvous_once(n, backend, ep, f"bench-{os.getpid()}-{n_run}"))
                results["rendezvous"][f"{backend} {n}"] = statistics.median(times)
                print(f"{backend} x{n}: {times}", file=sys.stderr)
        store = subprocess.Popen([STORE_SERVER, "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        store_port = int(store.stdout.readline().decode().strip().split("=")[1])
        try:
            for backend in ("etcd", "c10d"):
                times = []
                for _ in range(a.loss_runs):
                    n_run += 1
                    ep = etcd.endpoints() if backend == "etcd" else f"127.0.0.1:{store_port}"
                    times.append(loss_once(tmp, backend, ep, f"loss-{os.getpid()}-{n_run}"))
                results["loss"][backend] = statistics.median(times)
                print(f"loss {backend}: {times}", file=sys.stderr)
        finally:
            store.send_signal(signal.SIGKILL)
            store.wait()
    finally:
        etcd.stop()
    r = results["rendezvous"]
    print("\n| agents | etcd (s) | c10d store (s) | etcd / c10d |\n|---|---|---|---|")
    for n in [int(x) for x in a.sizes.split(",")]:
        e, c = r[f"etcd {n}"], r[f"c10d {n}"]
        print(f"| {n} | {e:.3f} | {c:.3f} | {e / c:.2f} |")
    lo = results["loss"]
    print("\n| rank-0 host SIGKILLed -> new workers | etcd (s) | c10d, separate store (s) | etcd / c10d |\n|---|---|---|---|")
    print(f"| 3 agents, lease 1.5 s (etcd: 2 s) | {lo['etcd']:.2f} | {lo['c10d']:.2f} | {lo['etcd'] / lo['c10d']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
