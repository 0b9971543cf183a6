#!/usr/bin/python3
"""Faults at random against a multi-node job, and how long the job takes to be whole again.

  /usr/bin/python3 bench/rendezvous/chaos.py [--seeds 1-6] [--steps 20] [--ddprun OTHER/build/bin/ddprun]
                                             [--mode elastic|host|static] [--etcd]

Per seed, four nodes of one worker each, `--max-restarts 1000`, a 1.5 s keep-alive window:
  elastic  `--nnodes 1:4` on a ddp-store-server of its own (--etcd: one etcd member, started
           once, and the etcd backend)
  host     `--nnodes 1:4`, the first node hosts the c10d store (the usual set-up)
  static   `--nnodes 4 --node-rank I`, node rank 0 hosts the store
Then, one at a time, a step picked at random (seeded):
  kill       SIGKILL a node's ddprun
  term       SIGTERM a node's ddprun (it leaves)
  worker     SIGKILL one worker (a counted restart)
  freeze     SIGSTOP a node's ddprun for 3 s (twice the window), then SIGCONT
  reform     SIGKILL one node, and SIGSTOP another 0.05-0.6 s later, while it re-forms, for 3 s
             (elastic and host)
  blip       SIGSTOP a node's ddprun for 0.3 s: nothing may happen (the round runs on)
  add        start a new node (elastic and host, while fewer than four run)
After each step the live nodes must be whole again within 15 s: every live worker in one
round, as many as there are live nodes, with that WORLD_SIZE, and no worker of an older
round alive (a frozen node's stale workers stopped). A step that ends the job (any node's
loss in a static job; the store host's kill or SIGTERM) must leave no node and no worker
alive, no node exiting 0; the next step then starts the job afresh. Prints each step, then
the time each kind of step took to be whole (from the step's end), and exits 1 at the first
step that did not converge (its run folder, /tmp/ddprun-chaos/seed<N>, keeps every node's
output).
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "tests", d) for d in ("testlib", "common")]
from ports import free_port  # noqa: E402
DDPRUN = os.path.join(ROOT, "build", "bin", "ddprun")
STORE = os.path.join(ROOT, "build", "bin", "ddp-store-server")
WORKER = os.path.join(ROOT, "tests", "launcher", "integration", "workers", "rdzv_env.py")
CONF = "last_call_timeout=0.5,join_timeout=30,keep_alive_interval=0.5,keep_alive_max_attempt=3"
FREEZE = 3.0  # twice the window
BLIP = 0.3  # well within the window, less its interval


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


class Job:
    def __init__(self, seed, ddprun, etcd, mode):
        self.rng = random.Random(seed)
        self.ddprun = ddprun
        self.etcd, self.mode = etcd, mode
        self.tmp = f"/tmp/ddprun-chaos/seed{seed}"
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.makedirs(f"{self.tmp}/rec")
        self.store = None
        self.nodes = {}
        self.generation = []  # the nodes of the running job, in the order they came
        self.jobs = 0

    def fresh(self):
        """A new job (on a new port): four nodes; the first hosts the store (host, static)."""
        self.jobs += 1
        self.generation = []
        if self.etcd:
            self.rdzv = ["--rdzv-backend", "etcd", "--rdzv-endpoint", self.etcd.endpoints(), "--rdzv-id",
                         f"{os.path.basename(self.tmp)}j{self.jobs}"]
        elif self.mode == "elastic":
            if not self.store:
                self.port = self.serve()
            self.rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id",
                         f"chaos{self.jobs}"]
        else:
            self.port = free_port()
        for _ in range(4):
            self.start()

    def serve(self):
        self.store = subprocess.Popen([STORE, "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE,
                                      stderr=open(f"{self.tmp}/store.err", "w"), start_new_session=True)
        return int(self.store.stdout.readline().decode().split("=")[1])

    def start(self):
        i = len(self.nodes)
        name, addr, first = f"n{i}", f"127.0.0.{10 + i}", not self.generation
        if self.mode == "static":
            rdzv = ["--nnodes", "4", "--node-rank", str(len(self.generation)), "--master-addr", "127.0.0.1",
                    "--master-port", str(self.port)]
        elif self.mode == "host":
            rdzv = ["--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                    "--rdzv-id", "chaos"]
        else:
            rdzv = ["--nnodes", "1:4", *self.rdzv]
        conf = CONF + (f",is_host={int(first)}" if self.mode == "host" else "")
        argv = [self.ddprun, "--log-level", "info", *rdzv, "--nproc-per-node", "1", "--max-restarts", "1000",
                "--local-addr", addr, "--rdzv-conf", conf, WORKER, f"{self.tmp}/rec", "--sleep", "1000"]
        self.nodes[name] = subprocess.Popen(argv, stdout=open(f"{self.tmp}/{name}.out", "w"),
                                            stderr=open(f"{self.tmp}/{name}.err", "w"), stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        self.generation.append(name)
        return name

    def live(self):
        return {n: p for n, p in self.nodes.items() if p.poll() is None}

    def workers(self):
        """The live workers, by round (MASTER_PORT: fresh every round)."""
        out = {}
        for f in glob.glob(f"{self.tmp}/rec/start_*.json"):
            try:
                with open(f) as fh:
                    r = json.load(fh)
            except ValueError:
                continue  # being written
            if alive(r["pid"]):
                out.setdefault(r["env"]["MASTER_PORT"], []).append(r)
        return out

    def whole(self, limit):
        """None once the live nodes run one round with all their workers; else why not."""
        t0 = time.time()
        why = ""
        while time.time() - t0 < limit:
            nodes, w = self.live(), self.workers()
            if len(w) == 1:
                rs = next(iter(w.values()))
                worlds = {r["env"]["WORLD_SIZE"] for r in rs}
                if len(rs) == len(nodes) and worlds == {str(len(nodes))}:
                    return None
                why = f"one round: {len(rs)} workers of world {worlds}, {len(nodes)} nodes alive"
            elif not w and not nodes:
                return None
            else:
                why = f"{len(w)} rounds have live workers ({', '.join(str(len(v)) for v in w.values())}), " \
                      f"{len(nodes)} nodes alive"
            time.sleep(0.05)
        return why

    def step(self):
        nodes = self.live()
        if not nodes:  # the last step ended the job
            self.fresh()
            return "fresh", f"job {self.jobs}"
        kinds = ["kill", "term", "worker", "freeze", "blip"]
        if self.mode != "static":
            kinds += ["reform"] + (["add"] if len(nodes) < 4 else [])
        kind = self.rng.choice(kinds)
        if self.mode != "static" and (kind == "add" or len(nodes) < 2 or (kind == "reform" and len(nodes) < 3)):
            return "add", self.start()
        victim = self.rng.choice(sorted(nodes))
        p = nodes[victim]
        if kind in ("kill", "term"):
            p.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            p.wait()
            return kind, victim
        if kind == "worker":
            r = self.rng.choice(sorted((r for rs in self.workers().values() for r in rs), key=lambda r: r["pid"]))
            os.kill(r["pid"], signal.SIGKILL)
            for _ in range(200):  # until it is gone (a zombie): measured from then
                if not alive(r["pid"]):
                    break
                time.sleep(0.01)
            return kind, f"rank {r['env']['RANK']}"
        if kind == "reform":
            other = self.rng.choice([n for n in sorted(nodes) if n != victim])
            nodes[other].send_signal(signal.SIGKILL)
            nodes[other].wait()
            time.sleep(self.rng.uniform(0.05, 0.6))
        p.send_signal(signal.SIGSTOP)
        time.sleep(BLIP if kind == "blip" else FREEZE)
        p.send_signal(signal.SIGCONT)
        return kind, victim

    def ended_well(self):
        """None when no node of the job that just ended exited 0 (its workers sleep); else who did."""
        zero = [n for n in self.generation if self.nodes[n].returncode == 0]
        return f"nodes {zero} exited 0" if zero else None

    def stop(self):
        for p in self.nodes.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        for rs in self.workers().values():  # orphans of SIGKILLed nodes, if any: ours
            for r in rs:
                try:
                    os.kill(r["pid"], signal.SIGKILL)
                except OSError:
                    pass
        if self.store:
            self.store.kill()
            self.store.wait()


def seeds(text):
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1-6")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ddprun", default=DDPRUN, help="another build's ddprun (the store server stays this build's)")
    ap.add_argument("--mode", choices=["elastic", "host", "static"], default="elastic")
    ap.add_argument("--etcd", action="store_true", help="the etcd backend, on one etcd member (etcd-server)")
    args = ap.parse_args()
    if args.etcd and args.mode != "elastic":
        ap.error("--etcd is an elastic job's backend (nobody hosts etcd's rendezvous)")
    etcd = None
    if args.etcd:
        import etcd_cluster
        etcd = etcd_cluster.EtcdCluster(1)
    try:
        return run(args, etcd)
    finally:
        if etcd:
            etcd.stop()


def run(args, etcd):
    took = {}
    for seed in seeds(args.seeds):
        job = Job(seed, args.ddprun, etcd, args.mode)
        try:
            job.fresh()
            why = job.whole(30)
            if why:
                print(f"seed {seed}: the job never formed: {why}")
                return 1
            for i in range(args.steps):
                before = set(job.workers())
                host = job.generation[0] if args.mode != "elastic" else None
                kind, whom = job.step()
                t0 = time.time()
                why = job.whole(30 if kind == "fresh" else 15)
                dt = time.time() - t0
                if why is None and kind == "blip" and set(job.workers()) != before:
                    why = "a pause within the window restarted the round"
                ended = kind != "fresh" and not job.live()
                if why is None and ended:
                    why = job.ended_well()
                label = kind + (" of the store host" if whom == host else "") + (": the job ended" if ended else "")
                print(f"seed {seed} step {i}: {kind} {whom}{' (the store host)' if whom == host else ''}: " +
                      (f"{'ended' if ended else 'whole'} after {dt:.2f} s" if why is None else
                       f"NOT WHOLE: {why} ({job.tmp})"), flush=True)
                if why:
                    return 1
                took.setdefault(label, []).append(dt)
        finally:
            job.stop()
    print("\n| step | count | median to whole (or to the job's end) | max |\n|---|---|---|---|")
    for kind, ts in sorted(took.items()):
        print(f"| {kind} | {len(ts)} | {statistics.median(ts):.2f} s | {max(ts):.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
