"""What the multi-node integration tests share: waiting for a set of nodes (ddprun
processes) to exit, and reading the records their workers wrote (rdzv_env.py and friends
write start_<pid>.json with their environment).

A node here is any object with `proc` (a subprocess.Popen) and `exited_at` (None until it
exited; then time.time() when this module saw it gone).
"""
import glob
import json
import os
import time


def wait_exited(nodes, timeout_s, poll_s=0.02):
    """Polls until every node exited or timeout_s (already scaled) passed; returns the
    nodes still running (empty when all exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for n in nodes:
            if n.exited_at is None and n.proc.poll() is not None:
                n.exited_at = time.time()
        running = [n for n in nodes if n.exited_at is None]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(poll_s)


def highest_round(prefix):
    """The highest round that workers/fail_round.sh recorded in <prefix>.<group rank>."""
    last = 0
    for path in glob.glob(glob.escape(prefix) + ".*"):
        with open(path) as f:
            last = max([last] + [int(x) for x in f.read().split()])
    return last


def last_error(node):
    """', saying: <its last "ddprun: error:" line>' when the node's stderr (err_path) has one:
    a failure's message names it first, not only in a log tail that a long output cuts."""
    try:
        with open(node.err_path, errors="replace") as f:
            lines = [line.strip() for line in f if line.startswith("ddprun: error:")]
    except (AttributeError, OSError):
        return ""
    return f", saying: {lines[-1]}" if lines else ""


def wait_round(prefix, at, nodes, stall_s, poll_s=0.05):
    """Waits until workers/fail_round.sh recorded round `at` under prefix for as long as the
    job moves: returns None then, else why it stopped waiting (a node exited first, or no new
    round started for stall_s, already scaled). Only a stall fails: a fixed deadline for
    hundreds of rounds ran out once in CI with nothing to say where the job stood."""
    last, since = -1, time.monotonic()
    while True:
        h = highest_round(prefix)
        if h >= at:
            return None
        if h != last:
            last, since = h, time.monotonic()
        gone = [f"{n.name} (exit {n.proc.returncode}{last_error(n)})" for n in nodes if n.proc.poll() is not None]
        if gone:
            return f"round {at} not reached: at round {h}, {', '.join(gone)} exited"
        if time.monotonic() - since > stall_s:
            return f"round {at} not reached: no round after round {h} for {stall_s:.0f} s"
        time.sleep(poll_s)


def start_records(folder):
    """The workers' start_*.json records in folder, oldest first."""
    out = []
    for f in glob.glob(os.path.join(folder, "start_*.json")):
        with open(f) as fh:
            out.append(json.load(fh))
    return sorted(out, key=lambda r: r["t"])


def rounds(records):
    """Worker records grouped by round (each round has its own MASTER_PORT), in the order
    the rounds started."""
    by_port = {}
    for r in records:
        by_port.setdefault(r["env"]["MASTER_PORT"], []).append(r)
    return sorted(by_port.values(), key=lambda rs: rs[0]["t"])
