"""Entrypoint stand-in for a runtime or init that leaves signals blocked and ignored:
blocks every signal, ignores SIGTERM, SIGINT, SIGCHLD, SIGUSR1, then execs its arguments
(both survive exec)."""
import os
import signal
import sys

signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGUSR1):
    signal.signal(s, signal.SIG_IGN)
os.execvp(sys.argv[1], sys.argv[1:])
