"""Issue 2: signals to ddprun are forwarded (SIGTERM, SIGUSR1, SIGHUP; a SIGUSR1 that finds no
worker running is said to have reached none), a second SIGINT kills at once (not a copy of
the first, as `timeout` sends; a Ctrl-C at the terminal always), no worker or
grandchild outlives `kill -9 ddprun` or a crashed ddprun, a process group that reuses an exited
worker's number is never killed, and ddprun as PID 1."""
import datetime
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import termios
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DDPRUN, DdprunTestCase, clean_env, free_port, pid_alive, read_text, scaled, worker

# "At once" for ddprun's reaction to a signal or a worker's exit: well under a second idle,
# a few seconds on a loaded machine. What a missing reaction costs (a shutdown timeout of
# 60 s, workers sleeping 300 s or more) is far above it.
PROMPT = 20


def accepts(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class SignalForwardingTest(DdprunTestCase):
    def start_signals(self, mode, n=3, extra=()):
        p = self.start(["--nproc-per-node", str(n), *extra, worker("signals.py"), self.tmp, mode])
        self.wait_for_files([self.path(f"ready_{r}") for r in range(n)])
        pids = [self.read_pid(self.path(f"pid_{r}")) for r in range(n)]
        return p, pids

    def test_sigterm_forwarded_and_exit_143(self):
        p, pids = self.start_signals("term")
        os.kill(p.pid, signal.SIGTERM)
        rc = p.wait(timeout=scaled(60))
        self.assertEqual(rc, 143, read_text(self.path("ddprun.stderr")))
        for r in range(3):
            self.assertTrue(os.path.exists(self.path(f"term_{r}")), f"rank {r} never got SIGTERM")
        for pid in pids:
            self.assertFalse(pid_alive(pid))

    def test_sigint_not_in_signals_to_handle_stops_the_workers_with_sigterm(self):
        """`--signals-to-handle SIGTERM` and a Ctrl-C: as torchrun's KeyboardInterrupt, the
        workers are stopped with SIGTERM and have --shutdown-timeout for it. Before, SIGINT
        kept its default action: ddprun died at once and its death signal SIGKILLed them."""
        p, pids = self.start_signals("term", n=2, extra=("--signals-to-handle", "SIGTERM"))
        os.kill(p.pid, signal.SIGINT)
        rc = p.wait(timeout=scaled(60))
        err = read_text(self.path("ddprun.stderr"))
        self.assertEqual(rc, 130, err)
        for r in range(2):
            self.assertTrue(os.path.exists(self.path(f"term_{r}")), f"rank {r} never got SIGTERM\n{err}")
        self.assertIn("received SIGINT (not in --signals-to-handle): stopping the workers with SIGTERM", err)
        for pid in pids:
            self.assertFalse(pid_alive(pid))

    def test_sighup_forwarded_and_exit_129(self):
        p, pids = self.start_signals("usr1", n=2)  # SIGHUP's default action ends the workers
        os.kill(p.pid, signal.SIGHUP)
        rc = p.wait(timeout=scaled(60))
        self.assertEqual(rc, 129, read_text(self.path("ddprun.stderr")))
        for pid in pids:
            self.assertFalse(pid_alive(pid))

    def test_under_nohup_sighup_stays_ignored(self):
        """`nohup ddprun ...`: SIGHUP was ignored when ddprun started, so it stays ignored, by
        ddprun and by its workers (it stopped the job with 129, as torchrun's agent does)."""
        p = self.start(["--nproc-per-node", "2", worker("signals.py"), self.tmp, "usr1"], cmd_prefix=("nohup",))
        self.wait_for_files([self.path(f"ready_{r}") for r in range(2)])
        pids = [self.read_pid(self.path(f"pid_{r}")) for r in range(2)]
        for pid in pids:
            with open(f"/proc/{pid}/status") as f:
                ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
            self.assertTrue(ignored & (1 << (signal.SIGHUP - 1)), f"worker {pid} does not ignore SIGHUP")
        os.kill(p.pid, signal.SIGHUP)
        time.sleep(1)
        self.assertIsNone(p.poll(), read_text(self.path("ddprun.stderr")))
        self.assertTrue(all(pid_alive(pid) for pid in pids))
        os.kill(p.pid, signal.SIGUSR1)
        self.assertEqual(self.wait_exit(p, 60), 0, read_text(self.path("ddprun.stderr")))
        self.assertNotIn("SIGHUP", read_text(self.path("ddprun.stderr")))

    def test_sigusr1_forwarded_without_stopping(self):
        p, pids = self.start_signals("usr1")
        os.kill(p.pid, signal.SIGUSR1)
        rc = p.wait(timeout=scaled(60))
        self.assertEqual(rc, 0, read_text(self.path("ddprun.stderr")))
        for r in range(3):
            self.assertTrue(os.path.exists(self.path(f"usr1_{r}")), f"rank {r} never got SIGUSR1")
            self.assertTrue(os.path.exists(self.path(f"after_usr1_{r}")), f"rank {r} stopped after SIGUSR1")

    def test_sigusr1_while_joining_reaches_no_worker_and_is_said(self):
        """SIGUSR1 (Slurm's --signal notice) while node 0 waits for node 1: no worker runs, so
        none gets it (it is not kept for the next ones, which could die of it before their
        handler is in place); ddprun says so, and the job then runs as usual."""
        port = free_port()

        def node(rank):
            err = open(self.path(f"node{rank}.stderr"), "wb")
            self._files.append(err)
            # sh: SIGUSR1 would end it (exit 138, the job failed)
            return self.start(["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                               "--master-port", str(port), "--nproc-per-node", "1", "--no-python", "sh", "-c",
                               "sleep 0.3"], stderr=err)

        first = node(0)
        self.wait_for(lambda: accepts(port), what="node 0's store (it is joining)")
        os.kill(first.pid, signal.SIGUSR1)
        said = "SIGUSR1 reached no worker: none is running on this node now (it is joining the rendezvous)"
        self.wait_for(lambda: said in read_text(self.path("node0.stderr")), what="ddprun's line about SIGUSR1")
        self.assertIsNone(first.poll(), "SIGUSR1 does not stop ddprun")
        second = node(1)
        for n, p in enumerate((first, second)):
            self.assertEqual(p.wait(timeout=scaled(60)), 0, read_text(self.path(f"node{n}.stderr")))
        self.assertEqual(read_text(self.path("node0.stderr")).count(said), 1)

    def test_second_sigint_kills_at_once(self):
        p, pids = self.start_signals("ignore-int", n=2, extra=("--shutdown-timeout", "60"))
        os.kill(p.pid, signal.SIGINT)
        # ddprun says when it has handled the first one (a second SIGINT before that would
        # count as the first).
        self.wait_for(lambda: "received SIGINT" in read_text(self.path("ddprun.stderr")),
                      what="ddprun handling the first SIGINT")
        # Time to exit, were it (wrongly) going to (a slow machine only hides that), and past
        # the second in which another SIGINT from a process is a copy of the first.
        time.sleep(1.2)
        self.assertIsNone(p.poll(), "the first SIGINT must wait for the workers (they ignore it)")
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGINT)
        rc = p.wait(timeout=scaled(60))
        self.assertLess(time.monotonic() - t0, scaled(PROMPT), "the second SIGINT must kill at once")
        self.assertEqual(rc, 130, read_text(self.path("ddprun.stderr")))
        for pid in pids:
            self.assertFalse(pid_alive(pid))


    def test_a_stop_signal_while_the_workers_stop_after_a_failure_keeps_the_failure(self):
        # `podman stop` (or a scheduler's SIGTERM) as ddprun stops the workers after rank 0
        # exited 5: rank 1 is not signalled again, its SIGKILL comes as it would have, and
        # the job ends as it failed: the summary, exit 5, reason worker_failed (before: a
        # second SIGTERM, a new 30 s clock, exit 143, no summary).
        script = ('if [ "$RANK" = 0 ]; then sleep 0.3; exit 5; fi; trap "echo rank1 got TERM" TERM; '
                  'while :; do sleep 0.05; done')
        summary = self.path("summary.json")
        p = self.start(["--nproc-per-node", "2", "--shutdown-timeout", "4", "--summary-json", summary,
                        "--no-python", "sh", "-c", script])
        self.wait_for(lambda: "rank1 got TERM" in read_text(self.path("ddprun.stdout")), what="rank 1's first SIGTERM")
        time.sleep(3)  # the SIGKILL is due about 1 s from now; a clock started again would make it 4
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGTERM)
        rc = p.wait(timeout=scaled(30))
        err = read_text(self.path("ddprun.stderr"))
        self.assertEqual(rc, 5, err)
        self.assertLess(time.monotonic() - t0, 3, "the SIGKILL deadline must not start again")
        self.assertEqual(read_text(self.path("ddprun.stdout")).count("rank1 got TERM"), 1)
        self.assertIn("received SIGTERM while the workers are stopping already: they are not signalled again", err)
        self.assertIn("Root Cause (first observed failure)", err)
        self.assertEqual(self.load_json(summary)["reason"], "worker_failed")


