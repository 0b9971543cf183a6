"""Workers and stdin: a piped stdin reaches the workers; on a terminal, workers (background
process groups) read /dev/null instead of being stopped by SIGTTIN, which would hang the job."""
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DDPRUN, DdprunTestCase, clean_env, scaled

READER = "read line; echo \"rc=$? line=$line\""


class StdinTest(DdprunTestCase):
    def test_piped_stdin_reaches_the_worker(self):
        env = clean_env(TMPDIR=self.tmp)
        p = subprocess.run([DDPRUN, "--no-python", "sh", "-c", READER], input=b"hello\n",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=self.tmp,
                           timeout=scaled(60))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"[rank0]:rc=0 line=hello", p.stdout)

    @unittest.skipUnless(shutil.which("script"), "util-linux 'script' is needed for a terminal")
    def test_terminal_stdin_gives_eof_instead_of_a_hang(self):
        env = clean_env(TMPDIR=self.tmp)
        cmd = f"{DDPRUN} --nproc-per-node 2 --no-python sh -c '{READER}'"
        t0 = time.monotonic()
        # script(1) runs the command on a new pseudo-terminal as its controlling terminal.
        p = subprocess.run(["script", "-qec", cmd, "/dev/null"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=self.tmp,
                           timeout=scaled(60), start_new_session=True)
        # A second or so; a worker stopped by SIGTTIN would hang until the timeout above.
        self.assertLess(time.monotonic() - t0, scaled(20))
        out = p.stdout.decode(errors="replace")
        self.assertEqual(p.returncode, 0, out)
        for r in (0, 1):
            self.assertIn(f"[rank{r}]:rc=1 line=", out)


if __name__ == "__main__":
    unittest.main()
