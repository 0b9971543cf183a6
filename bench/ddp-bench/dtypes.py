#!/usr/bin/env python3
"""All-reduce bandwidth of the CPU backend by dtype: float16 and bfloat16 against float32,
the anchor, measured in the same run (interleaved), medians. With --old-lib DIR (a folder
holding another build's libddp.so.0) each run also measures that library, interleaved, so
that a change to the 16-bit kernels is compared with the one before it on the same machine.

    python3 bench/ddp-bench/dtypes.py [--runs 5] [--ranks 2] [--size 16M] [--old-lib DIR]
"""
import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPES = ("float16", "bfloat16", "float32")


def bus_bandwidth(bench, ranks, size, dtype, lib):
    env = dict(os.environ)
    if lib:
        env["LD_LIBRARY_PATH"] = lib  # searched before the binary's RUNPATH
    out = subprocess.run([bench, "--spawn", str(ranks), "-b", size, "-e", size, "-n", "20", "-w", "3",
                          "--dtype", dtype], env=env, capture_output=True, text=True, timeout=300)
    for line in out.stdout.splitlines():
        if "Avg bus bandwidth" in line:
            return float(line.split()[-2])
    sys.exit(f"ddp-bench {dtype} gave no bandwidth (rc {out.returncode}):\n{out.stdout}{out.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--size", default="16M", help="bytes per rank (K/M/G suffixes)")
    ap.add_argument("--old-lib", help="a folder with another build's libddp.so.0")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bin", "ddp-bench"))
    a = ap.parse_args()
    variants = [("this build", None)] + ([("old", a.old_lib)] if a.old_lib else [])
    got = {(v, d): [] for v, _ in variants for d in DTYPES}
    for _ in range(a.runs):
        for v, lib in variants:
            for d in DTYPES:
                got[(v, d)].append(bus_bandwidth(a.bench, a.ranks, a.size, d, lib))
    med = {k: statistics.median(x) for k, x in got.items()}
    print(f"{a.ranks} ranks, {a.size} per rank, busbw GB/s, medians of {a.runs} interleaved runs")
    print("| dtype | " + " | ".join(v for v, _ in variants) + " | / float32 (this build) |"
          + (" this build / old |" if a.old_lib else ""))
    print("|---" * (len(variants) + 2 + (1 if a.old_lib else 0)) + "|")
    for d in DTYPES:
        row = [f"{med[(v, d)]:.2f}" for v, _ in variants]
        row.append(f"{med[('this build', d)] / med[('this build', 'float32')]:.2f}")
        if a.old_lib:
            row.append(f"{med[('this build', d)] / med[('old', d)]:.2f}x")
        print(f"| {d} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
