#!/usr/bin/env python3
"""The README's "Using it" lines, run as written, each by bash from a folder laid out as the
README assumes (build/bin/ddprun, train.py), on hosts that have the README's addresses and
names: network namespaces 10.0.0.1-4 (the training nodes; /etc/hosts there names 10.0.0.1
"head") and 10.0.0.5-7 (etcd members "etcd1", "etcd2", "etcd3", listening on port 2379).

- The one-node lines (--standalone, torchrun's spelling on port 12355) train the real
  examples/pytorch/train.py, each in a namespace of its own (its loopback, its free ports).
- The multi-node lines (static on 10.0.0.1:29500 with --node-rank 0 and 1, as the README's
  comment says; c10d at head:29400 and etcd at etcd1..3:2379 on four nodes, as many as
  "2:4" allows, so the round forms at once) run a train.py that records each worker's
  environment (workers/rdzv_env.py): 8 workers per node and 16 or 32 ranks is what the
  lines ask, too many PyTorch processes for 2 cores. Real training across namespace hosts:
  test_multinode_netns.py, test_rdzv_edges_netns.py.
- `build/bin/ddprun --help`.
Needs root, iproute2 and (for the etcd line) etcd; skipped otherwise.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import ddprun_testlib as lib
import jobwatch
from test_c10d_netns import C10dTopology, NetnsHosts
from test_multinode_netns import Node

sys.path.insert(0, os.path.join(lib.SOURCE_DIR, "tests", "testlib"))
import etcd_cluster  # noqa: E402

RECORDER = os.path.join(lib.SOURCE_DIR, "tests", "launcher", "integration", "workers", "rdzv_env.py")
STAND_IN = f"""# train.py as the README's multi-node lines run it here: records this worker's start
import os, runpy, sys
sys.argv = [{RECORDER!r}, os.environ["README_REC"]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
TRAINING_NODES = 4
ETCD_MEMBERS = 3
HOSTS = "127.0.0.1 localhost\n10.0.0.1 head\n" + "".join(f"10.0.0.{5 + m} etcd{m + 1}\n"
                                                          for m in range(ETCD_MEMBERS))


def using_it_lines():
    """The commands of the README's "## Using it" sh block: continuations joined, comments
    and blank lines dropped."""
    with open(os.path.join(lib.SOURCE_DIR, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## Using it\n```sh\n(.*?)^```", text, re.M | re.S)
    if not m:
        raise AssertionError("README.md has no ```sh block under '## Using it'")
    joined = re.sub(r"\\\n\s*", "", m.group(1))
    lines = [re.sub(r"\s+#.*$", "", l).strip() for l in joined.splitlines()]
    return [l for l in lines if l and not l.startswith("#")]


class ReadmeTopology(C10dTopology):
    @staticmethod
    def addr(i):
        return f"10.0.0.{i + 1}"


class ReadmeLines(NetnsHosts):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        lib.check_prerequisites(cls)
        lines = using_it_lines()

        def line(pred, what):
            found = [l for l in lines if pred(l)]
            if len(found) != 1:
                raise AssertionError(f"README 'Using it': expected one {what} line, found {found}")
            return found[0]

        cls.standalone = line(lambda l: "--standalone" in l, "--standalone")
        cls.torchrun = line(lambda l: "--nproc_per_node=" in l, "torchrun spelling")
        cls.static = line(lambda l: "--node-rank 0" in l, "two-node static")
        cls.c10d = line(lambda l: "--rdzv-backend c10d" in l, "c10d")
        cls.etcd = line(lambda l: "--rdzv-backend etcd" in l, "etcd")
        cls.help = line(lambda l: l.endswith("--help"), "--help")
        if len(lines) != 6:
            raise AssertionError(f"README 'Using it' has lines this test does not run: {lines}")

    def setUp(self):
        super().setUp()
        self.real, self.stand_in = self.folder("real"), self.folder("stand_in")
        shutil.copy(os.path.join(lib.EXAMPLES, "train.py"), os.path.join(self.real, "train.py"))
        with open(os.path.join(self.stand_in, "train.py"), "w") as f:
            f.write(STAND_IN)

    def folder(self, name):
        """A folder laid out as the README assumes: build/bin/ddprun (this build), train.py."""
        d = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(d, "build", "bin"))
        os.symlink(lib.DDPRUN, os.path.join(d, "build", "bin", "ddprun"))
        return d

    def make_topology(self, nodes):
        self.topo = ReadmeTopology(nodes)
        self.topo.create()

    def hosts(self, nodes):
        self.make_topology(nodes)
        for i in range(nodes):
            self.etc_file(i, "hosts", HOSTS)

    def run_line(self, i, line, cwd, name):
        """`line` by bash in cwd, on host i (a namespace)."""
        out, err = (os.path.join(self.tmp, f"{name}.{s}") for s in ("out", "err"))
        fo, fe = open(out, "w"), open(err, "w")
        self._files += [fo, fe]
        proc = subprocess.Popen(["ip", "netns", "exec", self.topo.nodes[i], "bash", "-c", line], cwd=cwd,
                                stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=lib.job_env(TMPDIR=self.tmp, README_REC=self.rec))
        node = Node(i, proc, out, err)
        self.started.append(node)
        return node

    def finish(self, nodes, timeout):
        running = jobwatch.wait_exited(nodes, lib.scaled(timeout))
        if running:
            self.fail(f"still running after {lib.scaled(timeout):.0f} s: {[n.rank for n in running]}"
                      + self.describe())
        for n in nodes:
            self.assertEqual(n.rc, 0, self.describe())

    def describe(self):
        return "".join(f"\n--- host {n.rank} rc={n.rc}\nstdout:\n{n.stdout()[-2000:]}\nstderr:\n{n.stderr()[-3000:]}"
                       for n in self.started)

    def check_round(self, nodes, nproc, master_addrs):
        """One round: every worker of `nodes` hosts x nproc, ranks 0..N-1, one MASTER_ADDR
        among master_addrs, reachable from every worker."""
        rounds = jobwatch.rounds(self.records())
        self.assertEqual(len(rounds), 1, self.describe())
        rs = rounds[0]
        world = nodes * nproc
        self.assertEqual(sorted(int(r["env"]["RANK"]) for r in rs), list(range(world)), self.describe())
        self.assertEqual(len({r["env"]["MASTER_ADDR"] for r in rs}), 1, self.describe())
        for r in rs:
            self.assertEqual(r["env"]["WORLD_SIZE"], str(world))
            self.assertEqual(r["env"]["LOCAL_WORLD_SIZE"], str(nproc))
            self.assertIn(r["env"]["MASTER_ADDR"], master_addrs)
            self.assertTrue(r["store_reachable"], r)
        return rs

    def training_addrs(self):
        return [self.topo.addr(i) for i in range(TRAINING_NODES)]

    # ------------------------------------------------------------------ one node

    def test_one_node_lines_train(self):
        self.hosts(2)
        for i, line in enumerate((self.standalone, self.torchrun)):
            ckpt = os.path.join(self.real, "checkpoint.pt")
            if os.path.exists(ckpt):
                os.unlink(ckpt)
            n = self.run_line(i, line, self.real, f"one_node{i}")
            self.finish([n], 180)
            self.assertIn("parameters identical on all 4 ranks", n.stdout(), self.describe())
            epochs = 3 if "--epochs 3" in line else 8
            self.assertEqual(len(lib.losses(n.stdout())), epochs, self.describe())
            self.assertTrue(os.path.exists(ckpt), "train.py's default ./checkpoint.pt" + self.describe())
        self.assertIn("--master_port=12355", self.torchrun)

    def test_help(self):
        self.hosts(1)
        n = self.run_line(0, self.help, self.stand_in, "help")
        self.finish([n], 30)
        self.assertIn("--nproc-per-node", n.stdout())

    # ------------------------------------------------------------------ several nodes

    def test_two_node_static_line(self):
        self.hosts(2)
        nodes = [self.run_line(i, self.static.replace("--node-rank 0", f"--node-rank {i}"), self.stand_in,
                               f"static{i}") for i in range(2)]
        self.finish(nodes, 60)
        rs = self.check_round(2, 8, ["10.0.0.1"])
        self.assertTrue(all(r["env"]["MASTER_PORT"] == "29500" for r in rs))

    def test_elastic_c10d_line(self):
        self.hosts(TRAINING_NODES)
        nodes = [self.run_line(i, self.c10d, self.stand_in, f"c10d{i}") for i in range(TRAINING_NODES)]
        self.finish(nodes, 60)
        rs = self.check_round(TRAINING_NODES, 8, self.training_addrs())
        self.assertTrue(all(r["env"]["TORCHELASTIC_RUN_ID"] == "job42" for r in rs))
        self.assertIn("head:29400", self.c10d)

    def test_elastic_etcd_line(self):
        if not etcd_cluster.find_etcd():
            self.skipTest("no etcd binary (Debian package etcd-server; scripts/setup.sh installs it)")
        self.hosts(TRAINING_NODES + ETCD_MEMBERS)
        self.start_etcd()
        nodes = [self.run_line(i, self.etcd, self.stand_in, f"etcd{i}") for i in range(TRAINING_NODES)]
        self.finish(nodes, 60)
        rs = self.check_round(TRAINING_NODES, 8, self.training_addrs())
        self.assertTrue(all(r["env"]["TORCHELASTIC_RUN_ID"] == "job42" for r in rs))

    def start_etcd(self):
        """etcd1..3 on hosts 4..6, each at its address, client port 2379, peer port 2380."""
        data = tempfile.mkdtemp(prefix="etcd", dir=self.tmp)
        addrs = [self.topo.addr(TRAINING_NODES + m) for m in range(ETCD_MEMBERS)]
        initial = ",".join(f"etcd{m + 1}=http://{a}:2380" for m, a in enumerate(addrs))
        for m, a in enumerate(addrs):
            log = open(os.path.join(self.tmp, f"etcd{m + 1}.log"), "w")
            self._files.append(log)
            self.helpers.append(subprocess.Popen(
                ["ip", "netns", "exec", self.topo.nodes[TRAINING_NODES + m], etcd_cluster.find_etcd(),
                 "--name", f"etcd{m + 1}", "--data-dir", os.path.join(data, str(m)),
                 "--listen-client-urls", f"http://{a}:2379", "--advertise-client-urls", f"http://{a}:2379",
                 "--listen-peer-urls", f"http://{a}:2380", "--initial-advertise-peer-urls", f"http://{a}:2380",
                 "--initial-cluster", initial, "--initial-cluster-state", "new", "--log-level", "warn"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True))
        probe = ("import sys, urllib.request\nfor n in ('etcd1', 'etcd2', 'etcd3'):\n"
                 "    urllib.request.urlopen(f'http://{n}:2379/health', timeout=1).read()\n")
        deadline = time.monotonic() + lib.scaled(30)
        while time.monotonic() < deadline:
            if subprocess.run(["ip", "netns", "exec", self.topo.nodes[0], sys.executable, "-c", probe],
                              capture_output=True, timeout=lib.scaled(10)).returncode == 0:
                return
            time.sleep(0.2)
        self.fail("etcd1..3 not healthy within 30 s: " + "".join(
            open(os.path.join(self.tmp, f"etcd{m + 1}.log")).read()[-1500:] for m in range(ETCD_MEMBERS)))


if __name__ == "__main__":
    lib.main()
