#!/usr/bin/env python3
"""The dynamic rendezvous (--rdzv-backend c10d, issue 10) across real "hosts": every node is
its own network namespace with its own UTS hostname (the topology of
test_multinode_netns.py: a bridge namespace and 10.77.0.<i+1> per node; names carry a tag
with this process's pid, so parallel runs do not clash). The endpoint is node 0's address;
no node is told who hosts the store or what its address is: they infer it.

S6: three hosts, --nnodes 3: node ranks follow the hostnames, MASTER_ADDR is the address
of node rank 0 that the others reach, and every worker connects to it.
S7: a host's link goes down mid-run: the cut-off host stops its workers and exits, the
others re-form without it (or stop, when they lost the store), all within
keep_alive_interval x keep_alive_max_attempt + 2 s; nothing hangs.

Needs root (skipped otherwise). Workers: tests/launcher/integration/workers/rdzv_env.py,
which records its environment and start time (a round is its MASTER_PORT).
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
from test_multinode_netns import Node, Topology, ip, netns_unavailable_reason

RECORDER = os.path.join(lib.SOURCE_DIR, "tests", "launcher", "integration", "workers", "rdzv_env.py")
PORT = 29400  # torchrun's default c10d port: each node is its own host
# A silent node is lost after 0.5 s x 3; a round below --nnodes MAX completes 0.3 s after MIN.
KEEP_ALIVE, ATTEMPTS = 0.5, 3
CONF = f"last_call_timeout=0.3,join_timeout=10,keep_alive_interval={KEEP_ALIVE},keep_alive_max_attempt={ATTEMPTS}"
WINDOW = KEEP_ALIVE * ATTEMPTS
HOSTNAMES = ["nodeb0", "nodea1", "nodec2"]  # node i's hostname: node ranks sort them a1, b0, c2


def hang(seconds):
    return lib.scaled(seconds)


class C10dTopology(Topology):
    def __init__(self, nodes):
        super().__init__(nodes)
        self.tag = f"ddpc{os.getpid()}x{secrets.token_hex(2)}"
        self.bridge = f"{self.tag}_br"
        self.nodes = [f"{self.tag}_n{i}" for i in range(nodes)]

    def cut(self, i):
        ip("-n", self.nodes[i], "link", "set", self.ifname(i), "down")


class NetnsHosts(unittest.TestCase):
    """Hosts as network namespaces (C10dTopology), the ddprun nodes started on them, and what
    their workers recorded; everything started is killed and removed in tearDown. No tests
    of its own: test_rdzv_edges_netns.py builds on it too."""

    @classmethod
    def setUpClass(cls):
        why = netns_unavailable_reason()
        if why:
            raise unittest.SkipTest(why)
        if not os.access(lib.DDPRUN, os.X_OK):
            raise unittest.SkipTest(f"no ddprun binary at {lib.DDPRUN} (set DDPRUN)")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_c10d_netns_")
        self.rec = os.path.join(self.tmp, "rec")
        os.mkdir(self.rec)
        self.topo = None
        self.started = []
        self._files = []
        self.helpers = []  # other processes started here (relays, etcd members): killed by their pid
        self._etc_dirs = []

    def etc_file(self, i, name, text):
        """Writes /etc/netns/<node i's namespace>/<name>, which `ip netns exec` mounts over
        /etc/<name> (e.g. hosts); removed in tearDown."""
        d = os.path.join("/etc/netns", self.topo.nodes[i])
        if d not in self._etc_dirs:
            os.makedirs(d, exist_ok=True)
            self._etc_dirs.append(d)
        with open(os.path.join(d, name), "w") as f:
            f.write(text)

    def tearDown(self):
        try:
            for p in self.helpers:
                p.kill()
                p.wait()
            for n in self.started:
                if n.proc.poll() is None:
                    n.proc.send_signal(signal.SIGKILL)
            for n in self.started:
                try:
                    n.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            # Workers of a node killed outright: the pids they recorded, if they still run.
            for r in self.records():
                if lib_pid_alive(r["pid"]):
                    try:
                        os.kill(r["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        finally:
            if self.topo:
                self.topo.destroy()
            for d in self._etc_dirs:
                shutil.rmtree(d, ignore_errors=True)
            for f in self._files:
                f.close()
            if os.environ.get("DDPRUN_IT_KEEP"):
                print(f"\nkept {self.tmp}", flush=True)
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)

    def make_topology(self, nodes):
        self.topo = C10dTopology(nodes)
        self.topo.create()

    def records(self):
        return jobwatch.start_records(self.rec)


class C10dNetns(NetnsHosts):
    def start_node(self, i, nnodes, script_args, extra=()):
        """ddprun on node i, under its own hostname, with the endpoint on node 0."""
        ns = self.topo.nodes[i]
        argv = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                HOSTNAMES[i], lib.DDPRUN, "--log-level", "info", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"{self.topo.addr(0)}:{PORT}", "--rdzv-id", "netjob", "--nnodes", nnodes, "--nproc-per-node", "2",
                "--rdzv-conf", CONF, *extra, RECORDER, self.rec, *script_args]
        out, err = (os.path.join(self.tmp, f"node{i}.{s}") for s in ("out", "err"))
        fo, fe = open(out, "w"), open(err, "w")
        self._files += [fo, fe]
        proc = subprocess.Popen(argv, cwd=self.tmp, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                env=lib.job_env(TMPDIR=self.tmp), start_new_session=True)
        node = Node(i, proc, out, err)
        self.started.append(node)
        return node

    def wait_all(self, nodes, timeout):
        running = jobwatch.wait_exited(nodes, hang(timeout))
        if running:
            self.fail(f"nodes still running after {hang(timeout):.0f} s: {[n.rank for n in running]}"
                      + self.describe())

    def describe(self):
        return "".join(f"\n--- node {n.rank} ({HOSTNAMES[n.rank]}) rc={n.rc}\nstdout:\n{n.stdout()[-2000:]}\n"
                       f"stderr:\n{n.stderr()[-4000:]}" for n in self.started)

    def rounds(self):
        return jobwatch.rounds(self.records())

    def wait_round(self, world, timeout=30):
        deadline = time.monotonic() + hang(timeout)
        while time.monotonic() < deadline:
            for rs in self.rounds():
                if rs[0]["env"]["WORLD_SIZE"] == str(world) and len(rs) >= world:
                    return rs
            time.sleep(0.02)
        self.fail(f"no round of world {world} within {hang(timeout):.0f} s" + self.describe())

    # ------------------------------------------------------------------ tests

    def test_s6_three_hosts_ranks_by_hostname_master_addr_reachable(self):
        self.make_topology(3)
        nodes = [self.start_node(i, "3", ["--sleep", "0.3"]) for i in range(3)]
        self.wait_all(nodes, 40)
        for n in nodes:
            self.assertEqual(n.rc, 0, self.describe())
        rounds = self.rounds()
        self.assertEqual(len(rounds), 1, self.describe())
        rs = rounds[0]
        self.assertEqual(sorted(int(r["env"]["RANK"]) for r in rs), list(range(6)))
        # Node ranks sort the hostnames: nodea1 (node 1) = 0, nodeb0 (node 0) = 1, nodec2 = 2.
        group_of_node = {1: 0, 0: 1, 2: 2}
        for r in rs:
            e = r["env"]
            g = int(e["GROUP_RANK"])
            node = {v: k for k, v in group_of_node.items()}[g]
            self.assertEqual(sorted(int(x["env"]["RANK"]) for x in rs if x["env"]["GROUP_RANK"] == str(g)),
                             [2 * g, 2 * g + 1])
            self.assertEqual(e["WORLD_SIZE"], "6")
            self.assertEqual(e["GROUP_WORLD_SIZE"], "3")
            # Rank 0 is nodea1: MASTER_ADDR is its address on the network the others share.
            self.assertEqual(e["MASTER_ADDR"], self.topo.addr(1), e)
            self.assertTrue(r["store_reachable"], f"rank {e['RANK']} on node {node} could not connect to "
                                                  f"{e['MASTER_ADDR']}:{e['MASTER_PORT']}")
            self.assertEqual(e["TORCHELASTIC_USE_AGENT_STORE"], "True")
        # Who hosts was inferred: the endpoint's address is node 0's own.
        self.assertRegex(nodes[0].stderr(), rf"this node hosts the c10d store on port {PORT} \('10\.77\.0\.1' "
                                            r"resolves to 10\.77\.0\.1, an address of this machine\)")
        for i in (1, 2):
            self.assertRegex(nodes[i].stderr(), rf"joining the c10d store at 10\.77\.0\.1:{PORT} \(not hosting it: "
                                                rf"'10\.77\.0\.1' .* is not this machine: its hostname is "
                                                rf"'{HOSTNAMES[i]}'")
            self.assertRegex(nodes[i].stderr(), r"node rank %d of 3 \(nodea1 \(.*\), nodeb0 \(.*\), nodec2 \(.*\)\)"
                             % group_of_node[i])

    def partition_run(self, cut):
        """Three hosts in --nnodes 2:3 with restarts left; node `cut`'s link goes down once
        round 0 runs. Returns (nodes, time of the cut)."""
        self.make_topology(3)
        args = ["--sleep", "60", "--sleep-at-world", "4=0.5"]
        nodes = [self.start_node(i, "2:3", args, extra=["--max-restarts", "2"]) for i in range(3)]
        self.wait_round(6)
        time.sleep(2 * KEEP_ALIVE)  # a renewal or two went through
        t_cut = time.time()
        self.topo.cut(cut)
        return nodes, t_cut

    def test_s7_partitioned_host_stops_and_the_others_reform(self):
        nodes, t_cut = self.partition_run(cut=2)
        cut_off = nodes[2]
        r0 = self.rounds()[0]
        # The cut-off host stops its workers and exits within the window (+ 2 s).
        self.wait_all([cut_off], 30)
        self.assertNotEqual(cut_off.rc, 0)
        self.assertLess(cut_off.exited_at - t_cut, WINDOW + 2, self.describe())
        self.assertRegex(cut_off.stderr(), r"this node lost contact with the c10d store at 10\.77\.0\.1:\d+ for the "
                                           r"keep-alive window", self.describe())
        # Said as it stops its workers and once more as its last line, not a third time.
        self.assertEqual(cut_off.stderr().count("lost contact"), 2, cut_off.stderr())
        for r in r0:
            if r["env"]["GROUP_RANK"] == "2":
                self.assertFalse(lib_pid_alive(r["pid"]), "a worker of the cut-off host still runs")
        # The others re-form without it within the window (+ 2 s) and finish.
        r1 = self.wait_round(4)
        self.assertLess(min(r["t"] for r in r1) - t_cut, WINDOW + 2, self.describe())
        self.wait_all(nodes[:2], 30)
        self.assertEqual([n.rc for n in nodes[:2]], [0, 0], self.describe())
        self.assertEqual({r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in r1}, {"1"})
        self.assertEqual({r["env"]["MASTER_ADDR"] for r in r1}, {self.topo.addr(1)})
        for n in nodes[:2]:  # the silence as measured: the window, or a few ms more on a loaded machine
            self.assertRegex(n.stderr(), r"node nodec2 \(nodec2_\d+_[0-9a-f]{8}\) was lost: no keep-alive for 1\.5\d? s",
                             self.describe())
        print(f"\nS7: link down to the cut-off host's exit {cut_off.exited_at - t_cut:.2f} s, to the others' new "
              f"workers {min(r['t'] for r in r1) - t_cut:.2f} s (window {WINDOW} s)", file=sys.stderr)

    def test_s7_partitioned_store_host_everyone_stops(self):
        nodes, t_cut = self.partition_run(cut=0)
        # The others lose the store and stop; the store host is left alone (below --nnodes
        # MIN 2) and stops too.
        self.wait_all(nodes, 30)
        for n in nodes:
            self.assertNotEqual(n.rc, 0, self.describe())
        for n in nodes[1:]:
            self.assertLess(n.exited_at - t_cut, WINDOW + 2, f"node {n.rank}" + self.describe())
            self.assertRegex(n.stderr(), r"this node lost contact with the c10d store at 10\.77\.0\.1:\d+",
                             self.describe())
        # The host sees both leases end within moments of each other. When it sees both at
        # once it stops at once (below MIN). When it sees one first, it starts to re-form
        # with the other, and stops when the second lease ends (before: it waited out
        # join_timeout, 10 s here, in that join; test_c10d's
        # test_s3_second_loss_while_reforming_stops_at_once).
        self.assertLess(nodes[0].exited_at - t_cut, WINDOW + 2, self.describe())
        self.assertRegex(nodes[0].stderr(), r"(not restarting: .*|was lost while the next round of job 'netjob' "
                                            r"formed; )only 1 node remains, fewer than the 2 the job needs",
                         self.describe())
        self.assertEqual(len(self.rounds()), 1)
        print(f"\nS7: store host cut off: nodes exited after {[round(n.exited_at - t_cut, 2) for n in nodes]} s "
              f"(window {WINDOW} s)", file=sys.stderr)
        for r in self.records():
            self.assertFalse(lib_pid_alive(r["pid"]), f"worker {r['pid']} outlived its node")


def lib_pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


if __name__ == "__main__":
    lib.main()
