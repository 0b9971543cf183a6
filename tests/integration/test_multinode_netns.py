#!/usr/bin/env python3
"""Real multi-node ddprun jobs: every node is its own network namespace.

Topology (names get a random tag, so concurrent runs do not collide):

    ddpt_<tag>_br : bridge br0, with veth p<i> to each node
    ddpt_<tag>_n<i>: lo up, veth ddpt<i> with 10.77.0.<i+1>/24

Node 0 (10.77.0.1) hosts the store on port 29600. Gloo picks the interface of the
hostname's address by default, which here is 127.0.0.1 (useless across namespaces), so each
node's workers get GLOO_SOCKET_IFNAME=ddpt<i>.

Needs root (ip netns add); the whole file is skipped otherwise. Every namespace created is
deleted in tearDown, and only the processes started here are killed. On torch 1.13 and, as
integration.multinode_netns.torch2, on torch 2.6 (the workers enter the chroot from their
node's namespace).
"""
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import ddprun_testlib as lib
import jobwatch

MASTER_ADDR = "10.77.0.1"
MASTER_PORT = 29600


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=lib.scaled(30))


def netns_unavailable_reason():
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "no 'ip' command (iproute2)"
    probe = f"ddpt_{secrets.token_hex(3)}_probe"
    try:
        r = ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"'ip netns add' failed: {r.stderr.strip()}"
        r = ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"cannot create a bridge in a namespace: {r.stderr.strip()}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


