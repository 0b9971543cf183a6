"""A worker that exits 0 leaving an "upload" running in a session of its own
(Popen(start_new_session=True)), as a checkpoint uploader would. usage:
    leaves_uploader.py DIR (clean|deaf) [wait]
clean: the upload ends on SIGTERM, writing DIR/cleaned_<rank> first; deaf: it ignores
SIGTERM. Its pid is in DIR/up_<rank>. With "wait" the worker then sleeps (until stopped)."""
import os
import subprocess
import sys
import time

d, how, rank = sys.argv[1], sys.argv[2], os.environ["RANK"]
code = ("import os, signal, sys, time\n"
        "def term(*_):\n"
        "    open(os.path.join(sys.argv[1], 'cleaned_' + sys.argv[2]), 'w').close()\n"
        "    os._exit(0)\n"
        "signal.signal(signal.SIGTERM, term if sys.argv[3] == 'clean' else signal.SIG_IGN)\n"
        "open(os.path.join(sys.argv[1], 'ready_' + sys.argv[2]), 'w').close()\n"
        "time.sleep(1000)\n")
up = subprocess.Popen([sys.executable, "-c", code, d, rank, how], start_new_session=True)
with open(os.path.join(d, f"up_{rank}.tmp"), "w") as f:
    f.write(str(up.pid))
os.rename(os.path.join(d, f"up_{rank}.tmp"), os.path.join(d, f"up_{rank}"))
while not os.path.exists(os.path.join(d, f"ready_{rank}")):  # its handler is in place
    pass
if sys.argv[3:] == ["wait"]:
    time.sleep(1000)
