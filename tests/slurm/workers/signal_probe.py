#!/usr/bin/python3
"""Records every signal a process of a Slurm step receives, with the sender, to measure what
Slurm delivers to whom. usage: signal_probe.py LOGDIR [children]

Each process appends "<monotonic> <role> <pid> <pgid> <signal> <sender pid> <sender comm>" to
LOGDIR/<node>.log and keeps running (it never exits on a signal: only SIGKILL ends it, so
duplicates and the KillWait are visible). With "children", the process first starts two
copies of itself, each in its own process group, as ddprun starts its workers.
"""
import os
import signal
import subprocess
import sys
import threading
import time

logdir = sys.argv[1]
role = os.environ.get("PROBE_ROLE", "task")
watched = [signal.SIGTERM, signal.SIGCONT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT,
           signal.SIGQUIT]
signal.pthread_sigmask(signal.SIG_BLOCK, watched)
node = os.environ.get("SLURMD_NODENAME", "none")
log = open(os.path.join(logdir, f"{node}.log"), "a", buffering=1)


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"




def beat():
    # The last beat tells when the process died (SIGKILL cannot be logged).
    path = os.path.join(logdir, f"{node}-{role}.alive")
    while True:
        with open(path + ".tmp", "w") as f:
            f.write(f"{time.monotonic():.3f}\n")
        os.replace(path + ".tmp", path)
        time.sleep(0.1)


threading.Thread(target=beat, daemon=True).start()
kids = []
if len(sys.argv) > 2 and sys.argv[2] == "children":
    for i in range(2):
        env = dict(os.environ, PROBE_ROLE=f"child{i}")
        kids.append(subprocess.Popen([sys.executable, sys.argv[0], logdir], env=env, preexec_fn=os.setpgrp))
log.write(f"{time.monotonic():.3f} {role} {os.getpid()} {os.getpgid(0)} START ppid={os.getppid()}({comm(os.getppid())})\n")
while True:
    si = signal.sigwaitinfo(watched)
    name = signal.Signals(si.si_signo).name
    log.write(f"{time.monotonic():.3f} {role} {os.getpid()} {os.getpgid(0)} {name} from={si.si_pid}({comm(si.si_pid)})\n")
