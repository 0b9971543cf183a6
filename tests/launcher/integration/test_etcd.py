"""Issue 13: the dynamic rendezvous over etcd (--rdzv-backend etcd / etcd-v2, etcd's v3 API)
with real ddprun agents on loopback (--local-addr 127.0.0.K) and real etcd members
(Debian's etcd-server) that this file starts once: one member, three members, one TLS
member (tests/testlib/etcd_cluster.py). Workers are workers/rdzv_env.py, as in
test_c10d.py (whose helpers this file reuses); a round is told apart by its MASTER_PORT.

With etcd nobody hosts the rendezvous; each round's node rank 0 hosts its workers' store.
Hang guards scale with DDP_TEST_TIMEOUT_SCALE.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "testlib"))
from ddprun_testlib import DDPRUN, clean_env, free_port, pid_alive, read_text, scaled, vm_rss_kb, worker  # noqa: E402
import jobwatch  # noqa: E402
from test_c10d import C10dTestCase, hang  # noqa: E402
import etcd_cluster  # noqa: E402

# Short timings: a round closes 1 s after MIN nodes joined; a node lease of 1.5 s (etcd
# grants whole seconds: 2 s).
CONF = "last_call_timeout=1,join_timeout=20,keep_alive_interval=0.5,keep_alive_max_attempt=3"
FAST = CONF.replace("last_call_timeout=1", "last_call_timeout=0.3")
# With three members the keep-alive window must outlast a leader election (etcd's default
# election timeout is 1 s; a new leader takes 1-3 s here, and more than 4 s once in CI, at the
# suite's busiest): 8 s, scaled (a slow machine elects slower; the window is a guard here,
# not what is tested).
THREE = ("last_call_timeout=0.3,join_timeout=20,keep_alive_interval=1,"
         f"keep_alive_max_attempt={max(8, round(scaled(8)))}")

# Rounds of test_rounds_hold_no_more_state (about 0.12 s each on 2 cores: a minute).
ROUNDS = 500

_clusters = {}
_pki_dir = None


def cluster(kind):
    """The file's etcd members, started on first use: "one", "three" or "tls"."""
    global _pki_dir
    if kind not in _clusters:
        if kind == "tls":
            _pki_dir = tempfile.mkdtemp(prefix="ddprun-etcd-pki-")
            _clusters["pki"] = etcd_cluster.TestPki(_pki_dir)
            _clusters[kind] = etcd_cluster.EtcdCluster(1, tls=_clusters["pki"])
        else:
            _clusters[kind] = etcd_cluster.EtcdCluster(1 if kind == "one" else 3)
        print(f"\n[etcd] {kind}: ready in {_clusters[kind].start_time:.1f} s", file=sys.stderr)
    return _clusters[kind]


def tearDownModule():
    for k, c in _clusters.items():
        if k != "pki":
            c.stop()
    if _pki_dir:
        import shutil
        shutil.rmtree(_pki_dir, ignore_errors=True)


class EtcdTestCase(C10dTestCase):
    members = "one"
    BACKEND = "etcd"
    DEFAULT_CONF = CONF

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not etcd_cluster.find_etcd():
            raise unittest.SkipTest("no etcd binary (Debian package etcd-server; scripts/setup.sh installs it)")

    def setUp(self):
        super().setUp()
        self.etcd = cluster(self.members)
        self.endpoint = self.etcd.endpoints()
        self.run_id = f"{self._testMethodName}-{os.getpid()}"

    def run_keys(self, member=0):
        return self.etcd.keys(member, f"/ddprun/rdzv/{self.run_id}/")

    def no_secrets(self, text):
        self.assertNotIn("PRIVATE KEY", text)
        self.assertNotIn("-----BEGIN", text)


