#!/usr/bin/python3
"""What a c10d round of N agents costs above its floor (N agents of --standalone), one build.

  /usr/bin/python3 bench/rendezvous/floor_cost.py [--agents 256] [--pairs 5] [DDPRUN]

N agents on loopback, one `true` worker each, started at once by build/bin/ddp-bench-spawn-n
as bench/rendezvous/run.py starts them; c10d and --standalone take turns. Per run: wall time
from the start to the last exit, CPU (user + system) and minor page faults of every process
of the run (getrusage of the children). Prints medians, round / floor, and the CPU per agent
that the rendezvous adds.
"""
import argparse, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cost  # noqa: E402  (one round's wall, CPU and faults)
import run  # noqa: E402  (its agents' command line and spawner)


def one(backend, n, binary):
    run.BACKEND = backend
    return cost.one_round(binary, n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("ddprun", nargs="?", default=run.DDPRUN)
    a = ap.parse_args()
    runs = {"c10d": [], "standalone": []}
    for _ in range(a.pairs):
        for backend in runs:
            runs[backend].append(one(backend, a.agents, a.ddprun))
    med = {b: [statistics.median(r[k] for r in runs[b]) for k in range(3)] for b in runs}
    print(f"{a.agents} agents, medians of {a.pairs} interleaved runs each\n")
    print("| | wall | CPU of every process | page faults |\n|---|---|---|---|")
    for b, label in (("c10d", "c10d round"), ("standalone", "N x `--standalone` (floor)")):
        w, c, f = med[b]
        print(f"| {label} | {w:.2f} s | {c:.2f} s | {f:.0f} |")
    extra = (med["c10d"][1] - med["standalone"][1]) / a.agents * 1000
    print(f"| round / floor | {med['c10d'][0] / med['standalone'][0]:.2f}x | {extra:.1f} ms more per agent | |")


if __name__ == "__main__":
    main()