class SignalCopiesTest(DdprunTestCase):
    """GNU timeout passes a SIGTERM it gets on to its command and then to its process group:
    ddprun gets it twice, microseconds apart, and when it had read the first in between it
    took the copy for a second signal and SIGKILLed the workers in their cleanup (5 of 16
    runs under `timeout 60 ddprun ...`)."""

    def start_linger(self, extra=(), **kw):
        p = self.start(["--nproc-per-node", "2", "--shutdown-timeout", "30", *extra, worker("signals.py"), self.tmp,
                        "linger"], **kw)
        self.wait_for_files([self.path(f"ready_{r}") for r in range(2)])
        return p

    def assert_cleaned_up(self, rc, expected_rc):
        err = read_text(self.path("ddprun.stderr"))
        self.assertNotIn("killing the workers now", err)
        self.assertEqual(rc, expected_rc, err)
        for r in range(2):
            self.assertTrue(os.path.exists(self.path(f"clean_{r}")), f"rank {r} did not finish its cleanup:\n{err}")

    def test_a_copy_of_the_stop_signal_does_not_kill_at_once(self):
        """The copy sent just after ddprun read the first (as soon as it says so) is taken as
        one: the workers finish their 1 s of cleanup and ddprun exits 143."""
        p = self.start_linger(("--log-level", "debug"))
        os.kill(p.pid, signal.SIGTERM)
        self.wait_for(lambda: "received SIGTERM:" in read_text(self.path("ddprun.stderr")), what="the first SIGTERM")
        sent = datetime.datetime.now()
        os.kill(p.pid, signal.SIGTERM)
        rc = p.wait(timeout=scaled(60))
        err = read_text(self.path("ddprun.stderr"))
        first = re.search(r"\[ddprun (\d\d):(\d\d):(\d\d\.\d{3}) warning\] received SIGTERM:", err)
        self.assertTrue(first, err)
        read_at = sent.replace(hour=int(first[1]), minute=int(first[2]), second=0, microsecond=0) + \
            datetime.timedelta(seconds=float(first[3]))
        if (sent - read_at).total_seconds() > 0.9:  # (a machine this slow sent no copy: a second signal)
            self.skipTest(f"the copy was sent {(sent - read_at).total_seconds():.2f} s after the first was read")
        self.assertRegex(err, r"received SIGTERM again from pid \d+, 0\.\d{3} s after the first: taken as a copy")
        self.assert_cleaned_up(rc, 143)

    def test_a_job_under_timeout_keeps_its_shutdown_timeout(self):
        """`timeout 300 ddprun ...`, timeout signalled as a scheduler or a person would."""
        p = self.start_linger(cmd_prefix=("timeout", "300"))
        os.kill(p.pid, signal.SIGTERM)  # timeout's pid: it passes the signal on (twice)
        rc = p.wait(timeout=scaled(60))
        self.assert_cleaned_up(rc, 143)

    def test_a_second_ctrl_c_at_the_terminal_kills_at_once(self):
        """A person's second Ctrl-C (the terminal's SIGINT, sent by the kernel) kills at once,
        however soon after the first: ddprun runs with a pseudo-terminal as its controlling
        terminal, and ^C is typed on it twice."""
        master, slave = os.openpty()
        self.addCleanup(os.close, master)

        def controlling_terminal():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = clean_env(TMPDIR=self.tmp)
        err = open(self.path("ddprun.stderr"), "wb")
        self._files.append(err)
        p = subprocess.Popen([DDPRUN, "--nproc-per-node", "2", "--shutdown-timeout", "60", worker("signals.py"),
                              self.tmp, "ignore-int"], stdin=slave, stdout=err, stderr=err, env=env, cwd=self.tmp,
                             preexec_fn=controlling_terminal)
        self._procs.append(p)
        os.close(slave)
        self.wait_for_files([self.path(f"ready_{r}") for r in range(2)])
        pids = [self.read_pid(self.path(f"pid_{r}")) for r in range(2)]
        os.write(master, b"\x03")
        self.wait_for(lambda: "received SIGINT" in read_text(self.path("ddprun.stderr")), what="the first Ctrl-C")
        t0 = time.monotonic()
        os.write(master, b"\x03")
        rc = p.wait(timeout=scaled(60))
        err_text = read_text(self.path("ddprun.stderr"))
        self.assertLess(time.monotonic() - t0, scaled(PROMPT), err_text)
        self.assertIn("received SIGINT again: killing the workers now", err_text)
        self.assertEqual(rc, 130, err_text)
        for pid in pids:
            self.assertFalse(pid_alive(pid))


