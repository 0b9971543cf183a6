#!/usr/bin/python3
"""The cost of libddp's progress record (what ddprun shows as each rank's collective):
all_reduce of 4 bytes on 2 ranks (ddp-bench --spawn 2), record on and off
(DDP_PROGRESS_RECORD=0), interleaved runs; prints each side's median time per call. With
--baseline OLD_DDP_BENCH: this build against another build's ddp-bench instead (record on in
both), for what a change to the collectives' front end costs the cheapest call.

  /usr/bin/python3 bench/ddp-bench/progress_ab.py [--runs 9] [--iters 20000] [--baseline PATH]
"""
import argparse
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "build", "bin", "ddp-bench")


def once(on, iters, bench=BENCH):
    env = dict(os.environ, DDP_PROGRESS_RECORD="1" if on else "0")
    out = subprocess.run([bench, "--spawn", "2", "-b", "4", "-e", "4", "-n", str(iters), "-w", "1000", "-c", "0"],
                         env=env, capture_output=True, text=True, check=True).stdout
    rows = [l.split() for l in out.splitlines() if l.strip() and l.split()[0] == "4"]
    return float(rows[-1][3])  # time per call, us (the slowest rank's average)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--baseline", help="another build's ddp-bench: compared with this one, record on")
    a = ap.parse_args()
    if a.baseline:
        new, old = [], []
        for _ in range(a.runs):
            old.append(once(True, a.iters, a.baseline))
            new.append(once(True, a.iters))
        m_new, m_old = statistics.median(new), statistics.median(old)
        print(f"| all_reduce 4 B, 2 ranks (median of {a.runs}) | baseline {m_old:.3f} us | this build {m_new:.3f} us "
              f"| this/baseline {m_new / m_old:.3f}x |")
        return
    on, off = [], []
    for _ in range(a.runs):
        on.append(once(True, a.iters))
        off.append(once(False, a.iters))
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"| all_reduce 4 B, 2 ranks (median of {a.runs}) | record off {m_off:.3f} us | record on {m_on:.3f} us "
          f"| on/off {m_on / m_off:.3f}x |")


if __name__ == "__main__":
    main()
