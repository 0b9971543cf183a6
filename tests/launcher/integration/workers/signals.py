"""Signal behaviours. usage: signals.py DIR MODE
term:       on SIGTERM write DIR/term_<rank> and exit 0.
usr1:       on SIGUSR1 write DIR/usr1_<rank>, keep running, exit 0 soon after (7 if none in 60 s).
ignore-int: ignore SIGINT and SIGTERM, sleep 300 (term: also at most 300 s).
linger:     on SIGTERM or SIGINT write DIR/term_<rank>, clean up for 1 s (a checkpoint), write
            DIR/clean_<rank> and exit 0.
Every rank writes DIR/ready_<rank> once its handlers are in place, and DIR/pid_<rank>.
"""
import os
import signal
import sys
import time

d, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
got = []


def mark(name):
    open(os.path.join(d, f"{name}_{rank}"), "w").close()


if mode == "term":
    def on_term(signum, frame):
        mark("term")
        os._exit(0)
    signal.signal(signal.SIGTERM, on_term)
elif mode == "linger":
    def on_stop(signum, frame):
        mark("term")
        time.sleep(1.0)
        mark("clean")
        os._exit(0)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
elif mode == "usr1":
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
elif mode == "ignore-int":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(d, f"pid_{rank}"), "w") as f:
    f.write(str(os.getpid()))
mark("ready")
deadline = time.monotonic() + (60 if mode == "usr1" else 300)
while time.monotonic() < deadline:
    if got:
        mark("usr1")
        time.sleep(0.3)  # still running after the signal
        mark("after_usr1")
        sys.exit(0)
    time.sleep(0.02)
sys.exit(7)
