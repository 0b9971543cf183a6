"""A rank that arms torchelastic's file timer (TORCHELASTIC_ENABLE_FILE_TIMER) through torch's
own FileTimerClient.

usage: file_timer.py DIR MODE [RANK]: only RANK (default 0) does MODE, the others sleep 300 s
unless MODE is ok; every rank writes DIR/pid_<rank> first.
  hang   arms a 1 s timer ('train_step'), then sleeps 300 s
  ok     arms a 30 s timer, releases it at once, exits 0 (every rank)
  term   as hang, but the timer asks for SIGTERM, which the rank handles: it writes
         DIR/term_<rank> and exits 7
"""
import os
import signal
import sys
import time

import torch.distributed.elastic.timer as timer

d, mode = sys.argv[1], sys.argv[2]
chosen = int(sys.argv[3]) if len(sys.argv) > 3 else 0
rank = int(os.environ["RANK"])
with open(os.path.join(d, f"pid_{rank}"), "w") as f:
    f.write(str(os.getpid()))
if mode == "ok":
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with timer.expires(after=30, scope="quick"):
        pass
    sys.exit(0)
if rank != chosen:
    time.sleep(300)
    sys.exit(0)
if mode == "term":
    def on_term(signum, frame):
        open(os.path.join(d, f"term_{rank}"), "w").close()
        os._exit(7)
    signal.signal(signal.SIGTERM, on_term)
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=signal.SIGTERM))
else:
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
if os.environ.get("DDP_TIMER_ARMED"):  # (bench/launcher/file_timer.py: when it was armed)
    with open(os.environ["DDP_TIMER_ARMED"], "w") as f:
        f.write(repr(time.time()))
with timer.expires(after=1, scope="train_step"):
    time.sleep(300)
