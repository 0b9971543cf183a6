#!/usr/bin/python3
"""A flood of worker lines onto a terminal: ddprun's output is a pseudo-terminal that this
script reads (as a terminal emulator would, as fast as it can), the workers write their
lines into terminals of their own (the default) or into pipes (--no-worker-tty), run
alternately so that the machine's drift hits both alike.

  /usr/bin/python3 bench/launcher/terminal_flood.py build/bin/ddprun [--runs 7] [--lines 100000]
  /usr/bin/python3 bench/launcher/terminal_flood.py build/bin/ddprun --other /tmp/old-ddprun  # a second
                                                     # binary (with its pipes) as the anchor instead

Workers: tests/launcher/integration/workers/flood.py, 4 of them, each writing --lines lines
to stdout and as many to stderr in writes of random sizes; with --print, a print() a line
(python -u: a write a line) of --lines lines each. Prints each side's median wall time, the
ratio, and checks that every line reached the terminal.
"""
import argparse
import fcntl
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import termios
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FLOOD = os.path.join(ROOT, "tests", "launcher", "integration", "workers", "flood.py")
PRINT = "import sys\nfor i in range(int(sys.argv[1])):\n    print('line', i, 'abcdefghijklmnopqrstuvwxyz')\n"


def once(argv, lines_expected):
    """Wall seconds from start until the terminal closed; checks the line count."""
    master, slave = pty.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ, PYTHON_EXEC=os.environ.get("PYTHON_EXEC", "/usr/bin/python3"))
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    newlines = 0
    while True:
        select.select([master], [], [], 1.0)
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: no one holds the terminal any more
            break
        if not chunk:
            break
        newlines += chunk.count(b"\n")
    rc = p.wait()
    elapsed = time.perf_counter() - t0
    os.close(master)
    if rc != 0 or newlines < lines_expected:
        raise SystemExit(f"{argv[0]}: exit {rc}, {newlines} lines of {lines_expected}")
    return elapsed


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("ddprun")
    a.add_argument("--other", help="a second ddprun binary as the anchor (run as it is)")
    a.add_argument("--runs", type=int, default=7)
    a.add_argument("--lines", type=int, default=100000)
    a.add_argument("--print", action="store_true", help="workers that print() each line")
    args = a.parse_args()
    worker, per_worker = FLOOD, 2 * args.lines
    if args.print:
        worker, per_worker = os.path.join(os.environ.get("TMPDIR", "/tmp"), "terminal_flood_print.py"), args.lines
        with open(worker, "w") as f:
            f.write(PRINT)
    common = ["--standalone", "--nproc-per-node", "4", worker, str(args.lines)]
    sides = {"ptys (default)": [args.ddprun, *common]}
    if args.other:
        sides["other binary"] = [args.other, *common]
    else:
        sides["pipes (--no-worker-tty)"] = [args.ddprun, "--no-worker-tty", *common]
    times = {k: [] for k in sides}
    for _ in range(args.runs):
        for name, argv in sides.items():
            times[name].append(once(argv, 4 * per_worker))
    names = list(sides)
    for name in names:
        print(f"{name}: median {statistics.median(times[name]):.3f} s  ({', '.join(f'{t:.2f}' for t in times[name])})")
    ratio = statistics.median(times[names[0]]) / statistics.median(times[names[1]])
    print(f"{names[0]} / {names[1]}: {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