class Topology:
    """A bridge namespace and one namespace per node, joined by veth pairs."""

    def __init__(self, nodes):
        self.tag = f"ddpt_{secrets.token_hex(3)}"
        self.bridge = f"{self.tag}_br"
        self.nodes = [f"{self.tag}_n{i}" for i in range(nodes)]
        self.created = []

    def add_ns(self, name):
        ip("netns", "add", name)
        self.created.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def create(self):
        self.add_ns(self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, ns in enumerate(self.nodes):
            self.add_ns(ns)
            dev, peer = self.ifname(i), f"p{i}"
            ip("-n", ns, "link", "add", dev, "type", "veth", "peer", "name", peer, "netns", self.bridge)
            ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", self.bridge, "link", "set", peer, "master", "br0")
            ip("-n", self.bridge, "link", "set", peer, "up")

    def destroy(self):
        for ns in reversed(self.created):
            ip("netns", "del", ns, check=False)
        self.created.clear()

    @staticmethod
    def ifname(i):
        return f"ddpt{i}"

    @staticmethod
    def addr(i):
        return f"10.77.0.{i + 1}"


class Node:
    """One ddprun started inside a node's namespace; output goes to files."""

    def __init__(self, rank, proc, out, err):
        self.rank, self.proc, self.out_path, self.err_path = rank, proc, out, err
        self.exited_at = None

    @property
    def rc(self):
        return self.proc.returncode

    def stdout(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()


class MultiNodeNetns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = netns_unavailable_reason()
        if why:
            raise unittest.SkipTest(why)
        lib.check_prerequisites(cls)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_netns_")
        self.topo = None
        self.started = []

    def tearDown(self):
        # Only the ddprun processes started here (ip netns exec execs ddprun in place);
        # ddprun takes its workers down with it.
        for n in self.started:
            if n.proc.poll() is None:
                n.proc.send_signal(signal.SIGTERM)
        for n in self.started:
            try:
                n.proc.wait(timeout=lib.scaled(30))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(timeout=lib.scaled(30))
        if self.topo:
            self.topo.destroy()
        if os.environ.get("DDPRUN_IT_KEEP"):
            print(f"\nkept {self.tmp}", flush=True)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def make_topology(self, nodes):
        self.topo = Topology(nodes)
        self.topo.create()

    def start_node(self, i, nnodes, nproc, script, script_args=(), ddprun_args=()):
        ns = self.topo.nodes[i]
        argv = ["ip", "netns", "exec", ns, lib.DDPRUN, "--nnodes", str(nnodes), "--node-rank", str(i),
                "--master-addr", MASTER_ADDR, "--master-port", str(MASTER_PORT), "--nproc-per-node", str(nproc),
                "--local-addr", self.topo.addr(i), *ddprun_args, script, *script_args]
        out, err = (os.path.join(self.tmp, f"node{i}.{s}") for s in ("out", "err"))
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(argv, cwd=self.tmp, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                    env=lib.job_env(GLOO_SOCKET_IFNAME=self.topo.ifname(i), TMPDIR=self.tmp))
        node = Node(i, proc, out, err)
        self.started.append(node)
        return node

    def wait_all(self, nodes, timeout):
        """Until every node exited; `timeout` (seconds, scaled here) only guards against a hang."""
        timeout = lib.scaled(timeout)
        running = jobwatch.wait_exited(nodes, timeout, poll_s=0.05)
        if running:
            self.fail(f"nodes still running after {timeout} s: {[n.rank for n in running]}\n" + self.describe(nodes))

    @staticmethod
    def describe(nodes):
        return "".join(f"\n--- node {n.rank} rc={n.rc}\nstdout:\n{n.stdout()}\nstderr:\n{n.stderr()}" for n in nodes)

    # ------------------------------------------------------------------ tests

    def run_until_not_torch_exit_race(self, start, done, timeout):
        """Nodes from start(), until they exited; once more when the job failed only by torch's
        exit race (lib.torch_exit_abort: a rank aborted in torch's exit after rank 0 printed
        `done`, and ddprun stopped the job, as it should), saying so on stderr."""
        for attempt in range(2):
            nodes = start()
            self.wait_all(nodes, timeout)
            raced = any(n.rc == 128 + 6 and lib.TORCH_EXIT_ABORT in n.stderr() for n in nodes)
            if attempt == 0 and raced and done in nodes[0].stdout():
                print(f"\n{self.id()}: a worker aborted in torch's exit after the job was done "
                      f"({lib.TORCH_EXIT_ABORT!r}); running the job again:{self.describe(nodes)}", file=sys.stderr)
                continue
            return nodes

    def test_three_nodes_train(self):
        self.make_topology(3)
        ckpt = os.path.join(self.tmp, "ckpt.pt")

        def start():
            if os.path.exists(ckpt):
                os.unlink(ckpt)  # each run writes its own
            return [self.start_node(i, 3, 2, os.path.join(lib.EXAMPLES, "train.py"), ["--checkpoint", ckpt, "--debug"])
                    for i in range(3)]

        nodes = self.run_until_not_torch_exit_race(start, "parameters identical on all 6 ranks", 150)
        for n in nodes:
            self.assertEqual(n.rc, 0, self.describe(nodes))
        loss = lib.losses(nodes[0].stdout())
        self.assertGreaterEqual(len(loss), 3, self.describe(nodes))
        self.assertLess(loss[-1], loss[0] * 0.5, f"the loss did not fall: {loss}")
        self.assertIn("training on 6 ranks", nodes[0].stdout())
        self.assertIn("parameters identical on all 6 ranks", nodes[0].stdout())
        self.assertTrue(os.path.isfile(ckpt))
        for n in nodes:
            env_lines = [l for l in n.stdout().splitlines() if " env: " in l]
            self.assertEqual(len(env_lines), 2, n.stdout())
            for l in env_lines:
                self.assertIn(f"GROUP_RANK={n.rank}", l)
                self.assertIn("WORLD_SIZE=6", l)
                self.assertIn(f"MASTER_ADDR={MASTER_ADDR} MASTER_PORT={MASTER_PORT}", l)
                self.assertIn("TORCHELASTIC_USE_AGENT_STORE=True", l)
            ranks = sorted(int(l.split("rank ")[1].split()[0]) for l in env_lines)
            self.assertEqual(ranks, [2 * n.rank, 2 * n.rank + 1])

    def test_killed_worker_stops_every_node(self):
        self.make_topology(3)
        nodes = [self.start_node(i, 3, 2, os.path.join(lib.WORKERS, "kill_self.py"), ["--kill-rank", "3"])
                 for i in range(3)]
        self.wait_all(nodes, 120)
        killed = [l for l in nodes[1].stdout().splitlines() if "KILLING rank 3 at" in l]
        self.assertEqual(len(killed), 1, self.describe(nodes))
        killed_at = float(killed[0].rsplit(" ", 1)[1])
        for n in nodes:
            self.assertNotEqual(n.rc, 0, self.describe(nodes))
            # A second or two; the other ranks sleep 300 s unless stopped.
            self.assertLess(n.exited_at - killed_at, lib.scaled(30),
                            f"node {n.rank} took too long\n" + self.describe(nodes))
        # The node that lost the worker names it; node 0 reports the root cause.
        self.assertIn("Signal 9 (SIGKILL)", nodes[1].stderr(), self.describe(nodes))
        self.assertRegex(nodes[1].stderr(), r"rank\s*: 3 \(local_rank: 1\)")
        for n in (nodes[0], nodes[2]):
            self.assertRegex(n.stderr(), r"node \S+ \(node rank 1, [^)]*\): rank 3 .*SIGKILL", self.describe(nodes))

    def test_missing_node_join_timeout(self):
        self.make_topology(2)
        t0 = time.time()
        node0 = self.start_node(0, 2, 2, os.path.join(lib.EXAMPLES, "allreduce.py"),
                                ddprun_args=["--rdzv-conf", "join_timeout=3"])
        self.wait_all([node0], 60)
        self.assertNotEqual(node0.rc, 0, self.describe([node0]))
        # At the 3 s join timeout, plus ddprun's start: far from the default of 600 s.
        self.assertLess(node0.exited_at - t0, 3 + lib.scaled(17), self.describe([node0]))
        self.assertRegex(node0.stderr(), r"node rank 1 never joined", self.describe([node0]))
        self.assertEqual(node0.stdout(), "", "no worker may start without the rendezvous")


if __name__ == "__main__":
    lib.main()
