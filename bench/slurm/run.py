#!/usr/bin/python3
"""Launch under Slurm: from `srun` start to every worker running, ddprun against torchrun
(torch 1.13, the c10d line pytorch/examples uses) in the same run, on the single-host test
cluster of tests/slurm (3 slurmd, proctrack/cgroup).

    scripts/setup.sh && /usr/bin/python3 bench/slurm/run.py [--reps 5] [--nodes 2 3]

Each sbatch job (one per node count) runs the launchers in turn, REPS times each, as
separate srun steps with 2 workers per node; bench/slurm/stamp.py records when each worker
started. The floor: srun starting the same workers itself, as its tasks (no launcher). Measured per step: srun start -> last worker started ("all running"), and srun
start -> srun returned ("step done"). Medians, and torchrun's time over ddprun's.

  srun:     srun --ntasks-per-node=2 python3 stamp.py DIR                          (the floor)
  ddprun:   srun --ntasks-per-node=1 ddprun --nproc-per-node 2 stamp.py DIR        (no flags)
  torchrun: srun --ntasks-per-node=1 python3 torchrun113.py --nnodes N --nproc_per_node 2 \\
              --rdzv_backend c10d --rdzv_endpoint $HEAD:PORT --rdzv_id $SLURM_JOB_ID.R stamp.py DIR
The torchrun anchor is Debian's torchrun made to start on Python 3.11
(/work/shared/anchors/torchrun113.py, outside this project; --torchrun PATH to change).
"""
import argparse
import os
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "slurm"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "testlib"))
from ports import free_port  # noqa: E402
from slurm_cluster import SlurmCluster, unavailable_reason  # noqa: E402

PYTHON = "/usr/bin/python3"


def job_script(nodes, reps, ddprun, torchrun, stamp, outdir):
    lines = ["#!/bin/bash", f"export PYTHON_EXEC={PYTHON} OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1",
             'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)']
    for r in range(reps):
        order = ["srun", "ddprun", "torchrun"] if r % 2 == 0 else ["torchrun", "ddprun", "srun"]
        for launcher in order:
            if launcher == "torchrun" and not torchrun:
                continue
            d = f"{outdir}/{launcher}-{r}"
            per_node = 1
            if launcher == "srun":
                cmd, per_node = f"{PYTHON} {stamp} {d}", 2
            elif launcher == "ddprun":
                cmd = f"{shlex.quote(ddprun)} --nproc-per-node 2 {stamp} {d}"
            else:
                cmd = (f"{PYTHON} {shlex.quote(torchrun)} --nnodes {nodes} --nproc_per_node 2 --rdzv_backend c10d "
                       f"--rdzv_endpoint $HEAD:{free_port()} --rdzv_id $SLURM_JOB_ID.{r} {stamp} {d}")
            lines += [f"mkdir -p {d}", f"date +%s.%N > {d}.start",
                      f"srun -n {nodes * per_node} --ntasks-per-node={per_node} {cmd} > {d}.log 2>&1; echo $? > {d}.rc",
                      f"date +%s.%N > {d}.end"]
    return "\n".join(lines) + "\n"


def read_float(path):
    with open(path) as f:
        return float(f.read().split()[0])


def measure(cluster, nodes, reps, ddprun, torchrun):
    outdir = cluster.job_dir(f"bench{nodes}")
    script = job_script(nodes, reps, ddprun, torchrun, os.path.join(HERE, "stamp.py"), outdir)
    job = cluster.sbatch(script, f"-N{nodes}", "--ntasks-per-node=2", name=f"bench{nodes}")
    info = cluster.wait(job, 60 + reps * 60 * nodes)
    if info["JobState"] != "COMPLETED":
        sys.exit(f"benchmark job {job} ended {info['JobState']}: see {outdir}")
    results = {}
    for launcher in ("srun", "ddprun", "torchrun"):
        running, done = [], []
        for r in range(reps):
            d = f"{outdir}/{launcher}-{r}"
            if not os.path.exists(d + ".rc"):
                continue
            with open(d + ".rc") as f:
                rc = f.read().strip()
            stamps = [read_float(os.path.join(d, f)) for f in os.listdir(d)]
            if rc != "0" or len(stamps) != 2 * nodes:
                sys.exit(f"{launcher} run {r} on {nodes} nodes: exit {rc}, {len(stamps)} workers; see {d}.log")
            t0 = read_float(d + ".start")
            running.append(max(stamps) - t0)
            done.append(read_float(d + ".end") - t0)
        if running:
            results[launcher] = (statistics.median(running), statistics.median(done), running, done)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--ddprun", default=os.path.join(SOURCE, "build", "bin", "ddprun"))
    ap.add_argument("--torchrun", default="/work/shared/anchors/torchrun113.py")
    args = ap.parse_args()
    why = unavailable_reason()
    if why:
        sys.exit(f"cannot start the test cluster: {why}")
    torchrun = args.torchrun if os.path.exists(args.torchrun) else None
    if not torchrun:
        print(f"no torchrun anchor at {args.torchrun}: measuring ddprun alone", file=sys.stderr)
    cluster = SlurmCluster(nodes=max(args.nodes))
    cluster.start()
    try:
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.reps} runs each, medians; "
              f"load average {os.getloadavg()[0]:.2f}\n")
        print("| nodes x workers | srun alone: srun to all running | ddprun | torchrun c10d | torchrun/ddprun "
              "| ddprun: srun to step done | torchrun | torchrun/ddprun |")
        print("|---|---|---|---|---|---|---|---|")
        for n in args.nodes:
            res = measure(cluster, n, args.reps, args.ddprun, torchrun)
            d = res["ddprun"]
            t = res.get("torchrun")
            fmt = lambda s: f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"  # noqa: E731
            ratio = lambda a, b: f"{a / b:.1f}x" if b > 0 else "-"  # noqa: E731
            print(f"| {n} x 2 | {fmt(res['srun'][0])} | {fmt(d[0])} | {fmt(t[0]) if t else '-'} "
                  f"| {ratio(t[0], d[0]) if t else '-'} "
                  f"| {fmt(d[1])} | {fmt(t[1]) if t else '-'} | {ratio(t[1], d[1]) if t else '-'} |", flush=True)
            for name, r in res.items():
                print(f"  {name} {n} nodes, all running: " + " ".join(f"{x:.3f}" for x in r[2]) +
                      "; step done: " + " ".join(f"{x:.3f}" for x in r[3]), file=sys.stderr)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
