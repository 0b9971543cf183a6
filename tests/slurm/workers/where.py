#!/usr/bin/python3
"""Records where a rank runs, then joins a gloo group. usage:
    where.py OUTDIR [--wait-for DIR N] [--train TRAIN_ARGS...]

Writes OUTDIR/where_<rank>.json (rank, local rank, world size, host name, Slurm node name,
MASTER_ADDR/PORT, run id). With --wait-for, first writes DIR/<job>_<rank> and waits until DIR
holds N files (jobs meant to overlap in time hold their stores open together). Then either
runs examples/pytorch/train.py with TRAIN_ARGS (--train), or checks one all_reduce.
"""
import json
import os
import runpy
import socket
import sys
import time

out = sys.argv[1]
args = sys.argv[2:]
rank = int(os.environ["RANK"])
rec = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                      "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURMD_NODENAME", "SLURM_JOB_ID")}
rec["hostname"] = socket.gethostname()
with open(os.path.join(out, f"where_{rank}.json.tmp"), "w") as f:
    json.dump(rec, f)
os.replace(os.path.join(out, f"where_{rank}.json.tmp"), os.path.join(out, f"where_{rank}.json"))


def finish(status):
    """Exits skipping the interpreter's finalization, as tests/integration/workers/elastic_train.py
    does: torch's exit race (tests/testlib/torch_runtime.py, TORCH_EXIT_ABORT) can abort a rank
    there after its work is done, and these tests are about where ranks run, not about that."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if args[:1] == ["--wait-for"]:
    d, n = args[1], int(args[2])
    args = args[3:]
    open(os.path.join(d, f"{os.environ.get('SLURM_JOB_ID')}_{rank}"), "w").close()
    deadline = time.time() + 120
    while len(os.listdir(d)) < n and time.time() < deadline:
        time.sleep(0.05)

if args[:1] == ["--train"]:
    train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "pytorch", "train.py")
    sys.argv = [train] + args[1:]
    try:
        runpy.run_path(train, run_name="__main__")
        status = 0
    except SystemExit as e:  # train.py's status, as the interpreter would turn it into one
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    finish(status)
else:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    world = dist.get_world_size()
    assert t.item() == world * (world - 1) / 2, t
    dist.destroy_process_group()
    print(f"rank {rank} on {rec['hostname']}: all_reduce ok", flush=True)
    finish(0)
