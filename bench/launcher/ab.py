#!/usr/bin/python3
"""Launch cost of two ddprun binaries, interleaved (A, B, A, B, ...) so that the machine's
drift hits both alike: launch-to-exit of `--standalone --nproc-per-node 4 --no-python true`.

  /usr/bin/python3 bench/launcher/ab.py OLD_DDPRUN NEW_DDPRUN [--runs 200]
  /usr/bin/python3 bench/launcher/ab.py B B --python --old-flags=--no-stack-dumps  # one binary,
                                                     # Python workers, without and with a flag

--python: the workers are `python3 -c pass` (PYTHON_EXEC or python3 from PATH, run with -u
by ddprun) instead of `true`. --lines N: each worker writes N short lines
(build/bin/ddp-bench-lines) through ddprun's output path; add `--old-flags="--log-dir D --tee 3"`
and the same --new-flags for the log files too. --old-flags/--new-flags: extra ddprun flags for either side.
--libddp: the workers are C++ on libddp, each side its own build's (train_linear beside the
binary, 300 steps: joining the job's store, its set-up and 300 small all-reduces).
--etcd: each launch a one-node job through a one-member etcd started here
(tests/testlib/etcd_cluster.py; `--rdzv-backend etcd --nnodes 1`, a run id of its own per
launch) instead of --standalone: what a job that uses etcd pays.
Prints each side's median and the ratio NEW/OLD (1.00 = unchanged), of the wall time and of
the CPU time (user + system of ddprun, its guardian and its workers).
"""
import argparse
import itertools
import os
import resource
import statistics
import subprocess
import sys
import time

def once(binary, args):
    """(wall, CPU) seconds of one launch; CPU is user + system of ddprun and all it started."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    rc = subprocess.run([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        raise SystemExit(f"{binary} exited {rc}")
    return t1 - t0, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--python", action="store_true", help="Python workers (python3 -c pass)")
    p.add_argument("--libddp", action="store_true", help="libddp workers (each build's train_linear)")
    p.add_argument("--lines", type=int, default=0, help="workers writing this many lines each")
    p.add_argument("--old-flags", default="", help="extra ddprun flags for OLD (space-separated)")
    p.add_argument("--new-flags", default="", help="extra ddprun flags for NEW (space-separated)")
    p.add_argument("--etcd", action="store_true", help="through a one-member etcd instead of --standalone")
    a = p.parse_args()
    base = ["--standalone", "--nproc-per-node", "4"]
    etcd = None
    if a.etcd:
        tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests")
        sys.path[:0] = [os.path.join(tests, "testlib"), os.path.join(tests, "common")]
        import etcd_cluster
        etcd = etcd_cluster.EtcdCluster(1)
        base = ["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints(), "--nnodes", "1",
                "--nproc-per-node", "4", "--rdzv-id"]
        run_ids = itertools.count()
    lines = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin", "ddp-bench-lines")
    worker = ["--no-python", os.environ.get("PYTHON_EXEC", "python3"), "-c", "pass"] if a.python else \
        ["--no-python", lines, str(a.lines)] if a.lines else ["--no-python", "true"]
    def args(binary, flags):
        run_id = [f"ab-{os.getpid()}-{next(run_ids)}"] if etcd else []
        if a.libddp:
            return base + run_id + flags.split() + [
                "--no-python", os.path.join(os.path.dirname(binary), "train_linear"), "--steps", "300",
                "--out", os.devnull]
        return base + run_id + flags.split() + worker

    try:
        for b, flags in ((a.old, a.old_flags), (a.new, a.new_flags)):  # warm the page cache
            once(b, args(b, flags))
        old, new = [], []
        for _ in range(a.runs):
            old.append(once(a.old, args(a.old, a.old_flags)))
            new.append(once(a.new, args(a.new, a.new_flags)))
    finally:
        if etcd:
            etcd.stop()
    what = ("`train_linear --steps 300` (libddp)" if a.libddp else "`python3 -c pass`" if a.python else
            f"`ddp-bench-lines {a.lines}`" if a.lines else "`true`")
    what += ", through etcd" if etcd else ""
    for i, row in ((0, "launch to exit"), (1, "CPU of the launch (ddprun and all it started)")):
        mo, mn = statistics.median(x[i] for x in old), statistics.median(x[i] for x in new)
        print(f"| {row}, 4 x {what} (median of {a.runs}, interleaved) | old {mo * 1e3:.2f} ms | "
              f"new {mn * 1e3:.2f} ms | new/old {mn / mo:.2f}x |")


if __name__ == "__main__":
    main()
