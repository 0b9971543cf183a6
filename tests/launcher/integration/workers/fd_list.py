"""Writes the descriptors this worker started with to OUTDIR/fds_<RANK>.json as
{fd: what it points to}, then exits 0."""
import json
import os
import sys

fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    except FileNotFoundError:  # the folder listdir itself had open, closed by now
        pass
path = os.path.join(sys.argv[1], f"fds_{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump(fds, f)
os.rename(path + ".tmp", path)
