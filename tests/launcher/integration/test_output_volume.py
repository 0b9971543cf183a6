"""Issue 3: heavy output arrives complete, each line exactly once, intact, with the right
prefix on the right stream; a worker leaving early does not cost the flooder lines."""
import os
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, worker

PAD = "abcdefghijklmnopqrstuvwxyz"
PREFIX = re.compile(rb"^\[rank(\d+)\]:(.*)$")
BODY = re.compile(rb"^([oe]) r(\d+) (\d+) ([a-z]*)$")
HEAD = re.compile(rb"^[oe]( (r(\d+( (\d+( [a-z]*)?)?)?)?)?)?$")  # a line's first bytes
IDLE_FLUSH = 0.1  # StreamForwarder::kIdleFlush, seconds


class VolumeTest(DdprunTestCase):
    def check_stream(self, data, kind, ranks, n, stream_name, elapsed):
        """Every line of data is '[rankR]:<kind> rR i pad', each i in 0..n-1 exactly once per rank.

        One exception, which only a slow or loaded machine shows: a worker that stalls for
        ddprun's idle flush (100 ms) in the middle of a line has that line's first bytes
        flushed, and when another rank's line comes first, the rest follows on a line of its
        own, prefixed again (the rest may be just the newline). Such a piece must be a line's
        beginning and join the next line of its rank into a whole line; each needs 100 ms of
        silence, so there are at most elapsed / 100 ms of them per rank (a forwarder that cut
        lines anywhere makes thousands).

        """
        seen = {r: bytearray(n) for r in ranks}
        problems = []
        heads = {}  # rank -> first bytes of its line flushed while idle, awaiting the rest
        pieces = 0
        for line in data.split(b"\n")[:-1]:
            if line.startswith(b"[ddprun"):
                continue
            m = PREFIX.match(line)
            if not m:
                problems.append(f"malformed line {line[:120]!r}")
                continue
            prefix_rank, body = int(m[1]), heads.pop(int(m[1]), b"") + m[2]
            if body == b"":  # the '\\n' of a line flushed whole while idle, after another rank's
                pieces += 1
                continue
            b = BODY.match(body)
            if b and b[4].decode() != PAD[: int(b[3]) % 27] and PAD.startswith(b[4].decode()):
                b = None  # its padding is cut short: the beginning of a line
            if not b and HEAD.match(body):
                heads[prefix_rank] = body
                pieces += 1
                continue
            if not b:
                problems.append(f"malformed line {line[:120]!r}")
            else:
                k, r, i, pad = b[1].decode(), int(b[2]), int(b[3]), b[4].decode()
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
        problems += [f"rank {r}'s line never finished: {h[:80]!r}" for r, h in heads.items()]
        self.assertFalse(data and not data.endswith(b"\n"), f"{stream_name} does not end with a newline")
        self.assertEqual(problems, [], f"{stream_name}: first problems")
        most = len(ranks) * (int(elapsed / IDLE_FLUSH) + 1)
        self.assertLessEqual(pieces, most, f"{stream_name}: {pieces} lines cut in two, more than idle "
                                           f"flushes in {elapsed:.1f} s explain")
        for r in ranks:
            missing = n - sum(seen[r])
            self.assertEqual(missing, 0, f"{stream_name}: rank {r} lost {missing} of {n} lines")

    def test_four_workers_100k_lines_each_stream(self):
        n = 100_000
        res = self.run_ddprun(["--nproc-per-node", "4", worker("flood.py"), str(n)], timeout=90)
        self.assertEqual(res.rc, 0, res)
        self.check_stream(res.out, "o", range(4), n, "stdout", res.elapsed)
        self.check_stream(res.err, "e", range(4), n, "stderr", res.elapsed)

    def test_worker_exits_while_another_floods(self):
        n = 150_000
        res = self.run_ddprun(["--nproc-per-node", "2", worker("flood.py"), str(n), "1"], timeout=90)
        self.assertEqual(res.rc, 0, res)
        self.check_stream(res.out, "o", [0], n, "stdout", res.elapsed)
        self.check_stream(res.err, "e", [0], n, "stderr", res.elapsed)

    def test_stdout_and_stderr_on_one_pipe_keep_their_lines_whole(self):
        """`ddprun ... 2>&1 | tee log`: one pipe behind both of ddprun's streams, read slowly
        so that it fills. Lines of stdout and of stderr never tear each other. Before, each
        stream had a writer thread of its own whose writevs (up to 64 chunks, far over the
        pipe's 4 KiB of atomic writes) interleaved: thousands of torn lines. (--tee keeps a
        pipe per worker stream; without it one pipe takes both, and a worker that writes
        parts of lines to both, as this one does, mixes them itself: OneConsoleTest.)"""
        n = 20_000
        p = self.start(["--nproc-per-node", "2", "--log-dir", self.path("logs"), "--tee", "3", worker("flood.py"),
                        str(n)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        chunks, t0 = [], time.monotonic()
        while True:
            b = p.stdout.read1(16384)
            if not b:
                break
            chunks.append(b)
            time.sleep(0.0005)  # a slow reader: the pipe stays full
        self.assertEqual(p.wait(timeout=60), 0)
        elapsed = time.monotonic() - t0
        data = b"".join(chunks)
        by_kind = {"o": [], "e": [], "?": []}
        unfinished = {}  # rank -> the kind of its line flushed in part while idle
        for line in data.split(b"\n")[:-1]:
            m = PREFIX.match(line)
            if line.startswith(b"[ddprun") or not m:
                by_kind["?" if m is None and not line.startswith(b"[ddprun") else "o"].append(line)
                continue
            start = re.match(rb"([oe])( |$)", m[2])
            kind = start[1].decode() if start else unfinished.pop(m[1], "?")
            if start and not BODY.match(m[2]):
                unfinished[m[1]] = kind
            by_kind[kind].append(line)
        self.assertEqual(by_kind["?"][:5], [], "lines that are neither stdout's nor stderr's")
        for kind in ("o", "e"):
            self.check_stream(b"\n".join(by_kind[kind]) + b"\n", kind, range(2), n, f"{kind} lines on the one pipe",
                              elapsed)


if __name__ == "__main__":
    unittest.main(verbosity=2)
