"""Issue 20: without --log-dir, ddprun keeps a failed run's error files in $TMPDIR/torchelastic_*
(else /tmp, as Python's tempfile), and each run prunes the folders of finished ddprun runs there: those
that ended more than a day ago, and all but the newest 10. Never a live run's folder, never
one ddprun did not make (torchrun's). (The harness points TMPDIR at the test's folder.)"""
import glob
import os
import shutil
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, worker

MARKER = ".ddprun-run"  # src/launcher/tmpdirs.hpp
DAY = 24 * 3600
SLEEPER = ["--no-python", "/bin/sleep", "300"]


class TmpdirPruneTest(DdprunTestCase):
    # Runs prune at most once every 5 s per folder (the stamp's time): each run here that
    # should prune finds the stamp dated long ago, except where the throttle is tested.
    throttled = False

    def start(self, *args, **kw):
        if not self.throttled:
            self.age_stamp()
        return super().start(*args, **kw)

    def age_stamp(self):
        stamp = os.path.join(self.tmp, ".ddprun-pruned")
        if os.path.exists(stamp):
            os.utime(stamp, (0, 0))

    def run_dirs(self):
        return {n for n in os.listdir(self.tmp) if n.startswith("torchelastic_")}

    def fail_once(self):
        """One failed run; the folder it left."""
        before = self.run_dirs()
        res = self.run_ddprun(["--nproc-per-node", "2", "--no-python", worker("exit_code.sh"), "3"])
        self.assertEqual(res.rc, 3, res)
        new = self.run_dirs() - before
        self.assertEqual(len(new), 1, (before, new))
        return new.pop()

    def start_sleeper(self):
        """A ddprun whose worker sleeps; its process and its folder."""
        before = self.run_dirs()
        p = self.start(SLEEPER)
        new = self.wait_for(lambda: [n for n in self.run_dirs() - before
                                     if os.path.exists(os.path.join(self.tmp, n, MARKER))], what="the live run's folder")
        self.assertEqual(len(new), 1, new)
        return p, new[0]

    def age(self, name, seconds):
        """Dates the run's end `seconds` ago."""
        marker = os.path.join(self.tmp, name, MARKER)
        self.assertTrue(os.path.isfile(marker), f"{name}: no {MARKER} (ddprun marks the folders it makes)")
        t = time.time() - seconds
        os.utime(marker, (t, t))

    def test_old_finished_folders_go_live_and_foreign_ones_stay(self):
        old = self.fail_once()
        self.age(old, 2 * DAY)
        recent = self.fail_once()
        live_proc, live = self.start_sleeper()
        self.age(live, 2 * DAY)
        killed_proc, killed = self.start_sleeper()
        killed_proc.send_signal(signal.SIGKILL)  # its lock goes with it: finished
        killed_proc.wait(timeout=30)
        self.age(killed, 2 * DAY)
        torchrun = "torchelastic_tr8x0q1z"  # torchrun's own: no marker
        os.makedirs(os.path.join(self.tmp, torchrun, "none_abc", "attempt_0", "0"))
        os.utime(os.path.join(self.tmp, torchrun), (time.time() - 2 * DAY,) * 2)

        newest = self.fail_once()
        self.assertEqual(self.run_dirs(), {recent, live, torchrun, newest})
        self.assertTrue(os.path.isdir(os.path.join(self.tmp, torchrun, "none_abc", "attempt_0", "0")))

        # The live run ends (SIGTERM: a failure, its folder kept), dated by its end, not its start.
        live_proc.send_signal(signal.SIGTERM)
        self.assertEqual(live_proc.wait(timeout=30), 143)
        self.fail_once()
        self.assertIn(live, self.run_dirs())

    def test_only_the_newest_ten_finished_folders_stay(self):
        made = [self.fail_once() for _ in range(12)]
        # Each run prunes as it starts: the 11th keeps the 10 before it, the 12th drops the first.
        self.assertEqual(self.run_dirs(), set(made[1:]))

    def test_runs_started_together_prune_once(self):
        """A second run within 5 s of the last pruning does not scan again (a thousand agents
        starting at once on one machine); once the stamp is old, the next run prunes."""
        old = self.fail_once()
        self.age(old, 2 * DAY)
        self.throttled = True
        self.fail_once()
        self.assertIn(old, self.run_dirs(), "pruned within 5 s of the last pruning")
        self.throttled = False
        self.fail_once()
        self.assertNotIn(old, self.run_dirs())

    def test_a_success_leaves_nothing_and_log_dir_runs_prune_nothing(self):
        old = self.fail_once()
        self.age(old, 2 * DAY)
        res = self.run_ddprun(["--log-dir", self.path("logs"), "--nproc-per-node", "2", "--no-python", "/bin/true"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(self.run_dirs(), {old}, "--log-dir: no folder in TMPDIR, nothing pruned there")
        res = self.run_ddprun(["--nproc-per-node", "2", "--no-python", "/bin/true"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(self.run_dirs(), set(), "a success removes its folder and prunes the old one")

    def test_a_success_keeps_its_redirected_and_teed_logs(self):
        """torchrun keeps the folder; ddprun removed a successful run's, and with it the only
        copy of --redirects' output. Now it is kept (and pruned like the others), and ddprun
        says where the redirected output went."""
        script = ["--no-python", "sh", "-c", 'echo "out $RANK"; echo "err $RANK" >&2']
        res = self.run_ddprun(["--nproc-per-node", "2", "--redirects", "3", *script])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.out, b"", "redirected: nothing on the console")
        (kept,) = self.run_dirs()
        logs = sorted(glob.glob(os.path.join(self.tmp, kept, "*", "attempt_0", "*", "std*.log")))
        self.assertEqual([open(f).read() for f in logs], ["err 0\n", "out 0\n", "err 1\n", "out 1\n"], logs)
        log_root = os.path.dirname(os.path.dirname(os.path.dirname(logs[0])))
        self.assertIn(f"--redirects without --log-dir: the workers' redirected output goes to files under {log_root}",
                      res.err.decode())
        res = self.run_ddprun(["--nproc-per-node", "1", "--tee", "1", *script])
        self.assertEqual(res.rc, 0, res)
        self.assertNotIn(b"--redirects", res.err, "--tee shows the output: nothing to point at")
        (teed,) = self.run_dirs() - {kept}
        self.assertEqual(len(glob.glob(os.path.join(self.tmp, teed, "*", "attempt_0", "0", "stdout.log"))), 1)

    def test_a_rdzv_id_with_slashes_stays_inside_the_runs_folder(self):
        # The id is a name in the store and the environment, and only a part of a file name:
        # '../esc' must not put the run's log folder beside TMPDIR's run folders.
        res = self.run_ddprun(["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "../esc",
                               "--no-python", "sh", "-c", 'echo "id=$TORCHELASTIC_RUN_ID"; exit 3'])
        self.assertEqual(res.rc, 3, res)
        self.assertIn("[rank0]:id=../esc", res.stdout)
        self.assertEqual([n for n in os.listdir(self.tmp) if "esc" in n], [], "a folder outside the run's folder")
        (run,) = self.run_dirs()
        logs = [n for n in os.listdir(self.path(run)) if n != MARKER]
        self.assertEqual(len(logs), 1, logs)
        self.assertRegex(logs[0], r"^___esc_[a-z0-9_]{8}$")



class TmpdirChoiceTest(DdprunTestCase):
    """Where a run's folder goes without --log-dir: an unusable TMPDIR is passed over, as
    Python's tempfile passes it over for torchrun (ddprun exited 1); --tee logs never go to
    tmpfs, whose RAM NCCL and DataLoader workers share."""

    def error_file_dir(self, res):
        line = next(l for l in res.stdout.splitlines() if l.startswith("[rank0]:EF="))
        return line.split("=", 1)[1].split("/torchelastic_")[0]

    def test_an_unusable_tmpdir_is_passed_over_with_a_warning(self):
        show = ["--no-python", "sh", "-c", 'echo "EF=$TORCHELASTIC_ERROR_FILE"']
        # (the harness sets TMPDIR to the test's folder: env(1) sets it after that)
        bad_tmpdir = ("env", "-u", "TEMP", "-u", "TMP", "TMPDIR=/nonexistent/ddprun-test")
        res = self.run_ddprun(show, cmd_prefix=bad_tmpdir)
        self.assertEqual(res.rc, 0, res)
        self.assertRegex(res.stderr, r"warning\] no folder can be made in /nonexistent/ddprun-test \(No such file or "
                                     r"directory\): the run's temporary files go to /")
        self.assertNotEqual(self.error_file_dir(res), "/nonexistent/ddprun-test")
        # As Python's tempfile (torchrun's), with or without --tee's logs: /tmp, not /dev/shm
        # (a container's fills up, and goes with it).
        for tee in ([], ["--tee", "3"]):
            res = self.run_ddprun([*tee, *show], cmd_prefix=bad_tmpdir)
            self.assertEqual(res.rc, 0, res)
            self.assertEqual(self.error_file_dir(res), "/tmp")
    def test_with_no_writable_folder_on_disk_dev_shm_is_the_last_resort(self):
        # A read-only root (Kubernetes' readOnlyRootFilesystem) where Python's tempfile would
        # give up: /tmp, /var/tmp and the current folder read-only (a mount namespace of
        # this test's own). The run goes on in /dev/shm, and says so.
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root and unshare(1) for a mount namespace")
        if not os.access("/dev/shm", os.W_OK):
            self.skipTest("no writable /dev/shm")
        # (Read-only binds of the folders themselves: what is in them, ddprun too when the
        # build lies under /tmp, stays where it is.)
        ro = " && ".join(f"mount --bind {d} {d} && mount -o remount,bind,ro {d}" for d in ("/tmp", "/var/tmp")) + \
            ' && cd /tmp && exec "$@"'
        res = self.run_ddprun(["--no-python", "sh", "-c", 'echo "EF=$TORCHELASTIC_ERROR_FILE"'],
                              cmd_prefix=("env", "-u", "TMPDIR", "-u", "TEMP", "-u", "TMP", "unshare", "-m",
                                          "--propagation", "private", "sh", "-c", ro, "sh"))
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(self.error_file_dir(res), "/dev/shm")
        self.assertRegex(res.stderr, r"warning\] no folder can be made in /tmp \(Read-only file system\), /var/tmp "
                                     r"\(Read-only file system\), .*: the run's temporary files go to /dev/shm, in "
                                     r"memory")

    def test_a_relative_log_dir_or_tmpdir_gives_workers_absolute_paths(self):
        # A worker that changes its directory (Hydra's run folders) still writes its error
        # file (torch's @record) and its heartbeats there: before, the paths were relative
        # to ddprun's directory, @record failed with FileNotFoundError, and --hang-timeout
        # took a working rank for a hung one.
        err = '{"message": {"message": "RuntimeError: the worker\'s own error", "extraInfo": ' \
              '{"py_callstack": "Traceback: the worker\'s own", "timestamp": "1"}}}'
        script = ["--no-python", "sh", "-c", 'mkdir -p sub && cd sub && env | grep -E '
                  '"^(TORCHELASTIC_ERROR_FILE|DDPRUN_[A-Z]+_FILE)=" && printf %s "$ERR" > "$TORCHELASTIC_ERROR_FILE" '
                  '&& exit 3']
        for flags, root in ((["--log-dir", "logs/"], self.path("logs")),
                            ([], self.path("rel", "torchelastic_"))):
            with self.subTest(flags=flags):
                os.makedirs(self.path("rel"), exist_ok=True)
                res = self.run_ddprun(["--hang-timeout", "60", *flags, *script],
                                      cmd_prefix=("env", "-u", "TEMP", "-u", "TMP", "TMPDIR=rel", f"ERR={err}"))
                self.assertEqual(res.rc, 3, res)
                paths = [l.split("=", 1)[1] for l in res.stdout.splitlines() if l.startswith("[rank0]:")]
                self.assertEqual(len(paths), 4, res)
                for p in paths:
                    self.assertTrue(p.startswith(root), f"{p} is not under {root}")
                self.assertIn("traceback : Traceback: the worker's own", res.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
