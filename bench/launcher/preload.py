#!/usr/bin/python3
"""Warm workers, `ddprun --preload torch` (issue 22), each beside its anchor measured in the same run.

  /usr/bin/python3 bench/launcher/preload.py [--runs 7] [--torch2-runs 3] [--mem-runs 3] [--loss-runs 3]
                                             [--parts launch,restart,memory,hostloss] [--no-torch2] [--json out.json]

Every part runs its variants interleaved, one of each per round, their order rotated from
round to round, so the drift of this noisy machine hits them alike. Medians.

1. launch: from just before starting the launcher to every worker past `import torch` (the
   latest of the time.time() stamps each rank writes right after the import), 4 and 8
   workers: ddprun cold (`python -u script` per worker), ddprun --preload torch, and in the
   torch 2.6 chroot (scripts/torch2-chroot.sh) ddprun cold, ddprun --preload torch and
   torchrun 2.6 (`python3 -m torch.distributed.run --standalone`). Anchor: one `python3 -u
   script` process (the same script, no launcher) to past its import, per torch version.
   The torch 2.6 launchers are started inside the chroot (one `torch2-chroot.sh exec` each,
   like the anchor's tests/torch2/python3), so every torch 2.6 line pays one entry (~50 ms)
   and no worker pays its own. The torch 2.6 lines (anchor included) run in the first
   --torch2-runs rounds only (they are the slow ones).
2. restart: `--max-restarts 1`, 4 workers; in attempt 0 every rank writes a ready file after
   `import torch`, rank 0 waits for all four and one second more, writes a stamp and exits 1
   (the others sleep);
   in attempt 1 every rank writes a stamp after `import torch` and exits 0. Measured: the
   latest attempt-1 stamp minus the failure stamp, and, from ddprun's `--log-level debug`
   line of rank 0's exit (millisecond stamps), how much of it was rank 0's own exit (Python's
   finalization with torch loaded) and how much ddprun's restart. ddprun cold against
   --preload (torch 1.13), and --preload with rank 0 ending at once (`os._exit(1)`, as a crash
   would), with and without the stacks ddprun gathers at a failure (`--no-stack-dumps`).
3. memory: 4 workers that write their pid after `import torch` and sleep; the sum of the
   workers' Pss (/proc/PID/smaps_rollup, shared pages divided among their sharers) cold
   against --preload (with --max-restarts 1), the warm process's own Pss (its pid from
   ddprun's info line) and that of the spare workers it keeps ready for a restart.
   Pss_Anon (the heap: shared only by the warm process and its workers) is split from
   Pss_File (mapped files, libtorch's code: shared with every process on the machine that
   maps them, other jobs' too, so it moves with what else runs).
4. hostloss: bench/rendezvous/run.py's host loss (two ddprun agents of 2 gloo workers each,
   bench/rendezvous/elastic_train.py, `--rdzv-backend c10d --nnodes 1:2 --max-restarts 3
   --rdzv-conf last_call_timeout=1`; SIGKILL to the process group of one agent, by the pid
   this script started) to the survivor's first finished step at world size 2, cold against
   --preload; also from the kill to the survivor's attempt-1 workers started (its debug log).

Prints markdown tables of medians and ratios, then one JSON line of the medians and every run.
"""
import argparse, atexit, json, os, re, shutil, signal, statistics, subprocess, tempfile, time
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rendezvous"))
# The rendezvous bench's paths, its launcher environment and its host-loss measure, shared.
from run import DDPRUN, ENV, PY, ROOT, TRAIN, free_port, wait_for_line, workers_restarted  # noqa: E402

TORCH2_PY = os.path.join(ROOT, "tests", "torch2", "python3")
CHROOT = os.path.join(ROOT, "scripts", "torch2-chroot.sh")
NOLIBUV = os.path.join(ROOT, "tests", "torch2", "nolibuv")
# torch 2.6: the launcher inside the chroot, its python3.13 as the workers' interpreter.
ENV2 = dict(ENV, PYTHON_EXEC="/usr/bin/python3", PYTHONPATH=NOLIBUV, DDP_TORCH2_BIND=os.path.join(ROOT, "build"))
ENV2_HOST = dict(ENV, DDP_TORCH2_BIND=os.path.join(ROOT, "build"))  # tests/torch2/python3 adds the shim itself
TMP = "/tmp"  # mounted into the chroot at the same path

