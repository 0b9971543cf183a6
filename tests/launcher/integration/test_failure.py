"""Issue 2: exec failures, failure propagation with the worker's exit code, death by
signal, --shutdown-timeout, restarts."""
import json
import os
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, clean_env, pid_alive, read_text, scaled, worker

# "At once" for a whole ddprun run: starting the workers and tearing them down takes well
# under a second idle and a few seconds on a loaded machine. A sibling that is not stopped
# sleeps 300 s (workers/fail_one.py), far above this bound.
PROMPT = 20


class ExecFailureTest(DdprunTestCase):
    def test_non_executable_with_no_python(self):
        # Refused before any worker starts, as a missing script is: one line, exit 2 (before, every
        # worker failed with exit 126 and a failure summary).
        script = self.path("not_executable.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\necho should not run > marker\n")
        os.chmod(script, 0o644)
        res = self.run_ddprun(["--nproc-per-node", "2", "--no-python", script])
        self.assertEqual(res.rc, 2, res)
        self.assertEqual(res.stderr, f"ddprun: error: training script '{script}' is not executable (chmod +x): "
                                     "--no-python runs it as a program\n", res)
        self.assertFalse(os.path.exists(self.path("marker")))

    def test_a_python_not_in_path_is_named_with_the_path_and_python_exec(self):
        script = self.path("w.py")
        with open(script, "w") as f:
            f.write("print('hi')\n")
        res = self.run_ddprun(["--nproc-per-node", "1", script], env=clean_env(PATH="/nonexistent-bin", PYTHON_EXEC=None))
        self.assertEqual(res.rc, 127, res)
        self.assertIn("rank 0: cannot execute python3: not found in any folder of PATH (/nonexistent-bin); "
                      "PYTHON_EXEC names the Python interpreter the workers run", res.stderr)

    def test_bad_interpreter_named(self):
        script = self.path("bad_interp.sh")
        with open(script, "w") as f:
            f.write("#!/nonexistent/interp-xyz\necho hi\n")
        os.chmod(script, 0o755)
        for args in (["--no-python", script], [script]):
            with self.subTest(args=args[0]):
                res = self.run_ddprun(args)
                self.assertEqual(res.rc, 127, res)
                self.assertIn("/nonexistent/interp-xyz", res.stderr, res)
                self.assertIn(script, res.stderr, res)
                self.summary_block(res.stderr)

    def test_python_exec_nonexistent(self):
        env = clean_env(PYTHON_EXEC="/nonexistent/python3.99")
        res = self.run_ddprun(["--nproc-per-node", "2", worker("marker.py"), self.path("marker")], env=env)
        self.assertEqual(res.rc, 127, res)
        self.assertIn("/nonexistent/python3.99", res.stderr, res)
        self.assertFalse(os.path.exists(self.path("marker")))
        self.summary_block(res.stderr)

    def test_exec_failure_stops_siblings(self):
        # No rank can start: PYTHON_EXEC names a file that is not executable. ddprun exits 126 at once.
        fake = self.path("python")
        with open(fake, "w") as f:
            f.write("not a program\n")
        os.chmod(fake, 0o644)
        env = clean_env(PYTHON_EXEC=fake)
        res = self.run_ddprun(["--nproc-per-node", "3", worker("marker.py"), self.path("marker")], env=env)
        self.assertEqual(res.rc, 126, res)
        self.assertIn(fake, res.stderr)
        self.assertLess(res.elapsed, scaled(PROMPT), res)


def pids_cgroup(name):
    """A cgroup (v1's pids hierarchy, or v2 with the pids controller) this test may make, as
    (its folder) or None."""
    v1 = "/sys/fs/cgroup/pids"
    if os.path.isdir(v1) and os.access(v1, os.W_OK):
        return os.path.join(v1, name)
    try:
        if "pids" in read_text("/sys/fs/cgroup/cgroup.subtree_control").split() and \
                os.access("/sys/fs/cgroup", os.W_OK):
            return os.path.join("/sys/fs/cgroup", name)
    except OSError:
        pass
    return None


