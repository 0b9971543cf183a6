"""A real PyTorch job: init_process_group(gloo, env://) and an all_reduce of the ranks."""
import os
import sys

import torch
import torch.distributed as dist

if os.environ.get("RANK") == "0":
    print(f"torch {torch.__version__}", flush=True)
    print(f"agent store {os.environ['TORCHELASTIC_USE_AGENT_STORE']} at port {os.environ['MASTER_PORT']}", flush=True)
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
world = dist.get_world_size()
expect = world * (world + 1) / 2
with open(os.path.join(sys.argv[1], f"sum_{dist.get_rank()}"), "w") as f:
    f.write(f"{t.item()} {expect}\n")
dist.barrier()
dist.destroy_process_group()
# os._exit skips the interpreter's finalization, where torch 2.6 can abort a finished rank
# ("terminate called without an active exception"; tests/integration/workers/elastic_train.py):
# these tests are about the launcher.
sys.stdout.flush()
os._exit(0 if t.item() == expect else 5)