LAUNCH_WORKER = r'''import torch
import os, sys, time
t = time.time()
with open(os.path.join(sys.argv[1], "stamp_" + os.environ.get("RANK", "0")), "w") as f:
    f.write(repr(t))
'''

RESTART_WORKER = r'''import torch
import os, sys, time
d, rank = sys.argv[1], os.environ["RANK"]


def stamp(name):
    t = time.time()
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(repr(t))
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))


if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    stamp("ready_" + rank)
    if rank == "0":  # fail once every rank is past its import, and the job ran a second (as
        # a failure in training would: a quiet machine at the failure, spare workers forked)
        while sum(n.startswith("ready_") and not n.endswith(".tmp") for n in os.listdir(d)) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.002)
        time.sleep(1)
        stamp("fail")
        if os.environ.get("HARD_EXIT") == "1":
            os._exit(1)  # the process ends at once (a crash, an OOM kill)
        sys.exit(1)  # Python's own exit: finalization with torch loaded (an uncaught exception's path)
    time.sleep(600)
else:
    stamp("restart_" + rank)
'''

MEM_WORKER = r'''import torch
import os, sys, time
with open(os.path.join(sys.argv[1], "pid_" + os.environ["RANK"] + ".tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(sys.argv[1], "pid_" + os.environ["RANK"] + ".tmp"), os.path.join(sys.argv[1], "pid_" + os.environ["RANK"]))
time.sleep(600)
'''


_SCRIPTS = []


def write(name, text):
    """The worker script `name` in this run's folder (removed at exit)."""
    if not _SCRIPTS:
        _SCRIPTS.append(tempfile.mkdtemp(dir=TMP, prefix="preload-bench-"))
        atexit.register(shutil.rmtree, _SCRIPTS[0], True)
    path = os.path.join(_SCRIPTS[0], name)
    with open(path, "w") as f:
        f.write(text)
    return path


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rounds(n, variants):
    """Yields (round, name, fn) n times over, the variants' order rotated each round."""
    for r in range(n):
        k = r % len(variants)
        for name, fn in variants[k:] + variants[:k]:
            yield r, name, fn


# ------------------------------------------------------------------ 1. launch


TORCH2_KINDS = ("anchor2", "cold2", "preload2", "torchrun2")


def launch_cmd(kind, n, script, d):
    """The command and environment of one launch variant."""
    dd = ["--standalone", "--nproc-per-node", str(n)]
    if kind == "anchor":
        return [PY, "-u", script, d], ENV
    if kind == "cold":
        return [DDPRUN, *dd, script, d], ENV
    if kind == "preload":
        return [DDPRUN, *dd, "--preload", "torch", script, d], ENV
    if kind == "anchor2":
        return [TORCH2_PY, "-u", script, d], ENV2_HOST
    if kind == "cold2":
        return [CHROOT, "exec", DDPRUN, *dd, script, d], ENV2
    if kind == "preload2":
        return [CHROOT, "exec", DDPRUN, *dd, "--preload", "torch", script, d], ENV2
    if kind == "torchrun2":
        return [TORCH2_PY, "-m", "torch.distributed.run", *dd, script, d], ENV2_HOST
    raise ValueError(kind)


