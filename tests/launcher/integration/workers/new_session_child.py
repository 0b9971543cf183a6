"""A worker whose child leaves its process group for a session of its own (as a daemon, or
Popen(start_new_session=True), does); records both pids: DIR/w_<rank>, DIR/gc_<rank>.
With a second argument "exit" the worker then exits 0 (else it sleeps)."""
import os
import subprocess
import sys
import time

d, rank = sys.argv[1], os.environ["RANK"]
child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
for name, pid in ((f"gc_{rank}", child.pid), (f"w_{rank}", os.getpid())):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(str(pid))
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
if sys.argv[2:] != ["exit"]:
    time.sleep(1000)
