"""Issue 2: every bad command line exits 2 with exactly one 'ddprun: error:' line on
stderr, names the culprit, and starts no worker."""
import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, clean_env, free_port, scaled, worker

# (name, ddprun flags before the script, text the error must contain, script given?)
CASES = [
    ("unknown flag", ["--bogus-flag", "1"], "--bogus-flag", True),
    ("nproc zero", ["--nproc-per-node", "0"], "--nproc-per-node", True),
    ("nproc abc", ["--nproc-per-node", "abc"], "--nproc-per-node", True),
    ("nnodes reversed", ["--nnodes", "3:1"], "--nnodes", True),
    ("master port too big", ["--master-port", "70000"], "--master-port", True),
    ("max restarts negative", ["--max-restarts", "-1"], "--max-restarts", True),
    ("ambiguous prefix", ["--n", "2"], "--nproc-per-node", True),
    ("missing script", ["--nproc-per-node", "2"], "training_script", False),
    ("no-python with -m", ["--no-python", "-m"], "--no-python", True),
    ("standalone with nnodes 2", ["--standalone", "--nnodes", "2"], "--nnodes", True),
    ("standalone with nnodes 2:3", ["--standalone", "--nnodes", "2:3"], "--nnodes", True),
    ("etcd without endpoint", ["--rdzv-backend", "etcd"], "--rdzv-endpoint", True),
    ("etcd bad endpoint list", ["--rdzv-backend", "etcd", "--rdzv-endpoint", "a:2379,,b"], "--rdzv-endpoint", True),
    ("etcd protocol ftp", ["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "a", "--rdzv-conf", "protocol=ftp"],
     "protocol", True),
    ("etcd cert without https", ["--rdzv-backend", "etcd", "--rdzv-endpoint", "a", "--rdzv-conf", "cert=/c.pem"],
     "protocol=https", True),
    ("c10d multi-node without endpoint", ["--rdzv-backend", "c10d", "--nnodes", "2"], "--rdzv-endpoint", True),
    ("c10d bad endpoint port", ["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:99999"], "--rdzv-endpoint", True),
    ("c10d bare ipv6 endpoint", ["--rdzv-backend", "c10d", "--rdzv-endpoint", "fe80::1"], "brackets", True),
    ("elastic range without c10d", ["--nnodes", "1:2"], "--rdzv-backend c10d", True),
    ("rdzv conf bad value", ["--rdzv-conf", "join_timeout=soon"], "join_timeout", True),
    ("rdzv conf no value", ["--rdzv-conf", "is_host"], "--rdzv-conf", True),
    ("rdzv conf join below last call", ["--rdzv-backend", "c10d", "--rdzv-endpoint", "h", "--nnodes", "1:2",
                                        "--rdzv-conf", "join_timeout=5"], "join_timeout", True),
    ("logs specs", ["--logs-specs", "x"], "--logs-specs", True),
    ("event log handler", ["--event-log-handler", "file"], "--event-log-handler: expected null, console or", True),
    ("numa binding mode", ["--numa-binding", "nodes"],
     "--numa-binding: expected node, socket, exclusive or core-complex, got 'nodes'", True),
    ("redirects 5", ["--redirects", "5"], "--redirects", True),
    ("local ranks filter letters", ["--local-ranks-filter", "a,b"], "--local-ranks-filter", True),
    ("bad signal", ["--signals-to-handle", "SIGNOPE"], "--signals-to-handle", True),
    ("bad PET value", [], "PET_NPROC_PER_NODE", True),
    # A control character in a value is shown escaped: the error stays one line.
    ("newline in a value", ["--nproc-per-node", "2\nx"], "--nproc-per-node: expected a positive integer or auto, "
                                                           "cpu, gpu; got '2\\nx'", True),
    ("master addr with a space", ["--master-addr", "a b"], "--master-addr", True),
    ("master addr with a newline", ["--master-addr", "x\ny"], "--master-addr: ", True),
    ("master addr with a port", ["--master-addr", "localhost:29500"], "--master-addr", True),
    ("master addr like a flag", ["--master-addr", "-h"], "--master-addr", True),
    ("rdzv id too long", ["--rdzv-id", "a" * 250],
     "--rdzv-id: 'aaaaaaaaaaaaaaaaaaaa...' is 250 bytes long, at most 200", True),
]


class BadInputTest(DdprunTestCase):
    def check(self, args, expect, env=None):
        marker = self.path("marker")
        res = self.run_ddprun(args, env=env)
        self.assertEqual(res.rc, 2, res)
        lines = res.stderr.splitlines()
        self.assertEqual(len([l for l in lines if l.startswith("ddprun: error:")]), 1, res)
        self.assertEqual(len(lines), 1, f"exactly one line expected on stderr: {res}")
        self.assertIn(expect, lines[0])
        self.assertEqual(res.stdout, "", res)
        self.assertFalse(os.path.exists(marker), "a worker was started")

    def test_each_bad_input(self):
        for name, flags, expect, with_script in CASES:
            with self.subTest(name):
                args = list(flags)
                if with_script:
                    args += [worker("marker.py"), self.path("marker")]
                env = clean_env(PET_NPROC_PER_NODE="many") if name == "bad PET value" else None
                self.check(args, expect, env)

    def test_blank_pet_master_addr(self):
        self.check([worker("marker.py"), self.path("marker")], "PET_MASTER_ADDR: no host",
                   clean_env(PET_MASTER_ADDR=" "))

    def test_summary_json_that_cannot_be_written_is_refused_before_the_job(self):
        with open(self.path("a_file"), "w"):
            pass
        for where, expect in ((self.path("a_file", "s.json"), "--summary-json: cannot create the folder"),
                              (self.tmp, "is a directory")):
            with self.subTest(where):
                self.check(["--summary-json", where, worker("marker.py"), self.path("marker")], expect)

    def test_log_dir_that_cannot_be_made_is_refused_before_the_job(self):
        # A usage error (exit 2), as --summary-json's, found before this node joins anything.
        with open(self.path("a_file"), "w"):
            pass
        for where, expect in ((self.path("a_file", "logs"), "--log-dir: cannot create the folder"),
                              (self.path("a_file"), "--log-dir: ")):
            with self.subTest(where):
                self.check(["--log-dir", where, worker("marker.py"), self.path("marker")], expect)

    def test_standalone_with_a_range_from_1_runs_one_node_at_once(self):
        """torchrun takes `--standalone --nnodes 1:4` (a templated line), waits out its 30 s last
        call for nodes that cannot come, and runs one: ddprun runs one at once, and says so.
        Before: exit 2 ("--standalone runs one node, but --nnodes asks for 1:4")."""
        res = self.run_ddprun(["--standalone", "--nnodes", "1:4", "--nproc-per-node", "2", "--no-python", "sh", "-c",
                               'echo "rank $RANK of $WORLD_SIZE, nodes $GROUP_WORLD_SIZE"'], timeout=20)
        self.assertEqual(res.rc, 0, res)
        self.assertIn("--standalone runs one node: --nnodes 1:4 is taken as 1 (no other node can join it)", res.stderr)
        self.assertIn("rank 1 of 2, nodes 1", res.stdout)
        self.assertLess(res.elapsed, scaled(10), "no last call waited for")

    def test_nonexistent_script(self):
        self.check(["/nonexistent/train.py", self.path("marker")], "/nonexistent/train.py")

    def test_more_workers_than_open_files_allow(self):
        # Not a usage error (exit 1): the limit is the machine's. One line that names it and
        # what to do, before any worker starts (every worker's pipes are opened first).
        # 12 workers pass the count check (16 files and 4 a worker, hard limit 64); 24 files
        # inherited from the shell that starts ddprun make it run out of pipes.
        hold = 'for i in $(seq 3 26); do eval "exec $i</dev/null"; done; exec "$@"'
        res = self.run_ddprun(["--nproc-per-node", "12", worker("marker.py"), self.path("marker")],
                              env=clean_env(OMP_NUM_THREADS="1"),
                              cmd_prefix=("prlimit", "--nofile=64:64", "bash", "-c", hold, "bash"))
        self.assertEqual(res.rc, 1, res)
        lines = res.stderr.splitlines()
        self.assertEqual(len(lines), 1, res)
        self.assertRegex(lines[0], r"^ddprun: error: cannot open a pipe for the std(out|err) of local rank \d+ "
                                   r"\(ddprun may hold 64 open files, RLIMIT_NOFILE, .* raise `ulimit -n`\): "
                                   r"Too many open files$")
        self.assertFalse(os.path.exists(self.path("marker")), "a worker was started")

    def test_more_workers_than_any_open_file_limit_allows(self):
        # 40 workers need about 176 files, past the hard limit of 64: refused before any
        # folder or pipe is made (99999999 once made 610k folders in /dev/shm first). The
        # advice counts ddprun's own files: the 12 workers it names run (6 more with
        # --log-dir and --tee), where its advice of 16 before did not.
        env = clean_env(OMP_NUM_THREADS="1", TMPDIR=self.tmp)
        res = self.run_ddprun(["--nproc-per-node", "40", worker("marker.py"), self.path("marker")],
                              env=env, cmd_prefix=("prlimit", "--nofile=64:64"))
        self.assertEqual(res.rc, 1, res)
        self.assertEqual(res.stderr.splitlines(), [
            "ddprun: error: --nproc-per-node: 40 workers need about 176 open files (16 for ddprun, 4 a worker), and "
            "this process may open at most 64 (the hard limit, ulimit -Hn): at most 12 workers per node"], res)
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith("torchelastic_")], [], "a folder was made")
        self.assertFalse(os.path.exists(self.path("marker")), "a worker was started")
        for extra, count in (([], 12), (["--log-dir", self.path("logs"), "--tee", "3"], 8)):
            res = self.run_ddprun([*extra, "--nproc-per-node", str(count), worker("marker.py"), self.path("marker")],
                                  env=env, cmd_prefix=("prlimit", "--nofile=64:64"))
            self.assertEqual(res.rc, 0, res)
        res = self.run_ddprun(["--log-dir", self.path("logs2"), "--nproc-per-node", "9", worker("marker.py"),
                               self.path("marker")], env=env, cmd_prefix=("prlimit", "--nofile=64:64"))
        self.assertIn("at most 8 workers per node", res.stderr, res)

    def test_flags_after_script_are_the_scripts(self):
        # Not bad input: '--redirects 5' after the script belongs to the script.
        res = self.run_ddprun([worker("marker.py"), self.path("marker"), "--redirects", "5"])
        self.assertEqual(res.rc, 0, res)
        self.assertTrue(os.path.exists(self.path("marker")))

    def test_help_and_version(self):
        res = self.run_ddprun(["--help"])
        self.assertEqual(res.rc, 0, res)
        self.assertIn("--nproc-per-node", res.stdout)
        res = self.run_ddprun(["--version"])
        self.assertEqual(res.rc, 0, res)
        self.assertTrue(res.stdout.startswith("ddprun "), res)

    def test_pet_help_and_version_do_not_replace_the_job(self):
        # torchrun reads neither from the environment.
        for var in ("PET_HELP", "PET_VERSION"):
            with self.subTest(var):
                marker = self.path(f"marker_{var}")
                res = self.run_ddprun([worker("marker.py"), marker], env=clean_env(**{var: "1"}))
                self.assertEqual(res.rc, 0, res)
                self.assertTrue(os.path.exists(marker), f"{var}=1: the job did not run: {res}")
                self.assertNotIn("Usage:", res.stdout)


