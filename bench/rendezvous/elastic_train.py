#!/usr/bin/python3
"""An elastic data-parallel worker for the host-loss benchmark: gloo, a small linear model,
a checkpoint rank 0 writes every few steps and every worker resumes from. Rank 0 appends one
JSON line per finished step: {"event": "step", "step", "world", "round", "time"}."""
import argparse, json, os, time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--log", required=True)
ap.add_argument("--ckpt", required=True)
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--step-time", type=float, default=0.0)
a = ap.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
if os.path.exists(a.ckpt):
    state = torch.load(a.ckpt)
    model.load_state_dict(state["model"])
    step = state["step"]
x = torch.randn(32, 64)
y = x.sum(dim=1, keepdim=True)


def log(**rec):
    if rank == 0:
        rec.update(world=world, round=os.environ.get("TORCHELASTIC_RESTART_COUNT"), time=time.time())
        with open(a.log, "a") as f:
            f.write(json.dumps(rec) + "\n")


log(event="start", step=step)
while step < a.steps:
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    step += 1
    log(event="step", step=step)
    if rank == 0 and step % 5 == 0:
        tmp = a.ckpt + ".tmp"
        torch.save({"model": model.state_dict(), "step": step}, tmp)
        os.replace(tmp, a.ckpt)
    if a.step_time:
        time.sleep(a.step_time)
dist.destroy_process_group()
