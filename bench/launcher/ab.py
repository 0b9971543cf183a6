#!/usr/bin/python3
"""Launch cost of two ddprun binaries, interleaved (A, B, A, B, ...) so that the machine's
drift hits both alike: launch-to-exit of `--standalone --nproc-per-node 4 --no-python true`.

  /usr/bin/python3 bench/launcher/ab.py OLD_DDPRUN NEW_DDPRUN [--runs 200]

Prints each binary's median and the ratio NEW/OLD (1.00 = unchanged).
"""
import argparse
import statistics
import subprocess
import time

ARGS = ["--standalone", "--nproc-per-node", "4", "--no-python", "true"]


def once(binary):
    t0 = time.perf_counter()
    rc = subprocess.run([binary, *ARGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    if rc != 0:
        raise SystemExit(f"{binary} exited {rc}")
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--runs", type=int, default=200)
    a = p.parse_args()
    for b in (a.old, a.new):  # warm the page cache
        once(b)
    old, new = [], []
    for _ in range(a.runs):
        old.append(once(a.old))
        new.append(once(a.new))
    mo, mn = statistics.median(old), statistics.median(new)
    print(f"| launch to exit, 4 x `true` (median of {a.runs}, interleaved) | old {mo * 1e3:.2f} ms | "
          f"new {mn * 1e3:.2f} ms | new/old {mn / mo:.2f}x |")


if __name__ == "__main__":
    main()