class NoOrphansTest(DdprunTestCase):
    def start_orphans(self, n=3):
        p = self.start(["--nproc-per-node", str(n), worker("orphan.sh"), self.tmp])
        workers = [self.read_pid(self.path(f"w_{r}")) for r in range(n)]
        grandchildren = [self.read_pid(self.path(f"gc_{r}")) for r in range(n)]
        for pid in workers + grandchildren:
            self.assertTrue(pid_alive(pid))
        return p, workers, grandchildren

    def assert_all_gone(self, why, workers, grandchildren):
        # Gone at once (the kernel's parent-death signal, the guardian): the bound is far from
        # that, and far from the 1000 s the grandchildren would otherwise sleep.
        limit = scaled(PROMPT)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and any(pid_alive(x) for x in workers + grandchildren):
            time.sleep(0.05)
        alive = [x for x in workers + grandchildren if pid_alive(x)]
        self.assertEqual(alive, [], f"alive {limit} s after {why}: {alive} "
                                    f"(workers {workers}, grandchildren {grandchildren})")

    def guardian_of(self, p):
        """ddprun's guardian: its child named ddprun-guard."""
        kids = read_text(f"/proc/{p.pid}/task/{p.pid}/children").split()
        guards = [int(k) for k in kids if read_text(f"/proc/{k}/comm").strip() == "ddprun-guard"]
        self.assertEqual(len(guards), 1, f"ddprun's children {kids}")
        return guards[0]

    def test_kill_9_leaves_no_worker_or_grandchild(self):
        p, workers, grandchildren = self.start_orphans()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=scaled(30))
        self.assert_all_gone("kill -9 of ddprun", workers, grandchildren)

    def test_kill_9_leaves_no_grandchild_in_a_session_of_its_own(self):
        """A worker's child in a new session (setsid, Popen(start_new_session=True)) is out of
        the worker's process group, which is what the guardian kills when ddprun is
        SIGKILLed: before, it ran on, reparented. ddprun hands such groups to the guardian
        within about a second of their leaving (a normal end kills them as descendants)."""
        p = self.start(["--nproc-per-node", "2", worker("new_session_child.py"), self.tmp])
        workers = [self.read_pid(self.path(f"w_{r}")) for r in range(2)]
        grandchildren = [self.read_pid(self.path(f"gc_{r}")) for r in range(2)]
        for gc in grandchildren:
            self.assertEqual(os.getsid(gc), gc, "the grandchild leads a session of its own")
        time.sleep(scaled(2.5))  # ddprun's look, once a second
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=scaled(30))
        self.assert_all_gone("kill -9 of ddprun", workers, grandchildren)

    def test_a_session_child_left_at_a_successful_end_is_killed_and_named(self):
        """Workers that exit 0 leaving a child in a session of its own (a daemon, an upload
        started with start_new_session): it is killed as every leftover is, and ddprun says so,
        naming it (before, silently)."""
        res = self.run_ddprun(["--nproc-per-node", "2", worker("new_session_child.py"), self.tmp, "exit"])
        self.assertEqual(res.rc, 0, res)
        grandchildren = [self.read_pid(self.path(f"gc_{r}")) for r in range(2)]
        self.assert_all_gone("the workers' exit", [], grandchildren)
        warnings = [line for line in res.stderr.splitlines() if "process groups of their own" in line]
        self.assertEqual(len(warnings), 1, res.stderr)
        for gc in grandchildren:
            self.assertIn(f"{gc} (sleep 1000)", warnings[0])
        self.assertIn("never outlive its attempt", warnings[0])

    def test_what_the_workers_left_gets_sigterm_then_sigkill(self):
        """A leftover (an upload the worker started in a session of its own) gets SIGTERM and
        ends cleanly within the grace (before: SIGKILL at once, no clean-up); one that ignores
        SIGTERM is killed kLeftoverGrace (3 s) later, and ddprun exits then."""
        for how in ("clean", "deaf"):
            with self.subTest(how):
                for name in os.listdir(self.tmp):
                    os.unlink(self.path(name))
                t0 = time.monotonic()
                res = self.run_ddprun(["--nproc-per-node", "2", worker("leaves_uploader.py"), self.tmp, how])
                took = time.monotonic() - t0
                self.assertEqual(res.rc, 0, res)
                uploads = [self.read_pid(self.path(f"up_{r}")) for r in range(2)]
                self.assert_all_gone("the workers' exit", [], uploads)
                self.assertIn("is stopped (SIGTERM, SIGKILL 3 s later)", res.stderr)
                cleaned = sorted(n for n in os.listdir(self.tmp) if n.startswith("cleaned_"))
                if how == "clean":
                    self.assertEqual(cleaned, ["cleaned_0", "cleaned_1"], res)
                    self.assertLess(took, scaled(2.5), res)
                else:
                    self.assertEqual(cleaned, [], res)
                    self.assertGreater(took, 3.0, res)
                    self.assertLess(took, scaled(6), res)

    def test_kill_9_during_the_leftovers_grace_leaves_none(self):
        """The worker exited at once, leaving an upload in a session of its own that ignores
        SIGTERM; ddprun is SIGKILLed during that leftover's 3 s grace. Before, only ddprun's
        sweep knew the upload (the worker lived under the second between looks for such
        groups): it ran on, reparented to init."""
        p = self.start(["--nproc-per-node", "1", worker("leaves_uploader.py"), self.tmp, "deaf"])
        upload = self.read_pid(self.path("up_0"))
        self.wait_for(lambda: "is stopped (SIGTERM, SIGKILL 3 s later)" in read_text(self.path("ddprun.stderr")),
                      what="the leftover's grace")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=scaled(30))
        self.assert_all_gone("kill -9 of ddprun in the leftovers' grace", [], [upload])

    def test_what_the_workers_left_gets_its_grace_when_ddprun_is_stopped(self):
        """SIGTERM to ddprun (a pre-emption, scancel): the workers stop, and what they left
        still gets its SIGTERM grace (before the review's mend, the stop signal already taken
        cut it short: SIGKILL at once); ddprun exits 143."""
        p = self.start(["--nproc-per-node", "1", worker("leaves_uploader.py"), self.tmp, "clean", "wait"])
        upload = self.read_pid(self.path("up_0"))
        self.wait_for(lambda: os.path.exists(self.path("ready_0")), scaled(10), "the upload's SIGTERM handler")
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(p.wait(timeout=scaled(30)), 128 + signal.SIGTERM)
        self.assert_all_gone("ddprun's stop", [], [upload])
        self.assertTrue(os.path.exists(self.path("cleaned_0")), "the upload got no SIGTERM grace")

    def test_a_ddprun_that_crashes_leaves_no_worker_or_grandchild(self):
        # SIGABRT is not one ddprun handles: it dies as an abort() would, through the kernel's
        # core-dump path (which, before Linux 5.16, also killed every process sharing the
        # dying one's memory: the guardian must not be one there).
        p, workers, grandchildren = self.start_orphans()
        os.kill(p.pid, signal.SIGABRT)
        self.assertEqual(p.wait(timeout=scaled(30)), -signal.SIGABRT)
        self.assert_all_gone("SIGABRT to ddprun", workers, grandchildren)

    def test_the_guardian_outlives_terminal_signals_and_still_acts(self):
        p, workers, grandchildren = self.start_orphans()
        guard = self.guardian_of(p)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                    signal.SIGUSR2, signal.SIGPIPE, signal.SIGALRM):
            os.kill(guard, sig)
        time.sleep(0.2)
        self.assertTrue(pid_alive(guard), "the guardian died of a terminal signal")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=scaled(30))
        self.assert_all_gone("kill -9 of ddprun, its guardian signalled before", workers, grandchildren)

    def test_the_guardian_holds_none_of_ddpruns_files(self):
        # Only its pipe: a console held by the guardian would outlive ddprun.
        p, _, _ = self.start_orphans(n=1)
        guard = self.guardian_of(p)
        fds = os.listdir(f"/proc/{guard}/fd")
        self.assertEqual(len(fds), 1, {fd: os.readlink(f"/proc/{guard}/fd/{fd}") for fd in fds})
        self.assertTrue(os.readlink(f"/proc/{guard}/fd/{fds[0]}").startswith("pipe:"))

    def test_orphan_holding_output_does_not_hang_ddprun(self):
        # The worker exits but its orphaned grandchild keeps stdout/stderr open.
        res = self.run_ddprun(["--nproc-per-node", "2", worker("leave_orphan.sh"), self.tmp, "0"])
        self.assertEqual(res.rc, 0, res)
        self.assertLess(res.elapsed, scaled(PROMPT), res)  # the orphan sleeps 1000 s
        self.assertIn("worker 1 done", res.stdout)
        for r in range(2):
            orphan = self.read_pid(self.path(f"orphan_{r}"))
            self.assertFalse(pid_alive(orphan), f"orphan {orphan} outlived ddprun")


