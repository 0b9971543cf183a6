"""Test worker: joins the process group, then rank --fail-rank raises; the others wait."""
import argparse
import os
import time

import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--fail-rank", type=int, default=1)
args = p.parse_args()
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
dist.barrier()
if rank == args.fail_rank:
    time.sleep(0.5)
    raise RuntimeError(f"deliberate failure on rank {rank} (pid {os.getpid()})")
time.sleep(300)  # ddprun stops us once the failing rank is gone
