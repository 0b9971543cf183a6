"""Writes this worker's environment (and argv) as JSON to <outdir>/env_<RANK>.json, and
whether something accepts connections at MASTER_ADDR:MASTER_PORT (the agent's store)."""
import json
import os
import socket
import sys

out = sys.argv[1]
try:
    socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=30).close()
    reachable = True
except OSError:
    reachable = False
data = {"env": dict(os.environ), "argv": sys.argv, "pid": os.getpid(), "store_reachable": reachable}
tmp = os.path.join(out, f".env_{os.environ['RANK']}.tmp")
with open(tmp, "w") as f:
    json.dump(data, f)
os.rename(tmp, os.path.join(out, f"env_{os.environ['RANK']}.json"))
