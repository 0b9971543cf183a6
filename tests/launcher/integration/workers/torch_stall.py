"""A 4-rank gloo training loop in which one rank stalls (tests of every rank's stack,
test_stacks.py): torch_stall.py OUTDIR MODE [SECONDS]

  stall S   at step 3 rank 2 sleeps S seconds inside slow_data(), while the others wait in
            all_reduce; then the job finishes (exit 0)
  raise     at step 3 rank 1 raises ValueError once the others wait in all_reduce
  skip      at step 3 rank 1 skips the all_reduce and exits 0 (os._exit) once the others wait in
            it (their all_reduce then fails as its connections close)

Markers in OUTDIR: waiting_<rank> just before a rank enters step 3's all_reduce, stalled_2 /
raising_1 just before rank 2 sleeps / rank 1 raises. Nothing is printed during step 3, so
that --hang-timeout sees no progress there.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

OUT, MODE = sys.argv[1], sys.argv[2]


def mark(name):
    with open(os.path.join(OUT, name), "w") as f:
        f.write(str(os.getpid()))


def slow_data(rank, step):
    if step == 3 and MODE == "stall" and rank == 2:
        mark("stalled_2")
        time.sleep(float(sys.argv[3]))
    if step == 3 and MODE == "raise" and rank == 1:
        while not all(os.path.exists(os.path.join(OUT, f"waiting_{r}")) for r in (0, 2, 3)):
            time.sleep(0.02)
        time.sleep(0.3)  # they are inside all_reduce by now
        mark("raising_1")
        raise ValueError("bad batch at step 3")
    return torch.ones(4) * (rank + 1)


def train_step(rank, step):
    grad = slow_data(rank, step)
    if step == 3 and MODE == "skip" and rank == 1:
        while not all(os.path.exists(os.path.join(OUT, f"waiting_{r}")) for r in (0, 2, 3)):
            time.sleep(0.02)
        sys.stdout.flush()
        os._exit(0)  # (a sys.exit with gloo's group alive sometimes aborts in torch 1.13's teardown)
    if step == 3:
        mark(f"waiting_{rank}")
    dist.all_reduce(grad)
    return grad


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(5):
        grad = train_step(rank, step)
        if step != 3:
            print(f"step {step} sum {grad[0].item()}", flush=True)
    dist.destroy_process_group()


main()
