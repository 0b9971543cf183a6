#!/usr/bin/env python3
"""A small DistributedDataParallel training loop, launched by ddprun (or torchrun).

    build/bin/ddprun --standalone --nproc-per-node 4 examples/pytorch/train.py --epochs 5

Each rank trains a tiny MLP on its shard of a synthetic regression set
(DistributedSampler, reshuffled every epoch with set_epoch). Rank 0 prints the loss
averaged over all ranks and saves a checkpoint; finally every rank checks that its
parameters equal rank 0's, which DDP's gradient all-reduce guarantees.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_dataset(n: int, dim: int) -> TensorDataset:
    # The same data on every rank: a fixed generator, not the global seed.
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, 1, generator=g)
    y = 2.0 * torch.tanh(x @ w / dim ** 0.5) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def log0(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--checkpoint", default="./checkpoint.pt", help="written by rank 0 after training")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--debug", action="store_true", help="print the launcher environment of every rank")
    args = parser.parse_args()

    t0 = time.time()
    dist.init_process_group(args.backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.debug:
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID")
        print(f"rank {rank} env: " + " ".join(f"{k}={os.environ.get(k, '')}" for k in keys)
              + f" torch={torch.__version__}", flush=True)

    torch.manual_seed(0)  # DDP broadcasts rank 0's initial parameters anyway
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp_model = DDP(model)
    data = synthetic_dataset(args.samples, 8)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()
    log0(f"training on {world} ranks: {len(data)} samples, {len(loader)} batches per rank per epoch")

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        ddp_model.train()
        total = torch.zeros(2)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(ddp_model(x), y)
            loss.backward()  # DDP averages the gradients over all ranks here
            opt.step()
            total += torch.tensor([loss.item() * len(x), float(len(x))])
        dist.all_reduce(total)
        log0(f"epoch {epoch} loss {(total[0] / total[1]).item():.6f}")

    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
        torch.save({"epoch": args.epochs, "model": model.state_dict(), "optimizer": opt.state_dict()},
                   args.checkpoint)
        print(f"saved checkpoint to {args.checkpoint}", flush=True)
    dist.barrier()

    # Every rank compares its parameters with rank 0's.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    mismatch = torch.tensor([0.0 if torch.equal(flat, ref) else 1.0])
    dist.all_reduce(mismatch)
    if mismatch.item() != 0:
        print(f"rank {rank}: parameters differ from rank 0's (max diff {(flat - ref).abs().max().item():g})",
              file=sys.stderr, flush=True)
        return 1
    log0(f"parameters identical on all {world} ranks; done in {time.time() - t0:.1f} s")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
