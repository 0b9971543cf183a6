"""A worker for the dynamic rendezvous tests: records when it started and its environment,
then sleeps, and may fail.

usage: rdzv_env.py DIR [--sleep S] [--sleep-at-world W=S ...] [--fail-rank R] [--fail-code N]
                       [--fail-after S] [--fail-restarts K,K..] [--fail-when FILE]
                       [--term-delay S] [--short-if FILE=S] [--until FILE]

Writes DIR/start_<pid>.json at once: {"t": time.time(), "pid", "env": the whole environment,
"store_reachable": whether MASTER_ADDR:MASTER_PORT accepts a connection}. A round is told
apart by its MASTER_PORT (fresh every round).
Then sleeps S seconds (or the S given for its WORLD_SIZE) and exits 0; the rank --fail-rank
instead exits --fail-code after --fail-after seconds, only on the restart counts listed in
--fail-restarts (default: every one), and only once --fail-when FILE exists (when given).
Writes DIR/end_<pid> when it exits normally. --term-delay: a SIGTERM is printed ("rank R got
SIGTERM") and obeyed S seconds later (exit 143). --short-if: a worker that starts when FILE
exists sleeps S seconds instead. --until: the sleep ends early once FILE exists (the test's
checks are over).
"""
import argparse
import json
import os
import signal
import socket
import sys
import time

t0 = time.time()
p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--sleep-at-world", action="append", default=[])
p.add_argument("--sleep-at-restart", action="append", default=[])  # RESTART_COUNT=SECONDS
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--fail-code", type=int, default=3)
p.add_argument("--fail-after", type=float, default=0.3)
p.add_argument("--fail-restarts", default="")
p.add_argument("--fail-when", default="")
p.add_argument("--term-delay", type=float, default=None)
p.add_argument("--short-if", default="")
p.add_argument("--until", default="")
a = p.parse_args()

env = dict(os.environ)
try:
    socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), timeout=5).close()
    reachable = True
except (OSError, KeyError, ValueError):
    reachable = False
pid = os.getpid()
tmp = os.path.join(a.dir, f".start_{pid}.tmp")
with open(tmp, "w") as f:
    json.dump({"t": t0, "pid": pid, "env": env, "store_reachable": reachable}, f)
os.rename(tmp, os.path.join(a.dir, f"start_{pid}.json"))

rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
if a.term_delay is not None:
    def on_term(signum, frame):
        print(f"rank {rank} got SIGTERM", flush=True)
        time.sleep(a.term_delay)
        os._exit(143)
    signal.signal(signal.SIGTERM, on_term)
restarts = int(env["TORCHELASTIC_RESTART_COUNT"])
fails = rank == a.fail_rank and (not a.fail_restarts or restarts in {int(k) for k in a.fail_restarts.split(",")})
if fails:
    deadline = time.time() + 60
    while a.fail_when and not os.path.exists(a.fail_when) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(a.fail_after)
    print(f"rank {rank} fails with exit code {a.fail_code} (restart count {restarts})", flush=True)
    sys.stdout.flush()
    os._exit(a.fail_code)
sleep = a.sleep
for spec in a.sleep_at_world:
    w, s = spec.split("=")
    if int(w) == world:
        sleep = float(s)
for spec in a.sleep_at_restart:
    r, s = spec.split("=")
    if int(r) == restarts:
        sleep = float(s)
if a.short_if and os.path.exists(a.short_if.split("=")[0]):
    sleep = float(a.short_if.split("=")[1])
end = time.monotonic() + sleep
while time.monotonic() < end and not (a.until and os.path.exists(a.until)):
    time.sleep(min(0.05, max(0.0, end - time.monotonic())) if a.until else max(0.0, end - time.monotonic()))
open(os.path.join(a.dir, f"end_{pid}"), "w").close()
