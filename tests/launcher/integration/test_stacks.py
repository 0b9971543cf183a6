"""Every rank's stack (issue 21, one node; docs/stacks.md), with real processes and, where it
matters, real PyTorch on gloo (torch 1.13, and 2.6 as test_stacks.torch2):

- on demand (SIGQUIT to ddprun, then `ddprun --dump-stacks PID`): rank 2 shown in its sleep,
  the others in all_reduce, the job then finishes (exit 0), the dump also in --log-dir;
- --hang-timeout 5: the job stops within the timeout plus a few seconds, rank 2 named, exit 124;
- rank 1 raises: the summary shows where ranks 0, 2, 3 were (in all_reduce);
- a worker that blocks every signal, and --no-python workers: ddprun answers within its
  deadline and the job runs on;
- the bootstrap is invisible: the user's sitecustomize runs, and the script sees the same
  argv, sys.path, PYTHONPATH, sitecustomize module and environment as with --no-stack-dumps;
- --no-stack-dumps: PYTHONPATH untouched, SIGQUIT stops the job (131) as torchrun's does;
- the README's lines, as written (in a pid namespace of their own, so that `ddprun
  --dump-stacks` finds only that job).
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import (DDPRUN, DdprunTestCase, RUNTIME, TORCH_EXIT_ABORT, clean_env, free_port, main,  # noqa: E402
                            read_text, scaled, torch_exit_abort, worker)

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
JOB_TIMEOUT = 120  # a hang guard: a torch job here takes 5-15 s on 2 cores
# torch 2.x wraps the collectives: all_reduce (distributed_c10d.py) <- wrapper (c10d_logger.py) <- caller
ALL_REDUCE = r"all_reduce \(distributed_c10d.py:\d+\) <- (?:wrapper \(c10d_logger.py:\d+\) <- )?"
SKIP_COLLECTIVE = os.environ.get("DDP_TEST_SKIP_COLLECTIVE") or os.path.join(
    os.path.dirname(os.path.realpath(DDPRUN)), "ddp-test-skip-collective")  # a libddp worker (C++)
BOOTSTRAP = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(DDPRUN))), "share", "ddprun", "python")


# Rank 0 raises once rank 1 is ready (its notice takes rank 1's stack) and lingers in an
# atexit handler; rank 1 exits with 3 once its stack was written (its dump file grew),
# before rank 0 has exited.
LATE_ROOT = """import atexit, os, time
def dump_size():  # the bootstrap's stack file: a descriptor above 900
    for fd in os.listdir('/proc/self/fd'):
        if int(fd) >= 900 and os.readlink(f'/proc/self/fd/{fd}').endswith('/stacks'):
            return os.fstat(int(fd)).st_size
    raise SystemExit('no stack file')
if os.environ['RANK'] == '0':
    def linger():
        open('announced', 'w').close()
        time.sleep(60)
    atexit.register(linger)
    while not os.path.exists('ready'):
        time.sleep(0.01)
    raise ValueError('rank 0 fails first')
size = dump_size()
open('ready', 'w').close()
while not os.path.exists('announced') or dump_size() == size:
    time.sleep(0.01)
os._exit(3)
"""


class StacksTest(DdprunTestCase):
    def stderr_text(self):
        return read_text(self.path("ddprun.stderr"))

    def wait_stderr(self, pattern, timeout, start=0):
        """The first match of `pattern` in ddprun's stderr after offset `start`."""
        return self.wait_for(lambda: re.compile(pattern, re.M).search(self.stderr_text(), start),
                             timeout, f"{pattern!r} on ddprun's stderr")

    def wait_markers(self, names, timeout=60):
        self.wait_for_files([self.path(n) for n in names], timeout)

    def finish(self, p, timeout=JOB_TIMEOUT):
        try:
            return p.wait(timeout=scaled(timeout))
        except subprocess.TimeoutExpired:
            self.fail(f"ddprun did not finish:\n{self.stderr_text()[-3000:]}")


@unittest.skipIf(RUNTIME.skip_reason(), f"{RUNTIME.name}: {RUNTIME.skip_reason()}")
class TorchStacks(StacksTest):
    """4-rank gloo jobs of workers/torch_stall.py."""

    def job(self, mode, *extra, flags=()):
        return self.start(["--standalone", "--nproc-per-node", "4", *flags, worker("torch_stall.py"), self.tmp,
                           mode, *extra])

    def block_of(self, text, rank):
        return "\n".join(l for l in text.splitlines() if l.startswith(f"[rank{rank}]:"))

    def test_on_demand_shows_the_sleeper_and_the_waiters_and_the_job_runs_on(self):
        log_dir = self.path("logs")
        p = self.job("stall", str(scaled(10)), flags=("--log-dir", log_dir))
        self.wait_markers(["stalled_2", "waiting_0", "waiting_1", "waiting_3"])
        time.sleep(0.3)  # the waiters are inside all_reduce by now
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGQUIT)
        m = self.wait_stderr(r"^\[ddprun\] where each rank is.*\n(?:  .*\n)+", 30)
        took = time.monotonic() - t0
        dump = self.stderr_text()[:m.end()]
        self.assertRegex(dump, r"SIGQUIT \(dump 1 asked on node 0 \(\S+\)\): the stacks of 4 ranks")
        self.assertRegex(self.block_of(dump, 2), r"torch_stall.py\", line \d+ in slow_data")
        for r in (0, 1, 3):
            self.assertRegex(self.block_of(dump, r), r"line \d+ in all_reduce\n(?:.*in wrapper\n)?.*line \d+ in train_step",
                             r)
        self.assertRegex(m.group(0), r"ranks 0-1, 3: " + ALL_REDUCE + r"train_step")
        self.assertRegex(m.group(0), r"rank 2: slow_data \(torch_stall.py:\d+\) <- train_step")
        self.assertLess(took, scaled(2.5), "all four answered: no deadline should have been waited for")
        # The same from another shell: ddprun --dump-stacks PID (SIGURG).
        r = subprocess.run([DDPRUN, "--dump-stacks", str(p.pid)], capture_output=True, text=True, timeout=scaled(30))
        self.assertEqual(r.returncode, 0, r)
        self.assertIn(f"asked ddprun {p.pid}", r.stdout)
        self.wait_stderr(r"SIGURG \(dump 2 asked on node 0 \(\S+\)\): the stacks of 4 ranks", 30, m.end())
        self.assertEqual(self.finish(p), 0, self.stderr_text()[-3000:])
        saved = [os.path.join(d, f) for d, _, fs in os.walk(log_dir) for f in fs if re.match(r"stacks_\d+\.txt", f)]
        self.assertEqual(len(saved), 2, saved)
        self.assertIn("in slow_data", read_text(sorted(saved)[0]))

    def test_a_rank_that_exited_0_before_the_others_failed_is_named_so(self):
        # Rank 1 skips step 3's all_reduce and exits 0; the others' all_reduce fails as its
        # connections close. The summary's view says it exited 0 (the one the others waited
        # for), whether it was gone or still exiting when the stacks were taken (QA saw
        # "<no Python frame ...>" then, with sys.exit: the unit test RanksThatExited0ByThemselves
        # covers that case; os._exit here, as sys.exit can abort in torch 1.13's gloo teardown).
        p = self.job("skip")
        rc = self.finish(p)
        err = self.stderr_text()
        self.assertNotEqual(rc, 0, err[-3000:])
        self.assertIn("Root Cause (first observed failure)", err)
        # (Its own line: grouped under "<no Python frame ...>" with others, it would not be.)
        self.assertRegex(err, r"\n  rank 1: not running: exited with code 0", err[-3000:])

    def test_a_dataloader_workers_crash_gets_a_hint(self):
        # torch's DataLoader workers handle SIGSEGV themselves (no Python stack of theirs), and
        # the rank's RuntimeError that ends its output names no signal: the summary's hint
        # says where that is and how to get the crash's stack (num_workers=0).
        script = os.path.join(self.tmp, "loader_crash.py")
        with open(script, "w") as f:
            f.write("import ctypes, torch\n"
                    "from torch.utils.data import DataLoader, Dataset\n"
                    "class Images(Dataset):\n"
                    "    def __len__(self):\n"
                    "        return 8\n"
                    "    def __getitem__(self, i):\n"
                    "        return torch.tensor([float(ctypes.string_at(0)[0] if i == 5 else i)])\n"
                    "for batch in DataLoader(Images(), batch_size=2, num_workers=2):\n"
                    "    pass\n")
        p = self.start(["--standalone", "--nproc-per-node", "1", script])
        self.assertEqual(self.finish(p), 1, self.stderr_text()[-3000:])
        err = self.stderr_text()
        self.assertIn("is killed by signal: Segmentation fault", err)
        self.assertRegex(err, r"\nhint: a DataLoader worker process died; .*num_workers=0", err[-3000:])

    def test_hang_timeout_stops_the_job_and_names_the_odd_rank(self):
        # The clock runs from the attempt's start, `import torch` included: four torch 2.6
        # workers took 5.7 s to reach step 3 on an idle 2-core machine, so 15 s, not 5.
        p = self.job("stall", "600", flags=("--hang-timeout", "15"))
        self.wait_markers(["stalled_2", "waiting_0", "waiting_1", "waiting_3"])
        t0 = time.monotonic()  # the last progress (step 2's lines) came before this
        rc = self.finish(p)
        took = time.monotonic() - t0
        err = self.stderr_text()
        self.assertEqual(rc, 124, err[-3000:])
        self.assertLess(took, 15 + scaled(6), err[-3000:])
        block = err[err.index(" HUNG: "):]
        self.assertIn("no rank made progress for 15 s (--hang-timeout)", block)
        self.assertIn("rank 2 not where the others are", block)
        self.assertRegex(block, r"rank 2: slow_data \(torch_stall.py:\d+\)")
        self.assertRegex(block, r"ranks 0-1, 3: all_reduce")

    def test_failure_summary_shows_where_the_other_ranks_were(self):
        p = self.job("raise")
        self.assertEqual(self.finish(p), 1)
        summary = self.summary_block(self.stderr_text())
        root = summary[summary.index("Root Cause"):]
        self.assertIn("rank      : 1 (local_rank: 1)", root)
        self.assertIn("Where the other ranks were", root)
        self.assertRegex(root, r"\n  ranks 0, 2-3: " + ALL_REDUCE + r"train_step \(torch_stall.py:\d+\)")
        self.assertLess(root.index("Where the other ranks were"), root.index("=" * 60))


