"""Static multi-node rendezvous on one machine: two ddprun processes (--nnodes 2,
--node-rank 0/1) agree on ranks and world size, and a failure on one node stops both."""
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DDPRUN, DdprunTestCase, clean_env, free_port, read_text, scaled, worker


def accepts(port):
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class MultiNodeTest(DdprunTestCase):
    def start_node(self, rank, port, args):
        out = open(self.path(f"node{rank}.stdout"), "wb")
        err = open(self.path(f"node{rank}.stderr"), "wb")
        self._files += [out, err]
        return self.start(["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                           "--master-port", str(port), "--nproc-per-node", "2", "--rdzv-conf",
                           f"join_timeout={scaled(60):g}",
                           *args], stdout=out, stderr=err)

    def test_two_nodes_ranks_and_world(self):
        port = free_port()
        nodes = [self.start_node(r, port, [worker("env_dump.py"), self.tmp]) for r in (1, 0)]
        for n in nodes:
            self.assertEqual(n.wait(timeout=scaled(90)), 0, read_text(self.path("node0.stderr")) +
                             read_text(self.path("node1.stderr")))
        seen = {}
        for r in range(4):
            with open(self.path(f"env_{r}.json")) as f:
                v = json.load(f)["env"]
            seen[r] = v
            self.assertEqual(v["RANK"], str(r))
            self.assertEqual(v["WORLD_SIZE"], "4")
            self.assertEqual(v["GROUP_WORLD_SIZE"], "2")
            self.assertEqual(v["GROUP_RANK"], str(r // 2))
            self.assertEqual(v["LOCAL_RANK"], str(r % 2))
            self.assertEqual(v["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(v["MASTER_PORT"], str(port))
        self.assertEqual(len({v["TORCHELASTIC_RUN_ID"] for v in seen.values()}), 1)

    def syn_dropping_port(self):
        """A port whose listener's accept queue is full: the kernel drops every new SYN, as a
        firewall would (connecting there waits, it is not refused)."""
        import socket
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        self.addCleanup(listener.close)
        port = listener.getsockname()[1]
        for _ in range(3):
            c = socket.socket()
            c.settimeout(0.5)
            try:
                c.connect(("127.0.0.1", port))
            except OSError:
                pass
            self.addCleanup(c.close)
        return port

    def silent_port(self):
        """A port whose listener never reads: connections are made (the kernel accepts them)
        and never answered, as by a frozen store host."""
        import socket
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        self.addCleanup(listener.close)
        return listener.getsockname()[1]

    def test_a_node_waiting_for_a_store_says_so_after_10_s(self):
        """Nobody answers where a node looks for its store (a wrong --master-addr or port, a
        store host that never started or is frozen, a firewall that drops the SYNs): after
        10 s it says where it is trying, why it fails and until when, then gives up at the
        limit with exit 1 (before: silent until then, 600 s with the defaults). The c10d line
        too, for an endpoint it does not host."""
        refused, dropped, silent = free_port(), self.syn_dropping_port(), self.silent_port()
        limit = 12
        lines = {
            "static": (["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                        str(refused), "--rdzv-conf", f"join_timeout={limit}"],
                       rf"node 0's store at 127\.0\.0\.1:{refused} \(--master-addr, --master-port\) after 1\d s "
                       rf"\(Connection refused\); trying until join_timeout {limit} s"),
            "static, SYNs dropped": (["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                                      "--master-port", str(dropped), "--rdzv-conf", f"join_timeout={limit}"],
                                     rf"node 0's store at 127\.0\.0\.1:{dropped} \(--master-addr, --master-port\) "
                                     rf"after 1\d s \(Connection timed out\); trying until join_timeout {limit} s"),
            "static, no answer": (["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                                   "--master-port", str(silent), "--rdzv-conf", f"join_timeout={limit}"],
                                  rf"node 0's store at 127\.0\.0\.1:{silent} \(--master-addr, --master-port\) "
                                  rf"after 1\d s \(connected, but the store has not answered\); trying until "
                                  rf"join_timeout {limit} s"),
            "c10d": (["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{refused}", "--nnodes", "1:2",
                      "--rdzv-conf", f"is_host=0,read_timeout={limit}"],
                     rf"the c10d store at 127\.0\.0\.1:{refused} \(--rdzv-endpoint\) after 1\d s \(Connection "
                     rf"refused\); trying until read_timeout {limit} s"),
        }
        procs = {name: subprocess.Popen([DDPRUN, *args, "--no-python", "true"], env=clean_env(TMPDIR=self.tmp),
                                        stderr=subprocess.PIPE, text=True) for name, (args, _) in lines.items()}
        for name, p in procs.items():
            self.track_pid(p.pid)
            with self.subTest(name):
                _, err = p.communicate(timeout=limit + scaled(30))
                self.assertEqual(p.returncode, 1, err)
                warned = [l for l in err.splitlines() if "still connecting" in l]
                self.assertEqual(len(warned), 1, err)
                self.assertRegex(warned[0], r"^\[ddprun [\d:]+ warning\] rendezvous: still connecting to " + lines[name][1])
                self.assertIn("ddprun: error:", err.splitlines()[-1])
                if name == "static, no answer":
                    self.assertIn("it accepted the connection but sent no reply to the handshake", err.splitlines()[-1])

    def test_a_node_whose_peer_is_refused_says_who_is_missing_before_its_join_timeout(self):
        """Node 1 is started with --nnodes 3: it is refused at once (exit 2, naming both
        values). Node 0 waits for node rank 1 until join_timeout; before, it said nothing
        until then (600 s by default). Now it says, well before, who joined and who is
        missing, and why a node it waits for may have been refused."""
        port = free_port()
        common = ["--master-addr", "127.0.0.1", "--master-port", str(port), "--no-python", "true"]
        limit = 10
        n0 = subprocess.Popen([DDPRUN, "--nnodes", "2", "--node-rank", "0", "--rdzv-conf",
                               f"join_timeout={limit},keep_alive_interval=1", *common],
                              env=clean_env(TMPDIR=self.tmp), stderr=subprocess.PIPE, text=True)
        self.track_pid(n0.pid)
        self.wait_for(lambda: accepts(port), what="node 0's store")
        n1 = subprocess.run([DDPRUN, "--nnodes", "3", "--node-rank", "1", *common], env=clean_env(TMPDIR=self.tmp),
                            stderr=subprocess.PIPE, text=True, timeout=scaled(30))
        self.assertEqual(n1.returncode, 2, n1.stderr)
        self.assertIn("this node has --nnodes 3:3 --max-restarts 0, but the job 'none'", n1.stderr)
        _, err = n0.communicate(timeout=limit + scaled(30))
        self.assertEqual(n0.returncode, 1, err)
        said = [l for l in err.splitlines() if "formed in" in l]  # (after 2.5 s; 5 s later too little is left)
        self.assertEqual(len(said), 1, err)
        self.assertRegex(said[0], r"^\[ddprun [\d:]+ warning\] rendezvous: no round of job 'none' formed in [2-8](\.\d+)? "
                                  r"s: 1 of the 2 nodes needed \(--nnodes 2:2\) joined \(\S+ \(node rank 0, [^)]*\)\); "
                                  r"missing: node rank 1; this node waits \d(\.\d+)? s more \(join_timeout\); a node "
                                  r"started with other --nnodes or --max-restarts, or a --node-rank already taken, is "
                                  r"refused, and says so on its own host$")
        self.assertRegex(err.splitlines()[-1], r"^ddprun: error: rendezvous: node rank 1 never joined job 'none' "
                                               rf"within join_timeout {limit} s")

    def test_a_silent_store_and_a_short_join_timeout_are_told_apart(self):
        """A store that accepts the connection is given a few seconds to answer even when
        join_timeout is shorter: the error says how long it waited in all, not only the
        join_timeout it went past."""
        silent = self.silent_port()
        t0 = time.monotonic()
        p = subprocess.run([DDPRUN, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                            "--master-port", str(silent), "--rdzv-conf", "join_timeout=2", "--no-python", "true"],
                           env=clean_env(TMPDIR=self.tmp), stderr=subprocess.PIPE, text=True, timeout=scaled(30))
        took = time.monotonic() - t0
        self.assertEqual(p.returncode, 1, p.stderr)
        last = p.stderr.splitlines()[-1]
        self.assertRegex(last, r"^ddprun: error: node 1 could not reach node 0's store at 127\.0\.0\.1:%d "
                               r"\(--master-addr, --master-port\) within join_timeout 2 s \([5-9](\.\d+)? s in all: "
                               r"a store that accepts is given time to answer\): .*sent no reply to the handshake"
                               % silent)
        self.assertLess(took, scaled(12), p.stderr)

    def test_failure_on_one_node_stops_the_other(self):
        port = free_port()
        # Global rank 3 (node 1) exits 3 once every rank is up; every other rank sleeps 300 s.
        args = [worker("fail_one.py"), self.tmp, "3", "exit:3"]
        n0 = self.start_node(0, port, args)
        n1 = self.start_node(1, port, args)
        rc1 = n1.wait(timeout=scaled(90))
        rc0 = n0.wait(timeout=scaled(90))
        exited = time.monotonic()
        self.assertEqual(rc1, 3, read_text(self.path("node1.stderr")))
        # The other node: 1, and a line naming the node and the rank (the README says so).
        err0 = read_text(self.path("node0.stderr"))
        self.assertEqual(rc0, 1, err0)
        self.assertRegex(err0, r"the job failed on another node: node \S+ \(node rank 1, [^)]*\): rank 3 ", err0)
        # From the failure (fail_one.py writes when, on the clock all processes share) to
        # both nodes' exit: about a second; the bound is far from that and from 300 s.
        with open(self.path("failed_at")) as f:
            elapsed = exited - float(f.read())
        self.assertLess(elapsed, scaled(20), "the healthy node must stop its workers promptly")

    def test_a_node_killed_outright_is_noticed_by_its_lease(self):
        port = free_port()
        # Beats every second: a live node is never silent for the 3 s that mean "gone", even on
        # a loaded machine.
        beat = ["--rdzv-conf", f"join_timeout={scaled(60):g},keep_alive_interval=1,keep_alive_max_attempt=3"]
        # Restarts remain, but a node that is gone would only be waited for: no restart.
        # Each worker marks that it runs (so the rendezvous is done), then sleeps 300 s.
        args = ["--max-restarts", "2", "--no-python", "sh", "-c",
                f'touch "{self.tmp}/up_$GROUP_RANK.$LOCAL_RANK" && exec sleep 300']
        n0 = self.start(["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                         str(port), *beat, *args])
        n1 = subprocess.Popen(
            [DDPRUN, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
             str(port), *beat, *args], env=clean_env(TMPDIR=self.tmp), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(n1)
        # Both nodes joined and started their workers (they beat from then on).
        self.wait_for_files([self.path(f"up_{g}.0") for g in (0, 1)])
        self.assertIsNone(n0.poll(), read_text(self.path("ddprun.stderr")))
        n1.kill()  # SIGKILL: no failure report from node 1, only silence
        t0 = time.monotonic()
        rc0 = n0.wait(timeout=scaled(60))
        self.assertNotEqual(rc0, 0)
        # Three missed beats of a second: the bound is far from that and from the workers' 300 s.
        self.assertLess(time.monotonic() - t0, scaled(20), "node 0 must notice within a few keep-alive intervals")

        err = read_text(self.path("ddprun.stderr"))
        # Its lease ended with its connection (SIGKILL closes it): named by its node rank.
        self.assertRegex(err, r"node \S+ \(node rank 1, [^)]*\) was lost: connection closed")
        self.assertIn("not restarting", err)


    def test_the_store_host_killed_outright_stops_the_other_node_with_one_clear_line(self):
        """Node 0 (it hosts the store) SIGKILLed: node 1 stops its workers at once, naming
        node 0's store (not a c10d store: no c10d flag was given) without the store
        client's own repetition of the address."""
        port = free_port()
        args = ["--no-python", "sh", "-c", f'touch "{self.tmp}/up_$GROUP_RANK.$LOCAL_RANK" && exec sleep 300']
        n1 = self.start_node(1, port, args)
        n0 = subprocess.Popen(
            [DDPRUN, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(port),
             "--nproc-per-node", "2", *args], env=clean_env(TMPDIR=self.tmp), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(n0)
        self.wait_for_files([self.path(f"up_{g}.{l}") for g in (0, 1) for l in (0, 1)])
        n0.kill()
        t0 = time.monotonic()
        self.assertEqual(n1.wait(timeout=scaled(60)), 1)
        self.assertLess(time.monotonic() - t0, scaled(10))
        err = read_text(self.path("node1.stderr"))
        self.assertRegex(err, r"error\] lost the rendezvous at node 0's store at 127\.0\.0\.1:%d: [a-z]" % port)
        self.assertNotIn("c10d", err)
        self.assertNotIn(": store at 127.0.0.1", err)
        self.assertIn("(the store lives in node 0's ddprun: when node 0 stops, so does the job)", err)

if __name__ == "__main__":
    unittest.main(verbosity=2)
