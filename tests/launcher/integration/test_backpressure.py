"""Issue 3: a console that stalls (a reader pausing 2 s) loses nothing, and ddprun's
memory stays bounded (< 50 MB peak RSS) while its workers write 200 MB."""
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, PYTHON, read_text, scaled, vm_hwm_kb, worker

RANKS = 4
MB_PER_RANK = 50
LINES_PER_RANK = MB_PER_RANK * 1024  # 1 KiB lines


class BackPressureTest(DdprunTestCase):
    def test_slow_console_loses_nothing_and_memory_stays_bounded(self):
        reader = subprocess.Popen([PYTHON, worker("count_reader.py"), "2", str(RANKS)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, cwd=self.tmp)
        self._procs.append(reader)
        p = self.start(["--nproc-per-node", str(RANKS), worker("bulk.py"), str(MB_PER_RANK)], stdout=reader.stdin)
        reader.stdin.close()  # only ddprun holds the write end now
        reader.stdin = None
        peak_kb = 0
        t0 = time.monotonic()
        limit = scaled(120)  # a hang guard
        while p.poll() is None and time.monotonic() - t0 < limit:
            hwm = vm_hwm_kb(p.pid)
            if hwm:
                peak_kb = max(peak_kb, hwm)
            time.sleep(0.05)
        self.assertIsNotNone(p.poll(), f"ddprun did not finish within {limit} s")
        exited = time.monotonic()
        out, _ = reader.communicate(timeout=scaled(60))
        self.assertEqual(p.returncode, 0, read_text(self.path("ddprun.stderr")))
        result = json.loads(out)
        # The reader sleeps 2 s before it reads anything; ddprun can only end after that.
        self.assertGreater(exited, result["began"], "ddprun finished before the reader read anything: output was buffered")
        self.assertEqual(result["counts"], [LINES_PER_RANK] * RANKS, result)
        self.assertEqual(result["lines"], LINES_PER_RANK * RANKS, result)
        self.assertEqual(result["rest"], 0)
        self.assertGreater(peak_kb, 0, "could not read ddprun's VmHWM")
        self.assertLess(peak_kb, 50 * 1024, f"ddprun's peak RSS was {peak_kb} kB")


if __name__ == "__main__":
    unittest.main(verbosity=2)