# The workers of BLOCKER, STRAGGLER, HALF_DONE and the ticker run until the test creates
# DIR/done (the test's checks are over), at most SECONDS: a loop on one line of C calls, so a
# dump taken at any moment shows the same frame and line.
BLOCKER = """
import os, signal, sys, time
if os.environ["RANK"] == "0" and os.environ.get("RANK_BLOCKS") != "no":
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
DONE, END = os.path.join(sys.argv[1], "done"), time.monotonic() + float(sys.argv[2])
while not os.access(DONE, os.F_OK) and time.monotonic() < END: time.sleep(0.05)
"""

# Rank 1 blocks SIGURG, so that the failure's dump waits out its deadline; rank 0 fails;
# rank 2 fails by itself 0.1 s later, while that dump waits.
FAILS_DURING_THE_DUMP = """
import os, signal, sys, time
d, r = sys.argv[1], int(os.environ["RANK"])
if r == 1:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGURG})
open(os.path.join(d, f"ready_{r}"), "w").close()
while not all(os.path.exists(os.path.join(d, f"ready_{k}")) for k in range(3)):
    time.sleep(0.01)
if r == 0:
    open(os.path.join(d, "failing"), "w").close()
    os._exit(1)
if r == 2:
    while not os.path.exists(os.path.join(d, "failing")):
        time.sleep(0.01)
    time.sleep(0.1)
    print("rank 2: disk full, giving up", file=sys.stderr, flush=True)
    sys.exit(5)
time.sleep(60)
"""

TERM_STAMP = """
import os, signal, sys, time
def on_term(*_):
    with open(os.path.join(sys.argv[1], "term_" + os.environ["RANK"]), "w") as f:
        f.write(repr(time.time()))
    os._exit(0)
if os.environ["RANK"] == "0":
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
else:
    signal.signal(signal.SIGTERM, on_term)
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
time.sleep(float(sys.argv[2]))
"""

# Rank 1 (node 0 of two static nodes) is somewhere else than ranks 0, 2 and 3.
STRAGGLER = """
import os, sys, time
DONE, END = os.path.join(sys.argv[1], "done"), time.monotonic() + float(sys.argv[2])
def wait_for_peers():
    while not os.access(DONE, os.F_OK) and time.monotonic() < END: time.sleep(0.05)
def load_batch():
    while not os.access(DONE, os.F_OK) and time.monotonic() < END: time.sleep(0.05)
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
load_batch() if os.environ["RANK"] == "1" else wait_for_peers()
"""

FAIL_LATE = """
import os, sys, time
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
while len([f for f in os.listdir(sys.argv[1]) if f.startswith("ready_")]) < 4:
    time.sleep(0.05)
if os.environ["RANK"] == "3":
    time.sleep(0.5)  # every bootstrap has announced itself
    sys.exit(3)
time.sleep(60)
"""

HALF_DONE = """
import os, sys, time
if int(os.environ["RANK"]) < 2:
    sys.exit(0)
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
DONE, END = os.path.join(sys.argv[1], "done"), time.monotonic() + float(sys.argv[2])
while not os.access(DONE, os.F_OK) and time.monotonic() < END: time.sleep(0.05)
"""

RANK0_TALKS = """
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    if os.environ["RANK"] == "0":
        print("step", flush=True)
    time.sleep(0.3)
"""

PROBE = """
import json, os, sys
import sitecustomize
print("PROBE " + json.dumps({"argv": sys.argv, "path": sys.path, "main": __file__,
    "pythonpath": os.environ.get("PYTHONPATH"), "site": getattr(sitecustomize, "__file__", None),
    "user_site_ran": os.environ.get("USER_SITE_RAN"),
    "env": sorted(k for k in os.environ if k.startswith("DDPRUN"))}), flush=True)
"""


