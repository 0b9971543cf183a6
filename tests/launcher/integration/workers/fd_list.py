"""Writes the descriptors this worker started with to OUTDIR/fds_<RANK>.json as
{fd: what it points to}, and under "ddprun" those of its parent (ddprun) that are not
close-on-exec, as ddprun holds them while its workers run; then exits 0."""
import json
import os
import sys


def listing(pid, inheritable_only=False):
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if inheritable_only:
                with open(f"/proc/{pid}/fdinfo/{name}") as f:
                    flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
                if flags & os.O_CLOEXEC:
                    continue
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:  # the folder listdir itself had open, closed by now
            pass
    return out


fds = listing("self")
# ddprun's stack bootstrap opens the worker's stack file itself (docs/stacks.md), far above
# the low numbers: not a descriptor the worker started with.
fds = {fd: what for fd, what in fds.items() if not (fd >= 900 and what.endswith("/stacks"))}
fds["ddprun"] = listing(os.getppid(), inheritable_only=True)
path = os.path.join(sys.argv[1], f"fds_{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump(fds, f)
os.rename(path + ".tmp", path)