PID_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc"]


class PidNamespaceTest(DdprunTestCase):
    """Tests that run ddprun in a pid namespace of their own (root only)."""
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        probe = subprocess.run(PID_NAMESPACE + ["true"], capture_output=True)
        if probe.returncode != 0:
            raise unittest.SkipTest(f"unshare --pid not permitted here: {probe.stderr.decode().strip()}")


class ReusedGroupNumberTest(PidNamespaceTest):
    """A worker that exits early leaves its process group's number free (so does a warm
    process that died); the kernel hands it out again after a wrap of the pid space (minutes
    on a busy host). Neither the end of the attempt nor the guardian (ddprun SIGKILLed) may
    then kill the unrelated group that got it.
    workers/reuse_number.py gives the number away at once, through ns_last_pid."""
    def reuse(self, how, extra=()):
        cmd = PID_NAMESPACE + [sys.executable, worker("reuse_number.py"), self.tmp, how, DDPRUN,
                               "--nproc-per-node", "2", *extra, worker("early_exit.py"), self.tmp]
        env = clean_env(TMPDIR=self.tmp)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=scaled(120))
        lines = r.stdout.strip().splitlines()
        self.assertTrue(lines, r)
        out = json.loads(lines[-1])
        self.assertTrue(out["reused"], f"no process got rank 1's number: {r}")
        self.assertTrue(out["rank0_gone"], r)
        return out, r

    def test_the_attempts_end_leaves_a_group_that_reuses_a_workers_number_alone(self):
        out, r = self.reuse("end")
        self.assertEqual(out["rc"], 0, r)
        self.assertTrue(out["bystander_alive"], f"ddprun killed the group that took rank 1's number: {r}")

    def test_the_guardian_leaves_a_group_that_reuses_a_workers_number_alone(self):
        out, r = self.reuse("kill9")
        self.assertEqual(out["rc"], -signal.SIGKILL, r)
        self.assertTrue(out["bystander_alive"], f"the guardian killed the group that took rank 1's number: {r}")

    def test_the_guardian_leaves_a_group_that_reuses_the_warm_processs_number_alone(self):
        out, r = self.reuse("warm", ["--preload", "json"])
        self.assertEqual(out["rc"], -signal.SIGKILL, r)
        self.assertTrue(out["bystander_alive"], f"the guardian killed the group that took the warm process's number: {r}")


class Pid1Test(PidNamespaceTest):

    def run_pid1(self, code):
        return self.run_ddprun(["--nproc-per-node", "2", worker("leave_orphan.sh"), self.tmp, str(code)],
                               cmd_prefix=PID_NAMESPACE)

    def test_pid1_worker_with_orphan_exits_cleanly(self):
        res = self.run_pid1(0)
        self.assertEqual(res.rc, 0, res)
        self.assertLess(res.elapsed, scaled(PROMPT), res)
        self.assertIn("worker 0 done", res.stdout)
        self.assertIn("worker 1 done", res.stdout)

    def test_pid1_exit_code_is_the_workers(self):
        res = self.run_pid1(4)
        self.assertEqual(res.rc, 4, res)
        self.assertLess(res.elapsed, scaled(PROMPT), res)
        self.summary_block(res.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