class PortInUseTest(DdprunTestCase):
    """A taken port fails at once (exit 1: the machine's state, not the command line), naming
    the process that holds it and the flag the port came from."""

    def test_the_message_names_the_holder_and_the_flag_the_port_came_from(self):
        port = free_port()
        with socket.socket() as held:
            held.bind(("127.0.0.1", port))
            held.listen()
            for args, expect in (
                    (["--nnodes", "1", "--master-port", str(port)],
                     f"--master-port {port}: the port is already in use by pid {os.getpid()} "),
                    # A second node 0 of a job (not --standalone: nodes must agree on the port).
                    (["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(port)],
                     f"--master-port {port}: the port is already in use by pid {os.getpid()} (python3); is node 0 of "
                     "this job running here already (two nodes with --node-rank 0)?"),
                    (["--nnodes", "1", "--rdzv-endpoint", f"localhost:{port}"],
                     f"--rdzv-endpoint localhost:{port}: the port {port} is already in use by pid {os.getpid()} ")):
                with self.subTest(" ".join(args[:4])):
                    res = self.run_ddprun(args + [worker("marker.py"), self.path("marker")])
                    self.assertEqual(res.rc, 1, res)
                    self.assertIn(expect, res.stderr, res)
                    self.assertEqual(len(res.stderr.splitlines()), 1, res)
                    self.assertFalse(os.path.exists(self.path("marker")), "a worker was started")

    def test_a_c10d_endpoint_port_held_by_another_program_is_named(self):
        """The endpoint is this machine's, so this node hosts the store; its port is taken by
        a program that accepts connections and never answers. The node joins it as a client
        (another agent of the job hosts it, as a rule), and when no answer comes it names the
        holder: before, it said it had not hosted the store *because* the endpoint is loopback
        and to start the node that hosts it."""
        port = free_port()
        with socket.socket() as held:
            held.bind(("0.0.0.0", port))
            held.listen()
            res = self.run_ddprun(["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                   "--rdzv-id", "x", "--rdzv-conf", "read_timeout=2", worker("marker.py"),
                                   self.path("marker")])
        self.assertEqual(res.rc, 1, res)
        self.assertIn(f"this node should host it ('127.0.0.1' is this machine's loopback), but port {port} here is in "
                      f"use by pid {os.getpid()} ", res.stderr)
        self.assertIn("does not answer as a rendezvous store: if that is not an agent of this job, stop it or choose "
                      "another port", res.stderr)
        self.assertNotIn("start the node that hosts it", res.stderr)
        self.assertFalse(os.path.exists(self.path("marker")), "a worker was started")


if __name__ == "__main__":
    unittest.main(verbosity=2)
