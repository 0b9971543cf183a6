"""Issue 3: a console that stalls (a reader pausing 2 s) loses nothing, and ddprun's
memory stays bounded (< 50 MB peak RSS) while its workers write 200 MB."""
import json
import os
import re
import signal
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


    def test_a_slow_reader_loses_nothing_after_the_workers_exit(self):
        """8 workers each write 1 MiB (it fits their pipes) and exit at once; the console
        reads on, slowly (16 KiB every 20 ms, about 10 s for all): 5 s after the last exit,
        the streams it had not taken yet were closed unread (5 ranks of 8 lost every line,
        exit 0, no warning)."""
        ranks = 8
        reader = subprocess.Popen([PYTHON, worker("count_reader.py"), "0", str(ranks), "16384", "0.02"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self.tmp)
        self._procs.append(reader)
        p = self.start(["--nproc-per-node", str(ranks), worker("bulk.py"), "1"], stdout=reader.stdin)
        reader.stdin.close()
        reader.stdin = None
        self.assertEqual(self.wait_exit(p, 120), 0, read_text(self.path("ddprun.stderr")))
        out, _ = reader.communicate(timeout=scaled(120))
        result = json.loads(out)
        self.assertEqual(result["counts"], [1024] * ranks, result)
        self.assertEqual(result["rest"], 0)

    def test_lines_written_in_parts_stay_whole_while_the_console_stalls(self):
        """`print(text, i)` under `python -u` writes a line in parts: while ddprun stops reading
        (its console is behind), the part in its buffer must wait for the rest, not go out
        as an idle line's (it did after 100 ms: one line in two, far apart)."""
        n = 30_000
        script = self.path("parts.py")
        with open(script, "w") as f:
            f.write(f"for i in range({n}):\n    print('x' * 200, i)\n")
        p = self.start(["--nproc-per-node", "2", script], stdout=subprocess.PIPE)
        time.sleep(2)  # a console that stalls: ddprun's bound fills, the workers block
        out = p.stdout.read()
        self.assertEqual(self.wait_exit(p, 60), 0, read_text(self.path("ddprun.stderr")))
        lines = out.decode().splitlines()
        bad = [line[:60] for line in lines if not re.fullmatch(r"\[rank[01]\]:x{200} \d+", line)]
        self.assertEqual(bad[:5], [], f"{len(bad)} lines not whole")
        for r in range(2):
            self.assertEqual([int(line.split()[-1]) for line in lines if line.startswith(f"[rank{r}]")], list(range(n)))


    def test_a_stop_signal_does_not_wait_for_a_stalled_console(self):
        """SIGTERM while ddprun's stdout is a pipe nobody reads: the workers stop, and the
        summary is written (and the other nodes told) without waiting for the reader; what
        the console did not take is dropped, with a warning, and ddprun exits 5 s later even
        if the reader never comes back. It waited until the reader read (without
        --summary-json written, even once the scheduler's SIGKILL came)."""
        summary = self.path("summary.json")
        p = self.start(["--nproc-per-node", "2", "--summary-json", summary, worker("bulk.py"), "50"],
                       stdout=subprocess.PIPE)
        time.sleep(2)  # the pipe and ddprun's bound fill; the workers block
        p.send_signal(signal.SIGTERM)
        self.wait_for_files([summary], timeout=20)
        self.assertEqual(self.load_json(summary)["reason"], "signal")
        self.assertEqual(self.wait_exit(p, 30), 143)  # the reader never read
        err = read_text(self.path("ddprun.stderr"))
        self.assertIn("stopping on SIGTERM: the console is behind", err)
        self.assertIn("the console did not take the workers' last output within 5 s: exiting without it", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
