#!/usr/bin/python3
"""Dynamic rendezvous benchmarks (issue 10), each beside its anchor measured in the same run.

  /usr/bin/python3 bench/rendezvous/run.py [--quick] [--no-torchrun] [--big 256,1024] [--json out.json]
                                           [--backend static] [--baseline OLD_DDPRUN]

1. rendezvous: N agents on loopback, `--rdzv-backend c10d --nnodes N` (or, with --backend
   static, `--nnodes N --node-rank i --master-addr 127.0.0.1`), one `true` worker
   each: from starting the N agents (build/bin/ddp-bench-spawn-n) to the last one's exit. ddprun for 2, 4, 8 and the big
   N; torchrun 1.13 (anchors/torchrun113.py, its defaults) for 2, 4, 8.
2. host loss: two "hosts" of 2 gloo workers each in an elastic job (`--nnodes 1:2
   --max-restarts 3 --rdzv-conf last_call_timeout=1`); one host's ddprun and workers are
   SIGKILLed; from the kill to the survivors' first finished training step at world size 2.
   Anchor: a cold start of the same 2 workers (`--standalone`) to their first step, in the
   same run (importing torch alone takes seconds here).
Prints markdown tables of medians and ratios.
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "testlib"))
from ports import free_port  # noqa: E402  (re-exported to preload.py)
DDPRUN = os.path.join(ROOT, "build", "bin", "ddprun")
SPAWN_N = os.path.join(ROOT, "build", "bin", "ddp-bench-spawn-n")
TORCHRUN = os.path.join(ROOT, "..", "shared", "anchors", "torchrun113.py")
TRAIN = os.path.join(ROOT, "bench", "rendezvous", "elastic_train.py")
PY = "/usr/bin/python3"
ENV = dict(os.environ, PYTHON_EXEC=PY, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
for k in list(ENV):
    if k.startswith(("PET_", "TORCHELASTIC_")):
        del ENV[k]


BACKEND = "c10d"


def rendezvous_once(n, torchrun=False, binary=None):
    """Seconds from starting n agents to the last one's exit; raises if any failed."""
    port = free_port()
    if BACKEND == "standalone":  # the floor: n agents that meet nobody
        rdzv = ["--standalone"]
    elif BACKEND == "static":
        rdzv = ["--nnodes", str(n), "--node_rank", "{i}", "--master_addr", "127.0.0.1", "--master_port", str(port)]
    else:
        rdzv = ["--nnodes", str(n), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id",
                "bench"]
    if torchrun:
        cmd = [PY, TORCHRUN, *rdzv, "--nproc_per_node", "1", "--no_python", "true"]
    else:
        cmd = [binary or DDPRUN, *rdzv, "--nproc-per-node", "1", "--no-python", "true"]
    # A C spawner starts the n agents (Python's Popen would take seconds for 1024 of them).
    cmd = [SPAWN_N, str(n)] + cmd
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
    dt, failed = r.stdout.split()
    if int(failed):
        raise RuntimeError(f"{'torchrun' if torchrun else 'ddprun'} x{n}: {failed} agents failed; rerun with "
                           f"SPAWN_N_LOGS=DIR for their output: {' '.join(cmd)}")
    return float(dt)


def median_runs(runs, n, torchrun=False, binary=None):
    return statistics.median(rendezvous_once(n, torchrun, binary) for _ in range(runs))


# ------------------------------------------------------------------ host loss


def wait_for_line(path, pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                for line in f:
                    rec = json.loads(line)
                    if pred(rec):
                        return rec
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.01)
    raise TimeoutError(f"no matching record in {path} within {timeout} s")


def workers_restarted(log, t_kill):
    """Seconds from the kill to the survivor starting its new round's workers (its debug
    log's millisecond time stamps, on the same clock as t_kill)."""
    day = time.strftime("%Y-%m-%d ", time.localtime(t_kill))
    for line in open(log):
        if "attempt 1: started" in line:
            stamp = line.split()[1]  # [ddprun HH:MM:SS.mmm debug]
            t = time.mktime(time.strptime(day + stamp.split(".")[0], "%Y-%m-%d %H:%M:%S"))
            return t + int(stamp.split(".")[1]) / 1000 - t_kill
    return float("nan")