def launch_once(kind, n, script):
    """Seconds from starting the launcher (or the one process) to the latest stamp."""
    d = tempfile.mkdtemp(dir=TMP, prefix="preload-bench-")
    cmd, env = launch_cmd(kind, n, script, d)
    t0 = time.time()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
    stamps = [float(open(os.path.join(d, f)).read()) for f in os.listdir(d) if f.startswith("stamp_")]
    want = 1 if kind.startswith("anchor") else n
    if r.returncode != 0 or len(stamps) != want:
        raise SystemExit(f"{kind} x{n}: exit {r.returncode}, {len(stamps)} of {want} stamps; "
                         f"rerun by hand: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    return max(stamps) - t0


def bench_launch(runs, torch2_runs, sizes, torch2):
    script = write("launch_worker.py", LAUNCH_WORKER)
    kinds = ["anchor", "cold", "preload"] + (list(TORCH2_KINDS) if torch2 else [])
    # Warm the page cache (torch's files, the chroot), not counted.
    for kind in kinds:
        if kind != "torchrun2":
            launch_once(kind, 1 if kind.startswith("anchor") else 2, script)
    res = {k: [] for k in ("anchor", "anchor2")}
    variants = []
    for kind in ("anchor", "anchor2"):
        if kind in kinds:
            variants.append((kind, lambda kind=kind: launch_once(kind, 1, script)))
    for n in sizes:
        for kind in kinds:
            if not kind.startswith("anchor"):
                res[f"{kind}_{n}"] = []
                variants.append((f"{kind}_{n}", lambda kind=kind, n=n: launch_once(kind, n, script)))
    for r, name, fn in rounds(runs, variants):
        if name.split("_")[0] in TORCH2_KINDS and r >= torch2_runs:
            continue
        res[name].append(fn())
    return res


# ------------------------------------------------------------------ 2. restart


def log_time(line, near):
    """The epoch time of a ddprun log line's local `HH:MM:SS.mmm` stamp, on the day that puts
    it nearest to `near`."""
    hms, ms = line.split()[1].split(".")
    best = None
    for day_shift in (-1, 0, 1):
        day = time.strftime("%Y-%m-%d ", time.localtime(near + day_shift * 86400))
        t = time.mktime(time.strptime(day + hms, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
        if best is None or abs(t - near) < abs(best - near):
            best = t
    return best


def restart_once(flags, hard, script):
    """From rank 0's failure stamp: (to the latest restarted worker past its import, to ddprun
    seeing rank 0's exit (its log line, millisecond stamps), to the first restarted worker)."""
    d = tempfile.mkdtemp(dir=TMP, prefix="preload-bench-")
    cmd = [DDPRUN, "--standalone", "--nproc-per-node", "4", "--max-restarts", "1", "--log-level", "debug", *flags,
           script, d]
    r = subprocess.run(cmd, env=dict(ENV, HARD_EXIT="1" if hard else "0"), stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    names = os.listdir(d)
    stamps = [float(open(os.path.join(d, f)).read()) for f in names if f.startswith("restart_") and not f.endswith(".tmp")]
    if r.returncode != 0 or len(stamps) != 4 or "fail" not in names:
        raise SystemExit(f"restart: exit {r.returncode}, {len(stamps)} of 4 restart stamps; "
                         f"rerun by hand: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    t_fail = float(open(os.path.join(d, "fail")).read())
    seen = [ln for ln in r.stderr.splitlines() if ln.startswith("[ddprun ") and "exited with code 1" in ln]
    t_seen = log_time(seen[0], t_fail) if seen else float("nan")
    for f in names:
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    return {"total": max(stamps) - t_fail, "exit_seen": t_seen - t_fail,
            "seen_to_first": min(stamps) - t_seen, "seen_to_last": max(stamps) - t_seen}


RESTART_VARIANTS = [  # name, ddprun flags, rank 0 ends at once (os._exit) instead of sys.exit
    ("cold", [], False),
    ("preload", ["--preload", "torch"], False),
    ("preload_hard", ["--preload", "torch"], True),
    ("preload_hard_nostacks", ["--preload", "torch", "--no-stack-dumps"], True),
]


def bench_restart(runs):
    script = write("restart_worker.py", RESTART_WORKER)
    res = {name: [] for name, _, _ in RESTART_VARIANTS}
    variants = [(name, lambda flags=flags, hard=hard: restart_once(flags, hard, script))
                for name, flags, hard in RESTART_VARIANTS]
    for _, name, fn in rounds(runs, variants):
        res[name].append(fn())
    return res


# ------------------------------------------------------------------ 3. memory


MEM_FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Rss")


def mem_kb(pid):
    """/proc/PID/smaps_rollup's MEM_FIELDS, in kB."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in MEM_FIELDS:
                out[k] = int(v.split()[0])
    return out


def children(pid):
    try:
        return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
    except OSError:
        return []


def spares_of(warm):
    """The warm process's descendants: the child between (a cat) and the spare workers."""
    out, todo = [], children(warm)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children(pid)
    return out


def memory_once(preload, script):
    """Pss of the 4 workers (and of the warm process, and of the spares it keeps for a
    restart: --max-restarts 1) once all are past the import."""
    d = tempfile.mkdtemp(dir=TMP, prefix="preload-bench-")
    err = os.path.join(d, "ddprun.err")
    cmd = [DDPRUN, "--standalone", "--nproc-per-node", "4", "--log-level", "info",
           *(["--preload", "torch", "--max-restarts", "1"] if preload else []), script, d]
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=open(err, "w"))
    try:
        deadline = time.monotonic() + 120
        while sum(1 for f in os.listdir(d) if f.startswith("pid_") and not f.endswith(".tmp")) < 4:
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"memory: workers not ready (exit {p.returncode}); rerun by hand: {' '.join(cmd)}\n"
                                 + open(err).read()[-3000:])
            time.sleep(0.02)
        time.sleep(0.5)  # let every worker reach its sleep
        pids = [int(open(os.path.join(d, f"pid_{r}")).read()) for r in range(4)]
        per = [mem_kb(x) for x in pids]
        res = {"workers": {k: sum(m[k] for m in per) for k in MEM_FIELDS}}
        if preload:
            m = re.search(r"--preload: imported torch in ([0-9.]+) s \(warm process pid (\d+)\)", open(err).read())
            if not m:
                raise SystemExit("memory: no --preload info line in ddprun's stderr:\n" + open(err).read()[-3000:])
            res["import_s"] = float(m.group(1))
            warm = int(m.group(2))
            res["warm"] = mem_kb(warm)
            deadline = time.monotonic() + 10
            while len(spares_of(warm)) < 5 and time.monotonic() < deadline:  # a cat and 4 spares
                time.sleep(0.05)
            time.sleep(0.2)
            found = [mem_kb(x) for x in spares_of(warm)]
            if len(found) != 5:
                raise SystemExit(f"memory: {len(found)} processes under the warm process, not a cat and 4 spares")
            res["spares"] = {k: sum(m[k] for m in found) for k in MEM_FIELDS}
        return res
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)


def bench_memory(runs):
    script = write("mem_worker.py", MEM_WORKER)
    res = {"cold": [], "preload": []}
    for _, name, fn in rounds(runs, [("cold", lambda: memory_once(False, script)),
                                     ("preload", lambda: memory_once(True, script))]):
        res[name].append(fn())
    return res


# ------------------------------------------------------------------ 4. host loss
# After bench/rendezvous/run.py (host_loss_once), with the extra ddprun flags of a variant.


def host_loss_once(tmp, flags, last_call):
    """Seconds from SIGKILL of one host to the survivor's first step at world size 2."""
    port = free_port()
    log = os.path.join(tmp, f"loss{port}.jsonl")
    ckpt = os.path.join(tmp, f"loss{port}.pt")
    conf = f"last_call_timeout={last_call},join_timeout=60"
    common = ["--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"loss{port}", *flags]
    args = [TRAIN, "--log", log, "--ckpt", ckpt, "--steps", "1000000", "--step-time", "0.05"]
    keep_log = os.path.join(tmp, f"keep{port}.log")
    keep = subprocess.Popen([DDPRUN, *common, "--log-level", "debug", "--local-addr", "127.0.0.1", "--rdzv-conf",
                             conf + ",is_host=1", *args],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=open(keep_log, "w"))
    lose = subprocess.Popen([DDPRUN, *common, "--local-addr", "127.0.0.2", "--rdzv-conf", conf + ",is_host=0", *args],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_line(log, lambda r: r["event"] == "step" and r["world"] == 4, 120)
        t_kill = time.time()
        os.killpg(lose.pid, signal.SIGKILL)  # the lost host's process group (its ddprun), by the pid started here
        rec = wait_for_line(log, lambda r: r["event"] == "step" and r["world"] == 2 and r["time"] > t_kill, 120)
        return rec["time"] - t_kill, workers_restarted(keep_log, t_kill)
    finally:
        try:
            os.killpg(lose.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        keep.send_signal(signal.SIGTERM)
        keep.wait(timeout=60)
        lose.wait(timeout=60)


def bench_hostloss(runs, last_call):
    res = {"cold": [], "preload": [], "cold_restarted": [], "preload_restarted": []}
    with tempfile.TemporaryDirectory(dir=TMP, prefix="preload-bench-") as tmp:
        for _, name, flags in rounds(runs, [("cold", []), ("preload", ["--preload", "torch"])]):
            loss, restarted = host_loss_once(tmp, flags, last_call)
            res[name].append(loss)
            res[name + "_restarted"].append(restarted)
    return res


# ------------------------------------------------------------------ report


def ddprun_version():
    """`ddprun --version` and the mtimes of the binary and of its warm-process script."""
    v = subprocess.run([DDPRUN, "--version"], capture_output=True, text=True).stdout.strip()
    share = os.path.join(ROOT, "build", "share", "ddprun", "python", "ddprun_preload.py")
    stamp = lambda f: time.strftime("%H:%M:%S", time.gmtime(os.path.getmtime(f))) if os.path.exists(f) else "-"  # noqa: E731
    return f"{v}, binary of {stamp(DDPRUN)} UTC, ddprun_preload.py of {stamp(share)} UTC"


def torch2_ready():
    if os.geteuid() != 0:
        return "the torch 2.6 chroot needs root"
    st = subprocess.run([CHROOT, "status"], capture_output=True, text=True)
    return None if st.returncode == 0 else f"{st.stdout.strip()}: run {CHROOT}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="rounds of the launch and restart parts")
    ap.add_argument("--torch2-runs", type=int, default=3,
                    help="rounds of the launch part that include the torch 2.6 lines (torchrun 2.6 among them)")
    ap.add_argument("--mem-runs", type=int, default=3)
    ap.add_argument("--loss-runs", type=int, default=3)
    ap.add_argument("--last-call", type=float, default=1.0, help="host loss: --rdzv-conf last_call_timeout")
    ap.add_argument("--sizes", default="4,8", help="launch: workers per launch")
    ap.add_argument("--parts", default="launch,restart,memory,hostloss")
    ap.add_argument("--no-torch2", action="store_true", help="no torch 2.6 (chroot) lines")
    ap.add_argument("--json", help="also write the medians and every run here")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    if parts - {"launch", "restart", "memory", "hostloss"}:
        ap.error(f"--parts: unknown {','.join(sorted(parts - {'launch', 'restart', 'memory', 'hostloss'}))}")
    sizes = [int(x) for x in a.sizes.split(",") if x]
    why_not = "not asked for" if a.no_torch2 else torch2_ready()
    torch2 = why_not is None
    version = ddprun_version()
    t_start = time.time()
    raw = {}
    if "launch" in parts:
        raw["launch"] = bench_launch(a.runs, a.torch2_runs, sizes, torch2)
    if "restart" in parts:
        raw["restart"] = bench_restart(a.runs)
    if "memory" in parts:
        raw["memory"] = bench_memory(a.mem_runs)
    if "hostloss" in parts:
        raw["hostloss"] = bench_hostloss(a.loss_runs, a.last_call)
    took = time.time() - t_start
    if ddprun_version() != version:
        print(f"**warning: {DDPRUN} changed during this run (was {version}, now {ddprun_version()}): rerun**\n")

    out = {"ddprun": version, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t_start)),
           "seconds": round(took, 1),
           "load_average_at_end": os.getloadavg(), "medians": {}, "runs": raw}
    M = out["medians"]
    ok = lambda c: "met" if c else "**not met**"  # noqa: E731
    if "launch" in raw:
        L = {k: med(v) for k, v in raw["launch"].items()}
        M["launch_s"] = L
        print(f"| launch to every worker past `import torch` (medians of {a.runs}; torch 2.6 lines: of "
              f"{min(a.runs, a.torch2_runs)}) | seconds | / one import (same torch) | target |")
        print("|---|---|---|---|")
        lines = [("anchor", None, "torch 1.13: one `python3 -u script` (the anchor)")]
        for n in sizes:
            lines += [("cold", n, f"torch 1.13, {n} workers: ddprun cold"),
                      ("preload", n, f"torch 1.13, {n} workers: ddprun --preload torch")]
        if torch2:
            lines.append(("anchor2", None, "torch 2.6 (chroot): one `python3 -u script` (the anchor)"))
            for n in sizes:
                lines += [("cold2", n, f"torch 2.6, {n} workers: ddprun cold"),
                          ("preload2", n, f"torch 2.6, {n} workers: ddprun --preload torch"),
                          ("torchrun2", n, f"torch 2.6, {n} workers: torchrun 2.6")]
        for kind, n, label in lines:
            key = kind if n is None else f"{kind}_{n}"
            base = L["anchor2" if kind in TORCH2_KINDS else "anchor"]
            target = ""
            if kind.startswith("preload") and n in (4, 8):
                limit = 1.15 if n == 4 else 1.3
                target = f"<= {limit}x: {ok(L[key] / base <= limit)}"
            print(f"| {label} | {L[key]:.2f} s | {L[key] / base:.2f}x | {target} |")
        if not torch2:
            print(f"\n(no torch 2.6 lines: {why_not})")
        print()
    if "restart" in raw:
        R = {k: {m: med([x[m] for x in v]) for m in v[0]} for k, v in raw["restart"].items()}
        M["restart_s"] = R
        ms = lambda v: f"{v * 1e3:.0f} ms"  # noqa: E731
        print(f"| rank 0 fails -> all 4 new workers past `import torch`, `--max-restarts 1` (medians of {a.runs}) "
              "| failure stamp -> last new worker | of which: to ddprun seeing the exit | exit seen -> first new "
              "worker | exit seen -> last | target |")
        print("|---|---|---|---|---|---|")
        labels = {"cold": "ddprun cold, rank 0 `sys.exit(1)`",
                  "preload": "ddprun --preload torch, rank 0 `sys.exit(1)`",
                  "preload_hard": "ddprun --preload torch, rank 0 `os._exit(1)` (ends at once)",
                  "preload_hard_nostacks": "the same with `--no-stack-dumps` (no stacks at the failure)"}
        for name, _, _ in RESTART_VARIANTS:
            x = R[name]
            target = f"< 50 ms: {ok(x['total'] < 0.05)}" if name.startswith("preload") else ""
            print(f"| {labels[name]} | {ms(x['total'])} | {ms(x['exit_seen'])} | {ms(x['seen_to_first'])} "
                  f"| {ms(x['seen_to_last'])} | {target} |")
        print()
    if "memory" in raw:
        mem = raw["memory"]
        C = {k: med([x["workers"][k] for x in mem["cold"]]) for k in MEM_FIELDS}
        P = {k: med([x["workers"][k] for x in mem["preload"]]) for k in MEM_FIELDS}
        W = {k: med([x["warm"][k] for x in mem["preload"]]) for k in MEM_FIELDS}
        S = {k: med([x["spares"][k] for x in mem["preload"]]) for k in MEM_FIELDS}
        T = {k: med([x["workers"][k] + x["warm"][k] + x["spares"][k] for x in mem["preload"]]) for k in MEM_FIELDS}
        M["memory_kb"] = {"cold_workers": C, "preload_workers": P, "warm_process": W, "spares": S, "preload_total": T,
                          "import_s": med([x["import_s"] for x in mem["preload"]])}
        mb = lambda kb: f"{kb / 1024:.0f} MB"  # noqa: E731
        print(f"| memory, 4 workers past `import torch` (medians of {a.mem_runs}) | Pss | Pss_Anon | Pss_File | Rss |")
        print("|---|---|---|---|---|")
        for label, x in (("ddprun cold: the 4 workers", C), ("ddprun --preload torch: the 4 workers", P),
                         ("--preload: the warm process alone", W),
                         ("--preload: the 4 spare workers waiting for a restart, and their cat", S),
                         ("--preload: all of these", T)):
            print(f"| {label} | {mb(x['Pss'])} | {mb(x['Pss_Anon'])} | {mb(x['Pss_File'])} | {mb(x['Rss'])} |")
        print(f"| cold / --preload (workers alone; all) | {C['Pss'] / P['Pss']:.1f}x; "
              f"{C['Pss'] / T['Pss']:.1f}x | {C['Pss_Anon'] / P['Pss_Anon']:.1f}x; {C['Pss_Anon'] / T['Pss_Anon']:.1f}x "
              f"| | |")
        print()
    if "hostloss" in raw:
        H = {k: med(v) for k, v in raw["hostloss"].items()}
        M["hostloss_s"] = H
        lc = a.last_call
        print(f"| host loss (SIGKILL) -> survivor's first step at world 2, last_call_timeout={lc:g} "
              f"(medians of {a.loss_runs}) | time | of which: to new workers started | target |")
        print("|---|---|---|---|")
        print(f"| ddprun cold | {H['cold']:.2f} s | {H['cold_restarted']:.3f} s | |")
        print(f"| ddprun --preload torch | {H['preload']:.2f} s | {H['preload_restarted']:.3f} s "
              f"| <= {lc + 0.5:g} s: {ok(H['preload'] <= lc + 0.5)} |")
        print()
    print(f"({version}; whole run {took:.0f} s from {out['started']}, load average at its end "
          f"{os.getloadavg()[0]:.1f})")
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
