"""Issue 2: signals to ddprun are forwarded (SIGTERM, SIGUSR1, SIGHUP), a second SIGINT
kills at once, no worker or grandchild outlives `kill -9 ddprun`, and ddprun as PID 1."""
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, clean_env, pid_alive, read_text, worker


class SignalForwardingTest(DdprunTestCase):
    def start_signals(self, mode, n=3, extra=()):
        p = self.start(["--nproc-per-node", str(n), *extra, worker("signals.py"), self.tmp, mode])
        self.wait_for_files([self.path(f"ready_{r}") for r in range(n)], timeout=15)
        pids = [self.read_pid(self.path(f"pid_{r}")) for r in range(n)]
        return p, pids

    def test_sigterm_forwarded_and_exit_143(self):
        p, pids = self.start_signals("term")
        os.kill(p.pid, signal.SIGTERM)
        rc = p.wait(timeout=10)
        self.assertEqual(rc, 143, read_text(self.path("ddprun.stderr")))
        for r in range(3):
            self.assertTrue(os.path.exists(self.path(f"term_{r}")), f"rank {r} never got SIGTERM")
        for pid in pids:
            self.assertFalse(pid_alive(pid))

    def test_sighup_forwarded_and_exit_129(self):
        p, pids = self.start_signals("usr1", n=2)  # SIGHUP's default action ends the workers
        os.kill(p.pid, signal.SIGHUP)
        rc = p.wait(timeout=10)
        self.assertEqual(rc, 129, read_text(self.path("ddprun.stderr")))
        for pid in pids:
            self.assertFalse(pid_alive(pid))

    def test_sigusr1_forwarded_without_stopping(self):
        p, pids = self.start_signals("usr1")
        os.kill(p.pid, signal.SIGUSR1)
        rc = p.wait(timeout=15)
        self.assertEqual(rc, 0, read_text(self.path("ddprun.stderr")))
        for r in range(3):
            self.assertTrue(os.path.exists(self.path(f"usr1_{r}")), f"rank {r} never got SIGUSR1")
            self.assertTrue(os.path.exists(self.path(f"after_usr1_{r}")), f"rank {r} stopped after SIGUSR1")

    def test_second_sigint_kills_at_once(self):
        p, pids = self.start_signals("ignore-int", n=2, extra=("--shutdown-timeout", "60"))
        os.kill(p.pid, signal.SIGINT)
        time.sleep(1.0)
        self.assertIsNone(p.poll(), "the first SIGINT must wait for the workers (they ignore it)")
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGINT)
        rc = p.wait(timeout=10)
        self.assertLess(time.monotonic() - t0, 2.0, "the second SIGINT must kill at once")
        self.assertEqual(rc, 130, read_text(self.path("ddprun.stderr")))
        for pid in pids:
            self.assertFalse(pid_alive(pid))


class NoOrphansTest(DdprunTestCase):
    def test_kill_9_leaves_no_worker_or_grandchild(self):
        n = 3
        p = self.start(["--nproc-per-node", str(n), worker("orphan.sh"), self.tmp])
        workers = [self.read_pid(self.path(f"w_{r}")) for r in range(n)]
        grandchildren = [self.read_pid(self.path(f"gc_{r}")) for r in range(n)]
        for pid in workers + grandchildren:
            self.assertTrue(pid_alive(pid))
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=5)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(pid_alive(x) for x in workers + grandchildren):
            time.sleep(0.05)
        alive = [x for x in workers + grandchildren if pid_alive(x)]
        self.assertEqual(alive, [], f"alive 2 s after kill -9 of ddprun: {alive} "
                                    f"(workers {workers}, grandchildren {grandchildren})")

    def test_orphan_holding_output_does_not_hang_ddprun(self):
        # The worker exits but its orphaned grandchild keeps stdout/stderr open.
        res = self.run_ddprun(["--nproc-per-node", "2", worker("leave_orphan.sh"), self.tmp, "0"], timeout=30)
        self.assertEqual(res.rc, 0, res)
        self.assertLess(res.elapsed, 5, res)
        self.assertIn("worker 1 done", res.stdout)
        for r in range(2):
            orphan = self.read_pid(self.path(f"orphan_{r}"))
            self.assertFalse(pid_alive(orphan), f"orphan {orphan} outlived ddprun")


class Pid1Test(DdprunTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
        if probe.returncode != 0:
            raise unittest.SkipTest(f"unshare --pid not permitted here: {probe.stderr.decode().strip()}")

    def run_pid1(self, code):
        return self.run_ddprun(["--nproc-per-node", "2", worker("leave_orphan.sh"), self.tmp, str(code)],
                               cmd_prefix=["unshare", "--pid", "--fork", "--mount-proc"], timeout=30)

    def test_pid1_worker_with_orphan_exits_cleanly(self):
        res = self.run_pid1(0)
        self.assertEqual(res.rc, 0, res)
        self.assertLess(res.elapsed, 5, res)
        self.assertIn("worker 0 done", res.stdout)
        self.assertIn("worker 1 done", res.stdout)

    def test_pid1_exit_code_is_the_workers(self):
        res = self.run_pid1(4)
        self.assertEqual(res.rc, 4, res)
        self.assertLess(res.elapsed, 5, res)
        self.summary_block(res.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