def cold_start(tmp):
    """Seconds from `ddprun --standalone` of 2 workers to their first finished step."""
    # Fresh files each time: an old log's step would count, an old checkpoint would resume.
    d = tempfile.mkdtemp(dir=tmp)
    log = os.path.join(d, "cold.jsonl")
    t0 = time.time()
    p = subprocess.Popen([DDPRUN, "--standalone", "--nproc-per-node", "2", TRAIN, "--log", log,
                          "--ckpt", os.path.join(d, "cold.pt"), "--steps", "1"],
                         env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rec = wait_for_line(log, lambda r: r["event"] == "step", 120)
    p.wait(timeout=120)
    return rec["time"] - t0


def host_loss_once(tmp):
    """Seconds from SIGKILL of one host to the survivors' first step at world size 2."""
    port = free_port()
    log = os.path.join(tmp, f"loss{port}.jsonl")
    ckpt = os.path.join(tmp, f"loss{port}.pt")
    common = ["--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"loss{port}",
              "--rdzv-conf", "last_call_timeout=1,join_timeout=60"]
    args = [TRAIN, "--log", log, "--ckpt", ckpt, "--steps", "1000000", "--step-time", "0.05"]
    # The store host stays; the other host is the one that goes.
    keep_log = os.path.join(tmp, f"keep{port}.log")
    keep = subprocess.Popen([DDPRUN, *common, "--log-level", "debug", "--local-addr", "127.0.0.1", "--rdzv-conf",
                             "last_call_timeout=1,join_timeout=60,is_host=1", *args],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=open(keep_log, "w"))
    lose = subprocess.Popen([DDPRUN, *common, "--local-addr", "127.0.0.2", "--rdzv-conf",
                             "last_call_timeout=1,join_timeout=60,is_host=0", *args],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_line(log, lambda r: r["event"] == "step" and r["world"] == 4, 120)
        t_kill = time.time()
        os.killpg(lose.pid, signal.SIGKILL)  # the host's ddprun and its workers, at once
        rec = wait_for_line(log, lambda r: r["event"] == "step" and r["world"] == 2 and r["time"] > t_kill, 120)
        return rec["time"] - t_kill, workers_restarted(keep_log, t_kill)
    finally:
        for p in (keep, lose):
            try:
                os.killpg(p.pid, signal.SIGKILL) if p is lose else p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        keep.wait(timeout=60)
        lose.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-torchrun", action="store_true")
    ap.add_argument("--no-host-loss", action="store_true")
    ap.add_argument("--big", default="256,1024")
    ap.add_argument("--json")
    ap.add_argument("--baseline", help="another ddprun binary measured beside build/bin/ddprun (e.g. the last release)")
    ap.add_argument("--small", default="2,4,8")
    ap.add_argument("--backend", choices=["c10d", "static"], default="c10d")
    ap.add_argument("--floor", action="store_true",
                    help="also N agents of --standalone (no rendezvous) for the big N: what starting them costs "
                         "(of the baseline too, when given)")
    a = ap.parse_args()
    global BACKEND
    BACKEND = a.backend
    runs = 3 if a.quick else 7
    res = {"ddprun": {}, "torchrun": {}, "baseline": {}, "floor": {}, "baseline_floor": {}}
    for n in [int(x) for x in a.small.split(",") if x]:
        res["ddprun"][n] = median_runs(runs, n)
        if a.baseline:
            res["baseline"][n] = median_runs(runs, n, binary=a.baseline)
        if not a.no_torchrun:
            res["torchrun"][n] = median_runs(1 if a.quick else 3, n, torchrun=True)
    for n in [int(x) for x in a.big.split(",") if x]:
        reps = 1 if a.quick or n > 256 else 3
        res["ddprun"][n] = median_runs(reps, n)
        if a.baseline:
            res["baseline"][n] = median_runs(reps, n, binary=a.baseline)
        if a.floor:
            BACKEND, backend = "standalone", BACKEND
            res["floor"][n] = median_runs(reps, n)
            if a.baseline:
                res["baseline_floor"][n] = median_runs(reps, n, binary=a.baseline)
            BACKEND = backend
    print("| agents | ddprun (median) | baseline (median) | baseline / ddprun | torchrun 1.13 (median) | torchrun / ddprun "
          "| N x --standalone (floor) | the baseline's floor |")
    print("|---|---|---|---|---|---|---|---|")
    for n, d in res["ddprun"].items():
        t, b, f = res["torchrun"].get(n), res["baseline"].get(n), res["floor"].get(n)
        bf = res["baseline_floor"].get(n)
        print(f"| {n} | {d * 1000:.0f} ms | {f'{b * 1000:.0f} ms' if b else '-'} | {f'{b / d:.2f}x' if b else '-'} | "
              f"{f'{t:.2f} s' if t else '-'} | {f'{t / d:.0f}x' if t else '-'} | {f'{f * 1000:.0f} ms' if f else '-'} | "
              f"{f'{bf * 1000:.0f} ms' if bf else '-'} |")
    if not a.no_host_loss:
        with tempfile.TemporaryDirectory() as tmp:
            r = 1 if a.quick else 3
            colds, losses, restarts = [], [], []
            for _ in range(r):  # interleaved: the machine's speed drifts
                colds.append(cold_start(tmp))
                loss, restarted = host_loss_once(tmp)
                losses.append(loss)
                restarts.append(restarted)
            cold, loss, restarted = (statistics.median(x) for x in (colds, losses, restarts))
        res["cold_start_s"], res["host_loss_s"], res["workers_restarted_s"] = cold, loss, restarted
        print()
        print("| host loss to training again | ddprun (median) | cold start of the same workers | difference |")
        print("|---|---|---|---|")
        print(f"| kill -9 of one host, `--nnodes 1:2`, last_call_timeout=1 | {loss:.2f} s | {cold:.2f} s | "
              f"{loss - cold:+.2f} s |")
        print(f"| of which: kill to the survivor's new workers started | {restarted:.3f} s | | |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
