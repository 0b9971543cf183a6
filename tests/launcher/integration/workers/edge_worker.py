"""A worker for the rendezvous edge tests: records its start, the stop signal it got (if
any) and its normal end, each with a timestamp (time.time(), shared by every process).

usage: edge_worker.py DIR [--sleep-rank R=S ...] [--sleep S] [--fail R=PATH] [--until PATH]

Writes DIR/pid_<rank> and DIR/start_<rank> at once; sleeps S seconds (the S given for its RANK, else --sleep,
default 0) and writes DIR/end_<rank>; on SIGTERM (or SIGINT) writes DIR/term_<rank> and
exits 143. Each file holds the time it was written. With --fail, rank R exits 3 as soon as
PATH exists (looked for every 10 ms) instead. --until: the sleep ends early once PATH exists
(the test decides the end; S is then a hang guard).
"""
import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--sleep-rank", action="append", default=[])
p.add_argument("--fail", default="")
p.add_argument("--until", default="")
a = p.parse_args()
rank = int(os.environ["RANK"])


def mark(name):
    tmp = os.path.join(a.dir, f".{name}_{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(repr(time.time()))
    os.rename(tmp, os.path.join(a.dir, f"{name}_{rank}"))


def on_stop(signum, frame):
    mark("term")
    os._exit(143)


signal.signal(signal.SIGTERM, on_stop)
signal.signal(signal.SIGINT, on_stop)
with open(os.path.join(a.dir, f"pid_{rank}"), "w") as f:
    f.write(str(os.getpid()))
mark("start")
sleep = a.sleep
for spec in a.sleep_rank:
    r, s = spec.split("=")
    if int(r) == rank:
        sleep = float(s)
if a.fail and int(a.fail.split("=", 1)[0]) == rank:
    while not os.path.exists(a.fail.split("=", 1)[1]):
        time.sleep(0.01)
    sys.exit(3)
end = time.monotonic() + sleep
while a.until and not os.path.exists(a.until) and time.monotonic() < end:
    time.sleep(0.05)
time.sleep(0 if a.until else sleep)
mark("end")
sys.exit(0)