@unittest.skipIf(RUNTIME.is_torch2 and RUNTIME.skip_reason(), f"{RUNTIME.name}: {RUNTIME.skip_reason()}")
class Stacks(StacksTest):
    """Jobs without torch: the bootstrap and the triggers themselves, in the runtime's interpreter
    (test_stacks.no_torch and .no_torch.torch2, beside other tests; test_stacks runs the
    other classes, with the torch jobs' lock)."""

    def ticker(self):
        """ticker.py DIR SECONDS: each rank writes DIR/pid_RANK; rank 0 prints every 0.3 s, until
        DIR/done (self.done()), at most SECONDS."""
        return self.write("ticker.py", "import os, sys, time\n"
                                       "d, r = sys.argv[1], os.environ['RANK']\n"
                                       "open(os.path.join(d, 'pid_' + r), 'w').write(str(os.getpid()))\n"
                                       "end = time.monotonic() + float(sys.argv[2])\n"
                                       "while time.monotonic() < end and not os.path.exists(os.path.join(d, 'done')):\n"
                                       "    if r == '0':\n"
                                       "        print('tick', flush=True)\n"
                                       "    time.sleep(0.3)\n")

    def done(self):
        """The test's checks are over: the workers that wait for DIR/done end."""
        open(self.path("done"), "w").close()

    def write(self, name, text):
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def static_nodes(self, args, env=None):
        """Two static nodes on loopback, 2 ranks each; node n's stderr in node<n>.stderr."""
        port = free_port()
        nodes = []
        for n in (0, 1):
            err = open(self.path(f"node{n}.stderr"), "wb")
            self._files.append(err)
            nodes.append(self.start(["--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1",
                                     "--master-port", str(port), "--nproc-per-node", "2", *args], env=env,
                                    stderr=err))
        return nodes

    def job_view_asked_on_node_1(self, nodes):
        """SIGQUIT to node 1's ddprun, whose view of the whole job comes within 2 s, with every
        node's answer: the match (1: what the answers were, 2: where each rank is)."""
        t0 = time.monotonic()
        os.kill(nodes[1].pid, signal.SIGQUIT)
        m = self.wait_for(lambda: re.search(r"dump 1 asked on node 1 \(\S+\): (every node answered .*)\n"
                                            r"\[ddprun\] where each rank of the job is .*\n((?:  .*\n)+)",
                                            read_text(self.path("node1.stderr"))),
                          scaled(10), "node 1's view of the whole job")
        self.assertLess(time.monotonic() - t0, scaled(2), "every node answers at once")
        return m

    def test_a_worker_that_blocks_every_signal_is_named_within_the_deadline(self):
        script = self.write("blocker.py", BLOCKER)
        p = self.start(["--standalone", "--nproc-per-node", "2", script, self.tmp, str(scaled(60))])
        self.wait_markers(["ready_0", "ready_1"])
        time.sleep(0.2)
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGQUIT)
        m = self.wait_stderr(r"^\[ddprun\] where each rank is.*\n(?:  .*\n)+", 30)
        took = time.monotonic() - t0
        self.assertLess(took, 2 + scaled(2), "the deadline is 2 s")
        self.assertRegex(self.stderr_text(), r"\[rank0\]:no answer \(pid \d+\): \d+ threads?: ")
        self.assertRegex(self.stderr_text(), r"\[rank1\]:.*\n\[rank1\]:  File .*blocker.py\", line \d+ in <module>")
        self.assertIn("rank 0: no answer", m.group(0))
        self.done()
        self.assertEqual(self.finish(p, 60), 0)  # the job ran on

    def test_a_rank_that_fails_while_the_failures_stacks_are_taken_is_a_failure(self):
        """Rank 2 exits 5 by itself while ddprun takes the stacks of rank 0's failure: it is
        listed under Failures and in --summary-json as failed. Before, every worker not yet
        reaped when the stop signal went out was marked as stopped by ddprun, and the summary
        said <NO_OTHER_FAILURES>."""
        path = self.path("summary.json")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "3", "--summary-json", path,
                               self.write("fails.py", FAILS_DURING_THE_DUMP), self.tmp])
        self.assertEqual(res.rc, 1, res)
        failures = res.stderr.split("Failures:", 1)[1].split("Root Cause", 1)[0]
        self.assertRegex(failures, r"rank      : 2 \(local_rank: 2\)\n  exitcode  : 5 ", res.stderr[-3000:])
        self.assertIn("rank 2: disk full, giving up", failures)
        rank2 = [w for w in self.load_json(path)["workers"] if w["rank"] == 2][0]
        self.assertEqual((rank2["state"], rank2["exit_code"], rank2["stopped_by_ddprun"]), ("failed", 5, False))

    def test_a_dump_asked_on_one_node_shows_every_nodes_ranks(self):
        """Two static nodes (loopback): SIGQUIT to node 1's ddprun; node 0 shows its own
        ranks' stacks too, through the rendezvous, under the same dump's name; the job runs
        on and both nodes exit 0."""
        script = self.write("blocker.py", BLOCKER)
        nodes = self.static_nodes([script, self.tmp, str(scaled(60))], env=dict(clean_env(), RANK_BLOCKS="no"))
        self.wait_markers([f"ready_{r}" for r in range(4)])
        time.sleep(0.2)
        t0 = time.monotonic()
        os.kill(nodes[1].pid, signal.SIGQUIT)
        name = r"dump 1 asked on node 1 \(\S+\)"
        node0 = lambda: read_text(self.path("node0.stderr"))  # noqa: E731
        self.wait_for(lambda: re.search(name + r": the stacks of 2 ranks", node0()), scaled(10),
                      "node 0's dump")
        self.assertLess(time.monotonic() - t0, scaled(2), "the relay is one events line away")
        for r in (0, 1):
            self.assertRegex(node0(), rf"\[rank{r}\]:  File .*blocker.py\", line \d+ in <module>")
        # (Node 1's own dump may come after node 0's: each writes when its ranks answered.)
        self.wait_for(lambda: re.search(r"SIGQUIT \(" + name + r"\): the stacks of 2 ranks(?:.*\n)*\[rank3\]:",
                                        read_text(self.path("node1.stderr"))), scaled(10), "node 1's dump")
        node1 = read_text(self.path("node1.stderr"))
        for r in (2, 3):
            self.assertRegex(node1, rf"\[rank{r}\]:  File .*blocker.py\", line \d+ in <module>")
        self.done()
        for p in nodes:
            self.assertEqual(self.finish(p, 60), 0, node0() + read_text(self.path("node1.stderr")))

    def test_a_dump_asked_on_every_node_at_once_shows_each_ranks_stack_once(self):
        """Two static nodes, each signalled at once (Slurm's `scancel -s URG` signals every
        node's ddprun): each node shows its own ranks' stacks once, not once for its own
        signal and again for the other's ask, and each shows the whole job's view."""
        script = self.write("blocker.py", BLOCKER)
        nodes = self.static_nodes([script, self.tmp, str(scaled(60))], env=dict(clean_env(), RANK_BLOCKS="no"))
        self.wait_markers([f"ready_{r}" for r in range(4)])
        time.sleep(0.2)
        for p in nodes:
            os.kill(p.pid, signal.SIGURG)
        errs = lambda: [read_text(self.path(f"node{n}.stderr")) for n in (0, 1)]  # noqa: E731
        view = r"dump 1 asked on node {} \(\S+\): every node answered .*\n\[ddprun\] where each rank of the job is"
        self.wait_for(lambda: all(re.search(view.format(n), e) for n, e in enumerate(errs())), scaled(10),
                      "each node's view of the whole job")
        for n, err in enumerate(errs()):
            self.assertEqual(err.count("[ddprun] where each rank is (main thread"), 1, err)
            for r in (2 * n, 2 * n + 1):
                self.assertEqual(len(re.findall(rf"\[rank{r}\]:  File .*blocker.py\", line \d+ in <module>", err)), 1, err)
        self.done()
        for p in nodes:
            self.assertEqual(self.finish(p, 60), 0, "".join(errs()))

    @unittest.skipIf(RUNTIME.is_torch2, "no torch in it: the run on the host's torch covers it")
    def test_the_node_that_asked_shows_where_every_rank_of_the_job_is(self):
        """Two static nodes; rank 1 (node 0) stands elsewhere. SIGQUIT to node 1's ddprun:
        within the dump's deadline node 1 shows where all four ranks are and names rank 1 on
        node 0, and --log-dir holds every node's full dumps. Then node 0's ddprun is stopped
        (SIGSTOP) and node 1 asks again: it says node 0 gave no answer, at its deadline (3 s),
        and its ranks are shown as such. After SIGCONT the job finishes (exit 0 on both)."""
        script = self.write("straggler.py", STRAGGLER)
        logs = self.path("logs")
        nodes = self.static_nodes(["--log-dir", logs, script, self.tmp, str(scaled(60))])
        self.wait_markers([f"ready_{r}" for r in range(4)])
        time.sleep(0.2)
        node1 = lambda: read_text(self.path("node1.stderr"))  # noqa: E731
        m = self.job_view_asked_on_node_1(nodes)
        self.assertRegex(m.group(1), r"^every node answered \(2 nodes, 4 ranks, in \d+\.\d\d s\); every node's saved in "
                                     + re.escape(logs))
        self.assertRegex(m.group(2), r"^  ranks 0, 2-3: wait_for_peers \(straggler.py:5\) <- <module> \(straggler.py:9\)\n"
                                     r"  rank 1: load_batch \(straggler.py:7\) <- <module> \(straggler.py:9\)\n"
                                     r"  rank 1 not where the others are: on node 0 \(\S+\)\n$")
        saved = glob.glob(os.path.join(logs, "*", "attempt_0", "stacks_1_all_nodes.txt"))
        self.assertEqual(len(saved), 1, os.listdir(logs))
        for r in range(4):
            self.assertRegex(read_text(saved[0]), rf"\[rank{r}\]:  File .*straggler.py\", line 9 in <module>")
        self.assertNotIn("of the job", read_text(self.path("node0.stderr")), "only the node that asked")

        os.kill(nodes[0].pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            os.kill(nodes[1].pid, signal.SIGQUIT)
            m = self.wait_for(lambda: re.search(r"dump 2 asked on node 1 \(\S+\): (0 of 1 other node answered .*)\n"
                                                r"\[ddprun\] where each rank of the job is .*\n((?:  .*\n)+)", node1()),
                              scaled(10), "node 1's second view")
            took = time.monotonic() - t0
        finally:
            os.kill(nodes[0].pid, signal.SIGCONT)
        self.assertGreater(took, 2.9)
        self.assertLess(took, 3 + scaled(1.5), "the deadline is 3 s")
        self.assertRegex(m.group(1), r"^0 of 1 other node answered within 3\.\d\d s; no answer from node 0")
        self.assertIn("  ranks 0-1: no answer from its node\n", m.group(2))
        self.assertIn("  ranks 2-3: wait_for_peers (straggler.py:5)", m.group(2))
        self.done()
        for n, p in enumerate(nodes):
            self.assertEqual(self.finish(p, 60), 0, read_text(self.path(f"node{n}.stderr")))

    def test_a_libddp_rank_that_skips_a_collective_is_named_in_the_table(self):
        """Four C++ workers on libddp; rank 1 skips all_reduce #3 and sleeps: the dump's table
        shows the others in all_reduce #3 and names rank 1 at #2, and every rank's native
        stack shows where it waits."""
        p = self.start(["--standalone", "--nproc-per-node", "4", "--no-python", SKIP_COLLECTIVE, "1", "3", "60",
                        self.tmp])
        self.wait_markers(["skipped"])
        time.sleep(0.3)
        os.kill(p.pid, signal.SIGQUIT)
        m = self.wait_stderr(r"^\[ddprun\] libddp collectives.*\n(?:  .*\n)+", scaled(10))
        table = m.group(0)
        self.assertRegex(table, r"  ranks 0, 2-3: all_reduce #3 in flight for [\d.]+ s \(4 B, cpu\)")
        self.assertRegex(table, r"  rank 1: all_reduce #2 done, started [\d.]+ s ago")
        self.assertIn("  rank 1 is at all_reduce #2 done, the others at all_reduce #3 in flight", table)
        # Each rank's native stack (libddp answers SIGURG with its backtrace, demangled by ddprun).
        err = self.stderr_text()
        for r in (0, 2, 3):
            self.assertRegex(err, rf"\[rank{r}\]:  ddp::ProcessGroup::all_reduce \(libddp\.so")
        self.assertRegex(err, r"\[rank1\]:  (clock_)?nanosleep \(libc")
        self.assertRegex(err, r"  rank 1: (clock_)?nanosleep \(libc[^)]*\) <- ")
        # Every thread: each rank's main thread and its sleeping second thread.
        for r in range(4):
            self.assertEqual(len(re.findall(rf"^\[rank{r}\]:Native thread \d+ ", err, re.M)), 2, err)
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(self.finish(p, 60), 128 + signal.SIGTERM)

    def test_ddp_native_stacks_0_keeps_libddp_out_of_the_workers_signals(self):
        """DDP_NATIVE_STACKS=0: libddp installs no SIGURG handler (a dump would interrupt the
        program's own poll or sleep with EINTR); the dump shows the kernel's view of each
        rank's threads instead, and the table of collectives still."""
        p = self.start(["--standalone", "--nproc-per-node", "2", "--no-python", SKIP_COLLECTIVE, "1", "3", "60",
                        self.tmp], env=clean_env(DDP_NATIVE_STACKS="0"))
        self.wait_markers(["skipped"])
        time.sleep(0.3)
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            children = [int(c) for c in f.read().split()]
        workers = [c for c in children if read_text(f"/proc/{c}/comm").startswith("ddp-test-skip")]
        self.assertEqual(len(workers), 2, children)
        for pid in workers:
            with open(f"/proc/{pid}/status") as f:
                caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
            self.assertFalse(caught & (1 << (signal.SIGURG - 1)), f"worker {pid} catches SIGURG")
        os.kill(p.pid, signal.SIGQUIT)
        m = self.wait_stderr(r"^\[ddprun\] where each rank is.*\n(?:  .*\n)+", 30)
        self.assertIn("no stack (no ddprun bootstrap or libddp in this worker, or not yet)", m.group(0))
        self.assertNotIn("Native thread", self.stderr_text())
        self.assertIn("[ddprun] libddp collectives", self.stderr_text())
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(self.finish(p, 60), 128 + signal.SIGTERM)

    def test_libddp_collectives_are_progress_for_the_hang_timeout(self):
        """No output, but an all_reduce every 0.2 s for about 4 s: --hang-timeout 2 sees
        progress and the job succeeds (without the collectives it would stop, exit 124)."""
        p = self.start(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "2", "--no-python",
                        SKIP_COLLECTIVE, "-1", "20", "0", self.tmp, "0.2"])
        self.assertEqual(self.finish(p, 60), 0, self.stderr_text())

    def test_a_failure_across_nodes_shows_where_every_rank_was(self):
        """Two static nodes; rank 3 (node 1) exits 3 while the others sleep: node 0 says the
        job failed on node 1 and, under that line, where its own ranks were; node 1's summary
        shows where every other rank of the job was (node 0 answered its ask at once)."""
        script = self.write("fail_late.py", FAIL_LATE)
        nodes = self.static_nodes([script, self.tmp])
        for p in nodes:
            self.finish(p, 60)
        err0, err1 = (read_text(self.path(f"node{n}.stderr")) for n in (0, 1))
        self.assertEqual(nodes[0].returncode, 1, err0)
        self.assertRegex(err0, r"the job failed on another node: node \S+ \(node rank 1, [^)]*\): rank 3 .* exited "
                               r"with 3\nWhere this node's ranks were \(main thread, innermost frame first; every "
                               r"thread: .*\):\n  ranks 0-1: <module> \(fail_late.py:\d+\)", err0)
        self.assertEqual(nodes[1].returncode, 3, err1)
        self.assertRegex(err1, r"Where the other ranks of the job were \(main thread, innermost frame first; every "
                               r"thread of every node: .*stacks_at_failure_all_nodes.txt\):\n"
                               r"  ranks 0-2: <module> \(fail_late.py:\d+\)\n={60}\n", err1)

    @unittest.skipIf(RUNTIME.is_torch2, "no torch in it: the run on the host's torch covers it")
    def test_a_node_whose_ranks_finished_answers_a_dump_at_once(self):
        """Two static nodes; node 0's ranks finish at once, node 1's sleep. SIGQUIT to node 1's
        ddprun: node 0, waiting for node 1, answers at once that its ranks finished (before,
        it did not answer, and node 1 waited out the 3 s deadline to say so)."""
        script = self.write("half_done.py", HALF_DONE)
        nodes = self.static_nodes(["--log-level", "info", script, self.tmp, str(scaled(60))])
        node0 = lambda: read_text(self.path("node0.stderr"))  # noqa: E731
        self.wait_markers(["ready_2", "ready_3"])
        self.wait_for(lambda: "waiting for the other nodes' workers" in node0(), scaled(10), "node 0 to wait")
        m = self.job_view_asked_on_node_1(nodes)
        self.assertRegex(m.group(1), r"^every node answered \(2 nodes, 4 ranks, in 0\.\d\d s\)")
        self.assertIn("  ranks 0-1: finished (exit code 0), its node waits for the others\n", m.group(2))
        self.assertRegex(m.group(2), r"  ranks 2-3: <module> \(half_done.py:7\)\n")
        self.assertRegex(node0(), r"dump 1 asked on node 1 \(\S+\): this node's workers have all finished")
        self.done()
        for n, p in enumerate(nodes):
            self.assertEqual(self.finish(p, 60), 0, read_text(self.path(f"node{n}.stderr")))

    def test_hang_timeout_counts_progress_on_any_node(self):
        """Two static nodes, --hang-timeout 2: only rank 0 (node 0) prints, every 0.3 s for
        about 5 s; node 1's ranks print nothing. Node 1 sees node 0's progress through the
        rendezvous and the job succeeds (judged alone, node 1 would stop it after 2 s)."""
        script = self.write("rank0_talks.py", RANK0_TALKS)
        nodes = self.static_nodes(["--hang-timeout", "2", script, "5"])
        for n, p in enumerate(nodes):
            self.assertEqual(self.finish(p, 60), 0, read_text(self.path(f"node{n}.stderr")))

    @unittest.skipIf(RUNTIME.is_torch2, "no torch in it: the run on the host's torch covers it")
    def test_a_hang_across_nodes_names_the_odd_rank_of_the_whole_job(self):
        """Two static nodes, --hang-timeout 2, nobody prints; rank 1 (node 0) stands elsewhere.
        Node 0 alone sees nothing odd, node 1 sees rank 1 not at all. The node that declares
        the hang asks the other for its ranks' stacks, and its summary shows every rank of
        the job and names rank 1 on node 0; the job stops within a few seconds. (Under load,
        the second node's own check fired after it had answered the first's ask, and it
        waited 3 s for an answer from a node that had already left.)"""
        script = self.write("straggler.py", STRAGGLER)
        t0 = time.monotonic()
        nodes = self.static_nodes(["--hang-timeout", "2", script, self.tmp, "600"])
        codes = [self.finish(p, 60) for p in nodes]
        took = time.monotonic() - t0
        errs = [read_text(self.path(f"node{n}.stderr")) for n in range(2)]
        self.assertLess(took, scaled(15), errs)
        self.assertIn(124, codes, errs)
        summaries = [e[e.index(" HUNG: "):] for e in errs if " HUNG: " in e]
        self.assertTrue(summaries, errs)
        # A node that answered another's hang ask before its own check fired does not declare
        # it again (it waits for that node's end); one whose check fired first declares too,
        # and each declaring node's view is the whole job's.
        for e in errs:
            if " HUNG: " not in e:
                self.assertRegex(e, r"hang on node \d \(\S+\): the stacks of 2 ranks", errs)
                self.assertRegex(e, r"the job failed on another node: .*: no rank made progress for 2 s", errs)
        for block in summaries:
            self.assertRegex(block, r"rank 1 not where the others are: on node 0 \(\S+\)\n"
                                    r"  ranks 0, 2-3: wait_for_peers \(straggler.py:5\) <- <module> \(straggler.py:9\)\n"
                                    r"  rank 1: load_batch \(straggler.py:7\)", errs)
            self.assertRegex(block, r"every thread of every rank: .*stacks_at_hang_all_nodes.txt")

    def test_a_dump_after_megabytes_of_earlier_ones_is_read_whole(self):
        """A rank's stack file holds every dump it ever wrote: with 5 MiB of earlier ones, the
        new dump (read from where the file ended) is shown all the same."""
        script = self.write("blocker.py", BLOCKER)
        logs = self.path("logs")
        p = self.start(["--standalone", "--nproc-per-node", "1", "--log-dir", logs, script, self.tmp, "30"],
                       env=dict(clean_env(), RANK_BLOCKS="no"))
        self.wait_markers(["ready_0"])
        stack_file = self.wait_for(lambda: next(iter(glob.glob(os.path.join(logs, "*", "attempt_0", "0", "stacks"))),
                                                None), 10, "the stack file")
        time.sleep(0.2)
        with open(stack_file, "a") as f:
            f.write(("# an earlier dump\n" * 64) * 5000)  # about 5.5 MiB
        os.kill(p.pid, signal.SIGQUIT)
        self.wait_stderr(r"^\[ddprun\] where each rank is", scaled(10))
        self.assertRegex(self.stderr_text(), r"\[rank0\]:  File .*blocker.py\", line \d+ in <module>")
        os.kill(p.pid, signal.SIGTERM)
        self.finish(p, 30)

    def test_a_stop_signal_during_a_dump_does_not_wait_for_it(self):
        """SIGTERM while ddprun waits for a dump that rank 0 never answers: the dump ends
        early and rank 1 gets SIGTERM at once, not after the dump's 2 s deadline (issue 19:
        a signal reaches the workers within 100 ms)."""
        script = self.write("term_stamp.py", TERM_STAMP)
        p = self.start(["--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "1", script, self.tmp, "60"])
        self.wait_markers(["ready_0", "ready_1"])
        time.sleep(0.2)
        os.kill(p.pid, signal.SIGQUIT)
        time.sleep(0.2)  # ddprun now waits for rank 0's dump
        sent = time.time()
        os.kill(p.pid, signal.SIGTERM)
        self.wait_markers(["term_1"], timeout=scaled(10))
        got = float(read_text(self.path("term_1")))
        self.assertLess(got - sent, scaled(0.5), self.stderr_text())
        self.assertEqual(self.finish(p, 30), 128 + signal.SIGTERM, self.stderr_text())

    def test_no_python_workers_are_named_at_once_and_run_on(self):
        p = self.start(["--standalone", "--nproc-per-node", "2", "--no-python", "sleep", str(scaled(4))])
        time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGQUIT)
        self.wait_stderr(r"ranks 0-1: no stack \(no ddprun bootstrap", 30)
        self.assertLess(time.monotonic() - t0, scaled(1.5), "no worker was asked, so nothing was waited for")
        self.assertRegex(self.stderr_text(), r"\[rank0\]:no stack .*\(pid \d+\): 1 thread: 1x S")
        self.assertEqual(self.finish(p, 60), 0)

    def test_stacks_say_whose_they_are_under_a_raw_prefix_template(self):
        """`--log-line-prefix-template ''` (raw output): a dump's lines still carry the rank.
        Before, every block was a bare "Current thread ..." with nothing to tell them apart."""
        script = self.write("sleeper.py", BLOCKER)
        p = self.start(["--standalone", "--nproc-per-node", "2", "--log-line-prefix-template", "", script, self.tmp,
                        str(scaled(20))], env=clean_env(RANK_BLOCKS="no"))
        self.wait_markers(["ready_0", "ready_1"])
        os.kill(p.pid, signal.SIGQUIT)
        for r in (0, 1):
            self.wait_stderr(rf"^\[rank{r}\]:  File .*sleeper.py\", line \d+ in <module>", 30)
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(self.finish(p, 60), 143)

    def test_a_wrapper_that_ran_another_python_first_shows_the_training_pythons_stack(self):
        """`--no-python` sh that runs a short Python step, then execs the training Python:
        both announce themselves in the rank's stack file; the dump shows the live one.
        Before, ddprun read the first (gone) Python's announcement: "no Python stack"."""
        script = self.write("loop.py", "import os, sys, time\n"
                                       "open(os.path.join(sys.argv[1], 'ready_0'), 'w').close()\n"
                                       "time.sleep(float(sys.argv[2]))\n")
        wrapper = f'"{sys.executable}" -c "print(1)" && exec "{sys.executable}" "{script}" "{self.tmp}" {scaled(20)}'
        p = self.start(["--standalone", "--nproc-per-node", "1", "--no-python", "sh", "-c", wrapper])
        self.wait_markers(["ready_0"])
        os.kill(p.pid, signal.SIGQUIT)
        self.wait_stderr(r"^\[rank0\]:  File .*loop.py\", line \d+ in <module>", 30)
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(self.finish(p, 60), 143)

    def probe(self, *flags):
        """What workers/probe.py sees, run as `-m probe` from a folder of its own."""
        self.write("pkg/probe.py", PROBE)
        self.write("user_site/sitecustomize.py", "import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
        env = clean_env(PYTHONPATH=self.path("user_site") + ":" + self.path("pkg"))
        args = ["--standalone", "--nproc-per-node", "1", *flags, "-m", "probe", "a", "--b"]
        res = self.run_ddprun(args, env=env)
        self.assertEqual(res.rc, 0, res)
        line = next(l for l in res.stdout.splitlines() if "PROBE " in l)
        return json.loads(line.split("PROBE ", 1)[1])

    def test_the_bootstrap_is_invisible_and_the_users_sitecustomize_runs(self):
        on, off = self.probe(), self.probe("--no-stack-dumps")
        self.assertEqual(on, off)
        self.assertEqual(on["user_site_ran"], "yes")
        self.assertEqual(on["site"], self.path("user_site", "sitecustomize.py"))
        self.assertEqual(on["argv"][1:], ["a", "--b"])
        # (torch 2.6's interpreter, tests/torch2/python3, puts its test-only shim first.)
        shim = os.path.join(SOURCE, "tests", "torch2", "nolibuv") + ":" if RUNTIME.is_torch2 else ""
        self.assertEqual(on["pythonpath"], shim + self.path("user_site") + ":" + self.path("pkg"))
        self.assertFalse(any("share/ddprun" in p for p in on["path"]), on["path"])
        self.assertEqual(on["env"], [])

    def test_no_stack_dumps_leaves_pythonpath_alone_and_sigquit_stops(self):
        env = clean_env(PYTHONPATH="/opt/mine")
        on = self.run_ddprun(["--standalone", "--no-python", "env"], env=env)
        self.assertIn(f"[rank0]:PYTHONPATH={BOOTSTRAP}:/opt/mine\n", on.stdout)
        self.assertRegex(on.stdout, r"\[rank0\]:DDPRUN_STACK_FILE=/\S+/attempt_0/0/stacks\n")
        off = self.run_ddprun(["--standalone", "--no-stack-dumps", "--no-python", "env"], env=env)
        self.assertIn("[rank0]:PYTHONPATH=/opt/mine\n", off.stdout)
        self.assertNotIn("DDPRUN_", off.stdout)
        # Without stack dumps SIGQUIT is torchrun's: forwarded, and the job stops (128+3).
        p = self.start(["--standalone", "--no-stack-dumps", "--no-python", "sleep", str(scaled(30))])
        time.sleep(0.5)
        os.kill(p.pid, signal.SIGQUIT)
        self.assertEqual(self.finish(p, 60), 131)

    def test_keyboard_interrupts_while_the_job_stops_take_no_stacks(self):
        """SIGINT to ddprun reaches the workers, whose KeyboardInterrupt goes through the
        bootstrap's excepthook: that is no failure, and takes nobody's stack."""
        script = self.write("blocker.py", BLOCKER)
        p = self.start(["--standalone", "--nproc-per-node", "2", "--log-level", "info", script, self.tmp, "60"],
                       env=clean_env(RANK_BLOCKS="no"))
        self.wait_markers(["ready_0", "ready_1"])
        time.sleep(0.3)
        os.kill(p.pid, signal.SIGINT)
        self.assertEqual(self.finish(p, 60), 130)
        self.assertNotIn("taking the other ranks' stacks", self.stderr_text())
        self.assertNotIn("SIGURG", self.stderr_text())  # nor is a worker's notice a dump on demand
        self.assertIn("KeyboardInterrupt", self.stderr_text())

    def test_ranks_listed_as_failures_are_not_among_the_other_ranks(self):
        """Rank 1 exits with 1; rank 0, which does not answer the stacks' signal, exits with 1
        by itself while ddprun waits for its stack: the summary lists it as a failure, and
        "where the other ranks were" listed it again ("rank 0: exited before it answered")."""
        script = self.write("both_fail.py", "import os, signal, sys, time\n"
                                            "if os.environ['RANK'] == '1':\n"
                                            "    open('pid_1.tmp', 'w').write(str(os.getpid()))\n"
                                            "    os.rename('pid_1.tmp', 'pid_1')\n"
                                            "    while not os.path.exists('blocked'):\n"
                                            "        time.sleep(0.01)\n"
                                            "    sys.exit(1)\n"
                                            "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGURG])\n"
                                            "while not os.path.exists('pid_1'):\n"
                                            "    time.sleep(0.01)\n"
                                            "peer = int(open('pid_1').read())\n"
                                            "open('blocked', 'w').close()\n"
                                            "while True:\n"
                                            "    try:\n"
                                            "        os.kill(peer, 0)\n"
                                            "    except ProcessLookupError:\n"
                                            "        break\n"
                                            "    time.sleep(0.01)\n"
                                            "time.sleep(0.2)\n"
                                            "sys.exit(1)\n")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", script])
        self.assertEqual(res.rc, 1, res)
        self.assertEqual(sorted(int(r) for r in re.findall(r"^  rank      : (\d+) ", res.stderr, re.M)), [0, 1], res)
        self.assertNotIn("Where the other ranks were", res.stderr)

    def test_a_keyboard_interrupt_inside_the_bootstraps_hook_is_not_shown(self):
        """A Ctrl-C that lands while the bootstrap's excepthook runs (here: in its notice to
        ddprun, made to raise KeyboardInterrupt) printed "Error in sys.excepthook" with a
        traceback through ddprun's sitecustomize.py; the user's own traceback is what shows."""
        script = self.write("hooked.py", "import os\n"
                                         "def interrupted(*a):\n"
                                         "    raise KeyboardInterrupt\n"
                                         "os.kill = interrupted\n"
                                         "raise ValueError('the real failure')\n")
        res = self.run_ddprun(["--standalone", script])
        self.assertEqual(res.rc, 1, res)
        self.assertIn("[rank0]:ValueError: the real failure", res.stderr)
        self.assertNotIn("Error in sys.excepthook", res.stderr)
        self.assertNotIn("sitecustomize", res.stderr)

    def test_a_root_cause_reaped_after_a_peers_notice_is_not_among_the_other_ranks(self):
        """Rank 0's uncaught exception is announced (the others' stacks are taken then), and
        rank 1 exits with 3 before rank 0 has exited; rank 0 ends on the stop's SIGTERM, so
        rank 1 is the root cause. "Where the other ranks were" showed rank 1 (where it was at
        the notice) and left rank 0 out; now rank 0 is shown failing, and rank 1 is not there."""
        script = self.write("late_root.py", LATE_ROOT)
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", script])
        self.assertEqual(res.rc, 3, res)
        summary = res.stderr[res.stderr.index("Root Cause"):]
        self.assertIn("rank      : 1 (local_rank: 1)", summary)
        where = summary[summary.index("Where the other ranks were"):]
        self.assertIn("  rank 0: failing: an uncaught exception (its traceback is in its output)\n", where)
        self.assertNotIn("rank 1:", where)

    def test_a_hang_is_a_failed_attempt_that_max_restarts_restarts(self):
        script = self.write("blocker.py", BLOCKER)
        for _ in range(3):
            res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "1", "--max-restarts",
                                   "1", script, self.tmp, "60"], env=clean_env(RANK_BLOCKS="no"))
            # A rank whose Python had not started within the 1 s (a loaded machine: once in CI,
            # in the torch 2 tree) shows no stack: nothing to compare. Run the job again.
            if "no stack (no ddprun bootstrap or libddp in this worker, or not yet)" not in res.stderr:
                break
            print("a rank's Python had not started within the 1 s --hang-timeout: running the job again",
                  file=sys.stderr)
        self.assertEqual(res.rc, 124, res)
        self.assertEqual(len(re.findall(r"error\] no rank made progress for 1 s \(--hang-timeout\)", res.stderr)), 2, res)
        self.assertIn("restarting all workers: attempt 1 of 1", res.stderr)
        self.assertIn(" HUNG: no rank made progress for 1 s", res.stderr)
        self.assertIn("every rank is at the same place", res.stderr)  # both sleep in the same line

    def test_a_dump_while_the_workers_stop_does_not_say_the_job_runs_on(self):
        """SIGTERM to ddprun, the workers ignore it (--shutdown-timeout 4), then SIGQUIT: the
        dump is taken and its line says the workers are being stopped."""
        script = self.write("ignore_term.py", "import os, signal, time, sys\n"
                            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                            "open(os.path.join(sys.argv[1], 'ready_' + os.environ['RANK']), 'w').close()\n"
                            "time.sleep(60)\n")
        p = self.start(["--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "4", script, self.tmp])
        self.wait_markers(["ready_0", "ready_1"])
        os.kill(p.pid, signal.SIGTERM)
        self.wait_stderr(r"received SIGTERM: forwarding it to the workers", 30)
        os.kill(p.pid, signal.SIGQUIT)
        self.assertEqual(self.finish(p, 60), 143)
        self.assertRegex(self.stderr_text(), r"SIGQUIT \(dump 1 asked on node 0 \(\S+\)\): the stacks of 2 ranks on "
                                             r"\S+ \(2 answered in [\d.]+ s\); the workers are being stopped\n")
        self.assertNotIn("the job runs on", self.stderr_text())

    def test_a_hang_without_stack_dumps_says_so_once_and_the_summary_names_it(self):
        """--no-stack-dumps at a hang: the report says stacks are off, with no empty "where
        each rank is" heading under it, and --summary-json says a hang ended the job."""
        summary = self.path("summary.json")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "1", "--no-stack-dumps",
                               "--summary-json", summary, "--no-python", "sleep", "60"], timeout=40)
        self.assertEqual(res.rc, 124, res)
        self.assertIn("stacks are off (--no-stack-dumps)", res.stderr)
        self.assertNotIn("where each rank is", res.stderr)
        with open(summary) as f:
            doc = json.load(f)
        self.assertEqual((doc["status"], doc["reason"], doc["exit_code"]), ("failed", "hang", 124), doc)

    def test_a_ddprun_run_by_the_loader_is_found_and_finds_its_bootstrap(self):
        """docker/Containerfile.pytorch starts /opt/ddprun/bin/ddprun through a loader in
        /opt/ddprun/lib: ddprun is then named after the loader, and its /proc/self/exe is it."""
        loader = "/lib64/ld-linux-x86-64.so.2"
        if not os.path.exists(loader):
            self.skipTest(f"no {loader}")
        opt = self.path("opt")
        for d in ("bin", "lib", "share/ddprun"):
            os.makedirs(os.path.join(opt, d))
        shutil.copy(loader, os.path.join(opt, "lib"))  # a copy: /proc/self/exe resolves links
        os.symlink(os.path.realpath(DDPRUN), os.path.join(opt, "bin", "ddprun"))
        os.symlink(BOOTSTRAP, os.path.join(opt, "share", "ddprun", "python"))
        script = self.write("blocker.py", BLOCKER)
        cmd = [os.path.join(opt, "lib", os.path.basename(loader)), "--argv0", "ddprun", os.path.join(opt, "bin", "ddprun"),
               "--standalone", "--nproc-per-node", "2", script, self.tmp, str(scaled(60))]
        with open(self.path("ddprun.stderr"), "wb") as err:
            p = subprocess.Popen(cmd, env=dict(clean_env(RANK_BLOCKS="no"), TMPDIR=self.tmp), stdout=subprocess.DEVNULL,
                                 stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(p)  # killed in tearDown if still running
        self.wait_markers(["ready_0", "ready_1"])
        time.sleep(0.2)
        r = subprocess.run([DDPRUN, "--dump-stacks", str(p.pid)], capture_output=True, text=True, timeout=scaled(30))
        self.assertEqual(r.returncode, 0, r)
        self.wait_stderr(r"SIGURG \(dump 1 asked on node 0 \(\S+\)\): the stacks of 2 ranks", 30)
        self.assertRegex(self.stderr_text(), r"ranks 0-1: <module> \(blocker.py:\d+\)")
        self.done()
        self.assertEqual(self.finish(p, 60), 0)

    def test_the_processes_a_rank_forked_are_shown_where_they_are(self):
        """Rank 1's forked children (as a DataLoader's workers: multiprocessing's fork): two
        stuck in decode() while it waits for them in a queue, one that blocks SIGURG (it never
        answers). On demand (SIGQUIT), the where lines name the children's places under rank
        1's ("rank 1's forked processes: pids A-B: decode (forks.py:6) <- ...; pid C: no
        answer"), their every thread is in the saved file, not the output, and the dump ends
        by its deadline (the first child answers through a memfd, the others through an
        O_TMPFILE file, as where Python has no os.memfd_create); rank 0's children, which exec'd sleep (one through preexec_fn, whose
        at-fork hook ran), are not asked. At --hang-timeout the report names them the same way."""
        script = self.write("forks.py", "import multiprocessing as mp, os, signal, subprocess, time\n"
                                        "def decode(q):\n"
                                        "    if os.environ['RANK'] == '1':\n"
                                        "        open(f'stuck_{os.getpid()}', 'w').close()\n"
                                        "        while True:\n"
                                        "            time.sleep(1)\n"
                                        "    q.put(1)\n"
                                        "def deaf():\n"
                                        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGURG])\n"
                                        "    open(f'deaf_{os.getpid()}', 'w').close()\n"
                                        "    time.sleep(600)\n"
                                        "if __name__ == '__main__' and os.environ['RANK'] == '1':\n"
                                        "    ctx = mp.get_context('fork')\n"
                                        "    q = ctx.Queue()\n"
                                        "    kids = [ctx.Process(target=decode, args=(q,)) for _ in range(2)]\n"
                                        "    for k in kids + [ctx.Process(target=deaf)]:\n"
                                        "        k.start()\n"
                                        "        os.__dict__.pop('memfd_create', None)  # the others: O_TMPFILE\n"
                                        "    print(q.get(), q.get(), flush=True)\n"
                                        "if os.environ['RANK'] == '0':\n"
                                        "    subprocess.Popen(['sleep', '600'])\n"
                                        "    subprocess.Popen(['sleep', '600'], preexec_fn=lambda: None)\n"
                                        "    open('execd', 'w').close()\n"
                                        "time.sleep(600)\n")
        p = self.start(["--standalone", "--nproc-per-node", "2", "--hang-timeout", str(scaled(15)), script])
        # (Well before the hang: its report would be taken for the dump's.)
        self.wait_for(lambda: len(glob.glob(self.path("stuck_*"))) == 2 and glob.glob(self.path("deaf_*")) and
                      os.path.exists(self.path("execd")), scaled(8), "rank 1's children stuck, rank 0's exec'd")
        kids = sorted(int(f.rsplit("_", 1)[1]) for f in glob.glob(self.path("stuck_*")))
        deaf = int(glob.glob(self.path("deaf_*"))[0].rsplit("_", 1)[1])
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGQUIT)
        m = self.wait_stderr(r"^\[ddprun\] where each rank is.*\n(?:  .*\n)+", 30)
        self.assertLess(time.monotonic() - t0, scaled(4), "the dump's deadline (2 s) holds for the children too")
        pids = "%d-%d" % tuple(kids) if kids[1] == kids[0] + 1 else "%d, %d" % tuple(kids)
        forked = (r"    rank 1's forked processes: pids %s: decode \(forks.py:6\) <- run \(process.py:\d+\)"
                  r".*; pid %d: no answer\n" % (pids, deaf))
        self.assertRegex(m.group(0), r"  rank 1: .* <- get \(queues.py:\d+\) <- <module> \(forks.py:19\)\n" + forked,
                         m.group(0))
        self.assertNotIn("rank 0's forked", m.group(0))  # exec'd: not asked
        dump = self.stderr_text()[:m.end()]
        self.assertNotIn("forked by this rank", dump)  # every thread of theirs: in the file only
        saved = re.search(r"dump 1 .* every thread of the processes they forked in (\S+stacks_1.txt)", dump)
        self.assertIsNotNone(saved, dump)
        text = read_text(saved.group(1))
        for k in kids:
            self.assertRegex(text, r"\[rank1\]:Process %d, forked by this rank:\n(?:\[rank1\]:.*\n)*?"
                                   r"\[rank1\]:  File \"%s\", line 6 in decode" % (k, re.escape(script)))
        self.assertEqual(self.finish(p, 60), 124, self.stderr_text()[-3000:])
        report = self.stderr_text()[self.stderr_text().index(" HUNG: "):]
        self.assertRegex(report, forked)

    def test_more_forked_processes_than_are_asked_are_counted(self):
        """Rank 0 forks 18 processes that wait: 16 are asked, and its forked line says that 2
        more were not. Before, nothing said that some were left out."""
        # (Each child writes kid_<pid> after fork() returned in it: its at-fork hook, which
        # announces it, has run.)
        script = self.write("many.py", "import os, sys, time\n"
                                       "DONE, END = os.path.join(sys.argv[1], 'done'), time.monotonic() + 60\n"
                                       "for _ in range(18):\n"
                                       "    if os.fork() == 0:\n"
                                       "        open(os.path.join(sys.argv[1], f'kid_{os.getpid()}'), 'w').close()\n"
                                       "        while not os.access(DONE, os.F_OK) and time.monotonic() < END: time.sleep(0.05)\n"
                                       "        os._exit(0)\n"
                                       "open(os.path.join(sys.argv[1], 'ready_0'), 'w').close()\n"
                                       "while not os.access(DONE, os.F_OK) and time.monotonic() < END: time.sleep(0.05)\n"
                                       "while True:\n"
                                       "    try:\n"
                                       "        os.wait()\n"
                                       "    except ChildProcessError:\n"
                                       "        break\n")
        p = self.start(["--standalone", "--nproc-per-node", "1", script, self.tmp])
        self.wait_markers(["ready_0"])
        self.wait_for(lambda: len(glob.glob(self.path("kid_*"))) == 18, scaled(30), "18 children")
        os.kill(p.pid, signal.SIGQUIT)
        m = self.wait_stderr(r"^\[ddprun\] where each rank is.*\n(?:  .*\n)+", 30)
        # (A child whose marker was just written may still show its line 5: two frames then.)
        self.assertRegex(m.group(0), r"\n    rank 0's forked processes: (?:pids? [\d, -]+: <module> \(many.py:[56]\); )+"
                                     r"2 more not asked \(at most 16 a rank are asked\)\n")
        self.done()
        self.assertEqual(self.finish(p, 60), 0, self.stderr_text()[-2000:])

    def test_a_heartbeat_is_progress(self):
        """Silent workers that touch $DDPRUN_HEARTBEAT_FILE (docs/stacks.md's snippet) outlive
        a --hang-timeout three times shorter than their run; the same without it would hang
        (test_a_hang_is_a_failed_attempt_that_max_restarts_restarts). The timeout is 2 s: a
        worker's interpreter must start and touch the file within it (under CI's load, torch
        2's took longer than 1 s once)."""
        script = self.write("beat.py", "import os, pathlib, time\n"
                                       "end = time.monotonic() + 6\n"
                                       "while time.monotonic() < end:\n"
                                       "    if hb := os.environ.get('DDPRUN_HEARTBEAT_FILE'):\n"
                                       "        pathlib.Path(hb).touch()\n"
                                       "    time.sleep(0.2)\n")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "2", script])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.stdout, "")

    def test_output_waiting_for_a_slow_console_is_progress(self):
        """A rank that prints without pause into a console nobody reads for 6 s (`| less`):
        ddprun's console queue fills, it stops reading the rank's pipe and the rank blocks in
        print. That is no hang: --hang-timeout 2 does not stop the job, which ends with exit
        0 once the console is read. Before, no byte read for 2 s was a hang (exit 124)."""
        script = self.write("chatty.py", "import sys\n"
                                         "for i in range(120_000):\n"
                                         "    print(f'line {i} ' + 'x' * 90)\n")
        p = self.start(["--standalone", "--nproc-per-node", "1", "--hang-timeout", "2", script],
                       stdout=subprocess.PIPE)
        time.sleep(scaled(6))
        out = p.stdout.read()
        self.assertEqual(self.finish(p, 60), 0, self.stderr_text()[-2000:])
        self.assertEqual(out.count(b"\n"), 120_000)

    def test_the_time_an_on_demand_dump_takes_is_not_a_hang(self):
        """Rank 0 prints every 0.3 s; rank 1 is stopped (SIGSTOP by its pid), so an on-demand
        dump waits out its 2 s deadline, reading no output meanwhile. With --hang-timeout 2
        that wait is not the ranks' silence: the job runs on. Before, the hang was declared
        right after the dump (exit 124)."""
        script = self.ticker()
        p = self.start(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "2", script, self.tmp,
                        str(scaled(60))])
        self.wait_markers(["pid_0", "pid_1"])
        stopped = self.read_pid(self.path("pid_1"))
        self.track_pid(stopped)
        time.sleep(0.5)
        os.kill(stopped, signal.SIGSTOP)
        try:
            os.kill(p.pid, signal.SIGQUIT)
            self.wait_stderr(r"^\[ddprun\] where each rank is", 30)
            time.sleep(1.5)
            self.assertIsNone(p.poll(), "the job was stopped as hung:\n" + self.stderr_text()[-2000:])
        finally:
            os.kill(stopped, signal.SIGCONT)
        self.done()
        self.assertEqual(self.finish(p, 60), 0, self.stderr_text()[-2000:])

    def test_a_pause_of_the_whole_job_is_not_a_hang(self):
        """ddprun and its ranks stopped together for 5 s (as `podman pause` freezes a
        container) with --hang-timeout 3: nobody ran, so nobody hung; the job runs on and
        ends 0. Before, the hang was declared the moment the pause ended (exit 124)."""
        script = self.ticker()
        p = self.start(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "3", script, self.tmp,
                        str(scaled(60))])
        self.wait_markers(["pid_0", "pid_1"])
        ranks = [self.read_pid(self.path(f"pid_{r}")) for r in (0, 1)]
        time.sleep(0.5)
        frozen = [p.pid] + ranks
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(5)
        finally:
            for pid in reversed(frozen):
                os.kill(pid, signal.SIGCONT)
        time.sleep(scaled(2))  # ddprun's checks after the pause (its first comes at once)
        self.done()
        self.assertEqual(self.finish(p, 60), 0, self.stderr_text()[-2000:])

    def test_a_rank_that_ended_early_is_named_where_each_rank_is(self):
        """Rank 0 finishes at once (exit 0), ranks 1-2 wait for it for ever (the classic hang:
        a collective it never joins). The hang report names rank 0 as the odd one and says it
        is not running. Before, it vanished from every view ("every rank is at the same
        place", ranks 1-2 only)."""
        script = self.write("early.py", "import os, time\n"
                                        "if os.environ['RANK'] != '0':\n"
                                        "    time.sleep(60)\n")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "3", "--hang-timeout", "2", script], timeout=40)
        self.assertEqual(res.rc, 124, res)
        report = res.stderr.split("HUNG: ", 1)[1]
        self.assertIn("rank 0 not where the others are", report)
        self.assertRegex(report, r"  ranks 1-2: <module> \(early.py:3\)\n  rank 0: not running: exited with code 0\n")

    def test_a_heartbeat_dated_in_the_future_does_not_hide_a_hang(self):
        """A worker touches its heartbeat file once with a time an hour ahead (a file server
        whose clock is ahead), then blocks: --hang-timeout 2 still finds the hang (exit 124).
        Before, the file's time counted as progress for the next hour."""
        script = self.write("future.py", "import os, time\n"
                                         "hb = os.environ['DDPRUN_HEARTBEAT_FILE']\n"
                                         "open(hb, 'w').close()\n"
                                         "os.utime(hb, (time.time() + 3600, time.time() + 3600))\n"
                                         "time.sleep(60)\n")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "1", "--hang-timeout", "2", script], timeout=40)
        self.assertEqual(res.rc, 124, res)
        self.assertLess(res.elapsed, scaled(15), res)

    def test_dump_stacks_finds_a_ddprun_started_as_torchrun(self):
        """The drop-in use: ddprun started through a symlink named torchrun (its process is
        named torchrun). `ddprun --dump-stacks PID` finds it by its executable. Before: "pid N
        is not a running ddprun job of yours"."""
        link = self.path("torchrun")
        os.symlink(DDPRUN, link)
        script = self.write("sleeper.py", BLOCKER)
        p = self.start(["--standalone", "--nproc-per-node", "1", script, self.tmp, str(scaled(20))],
                       env=clean_env(RANK_BLOCKS="no"), cmd_prefix=["sh", "-c", f'exec "{link}" "$@"'])
        self.wait_markers(["ready_0"])
        r = subprocess.run([DDPRUN, "--dump-stacks", str(p.pid)], capture_output=True, text=True,
                           timeout=scaled(30))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.wait_stderr(r"^\[rank0\]:.*\n\[rank0\]:  File .*sleeper.py\", line \d+ in <module>", 30)
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(self.finish(p, 60), 143)

    def test_dump_stacks_without_a_job(self):
        r = subprocess.run([DDPRUN, "--dump-stacks", "1"], capture_output=True, text=True, timeout=scaled(30))
        self.assertEqual((r.returncode, r.stdout), (1, ""))
        self.assertEqual(r.stderr, "ddprun: error: --dump-stacks: pid 1 is not a running ddprun job of yours\n")
        r = subprocess.run([DDPRUN, "--dump-stacks", "x"], capture_output=True, text=True, timeout=scaled(30))
        self.assertEqual(r.returncode, 2)
        self.assertTrue(r.stderr.startswith("ddprun: error: --dump-stacks: expected the pid"), r.stderr)


