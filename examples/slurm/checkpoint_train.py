#!/usr/bin/env python3
"""DDP training that survives preemption and time limits on Slurm (see preempt.sbatch).

On SIGUSR1 (sbatch --signal=USR1@SECONDS, or scancel -s USR1) every rank notes it; at the end
of the epoch the ranks agree (one all_reduce: the signal reaches them at slightly different
moments), rank 0 saves a checkpoint and leaves a marker beside it (CHECKPOINT.requeue), and
every rank exits 0. The batch script (preempt.sbatch) sees the marker once the step has ended
and runs `scontrol requeue`: the workers need no Slurm commands, so this works as well in a
container or chroot without them. The requeued job starts again with the same job id and
SLURM_RESTART_COUNT=1 and resumes at the saved epoch. Without a signal it trains to the end.

    srun ddprun --nproc-per-node gpu checkpoint_train.py --epochs 100 --checkpoint ./checkpoint.pt
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

preempted = False


def on_usr1(signum, frame):
    global preempted
    preempted = True


def log0(msg):
    if dist.get_rank() == 0:
        print(msg, flush=True)


def train_epoch(model, opt, rank, epoch, args):
    g = torch.Generator().manual_seed(epoch * 1000 + rank)
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=g)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients here
        opt.step()
    if args.epoch_seconds:
        time.sleep(args.epoch_seconds)
    return loss.item()


def save(path, model, opt, epoch):
    tmp = path + ".tmp"
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)  # a preempted save never leaves a half-written checkpoint


def request_requeue(checkpoint):
    """The marker preempt.sbatch looks for after the step: written by rank 0, after the save."""
    if dist.get_rank() == 0:
        with open(checkpoint + ".requeue", "w") as f:
            f.write(os.environ.get("SLURM_JOB_ID", "") + "\n")
        print(f"requeue requested ({checkpoint}.requeue)", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--steps", type=int, default=20, help="steps per epoch")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epoch-seconds", type=float, default=0, help="extra time per epoch (demonstrations)")
    p.add_argument("--checkpoint", default="./checkpoint.pt")
    p.add_argument("--backend", default="gloo")
    args = p.parse_args()

    signal.signal(signal.SIGUSR1, on_usr1)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"]
    ddp = DDP(model)
    log0(f"run {os.environ.get('SLURM_RESTART_COUNT', '0')}: starting at epoch {start} of {args.epochs}")
    for epoch in range(start, args.epochs):
        loss = train_epoch(ddp, opt, rank, epoch, args)
        log0(f"epoch {epoch} loss {loss:.4f}")
        flag = torch.tensor([1.0 if preempted else 0.0])
        dist.all_reduce(flag)  # any rank signalled: all stop after this same epoch
        if flag.item() > 0:
            if rank == 0:
                save(args.checkpoint, model, opt, epoch + 1)
                print(f"SIGUSR1: saved epoch {epoch + 1} to {args.checkpoint}", flush=True)
                request_requeue(args.checkpoint)
            dist.barrier()  # the checkpoint is on disk before any rank exits
            dist.destroy_process_group()
            return 0
    if rank == 0:
        save(args.checkpoint, model, opt, args.epochs)
        print(f"done: {args.epochs} epochs", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