class ForkFailureTest(DdprunTestCase):
    def test_no_process_for_a_worker_fails_it_with_the_limit_named(self):
        # A container's --pids-limit (Kubernetes' podPidsLimit) reached: the ranks ddprun
        # cannot make a process for fail as an exec failure does, naming the limit, with a
        # summary and --summary-json (before: "ddprun: error: vfork for /usr/bin/sleep:
        # Resource temporarily unavailable", exit 1, no summary).
        cg = pids_cgroup(f"ddprun_test_{os.getpid()}")
        if not cg:
            self.skipTest("no pids cgroup this test may make (needs root and cgroup v1's pids or v2's controller)")
        os.mkdir(cg)
        self.addCleanup(os.rmdir, cg)
        with open(os.path.join(cg, "pids.max"), "w") as f:
            f.write("8")
        summary = self.path("s.json")
        res = self.run_ddprun(["--nproc-per-node", "8", "--summary-json", summary, "--no-python", "sleep", "1"],
                              cmd_prefix=("sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"))
        self.assertEqual(res.rc, 1, res)
        self.assertRegex(res.stderr, r"error\] rank \d: cannot make a process for it: vfork: Resource temporarily "
                                     r"unavailable \(the processes and threads this job may have are used up: the "
                                     r"cgroup's pids.max 8")
        first = int(re.search(r"error\] rank (\d): cannot make a process", res.stderr).group(1))
        self.assertIn(f"  rank      : {first} (local_rank: {first})", res.stderr)
        self.assertEqual(json.load(open(summary))["reason"], "worker_failed")


class FailurePropagationTest(DdprunTestCase):
    def pids(self, n):
        return [self.read_pid(self.path(f"pid_{r}")) for r in range(n)]

    def test_exit_code_propagates_quickly(self):
        res = self.run_ddprun(["--nproc-per-node", "4", worker("fail_one.py"), self.tmp, "1", "exit:3"])
        self.assertEqual(res.rc, 3, res)
        self.assertLess(res.elapsed, scaled(PROMPT), f"siblings sleeping 300 s must be stopped at once: {res}")
        for pid in self.pids(4):
            self.assertFalse(pid_alive(pid), f"worker {pid} still running after ddprun exited")
        summary = self.summary_block(res.stderr)
        root = summary[summary.index("Root Cause"):]
        self.assertIn("rank      : 1 (local_rank: 1)", root)
        self.assertIn("exitcode  : 3 (pid: ", root)
        # The siblings ddprun stopped with SIGTERM are no failures of their own: as torchrun,
        # the summary has none besides the root cause (before, it listed the 3 as -15).
        others = summary[summary.index("Failures:"):summary.index("Root Cause")]
        self.assertEqual(others, "Failures:\n  <NO_OTHER_FAILURES>\n" + "-" * 60 + "\n", summary)

    def test_killed_by_sigkill_exits_137(self):
        res = self.run_ddprun(["--nproc-per-node", "2", worker("fail_one.py"), self.tmp, "0", "signal:9"])
        self.assertEqual(res.rc, 137, res)
        self.assertLess(res.elapsed, scaled(PROMPT), res)
        summary = self.summary_block(res.stderr)
        self.assertIn("exitcode  : -9 (pid: ", summary)
        self.assertRegex(summary, r"Signal 9 \(SIGKILL\) received by PID \d+")

    def test_killed_by_sigsegv_exits_139(self):
        res = self.run_ddprun(["--nproc-per-node", "2", worker("fail_one.py"), self.tmp, "1", "signal:11"])
        self.assertEqual(res.rc, 139, res)
        self.assertLess(res.elapsed, scaled(PROMPT), res)
        self.assertIn("SIGSEGV", self.summary_block(res.stderr))

    def test_a_python_rank_that_crashes_shows_its_stack_in_the_summary(self):
        # A crash in native code (a NULL read through ctypes, in a thread of the script): the
        # bootstrap's faulthandler writes the stack into the rank's stack file, not stderr,
        # and the summary shows the crashing thread's, innermost first; still 139, and
        # nothing in the rank's output. PYTHONFAULTHANDLER=1 (the user's choice) wins: the
        # dump goes to stderr, as Python alone does. Not with --no-stack-dumps.
        script = self.path("crash.py")
        with open(script, "w") as f:
            f.write("import ctypes, os, threading\n"
                    "def bad_layer():\n"
                    "    ctypes.string_at(0)\n"
                    "def loader():\n"
                    "    bad_layer()\n"
                    "if os.environ['RANK'] == '1':\n"
                    "    t = threading.Thread(target=loader)\n"
                    "    t.start()\n"
                    "    t.join()\n")
        res = self.run_ddprun(["--nproc-per-node", "2", script])
        self.assertEqual(res.rc, 139, res)
        root = self.summary_block(res.stderr)
        root = root[root.index("Root Cause"):]
        self.assertRegex(root, r"Signal 11 \(SIGSEGV\) received by PID \d+\n *Python stack at the crash "
                               r"\(most recent call first; every thread: \S+/attempt_0/1/stacks\):\n.*line \d+ in string_at\n"
                               r" *File \"%s\", line 3 in bad_layer\n *File \"%s\", line 5 in loader\n"
                               % (re.escape(script), re.escape(script)), root)
        self.assertNotIn("Fatal Python error", res.stderr)
        res = self.run_ddprun(["--nproc-per-node", "2", script], env=dict(clean_env(), PYTHONFAULTHANDLER="1"))
        self.assertEqual(res.rc, 139, res)
        self.assertIn("Fatal Python error: Segmentation fault", res.stderr)
        self.assertNotIn("Python stack at the crash", res.stderr)
        res = self.run_ddprun(["--no-stack-dumps", "--nproc-per-node", "2", script])
        self.assertEqual(res.rc, 139, res)
        self.assertNotIn("Python stack at the crash", res.stderr)
        self.assertNotIn("Fatal Python error", res.stderr)

    def _time_teardown(self, args, env=None):
        """ddprun's exit code, and the seconds from the failing rank's exit (it writes
        time.monotonic() to DIR/failed_at, a clock all processes share) to ddprun's exit."""
        p = self.start(args, env=env)
        rc = p.wait(timeout=scaled(60))
        exited = time.monotonic()
        if not os.path.exists(self.path("failed_at")):
            self.fail(f"ddprun exited {rc} before the failing rank wrote failed_at:\n"
                      + read_text(self.path("ddprun.stderr")))
        with open(self.path("failed_at")) as f:
            return rc, exited - float(f.read())

    def test_shutdown_timeout_sigkills_sibling_ignoring_sigterm(self):
        rc, t = self._time_teardown(["--nproc-per-node", "3", "--shutdown-timeout", "2", worker("fail_one.py"),
                                     self.tmp, "0", "exit:4", "ignore-term"])
        self.assertEqual(rc, 4)
        self.assertGreater(t, 1.6, "SIGKILL came before the shutdown timeout")
        # At 2 s plus the time to notice and reap; far from the default of 30 s.
        self.assertLess(t, 2 + scaled(8), "SIGKILL came long after the shutdown timeout")
        for r in range(3):
            self.assertFalse(pid_alive(self.read_pid(self.path(f"pid_{r}"))))
        with open(self.path("ddprun.stderr")) as f:
            err = f.read()
        self.assertIn("SIGKILL", err)

    def test_shutdown_timeout_from_environment(self):
        env = clean_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="1")
        rc, t = self._time_teardown(["--nproc-per-node", "3", worker("fail_one.py"), self.tmp, "0", "exit:4",
                                     "ignore-term"], env=env)
        self.assertEqual(rc, 4)
        self.assertGreater(t, 0.7)
        self.assertLess(t, 1 + scaled(8))  # far from the default of 30 s


