#!/usr/bin/python3
"""How often a stop signal is lost while ddprun opens its rendezvous: node 0 of a static
two-node job (it hosts the store, and waits for node 1, which never comes) is frozen
(SIGSTOP) a random moment after its store listens, then sent SIGTERM and SIGCONT. It must
exit 143 at once; a lost signal leaves it waiting for node 1 until join_timeout (300 s
here). The race: the opening's end and the signal read in one wake-up of ddprun's loop.

  /usr/bin/python3 bench/launcher/signal_race.py OLD_DDPRUN NEW_DDPRUN [--runs 500]

The binaries take turns. Prints, for each, the runs that did not exit within 3 s.
"""
import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "testlib"))
from ports import free_port  # noqa: E402


def trial(binary, spread_s):
    """True when node 0 exited within 3 s of the signal."""
    port = free_port()
    p = subprocess.Popen([binary, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                          str(port), "--rdzv-conf", "join_timeout=300", "--no-python", "/bin/true"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.001)
    time.sleep(random.random() * spread_s)
    os.kill(p.pid, signal.SIGSTOP)  # (ours: started above)
    time.sleep(0.05)
    os.kill(p.pid, signal.SIGTERM)
    os.kill(p.pid, signal.SIGCONT)
    try:
        p.wait(3)
        return True
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--runs", type=int, default=500, help="trials per binary")
    ap.add_argument("--spread", type=float, default=0.004, help="freeze up to this many seconds after the store listens")
    a = ap.parse_args()
    lost = {b: 0 for b in a.binaries}
    for _ in range(a.runs):
        for b in a.binaries:
            lost[b] += not trial(b, a.spread)
    for b in a.binaries:
        print(f"{b}: {lost[b]} of {a.runs} runs lost the signal")


if __name__ == "__main__":
    main()
