#!/usr/bin/env python3
"""An elastic DistributedDataParallel job (gloo) in torchelastic's style: it resumes from
its checkpoint whenever it is (re)started, at whatever world size the round has.

usage: elastic_train.py --checkpoint PATH --record DIR [--epochs N] [--epoch-seconds S]

Rank 0 saves {"epoch", "model", "optimizer"} after every epoch (write, then rename). Every
rank appends JSON lines to DIR/train_<pid>.jsonl:
  {"event": "start", "rank", "world", "resume_epoch", "restart_count", "master", "t"}
  {"event": "epoch", "rank", "world", "epoch", "loss", "t"}   after the epoch's all-reduce
  {"event": "saved", "rank", "world", "epoch", "t"}           rank 0, once the checkpoint holds it
  {"event": "done", "rank", "world", "t"}
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset(n, dim):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, dim, generator=g)
    y = torch.tanh(x @ torch.randn(dim, 1, generator=g))
    return TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--epoch-seconds", type=float, default=0.8, help="minimum length of an epoch")
    a = p.parse_args()

    rec_path = os.path.join(a.record, f"train_{os.getpid()}.jsonl")

    def record(**kw):
        kw["t"] = time.time()
        with open(rec_path, "a") as f:
            f.write(json.dumps(kw) + "\n")

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if os.path.exists(a.checkpoint):
        ck = torch.load(a.checkpoint)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start = ck["epoch"] + 1
    record(event="start", rank=rank, world=world, resume_epoch=start,
           restart_count=int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
           master=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    ddp = DDP(model)
    data = dataset(512, 8)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    loss_fn = nn.MSELoss()
    for epoch in range(start, a.epochs):
        t0 = time.time()
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(x), float(len(x))])
        time.sleep(max(0.0, a.epoch_seconds - (time.time() - t0)))
        dist.all_reduce(total)
        record(event="epoch", rank=rank, world=world, epoch=epoch, loss=(total[0] / total[1]).item())
        if rank == 0:
            tmp = a.checkpoint + ".tmp"
            torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
            os.rename(tmp, a.checkpoint)
            record(event="saved", rank=rank, world=world, epoch=epoch)
        dist.barrier()
    record(event="done", rank=rank, world=world)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    rc = main()
    # Skips the interpreter's finalization: torch's exit race (tests/testlib/torch_runtime.py,
    # TORCH_EXIT_ABORT) can abort a rank there after its work is done, and these tests are
    # about the rendezvous, not torch's exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
