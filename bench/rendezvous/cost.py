#!/usr/bin/python3
"""What one c10d round of N agents costs the machine, for two ddprun builds, interleaved.

  /usr/bin/python3 bench/rendezvous/cost.py [--agents 1024] [--pairs 5] OLD_DDPRUN [NEW_DDPRUN]

N agents on loopback (`--nnodes N --rdzv-backend c10d`, one `true` worker each), started at
once by build/bin/ddp-bench-spawn-n as bench/rendezvous/run.py starts them; per run: wall
time from the start to the last exit, CPU (user + system) and minor page faults of every
process of the run (the spawner's children and theirs, from getrusage). OLD and NEW take
turns, so the drift of a noisy machine hits both alike. Prints medians and NEW / OLD.
NEW defaults to this checkout's build/bin/ddprun.
"""
import argparse, os, resource, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (its agents' command line and spawner)


def one_round(binary, n):
    """(wall s, CPU s, minor faults) of one round of n agents; raises if any agent failed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = run.rendezvous_once(n, binary=binary)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_minflt - before.ru_minflt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("old")
    ap.add_argument("new", nargs="?", default=run.DDPRUN)
    a = ap.parse_args()
    runs = {"old": [], "new": []}
    for i in range(a.pairs):
        for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
            runs[name].append(one_round(getattr(a, name), a.agents))
            w, c, f = runs[name][-1]
            print(f"{name} {w:.2f} s wall, {c:.2f} s CPU, {f} faults", file=sys.stderr, flush=True)
    print(f"{a.agents} agents, medians of {a.pairs} interleaved runs each\n")
    print("| | old | new | new / old |\n|---|---|---|---|")
    for k, label, fmt in ((0, "wall", "{:.2f} s"), (1, "CPU (user + system)", "{:.2f} s"), (2, "minor page faults", "{:.0f}")):
        o, n = (statistics.median(r[k] for r in runs[x]) for x in ("old", "new"))
        print(f"| {label} | {fmt.format(o)} | {fmt.format(n)} | {n / o:.2f}x |")


if __name__ == "__main__":
    main()