class RestartTest(DdprunTestCase):
    def attempts(self, rank):
        with open(self.path(f"attempts_{rank}")) as f:
            return f.read().split("\n")[:-1]

    def test_succeeds_on_third_attempt(self):
        res = self.run_ddprun(["--nproc-per-node", "2", "--max-restarts", "2", worker("restart.py"), self.tmp,
                               "2", "5"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(self.attempts(0), ["0 2", "1 2", "2 2"])
        self.assertEqual(self.attempts(1), ["0 2", "1 2", "2 2"])
        self.assertRegex(res.stderr, re.compile(r"restart", re.I))
        self.assertEqual(len(re.findall(r"restarting", res.stderr)), 2, res)
        self.assertNotIn(" FAILED\n", res.stderr)
        # Three attempts of ~0.2 s each; siblings of a failed attempt sleep 300 s unless stopped.
        self.assertLess(res.elapsed, scaled(3 * PROMPT), res)

    def test_always_failing_exits_with_code_after_three_attempts(self):
        res = self.run_ddprun(["--nproc-per-node", "2", "--max-restarts", "2", worker("restart.py"), self.tmp,
                               "-1", "5"])
        self.assertEqual(res.rc, 5, res)
        self.assertEqual(self.attempts(0), ["0 2", "1 2", "2 2"])
        self.summary_block(res.stderr)

    def test_no_restarts_by_default(self):
        res = self.run_ddprun(["--nproc-per-node", "2", worker("restart.py"), self.tmp, "1", "6"])
        self.assertEqual(res.rc, 6, res)
        self.assertEqual(self.attempts(0), ["0 0"])


def cpu_seconds(pid):
    """User + system CPU time of every thread of pid so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FileTimerTest(DdprunTestCase):
    """TORCHELASTIC_ENABLE_FILE_TIMER=1: torch's own FileTimerClient arms watchdog timers through
    the FIFO that ddprun names in TORCHELASTIC_TIMER_FILE (workers/file_timer.py)."""

    def timer_env(self):
        self.fifo = self.path("timer.fifo")
        return clean_env(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=self.fifo)

    def test_an_expired_timer_kills_its_rank_and_the_summary_names_it_and_where_each_rank_was(self):
        t0 = time.monotonic()
        res = self.run_ddprun(["--nproc-per-node", "2", worker("file_timer.py"), self.tmp, "hang", "1"],
                              env=self.timer_env())
        self.assertEqual(res.rc, 137, res)
        self.assertLess(time.monotonic() - t0, PROMPT, "the 1 s timer, not the 300 s sleep, ended the job")
        self.assertRegex(res.stderr, r"rank 1: its timer 'train_step' expired [0-9.]+ s ago: SIGKILL to pid \d+ "
                                     r"\(TORCHELASTIC_ENABLE_FILE_TIMER\)")
        summary = self.summary_block(res.stderr)
        self.assertIn("its timer 'train_step' expired: SIGKILL", summary)
        self.assertIn("Where each rank was when rank 1's timer expired", summary)
        self.assertRegex(summary, r"rank 1: <module> \(file_timer.py:\d+\)")
        self.assertFalse(os.path.exists(self.fifo), "ddprun removes its FIFO")
        self.assertFalse(pid_alive(self.read_pid(self.path("pid_0"))))

    def test_a_released_timer_never_fires(self):
        res = self.run_ddprun(["--nproc-per-node", "2", worker("file_timer.py"), self.tmp, "ok"],
                              env=self.timer_env())
        self.assertEqual(res.rc, 0, res)
        self.assertNotIn("expired", res.stderr)

    def test_the_clients_signal_is_the_one_sent(self):
        res = self.run_ddprun(["--nproc-per-node", "2", worker("file_timer.py"), self.tmp, "term", "0"],
                              env=self.timer_env())
        self.assertEqual(res.rc, 7, res)
        self.assertTrue(os.path.exists(self.path("term_0")), res)
        self.assertIn("rank 0: its timer 'train_step' expired", res.stderr)
        self.assertIn("SIGTERM to pid", res.stderr)

    def test_a_request_while_no_worker_runs_leaves_ddprun_idle(self):
        """A request that comes while ddprun waits for the other node (no worker runs) stays
        unread until the attempt starts: it must not wake ddprun's every wait."""
        p = self.start(["--nnodes", "2", "--node-rank", "0", "--no-python", "true"], env=self.timer_env())
        deadline = time.monotonic() + scaled(10)
        while not os.path.exists(self.fifo) and time.monotonic() < deadline:
            time.sleep(0.02)
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b'{"version": 1, "pid": 1, "scope_id": "x", "expiration_time": 1e12, "signal": 9}\n')
        os.close(fd)
        time.sleep(0.2)
        before = cpu_seconds(p.pid)
        time.sleep(2)
        used = cpu_seconds(p.pid) - before
        p.terminate()
        self.assertEqual(p.wait(timeout=scaled(30)), 128 + 15)
        self.assertLess(used, 0.5, "ddprun spun while it waited for node 1")

    def test_a_timer_naming_a_process_that_is_no_worker_is_left_alone(self):
        stranger = subprocess.Popen(["sleep", "60"])
        self.addCleanup(stranger.wait)
        self.addCleanup(stranger.kill)
        request = json.dumps({"version": 1, "pid": stranger.pid, "scope_id": "x", "expiration_time": 1.0,
                              "signal": 9})
        res = self.run_ddprun(["--no-python", "sh", "-c", 'printf "%s\\n" "$0" > "$TORCHELASTIC_TIMER_FILE"; sleep 1',
                               request], env=self.timer_env())
        self.assertEqual(res.rc, 0, res)
        self.assertIn(f"timer 'x' of pid {stranger.pid} expired, but pid {stranger.pid} is none of this node's "
                      "workers", res.stderr)
        self.assertIsNone(stranger.poll(), "a process ddprun did not start was signalled")


if __name__ == "__main__":
    unittest.main(verbosity=2)