README_DRIVER = r"""
import os, subprocess, sys, time
job_line, dump_line = sys.argv[1], sys.argv[2]
job = subprocess.Popen(job_line, shell=True, stdout=open("job.out", "wb"), stderr=open("job.err", "wb"))
deadline = time.monotonic() + float(sys.argv[3])
while b"[rank0]:" not in open("job.out", "rb").read() and time.monotonic() < deadline:
    time.sleep(0.05)
dump = subprocess.run(dump_line, shell=True, capture_output=True, text=True)
print("DUMP", dump.returncode, dump.stdout.strip(), dump.stderr.strip(), flush=True)
print("JOB", job.wait(), flush=True)
"""


@unittest.skipIf(RUNTIME.skip_reason(), f"{RUNTIME.name}: {RUNTIME.skip_reason()}")
class ReadmeLines(StacksTest):
    def test_readme_lines_as_written(self):
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root for a pid namespace of its own")
        readme = read_text(os.path.join(SOURCE, "README.md"))
        section = readme[readme.index("## Where is it stuck?"):]
        block = section[section.index("```sh\n") + 6:section.index("```", section.index("```sh\n") + 6)]
        lines = [l.split("  #")[0].strip() for l in block.splitlines() if l.strip()]
        self.assertEqual(len(lines), 2, lines)
        for name in ("build", "examples"):  # the lines' relative paths, from this folder
            os.symlink(os.path.join(SOURCE, name), self.path(name))
        r, err = self.run_driver(lines)
        self.assertIn("DUMP 0 ddprun: asked ddprun", r.stdout, r.stderr + err[-2000:])
        self.assertIn("JOB 0", r.stdout, err[-3000:])
        self.assertRegex(err, r"SIGURG \(dump 1 asked on node 0 \(\S+\)\): the stacks of 4 ranks")
        self.assertRegex(err, r"\[rank0\]:  File \".*train.py\", line \d+ in")

    def run_driver(self, lines):
        """README_DRIVER's output and the job's stderr; run once more when the job failed only
        by torch's exit race (torch_exit_abort: exit 134 after train.py printed it was done)."""
        driver = self.path("driver.py")
        with open(driver, "w") as f:
            f.write(README_DRIVER)
        for attempt in range(2):
            r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, driver, lines[0],
                                lines[1], str(scaled(60))], cwd=self.tmp, env=clean_env(), capture_output=True,
                               text=True, timeout=scaled(JOB_TIMEOUT))
            err = read_text(self.path("job.err"))
            job = subprocess.CompletedProcess(lines[0], 128 + 6 if "JOB 134" in r.stdout else None,
                                              read_text(self.path("job.out")), err)
            if attempt or not torch_exit_abort(job, "; done in "):
                return r, err
            print(f"torch's exit race ({TORCH_EXIT_ABORT!r}); once more:\n{err[-2000:]}", file=sys.stderr)


if __name__ == "__main__":
    main()
