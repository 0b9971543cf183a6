#!/usr/bin/python3
"""A worker that records every signal it gets, with its sender. usage: sig_worker.py DIR MODE

Appends "<monotonic> <signal> <sender pid> <sender comm>" to DIR/sig_<rank>.log; writes
DIR/ready_<rank> once its signals are taken. Never dies of a signal but SIGKILL.
MODE term:   exits 0 on SIGTERM (after 0.3 s: a duplicate would still be recorded).
MODE notify: exits 0 one second after its first SIGUSR1/SIGUSR2; exits 7 after 120 s.
MODE hold:   exits 0 on SIGTERM, like term; notifications are recorded and it runs on.
"""
import os
import signal
import sys
import time

d, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
watched = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
           signal.SIGCONT]
signal.pthread_sigmask(signal.SIG_BLOCK, watched)
log = open(os.path.join(d, f"sig_{rank}.log"), "a", buffering=1)


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


open(os.path.join(d, f"ready_{rank}"), "w").close()
deadline = time.monotonic() + 120
exit_at = None
while True:
    now = time.monotonic()
    if exit_at is not None and now >= exit_at:
        log.write(f"{now:.3f} EXIT\n")
        sys.exit(0)
    if now > deadline:
        sys.exit(7)
    wait = min(exit_at or deadline, deadline) - now
    si = signal.sigtimedwait(watched, max(0.01, wait))
    if si is None:
        continue
    name = signal.Signals(si.si_signo).name
    log.write(f"{time.monotonic():.3f} {name} {si.si_pid} {comm(si.si_pid)}\n")
    if name == "SIGTERM" and exit_at is None:
        exit_at = time.monotonic() + 0.3
    if mode == "notify" and name in ("SIGUSR1", "SIGUSR2") and exit_at is None:
        exit_at = time.monotonic() + 1.0
