"""Output that cannot go where it should (src/launcher/output.cpp): the job runs on, and ddprun
says so once per place, naming it and the system's reason.

- stdout read by `head -2`: the pipe closes early; one line "cannot write to stdout (Broken
  pipe)", every worker finishes, exit 0;
- stdout or ddprun's own stderr on /dev/full (ENOSPC at every write): the same;
- --log-dir on a full disk (a 32 kB tmpfs in a mount namespace of the test's own): one line
  per log file, naming it; what was written before is intact.
"""
import os
import re
import shutil
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

    def test_stdout_on_a_full_device(self):
        rc, err = self.run_on_full_device("stdout")
        self.assert_finished(rc, err)
        self.assertEqual(err.count("cannot write to stdout (No space left on device)"), 1, err)

    def test_ddpruns_stderr_on_a_full_device(self):
        rc, out = self.run_on_full_device("stderr")
        self.assert_finished(rc, out)
        self.assertEqual(len(out.splitlines()), 100, out[-2000:])  # stdout unharmed

    def test_log_dir_on_a_full_disk(self):
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root for a tmpfs in a mount namespace of its own")
        disk = self.path("disk")
        os.mkdir(disk)
        kept = self.path("stdout.log")  # the log as ddprun left it, copied out of the namespace
        script = ('mount -t tmpfs -o size=32k tmpfs "$1" || exit 99; shift; "$@"; rc=$?; '
                  f'cat {disk}/logs/*/attempt_0/0/stdout.log > {kept}; exit $rc')
        p = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", disk, DDPRUN, "--log-dir", f"{disk}/logs",
                            "--redirects", "1", "--nproc-per-node", "1",
                            self.worker(lines=2000, pause=0)],
                           env=dict(clean_env(), TMPDIR=self.tmp), capture_output=True, text=True, cwd=self.tmp,
                           timeout=scaled(60))
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


if __name__ == "__main__":
    main()
