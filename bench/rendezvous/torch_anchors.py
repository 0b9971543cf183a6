#!/usr/bin/python3
"""Rendezvous benchmarks (issue 14): N agents on this machine, started at once, each with
one worker running `true`; wall time from the first start until every agent has exited.

  /usr/bin/python3 bench/rendezvous/torch_anchors.py [--quick] [--agents 2 4] [--no-torch2] [--json out.json]

Cases, each for ddprun and its anchors torchrun 1.13 (../shared/anchors/torchrun113.py)
and torchrun 2.6 (Debian 13's, in the chroot of scripts/torch2-chroot.sh):
  c10d    --nnodes=N --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:PORT --rdzv_id=ID
          (no is_host: the first ddprun agent to bind the port hosts the store, the others join)
  static  --nnodes=N --node_rank=i --master_addr=127.0.0.1 --master_port=PORT
The torchrun 2.6 part runs inside the chroot (this file again, with --torch2-part, through
tests/torch2/python3), ddprun measured there too, so that nobody pays for entering it.
Prints a markdown table of medians and ratios.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
from ports import free_port  # noqa: E402
DDPRUN = os.path.join(ROOT, "build", "bin", "ddprun")
TORCHRUN113 = os.path.join(ROOT, "..", "shared", "anchors", "torchrun113.py")
TORCH2_PY = os.path.join(ROOT, "tests", "torch2", "python3")
CHROOT = os.path.join(ROOT, "scripts", "torch2-chroot.sh")
AGENT_TIMEOUT = 120


def agent_argv(launcher, case, n, i, port, run_id):
    """torchrun's underscore spellings: torchrun 1.13 knows no others (ddprun and 2.6 take both)."""
    if case == "c10d":
        rdzv = [f"--nnodes={n}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}"]
    else:
        rdzv = [f"--nnodes={n}", f"--node_rank={i}", "--master_addr=127.0.0.1", f"--master_port={port}"]
    return launcher + rdzv + ["--nproc_per_node=1", "--no_python", "true"]


def one_run(launcher, case, n, env):
    """Seconds until all n agents exited, and their exit codes; stderr of a failed agent."""
    port, run_id = free_port(), uuid.uuid4().hex[:12]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(agent_argv(launcher, case, n, i, port, run_id), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for i in range(n)]
    errs = [p.communicate(timeout=AGENT_TIMEOUT)[1] for p in procs]
    dt = time.perf_counter() - t0
    rcs = [p.returncode for p in procs]
    return dt, rcs, next((e for e, rc in zip(errs, rcs) if rc != 0), "")


def measure(launcher, case, n, reps, env):
    """{'median_s', 'runs'} or {'unsupported': first error line} / {'failed': ...}."""
    times = []
    for _ in range(reps):
        dt, rcs, err = one_run(launcher, case, n, env)
        if any(rcs):
            line = next((l for l in err.splitlines() if "error" in l.lower()), err.strip()[-300:])
            if "not supported yet" in err:
                return {"unsupported": line.strip()}
            return {"failed": f"exit codes {rcs}: {line.strip()}"}
        times.append(dt)
    return {"median_s": statistics.median(times), "runs": times}


def part(launchers, cases, agents, reps):
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
    res = {}
    for case in cases:
        for n in agents:
            for name, launcher in launchers.items():
                res[f"{name}/{case}/{n}"] = measure(launcher, case, n, reps, env)
    return res


def torch2_part(cases, agents, reps):
    import torch
    out = part({"ddprun": [DDPRUN], "torchrun2": [sys.executable, "-m", "torch.distributed.run"]},
               cases, agents, reps)
    out["torch"] = torch.__version__
    print(json.dumps(out), flush=True)


def run_torch2_part(cases, agents, reps):
    if os.geteuid() != 0:
        return None, "the torch 2.6 chroot needs root"
    st = subprocess.run([CHROOT, "status"], capture_output=True, text=True)
    if st.returncode != 0:
        return None, f"{st.stdout.strip()}: run {CHROOT}"
    argv = [TORCH2_PY, os.path.abspath(__file__), "--torch2-part", "--reps", str(reps), "--cases", *cases,
            "--agents", *map(str, agents)]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"the chroot part failed ({r.returncode}): {r.stderr.strip()[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def cell(m):
    if "median_s" in m:
        return f"{m['median_s']:.2f} s"
    return "not supported yet" if "unsupported" in m else "FAILED"


def ratio(anchor, ddp):
    if "median_s" not in anchor or "median_s" not in ddp:
        return ""
    return f"{anchor['median_s'] / ddp['median_s']:.0f}x"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 repetitions instead of 5")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--agents", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--cases", nargs="+", default=["c10d", "static"], choices=["c10d", "static"])
    ap.add_argument("--no-torch2", action="store_true")
    ap.add_argument("--torch2-part", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    a = ap.parse_args()
    reps = a.reps or (3 if a.quick else 5)
    if a.torch2_part:
        return torch2_part(a.cases, a.agents, reps)
    host = part({"ddprun": [DDPRUN], "torchrun113": ["/usr/bin/python3", TORCHRUN113]}, a.cases, a.agents, reps)
    t2, why_not = (None, "--no-torch2") if a.no_torch2 else run_torch2_part(a.cases, a.agents, reps)
    if a.json:
        json.dump({"host": host, "torch2": t2}, open(a.json, "w"), indent=2)
    print(f"| case (medians of {reps}) | ddprun | torchrun 1.13 | torchrun 1.13 / ddprun "
          f"| ddprun in the chroot | torchrun {t2['torch'] if t2 else '2.6'} (chroot) | torchrun 2.6 / ddprun |")
    print("|---|---|---|---|---|---|---|")
    for case in a.cases:
        for n in a.agents:
            k = f"{{}}/{case}/{n}"
            d, t1 = host[k.format("ddprun")], host[k.format("torchrun113")]
            row = f"| {case}, {n} agents | {cell(d)} | {cell(t1)} | {ratio(t1, d)} |"
            if t2:
                d2, tt = t2[k.format("ddprun")], t2[k.format("torchrun2")]
                row += f" {cell(d2)} | {cell(tt)} | {ratio(tt, d2)} |"
            else:
                row += " | | |"
            print(row)
    problems = {k: v for k, v in list(host.items()) + list((t2 or {}).items())
                if isinstance(v, dict) and "median_s" not in v}
    for k, v in problems.items():
        print(f"\n{k}: {v}")
    if not t2:
        print(f"\n(no torchrun 2.6 anchor: {why_not})")
    print(f"\n{os.cpu_count()} cores; {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")


if __name__ == "__main__":
    main()