class EtcdScenarios(EtcdTestCase):
    def test_s1_three_nodes_form_one_job(self):
        args = ["--sleep", "0.3"]
        nodes = [self.start_node(n, a, args, nnodes="3", conf=FAST)
                 for n, a in (("C", "127.0.0.4"), ("A", "127.0.0.2"), ("B", "127.0.0.3"))]
        self.wait_nodes(nodes, 30)
        self.assertEqual([n.rc for n in nodes], [0, 0, 0], self.describe())
        rounds = self.rounds()
        self.assertEqual(len(rounds), 1, self.describe())
        self.check_round(rounds[0], 6, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], restarts=0)
        self.assertEqual(self.group_rank_of(rounds[0]), {0: [0, 1], 1: [2, 3], 2: [4, 5]})
        for r in rounds[0]:
            e = r["env"]
            # The workers' store is hosted by rank 0's ddprun: workers are its clients.
            self.assertEqual(e["TORCHELASTIC_USE_AGENT_STORE"], "True")
            self.assertEqual(e["TORCHELASTIC_RUN_ID"], self.run_id)
            self.assertEqual(e["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(e["ROLE_WORLD_SIZE"], "6")
        for n in nodes:
            self.assertIn(f"rendezvous: etcd at {self.endpoint}", n.stderr())
            self.assertRegex(n.stderr(), r"round 0 of job '[^']+': node rank \d of 3")
        # The last node to leave removed the run's keys: a reused run id starts clean.
        self.wait_for(lambda: not self.run_keys(), hang(5), "the run's keys to go: " + str(self.run_keys()))

    def test_s2_late_node_scales_up(self):
        args = ["--sleep", "30", "--sleep-at-world", "6=0.3"]
        a = self.start_node("A", "127.0.0.2", args)
        b = self.start_node("B", "127.0.0.3", args)
        self.wait_workers(4, world=4)
        c = self.start_node("C", "127.0.0.4", args, backend="etcd-v2")  # the other name: the same run
        self.wait_nodes([a, b, c], 40)
        self.assertEqual((a.rc, b.rc, c.rc), (0, 0, 0), self.describe())
        rounds = self.rounds()
        self.assertEqual(len(rounds), 2, "exactly one restart" + self.describe())
        self.check_round(rounds[0], 4, ["127.0.0.2", "127.0.0.3"], restarts=0)
        self.check_round(rounds[1], 6, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], restarts=0)
        self.assertNotEqual(rounds[0][0]["env"]["MASTER_PORT"], rounds[1][0]["env"]["MASTER_PORT"])
        for n in (a, b):
            self.assertRegex(n.stderr(), r"a node is waiting to join .*127\.0\.0\.4.*not counted as a restart")

    def test_s3_worker_failure_restart_counted(self):
        args = ["--sleep", "0.5", "--fail-rank", "3", "--fail-code", "7", "--fail-after", "0.2", "--fail-restarts", "0"]
        kw = dict(nnodes="2", conf=FAST, extra=["--max-restarts", "1"])
        a = self.start_node("A", "127.0.0.2", args, **kw)
        b = self.start_node("B", "127.0.0.3", args, **kw)
        self.wait_nodes([a, b], 40)
        self.assertEqual((a.rc, b.rc), (0, 0), self.describe())
        rounds = self.rounds()
        self.assertEqual(len(rounds), 2, self.describe())
        self.check_round(rounds[0], 4, ["127.0.0.2", "127.0.0.3"], restarts=0)
        self.check_round(rounds[1], 4, ["127.0.0.2", "127.0.0.3"], restarts=1)
        for r in rounds[1]:
            self.assertEqual(r["env"]["TORCHELASTIC_MAX_RESTARTS"], "1")

    def test_rounds_hold_no_more_state(self):
        """Issue 19: a job's keys in etcd and its agents' memory do not grow with its age. Two
        agents whose worker fails at once (every round a counted restart) run ROUNDS rounds;
        between 10% and 90% of them the run's keys (exit logs, counters, the events and
        requests logs' lines, lease records) and each agent's RSS stay flat (before: an exit
        log and counter more every round, a lease-end line more in every node's pending
        record, and about ten log lines more a round)."""
        rounds = ROUNDS
        rec = self.path("rounds")
        kw = dict(nnodes="2", conf=FAST, nproc=1, extra=["--max-restarts", str(rounds), "--no-python"],
                  script="sh", script_args=[os.path.join(HERE, "workers", "fail_round.sh"), rec])
        agents = [self.start_node(n, addr, **kw) for n, addr in (("A", "127.0.0.2"), ("B", "127.0.0.3"))]
        samples = {}
        for at in (rounds // 10, rounds * 4 // 10, rounds * 9 // 10):
            why = jobwatch.wait_round(rec, at, agents, scaled(60))
            self.assertIsNone(why, f"{why}{self.describe()}")
            keys = self.run_keys()
            samples[at] = (len(keys), [vm_rss_kb(a.proc.pid) for a in agents])
        self.wait_nodes(agents, 120)
        (k1, _), (_, rss4), (k9, rss9) = (samples[rounds * i // 10] for i in (1, 4, 9))
        # The lines since the last trim (a round's or two) come and go.
        self.assertLessEqual(k9, k1 + 16, f"the run's keys at round {rounds // 10}: {k1}, at {rounds * 9 // 10}: "
                                          f"{k9}:\n" + "\n".join(keys))
        # glibc's heap settles over the first rounds, with one step of up to 0.8 MB at a
        # round that varies from run to run: the slack is above that, far below a leak's
        # 250 rounds' worth.
        for before, after, name in zip(rss4, rss9, "AB"):
            self.assertLess(after - before, 1024, f"{name}'s RSS grew from {before} to {after} kB")

    def test_s5_node_beyond_max_waits_and_times_out_alone(self):
        args = ["--sleep", "4"]
        kw = dict(nnodes="1:2", conf=FAST)
        a = self.start_node("A", "127.0.0.2", args, **kw)
        b = self.start_node("B", "127.0.0.3", args, **kw)
        r0 = self.wait_workers(4, world=4)
        c = self.start_node("C", "127.0.0.4", args, nnodes="1:2", conf=FAST.replace("join_timeout=20", "join_timeout=1.5"))
        self.wait_nodes([c], 20)
        self.assertNotEqual(c.rc, 0)
        self.assertRegex(c.stderr(), r"the job '[^']+' is full: its 2 nodes \(the maximum, --nnodes 1:2\) are running "
                                     r"\(.*127\.0\.0\.2.*127\.0\.0\.3.*\); this node waited join_timeout 1\.5",
                         self.describe())
        self.wait_nodes([a, b], 30)
        self.assertEqual((a.rc, b.rc), (0, 0), self.describe())
        self.assertEqual([r["pid"] for r in self.rounds()[0]], [r["pid"] for r in r0])
        self.assertEqual(len(self.rounds()), 1, "the waiting node did not disturb the job" + self.describe())

    def test_s8_fewer_than_min_join_timeout_names_who_came(self):
        # Two of the three nodes needed come; both give up after join_timeout, naming who was
        # there: the first to give up names both, the other may find it gone already (it
        # left the round when it gave up), as with c10d.
        conf = FAST.replace("join_timeout=20", "join_timeout=2")
        a = self.start_node("A", "127.0.0.2", ["--sleep", "1"], nnodes="3", conf=conf)
        b = self.start_node("B", "127.0.0.3", ["--sleep", "1"], nnodes="3", conf=conf)
        t0 = time.time()
        self.wait_nodes([a, b], 20)
        counts = []
        for n in (a, b):
            self.assertNotEqual(n.rc, 0, self.describe())
            self.assertLess(n.exited_at - t0, hang(2 + 5), self.describe())
            err = n.stderr()
            m = re.search(r"ddprun: error: rendezvous: no round of job '[^']+' formed at etcd at 127\.0\.0\.1:\d+ within "
                          r"join_timeout 2 s \(--rdzv-conf join_timeout=SECONDS\): (\d) of the 3 nodes needed "
                          r"\(--nnodes 3:3\) joined: (.*)", err)
            self.assertTrue(m, self.describe())
            counts.append(int(m.group(1)))
            self.assertRegex(m.group(2), rf"\({re.escape(n.addr)}, {re.escape(n.addr)}_{n.proc.pid}_[0-9a-f]{{8}}\)")
        self.assertEqual(max(counts), 2, self.describe())
        self.assertEqual(self.records(), [])

    def test_etcd_down_longer_than_join_timeout_clear_error(self):
        # A waits for a second node; etcd goes away for good: A stops with the endpoint and
        # the reason, within join_timeout + read_timeout, and leaves no worker behind.
        conf = FAST.replace("join_timeout=20", "join_timeout=3") + ",read_timeout=2"
        a = self.start_node("A", "127.0.0.2", ["--sleep", "1"], nnodes="2", conf=conf)
        self.wait_for(lambda: "rendezvous: etcd at" in a.stderr(), hang(10), "A to start")
        time.sleep(0.5)
        t_kill = time.time()
        self.etcd.kill(0)
        try:
            self.wait_nodes([a], 3 + 2 + 5)
        finally:
            self.etcd.start(0)
        self.assertNotEqual(a.rc, 0)
        self.assertLess(a.exited_at - t_kill, hang(3 + 2 + 3), self.describe())
        err = a.stderr()
        self.assertIn(self.endpoint, err.splitlines()[-1] if err.strip() else "", self.describe())
        self.assertRegex(err, r"(?i)ddprun: error: .*(connection refused|lost contact|cannot connect)", self.describe())

    def test_unreachable_etcd_says_so_after_10_s(self):
        """No etcd where the endpoint says: after 10 s the node says what it is trying, since
        when, until when and each member's error, then gives up at read_timeout with exit 1
        (before: silent until then, 60 s with the defaults)."""
        port = free_port()
        p = subprocess.run([DDPRUN, "--rdzv-backend", "etcd", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                            self.run_id, "--nnodes", "1", "--rdzv-conf", "read_timeout=12", "--no-python", "true"],
                           env=clean_env(TMPDIR=self.tmp), capture_output=True, text=True, timeout=hang(60))
        self.assertEqual(p.returncode, 1, p.stderr)
        refused = f"cannot connect to 127.0.0.1:{port}: Connection refused"
        warned = [l for l in p.stderr.splitlines() if "still trying" in l]
        self.assertEqual(len(warned), 1, p.stderr)
        self.assertTrue(warned[0].endswith(
            f"warning] rendezvous: still trying: etcd at 127.0.0.1:{port}: granting this node's lease: no member has "
            f"answered for 10 s of 12 s: {refused}"), p.stderr)
        self.assertTrue(p.stderr.splitlines()[-1].endswith(f"no member answered within 12 s: {refused}"), p.stderr)

    def test_signal_while_etcd_is_frozen(self):
        # etcd frozen (SIGSTOP) before a node starts: the kernel accepts the node's
        # connections and nobody answers them. A SIGTERM to the node while it opens the
        # rendezvous stops it at once (exit 143), not after read_timeout (60 s here) or
        # join_timeout; thawed, etcd serves the next test as before.
        member = self.etcd.members[0]["proc"]  # started by this file
        os.kill(member.pid, signal.SIGSTOP)
        try:
            a = self.start_node("A", "127.0.0.2", ["--sleep", "1"], nnodes="2",
                                conf=CONF.replace("join_timeout=20", "join_timeout=300") + ",read_timeout=60")
            time.sleep(scaled(1.5))  # it has connected and waits for etcd's first reply
            t0 = time.time()
            a.proc.send_signal(signal.SIGTERM)
            self.wait_nodes([a], 10)
        finally:
            os.kill(member.pid, signal.SIGCONT)
        self.assertEqual(a.rc, 128 + signal.SIGTERM, self.describe())
        self.assertLess(a.exited_at - t0, scaled(2), "a signal must not wait for etcd" + self.describe())
        self.assertIn("received SIGTERM while connecting to the rendezvous", a.stderr(), self.describe())
        self.assertEqual(self.records(), [], "no worker started" + self.describe())
        self.etcd.wait_ready(30)

    def test_rank0_host_killed_survivors_reform_under_a_new_rank0(self):
        # A is node rank 0 and hosts the round's worker store: SIGKILL it (and its workers).
        # B and C re-form with B as rank 0 and a new store; the rendezvous never was on A.
        args = ["--sleep", "30", "--sleep-at-world", "4=0.3"]
        kw = dict(conf=FAST, extra=["--max-restarts", "1"])
        a = self.start_node("A", "127.0.0.2", args, **kw)
        b = self.start_node("B", "127.0.0.3", args, **kw)
        c = self.start_node("C", "127.0.0.4", args, **kw)
        r0 = self.wait_workers(6, world=6)
        a_workers = [r["pid"] for r in r0 if r["env"]["GROUP_RANK"] == "0"]
        t_kill = time.time()
        for pid in [a.proc.pid] + a_workers:
            os.kill(pid, signal.SIGKILL)
        r1 = self.wait_workers(4, world=4)
        reform = min(r["t"] for r in r1) - t_kill
        self.wait_nodes([b, c], 30)
        self.assertEqual((b.rc, c.rc), (0, 0), self.describe())
        self.check_round(r1, 4, ["127.0.0.3", "127.0.0.4"], restarts=1)
        self.assertNotEqual(r0[0]["env"]["MASTER_PORT"], r1[0]["env"]["MASTER_PORT"])
        # etcd sees A's lease expire: 2 s (its ttl, whole seconds) + up to 0.5 s + the last call.
        self.assertLess(reform, hang(6), self.describe())
        print(f"\nrank-0 host SIGKILLed -> survivors' new workers: {reform:.2f} s", file=sys.stderr)

    def test_a_lost_node_below_min_is_replaced_within_replace_timeout(self):
        # --nnodes 2, --rdzv-conf replace_timeout: B's ddprun and workers are SIGKILLed (its
        # lease expires in etcd); A stops its workers and waits; a new node C takes B's place.
        args = ["--sleep", "30", "--sleep-at-restart", "1=0.3"]
        kw = dict(nnodes="2", conf=FAST + ",replace_timeout=30", extra=["--max-restarts", "2"])
        a = self.start_node("A", "127.0.0.2", args, **kw)
        b = self.start_node("B", "127.0.0.3", args, **kw)
        self.wait_workers(4, world=4)
        b.proc.send_signal(signal.SIGKILL)  # its guardian takes its workers with it
        self.wait_for(lambda: "replace_timeout" in a.stderr(), hang(10), "A to wait for a replacement" +
                      self.describe())
        self.assertEqual(len(self.rounds()), 1)
        c = self.start_node("C", "127.0.0.4", args, **kw)
        self.wait_nodes([a, c], 30)
        self.assertEqual((a.rc, c.rc), (0, 0), self.describe())
        r1 = self.rounds()[-1]
        self.check_round(r1, 4, ["127.0.0.2", "127.0.0.4"], restarts=1)


class EtcdNodeFaults(EtcdTestCase):
    """What test_edges.py does to c10d and static nodes, done to etcd nodes: a node that
    finishes early (the one whose ddprun hosts the workers' store among them), a node frozen
    past the keep-alive window, a signal while a node waits for others. Workers are
    workers/edge_worker.py: start_<rank>, end_<rank>, term_<rank> (with the time) in the
    test's folder."""

    JOIN = scaled(3)            # join_timeout: what an exit barrier would have waited
    WORK = JOIN + scaled(4)     # the slow rank works past it and past the keep-alive window

    def edge_node(self, name, addr, script_args, conf=None, nnodes="2"):
        conf = conf or (f"last_call_timeout=0.3,join_timeout={self.JOIN:g},keep_alive_interval=0.5,"
                        "keep_alive_max_attempt=3")
        return self.start_node(name, addr, [self.tmp, *script_args], nnodes=nnodes, conf=conf,
                               script=worker("edge_worker.py"))

    def stamp(self, name):
        p = self.path(name)
        return float(read_text(p)) if os.path.exists(p) else None

    def check_early_finisher(self, slow_rank):
        """Every node exits 0; the slow rank finished untouched; the node whose workers were
        done waited until then (node rank 0 keeps its workers' store up meanwhile)."""
        a, b = (self.edge_node(n, addr, ["--sleep-rank", f"{slow_rank}={self.WORK:g}"])
                for n, addr in (("A", "127.0.0.2"), ("B", "127.0.0.3")))
        self.wait_nodes([a, b], self.WORK + 30)
        self.assertEqual((a.rc, b.rc), (0, 0), self.describe())
        end = self.stamp(f"end_{slow_rank}")
        self.assertIsNotNone(end, "the slow rank must finish its work" + self.describe())
        for r in range(4):
            self.assertIsNone(self.stamp(f"term_{r}"), f"rank {r} was signalled" + self.describe())
        for n in (a, b):
            self.assertGreaterEqual(n.exited_at, end - 0.05,
                                    f"{n.name} left before the slow rank ended" + self.describe())
        # The node that finished first (seconds before the other) said why it stayed. (The
        # last one says it too only when the round's end takes it over a second: load.)
        early = b if slow_rank < 2 else a
        self.assertIn("this node's workers all succeeded; waiting for the other nodes'", early.stderr(),
                      self.describe())

    def test_early_finisher_node_rank_0_works_longer(self):
        self.check_early_finisher(slow_rank=0)

    def test_early_finisher_node_rank_0_finishes_first(self):
        """Node rank 0's ddprun hosts the workers' store: finished first, it keeps serving
        the other node's workers until they are done."""
        self.check_early_finisher(slow_rank=2)

    def test_frozen_node_stops_its_stale_workers(self):
        """A node frozen (SIGSTOP of its ddprun and its workers) past the keep-alive window is
        lost when etcd ends its lease: the others re-form without it. Thawed, it learns that
        its lease ended, stops its stale workers and exits 1; no worker of its starts beside
        the re-formed job."""
        conf = "last_call_timeout=1,join_timeout=30,keep_alive_interval=0.5,keep_alive_max_attempt=3"
        nodes = {n: self.start_node(n, addr, ["--sleep", "300"], nnodes="2:3", conf=conf, extra=["--max-restarts", "3"])
                 for n, addr in (("A", "127.0.0.2"), ("B", "127.0.0.3"), ("C", "127.0.0.4"))}
        r0 = self.wait_workers(6, world=6, timeout=30)
        # Node ranks follow the addresses (check_round): C (127.0.0.4) is node rank 2.
        self.check_round(r0, 6, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], restarts=0)
        c_workers = [r["pid"] for r in r0 if r["env"]["GROUP_RANK"] == "2"]
        frozen = [nodes["C"].proc.pid] + c_workers
        for pid in frozen:
            self.track_pid(pid)
            os.kill(pid, signal.SIGSTOP)
        t0 = time.time()
        try:
            r1 = self.wait_workers(4, world=4, timeout=30)
        finally:
            thawed = time.time()
            for pid in reversed(frozen):
                os.kill(pid, signal.SIGCONT)
        # etcd ends the lease after its ttl (2 s: whole seconds) and up to 0.5 s more when idle
        # (up to 7 s more seen under CI's load: test_etcd_backend.cpp); then the last call
        # (1 s) and the new workers' start.
        self.assertLess(min(r["t"] for r in r1) - t0, hang(15), self.describe())
        c = nodes["C"]
        self.wait_nodes([c], 10)
        self.assertEqual(c.rc, 1, self.describe())
        self.assertLess(c.exited_at - thawed, scaled(3), self.describe())
        self.assertRegex(c.stderr(), r"lost contact|declared lost by the rendezvous|lease has ended", self.describe())
        # No worker of C's beside the re-formed job: the records are round 0's six and round 1's four.
        self.assertEqual([len(rs) for rs in self.rounds()], [6, 4],
                         "no new worker on the frozen node" + self.describe())
        for pid in c_workers:
            self.assertFalse(os.path.exists(os.path.join(self.rec, f"end_{pid}")), "its workers were stopped")
            self.assertFalse(pid_alive(pid), f"its worker {pid} still runs")
        self.check_round(r1, 4, ["127.0.0.2", "127.0.0.3"], restarts=1)
        for n in "AB":
            self.assertIsNone(nodes[n].proc.poll(), "the re-formed job trains on" + self.describe())

    def test_signal_while_waiting_for_nodes(self):
        a = self.edge_node("A", "127.0.0.2", ["--sleep", "30"],
                           conf="join_timeout=300,keep_alive_interval=0.5,keep_alive_max_attempt=3")
        self.wait_for(lambda: "rendezvous: etcd at" in a.stderr(), hang(10), "A to join")
        time.sleep(scaled(1))  # it waits for a second node
        t0 = time.time()
        a.proc.send_signal(signal.SIGTERM)
        self.wait_nodes([a], 10)
        self.assertEqual(a.rc, 128 + signal.SIGTERM, self.describe())
        self.assertLess(a.exited_at - t0, scaled(3), "a signal must not wait for the join" + self.describe())
        self.assertEqual(os.listdir(self.tmp).count("start_0"), 0, "no worker started")
        self.wait_for(lambda: not self.run_keys(), hang(5), "the run's keys to go: " + str(self.run_keys()))


class EtcdThreeMembers(EtcdTestCase):
    members = "three"
    # The agents reconnect to the remaining members; the job carries on (no restart).

    def tearDown(self):
        for i in range(3):
            if not self.etcd.running(i):
                self.etcd.start(i, wait=False)
        self.etcd.wait_ready(30)
        super().tearDown()

    def test_leader_killed_during_a_running_job(self):
        args = ["--sleep", "5"]
        a = self.start_node("A", "127.0.0.2", args, nnodes="2", conf=THREE)
        b = self.start_node("B", "127.0.0.3", args, nnodes="2", conf=THREE)
        self.wait_workers(4, world=4)
        leader = self.etcd.leader()
        self.assertGreaterEqual(leader, 0)
        self.etcd.kill(leader)
        self.wait_nodes([a, b], 30)
        self.assertEqual((a.rc, b.rc), (0, 0), self.describe())
        self.assertEqual(len(self.rounds()), 1, "the job carried on: no restart" + self.describe())

    def test_leader_killed_during_a_round(self):
        args = ["--sleep", "0.5"]
        a = self.start_node("A", "127.0.0.2", args, nnodes="3", conf=THREE)
        b = self.start_node("B", "127.0.0.3", args, nnodes="3", conf=THREE)
        self.wait_for(lambda: "rendezvous: etcd at" in a.stderr() + b.stderr(), hang(10), "A and B to start")
        time.sleep(0.3)  # A and B are in the round, waiting for a third
        leader = self.etcd.leader()
        self.assertGreaterEqual(leader, 0)
        self.etcd.kill(leader)
        c = self.start_node("C", "127.0.0.4", args, nnodes="3", conf=THREE)
        self.wait_nodes([a, b, c], 40)
        self.assertEqual((a.rc, b.rc, c.rc), (0, 0, 0), self.describe())
        rounds = self.rounds()
        self.assertEqual(len(rounds), 1, self.describe())
        self.check_round(rounds[0], 6, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], restarts=0)

class EtcdTls(EtcdTestCase):
    members = "tls"

    def conf(self, **kw):
        pki = _clusters["pki"]
        c = dict(protocol="https", cacert=pki.ca, cert=pki.client_cert, key=pki.client_key)
        c.update(kw)
        return FAST + "," + ",".join(f"{k}={v}" for k, v in c.items() if v is not None)

    def test_right_certificates_work(self):
        a = self.start_node("A", "127.0.0.2", ["--sleep", "0.2"], nnodes="2", conf=self.conf())
        b = self.start_node("B", "127.0.0.3", ["--sleep", "0.2"], nnodes="2", conf=self.conf())
        self.wait_nodes([a, b], 30)
        self.assertEqual((a.rc, b.rc), (0, 0), self.describe())
        self.check_round(self.rounds()[0], 4, ["127.0.0.2", "127.0.0.3"], restarts=0)
        for n in (a, b):
            self.assertIn("https", n.stderr())
            self.no_secrets(n.stderr() + n.stdout())

    def test_wrong_ca_fails_naming_endpoint_and_problem(self):
        a = self.start_node("A", "127.0.0.2", ["--sleep", "0.2"], nnodes="2",
                            conf=self.conf(cacert=_clusters["pki"].other_ca))
        self.wait_nodes([a], 20)
        self.assertNotEqual(a.rc, 0)
        err = a.stderr()
        self.assertRegex(err, r"ddprun: error: .*TLS with 127\.0\.0\.1:\d+: the member's certificate is not accepted",
                         self.describe())
        self.no_secrets(err)
        self.assertEqual(self.records(), [])

    def test_missing_client_certificate_is_refused(self):
        a = self.start_node("A", "127.0.0.2", ["--sleep", "0.2"], nnodes="2", conf=self.conf(cert=None, key=None))
        self.wait_nodes([a], 20)
        self.assertNotEqual(a.rc, 0)
        self.assertRegex(a.stderr(), r"ddprun: error: .*127\.0\.0\.1:\d+.*(client certificate|refused)", self.describe())

    def test_https_to_a_plain_http_member_fails_clearly(self):
        plain = cluster("one")
        a = self.start_node("A", "127.0.0.2", ["--sleep", "0.2"], nnodes="2", conf=self.conf(),
                            endpoint=plain.endpoints())
        self.wait_nodes([a], 20)
        self.assertNotEqual(a.rc, 0)
        self.assertRegex(a.stderr(), r"ddprun: error: .*TLS with 127\.0\.0\.1:\d+: the member does not answer in TLS",
                         self.describe())

    def test_http_to_a_tls_member_fails_clearly(self):
        a = self.start_node("A", "127.0.0.2", ["--sleep", "0.2"], nnodes="2", conf=FAST)
        self.wait_nodes([a], 20)
        self.assertNotEqual(a.rc, 0)
        self.assertRegex(a.stderr(), r"ddprun: error: .*127\.0\.0\.1:\d+.*(speaks TLS|is it a TLS etcd\?).* use protocol=https", self.describe())

    def test_unreadable_key_file_exit_2(self):
        a = self.start_node("A", "127.0.0.2", ["--sleep", "0.2"], nnodes="2",
                            conf=self.conf(key="/nonexistent/ddprun-test.key"))
        self.wait_nodes([a], 20)
        self.assertEqual(a.rc, 2, self.describe())
        lines = [l for l in a.stderr().splitlines() if l.startswith("ddprun: error:")]
        self.assertEqual(len(lines), 1, self.describe())
        self.assertIn("/nonexistent/ddprun-test.key", lines[0])


class EtcdTransport(EtcdTestCase):
    """The etcd transport (HTTP, TLS, OpenSSL) is a plugin, lib/ddprun/etcd-http.so beside
    bin/ddprun, that only a job using etcd loads (docs/design.md, "etcd rendezvous backend")."""

    def mapped_files(self, pid):
        with open(f"/proc/{pid}/maps") as f:
            return {line.split()[-1] for line in f if len(line.split()) >= 6}

    def maps_once_a_worker_runs(self, proc, started):
        self.wait_for(lambda: os.path.exists(started) or proc.poll() is not None, hang(20), "a worker to start")
        self.assertIsNone(proc.poll(), "ddprun ended before its worker started")
        maps = self.mapped_files(proc.pid)
        proc.send_signal(signal.SIGTERM)  # the pid this test started
        proc.wait(timeout=hang(30))
        return maps

    def test_only_an_etcd_job_loads_the_transport(self):
        started = self.path("started")
        worker_cmd = ["--no-python", "sh", "-c", f"touch {started}; sleep 30"]
        p = self.start(["--standalone", "--nproc-per-node", "1"] + worker_cmd)
        maps = self.maps_once_a_worker_runs(p, started)
        self.assertFalse([m for m in maps if "etcd-http" in m or "ssl" in m or "crypto" in m], sorted(maps))
        os.unlink(started)
        p = self.start(["--rdzv-backend", "etcd", "--rdzv-endpoint", self.endpoint, "--rdzv-id", self.run_id,
                        "--rdzv-conf", FAST, "--nnodes", "1", "--nproc-per-node", "1"] + worker_cmd)
        maps = self.maps_once_a_worker_runs(p, started)
        plugin = os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(DDPRUN)), "..", "lib", "ddprun",
                                               "etcd-http.so"))
        self.assertIn(plugin, maps)
        # ddprun itself holds none of OpenSSL: not its code, not its tables to relocate at start.
        with open(DDPRUN, "rb") as f:
            self.assertNotIn(b"OPENSSL_init_ssl", f.read())

    def run_copied_ddprun(self, plugin=None):
        """An etcd job run by a copy of ddprun in a folder of its own, beside `plugin` (a file
        copied to lib/ddprun/etcd-http.so) or none."""
        root = self.path("copy")
        os.makedirs(os.path.join(root, "bin"))
        shutil.copy(DDPRUN, os.path.join(root, "bin", "ddprun"))
        if plugin:
            os.makedirs(os.path.join(root, "lib", "ddprun"))
            shutil.copy(plugin, os.path.join(root, "lib", "ddprun", "etcd-http.so"))
        p = subprocess.run([os.path.join(root, "bin", "ddprun"), "--rdzv-backend", "etcd", "--rdzv-endpoint",
                            self.endpoint, "--rdzv-id", self.run_id, "--nnodes", "1", "--nproc-per-node", "1",
                            "--no-python", "true"], env=clean_env(TMPDIR=self.tmp), capture_output=True, text=True,
                           timeout=hang(30))
        lines = [l for l in p.stderr.splitlines() if l.startswith("ddprun: error:")]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertEqual(p.returncode, 1, p.stderr)
        return lines[0], os.path.join(root, "lib", "ddprun", "etcd-http.so")

    def test_without_its_transport_an_etcd_job_fails_naming_it(self):
        line, where = self.run_copied_ddprun()
        self.assertIn(f"the etcd rendezvous needs ddprun's etcd transport, {where}, which cannot be loaded", line)
        self.assertIn("No such file", line)

    def test_a_transport_from_elsewhere_is_refused(self):
        libddp = os.path.join(os.path.dirname(DDPRUN), "..", "lib", "libddp.so")
        line, where = self.run_copied_ddprun(plugin=libddp)
        self.assertIn(f"{where} is not ddprun's etcd transport (it has no ddprun_etcd_transport)", line)

    def test_a_transport_from_another_build_is_refused(self):
        # ddprun's own interface with the next interface number (workers/etcd_other_abi.cpp).
        line, where = self.run_copied_ddprun(plugin=os.environ["DDP_TEST_ETCD_OTHER_ABI"])
        self.assertRegex(line, rf"{re.escape(where)} is from another build of ddprun \(interface (\d+), this "
                               r"ddprun's (\d+)\): install ddprun and its etcd transport from one build")
        theirs, ours = map(int, re.search(r"interface (\d+), this ddprun's (\d+)", line).groups())
        self.assertEqual(theirs, ours + 1)


if __name__ == "__main__":
    unittest.main()
