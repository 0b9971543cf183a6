"""Issue 3: heavy output arrives complete, each line exactly once, intact, with the right
prefix on the right stream; a worker leaving early does not cost the flooder lines."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, worker

PAD = "abcdefghijklmnopqrstuvwxyz"
LINE = re.compile(rb"^\[rank(\d+)\]:([oe]) r(\d+) (\d+) ([a-z]*)$")


class VolumeTest(DdprunTestCase):
    def check_stream(self, data, kind, ranks, n, stream_name):
        """Every line of data is '[rankR]:<kind> rR i pad', each i in 0..n-1 exactly once per rank."""
        seen = {r: bytearray(n) for r in ranks}
        problems = []
        own_lines = 0
        for line in data.split(b"\n")[:-1]:
            if line.startswith(b"[ddprun"):
                own_lines += 1
                continue
            m = LINE.match(line)
            if not m:
                problems.append(f"malformed line {line[:120]!r}")
            else:
                prefix_rank, k, r, i, pad = int(m[1]), m[2].decode(), int(m[3]), int(m[4]), m[5].decode()
                if prefix_rank != r:
                    problems.append(f"line of rank {r} under prefix of rank {prefix_rank}: {line[:80]!r}")
                elif k != kind:
                    problems.append(f"{'stdout' if k == 'o' else 'stderr'} line on {stream_name}: {line[:80]!r}")
                elif r not in seen or i >= n:
                    problems.append(f"unexpected line {line[:80]!r}")
                elif pad != PAD[: i % 27]:
                    problems.append(f"torn line {line[:80]!r}")
                elif seen[r][i]:
                    problems.append(f"duplicate line {line[:80]!r}")
                else:
                    seen[r][i] = 1
            if len(problems) > 10:
                break
        self.assertFalse(data and not data.endswith(b"\n"), f"{stream_name} does not end with a newline")
        self.assertEqual(problems, [], f"{stream_name}: first problems")
        for r in ranks:
            missing = n - sum(seen[r])
            self.assertEqual(missing, 0, f"{stream_name}: rank {r} lost {missing} of {n} lines")

    def test_four_workers_100k_lines_each_stream(self):
        n = 100_000
        res = self.run_ddprun(["--nproc-per-node", "4", worker("flood.py"), str(n)], timeout=90)
        self.assertEqual(res.rc, 0, res)
        self.check_stream(res.out, "o", range(4), n, "stdout")
        self.check_stream(res.err, "e", range(4), n, "stderr")

    def test_worker_exits_while_another_floods(self):
        n = 150_000
        res = self.run_ddprun(["--nproc-per-node", "2", worker("flood.py"), str(n), "1"], timeout=90)
        self.assertEqual(res.rc, 0, res)
        self.check_stream(res.out, "o", [0], n, "stdout")
        self.check_stream(res.err, "e", [0], n, "stderr")


if __name__ == "__main__":
    unittest.main(verbosity=2)
