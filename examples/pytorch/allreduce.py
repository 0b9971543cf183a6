#!/usr/bin/env python3
"""All-reduce of each rank's number, launched by ddprun (or torchrun).

    build/bin/ddprun --standalone --nproc-per-node 4 examples/pytorch/allreduce.py

Every rank contributes a tensor filled with its rank; after all_reduce(SUM) every
rank holds 0 + 1 + ... + (world_size - 1), which each rank checks and rank 0 prints.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gloo", help="process group backend (default: gloo)")
    parser.add_argument("--size", type=int, default=4, help="number of elements in the tensor")
    parser.add_argument("--debug", action="store_true", help="print the launcher environment of every rank")
    args = parser.parse_args()

    # MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE come from the launcher. With
    # TORCHELASTIC_USE_AGENT_STORE=True, torch connects to the launcher's store as a client.
    dist.init_process_group(args.backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.debug:
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID")
        print(f"rank {rank} env: " + " ".join(f"{k}={os.environ.get(k, '')}" for k in keys)
              + f" torch={torch.__version__}", flush=True)

    t = torch.full((args.size,), float(rank))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    expected = float(world * (world - 1) // 2)
    assert torch.all(t == expected), f"rank {rank}: all_reduce gave {t.tolist()}, expected {expected}"
    if rank == 0:
        print(f"all_reduce over {world} ranks: sum = {t[0].item():g} (expected {expected:g})", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
