"""Test worker: joins the process group, then rank --kill-rank SIGKILLs itself after
--delay seconds (printing the time first); the others sleep long."""
import argparse
import os
import signal
import time

import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--kill-rank", type=int, default=3)
p.add_argument("--delay", type=float, default=1.0)
args = p.parse_args()
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
dist.barrier()
if rank == args.kill_rank:
    time.sleep(args.delay)
    print(f"KILLING rank {rank} at {time.time():.3f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(300)  # ddprun stops us once the killed rank is gone
