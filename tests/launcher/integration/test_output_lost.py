"""Output that cannot go where it should (src/launcher/output.cpp): the job runs on, and ddprun
says so once per place, naming it and the system's reason.

- stdout read by `head -2`: the pipe closes early; one line "cannot write to stdout (Broken
  pipe)", every worker finishes, exit 0;
- stdout or ddprun's own stderr on /dev/full (ENOSPC at every write): the same;
- --log-dir on a full disk (a 32 kB tmpfs in a mount namespace of the test's own): one line
  per log file, naming it; what was written before is intact;
- ddprun's stderr a file on a full disk: nothing can be said, and a failing job still ends at
  once with the worker's exit status (a failed log line once waited forever for the logger);
- ddprun started with stdin and stdout (or all three) closed: the job runs, its output is
  dropped (the descriptor ddprun opened next once took the number: the guardian's pipe, and
  the workers' output into it SIGKILLed them; or its signalfd, "Invalid argument").
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DDPRUN, DdprunTestCase, clean_env, main, read_text, scaled  # noqa: E402

WORKER = """\
import os, sys, time
for i in range({lines}):
    print("line", i, "x" * 60, flush=True)
    time.sleep({pause})
open(os.path.join({out!r}, "done." + os.environ["RANK"]), "w").close()
"""


class OutputLost(DdprunTestCase):
    def worker(self, lines=50, pause=0.01):
        path = self.path("w.py")
        with open(path, "w") as f:
            f.write(WORKER.format(lines=lines, pause=pause, out=self.tmp))
        return path

    def assert_finished(self, rc, err, ranks=2):
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(f for f in os.listdir(self.tmp) if f.startswith("done.")),
                         [f"done.{r}" for r in range(ranks)], err)

    def test_stdout_closed_by_head(self):
        head = subprocess.Popen(["head", "-2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        p = self.start(["--nproc-per-node", "2", self.worker()], stdout=head.stdin)
        head.stdin.close()  # only head holds the read end, and head leaves after two lines
        shown = head.stdout.read().decode()
        head.wait(timeout=scaled(30))
        rc = p.wait(timeout=scaled(60))
        err = read_text(self.path("ddprun.stderr"))
        self.assertEqual(len(shown.splitlines()), 2, shown)
        self.assert_finished(rc, err)
        self.assertEqual(len(re.findall(r"cannot write to stdout \(Broken pipe\): the workers' output to it is "
                                        r"dropped from here on; the job runs on", err)), 1, err)

    def run_on_full_device(self, stream):
        """ddprun with its `stream` ("stdout" or "stderr") on /dev/full; (its exit, the other stream)."""
        with open("/dev/full", "wb") as full:
            rc = self.start(["--nproc-per-node", "2", self.worker()], **{stream: full}).wait(timeout=scaled(60))
        return rc, read_text(self.path("ddprun.stderr" if stream == "stdout" else "ddprun.stdout"))

    def test_started_with_standard_streams_closed(self):
        for closes in ("<&- >&-", ">&-", "<&- >&- 2>&-"):
            with self.subTest(closes=closes):
                for f in os.listdir(self.tmp):
                    if f.startswith("done."):
                        os.remove(os.path.join(self.tmp, f))
                summary = self.path("summary.json")
                p = self.start(["--nproc-per-node", "2", "--summary-json", summary, self.worker(lines=5)],
                               cmd_prefix=("sh", "-c", f'exec "$0" "$@" {closes}'))
                rc = p.wait(timeout=scaled(60))
                err = read_text(self.path("ddprun.stderr"))
                self.assert_finished(rc, err)
                self.assertNotIn("cannot write", err)
                self.assertEqual(json.loads(read_text(summary))["status"], "succeeded")

    def test_stdout_on_a_full_device(self):
        rc, err = self.run_on_full_device("stdout")
        self.assert_finished(rc, err)
        self.assertEqual(err.count("cannot write to stdout (No space left on device)"), 1, err)

    def test_ddpruns_stderr_on_a_full_device(self):
        rc, out = self.run_on_full_device("stderr")
        self.assert_finished(rc, out)
        self.assertEqual(len(out.splitlines()), 100, out[-2000:])  # stdout unharmed

    def on_small_disk(self, before, args, after="", mount="size=32k"):
        """ddprun `args` in a mount namespace of its own, with a 32 kB tmpfs at $D (the
        returned folder): the shell lines `before` run first (on it), `after` once ddprun
        has exited (its status is kept)."""
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root for a tmpfs in a mount namespace of its own")
        disk = self.path("disk")
        os.mkdir(disk)
        script = f'mount -t tmpfs -o {mount} tmpfs "$D" || exit 99; {before}\n"$@"; rc=$?; {after}\nexit $rc'
        p = subprocess.Popen(["unshare", "-m", "sh", "-c", script, "sh", DDPRUN, *args],
                             env=dict(clean_env(), TMPDIR=self.tmp, D=disk), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=self.tmp, start_new_session=True)
        try:
            out, err = p.communicate(timeout=scaled(60))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the session this test started: sh, ddprun, its workers
            out, err = p.communicate()
            self.fail(f"ddprun did not finish within 60 s:\n{err[-3000:]}")
        return subprocess.CompletedProcess(p.args, p.returncode, out, err), disk

    def test_log_dir_on_a_full_disk(self):
        kept = self.path("stdout.log")  # the log as ddprun left it, copied out of the namespace
        p, disk = self.on_small_disk("", ["--log-dir", f"{self.tmp}/disk/logs", "--redirects", "1",
                                          "--nproc-per-node", "1", self.worker(lines=2000, pause=0)],
                                     after=f'cat "$D"/logs/*/attempt_0/0/stdout.log > {kept}')
        self.assert_finished(p.returncode, p.stderr, ranks=1)
        lost = re.findall(r"cannot write (\S+) \(No space left on device\): the rest of this worker's output is "
                          r"missing from it", p.stderr)
        self.assertEqual(len(lost), 1, p.stderr)
        self.assertRegex(lost[0], rf"^{re.escape(disk)}/logs/[^/]+/attempt_0/0/stdout\.log$")
        self.assertNotIn("line 1999", p.stdout)  # --redirects 1: stdout went only to the file
        # What fitted is there, in order: whole lines, then at most the start of one more.
        lines = read_text(kept).split("\n")
        self.assertGreater(len(lines), 100, lines[:3])
        for i, line in enumerate(lines):
            whole = f"line {i} {'x' * 60}"
            self.assertTrue(line == whole or (i == len(lines) - 1 and whole.startswith(line)), (i, line))

    def test_a_restart_on_a_full_disk_runs_without_its_folder(self):
        """The first attempt's worker uses up the disk's inodes and fails: the next attempts'
        folders cannot be made (ENOSPC). They run all the same, their output on the console,
        and the job ends as its failure made it end (it was ended by 'cannot create', exit 1)."""
        fail = self.path("fill.py")
        with open(fail, "w") as f:
            f.write("import os, sys\n"
                    "n = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
                    "print('hello', n, 'TORCHELASTIC_ERROR_FILE' in os.environ, flush=True)\n"
                    "try:\n"
                    "    for i in range(100000):\n"
                    "        open(os.path.join(os.environ['D'], f'fill{n}.{i}'), 'w').close()\n"
                    "except OSError:\n"
                    "    pass\n"
                    "sys.exit(5)\n")
        summary = self.path("summary.json")
        p, disk = self.on_small_disk("", ["--log-dir", f"{self.tmp}/disk/logs", "--redirects", "1", "--max-restarts",
                                          "2", "--summary-json", summary, "--nproc-per-node", "1", fail],
                                     mount="size=32k,nr_inodes=64")
        self.assertEqual(p.returncode, 5, p.stderr)
        for attempt in (1, 2):
            self.assertRegex(p.stderr, rf"cannot create {re.escape(disk)}/logs/[^/]+/attempt_{attempt}/0 \(No space "
                                       rf"left on device\): rank 0 runs without error file and log files this attempt")
            # Redirected, but no file: the console; no error file named in a folder not there.
            self.assertIn(f"[rank0]:hello {attempt} False\n", p.stdout)
        self.assertNotIn("hello 0", p.stdout)  # attempt 0 had its file
        self.assertIn("restarting all workers: attempt 2 of 2", p.stderr)
        self.assertIn("exitcode  : 5", p.stderr)
        self.assertEqual(json.loads(read_text(summary))["exit_code"], 5)

    def test_ddpruns_stderr_a_file_on_a_full_disk(self):
        """ddprun's own log lines fail to be written as they are logged (a regular file: no
        writer thread): a worker's failure still stops the job at once, with its exit status."""
        fail = self.path("fail.py")
        with open(fail, "w") as f:
            f.write("import sys, time\ntime.sleep(0.5)\nsys.exit(3)\n")
        p, _ = self.on_small_disk('dd if=/dev/zero of="$D/fill" bs=1k count=64 2>/dev/null; exec 2>"$D/err"',
                                  ["--nproc-per-node", "2", fail])
        self.assertEqual(p.returncode, 3, p.stdout)


if __name__ == "__main__":
    main()
