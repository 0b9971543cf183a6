#!/usr/bin/python3
"""Launcher benchmarks (issues 2, 3 and 14), each beside its anchors measured in the same run.

  /usr/bin/python3 bench/launcher/run.py [--quick] [--no-torchrun] [--no-torch2] [--json out.json]

1. launch: launch-to-exit of `ddprun --standalone --nproc-per-node 4 --no-python true`
   against `sh -c 'true & true & true & true & wait'` and torchrun (anchors/torchrun113.py);
   ddprun's own peak RSS (from --summary-json, RUSAGE_SELF).
2. failure: from a worker's `exit 3` to ddprun's exit, three siblings in `sleep 60`
   honouring SIGTERM (torchrun: the same job, fewer runs: its monitor polls).
3. output: four workers each writing 500k short lines (python -u, as torchrun runs them),
   through ddprun to /dev/null, against the same workers writing to /dev/null directly, the
   same workers each piped into `cat > /dev/null` (what a pipe alone costs them), and
   torchrun --tee 3. Also a C worker (stdio, full buffering) for the raw rate.
4. torchrun 2.6, the second anchor: 1-3 again for ddprun and Debian 13's torchrun 2.6, both
   inside the chroot of scripts/torch2-chroot.sh (this file re-run there with --torch2-part
   through tests/torch2/python3, so neither pays for entering the chroot; their Python
   workers are the chroot's python3.13). Needs root and the chroot (else skipped, and said).
Prints a markdown table of medians and ratios.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDPRUN = os.path.join(ROOT, "build", "bin", "ddprun")
LINES = os.path.join(ROOT, "build", "bin", "ddp-bench-lines")
TORCHRUN = os.path.join(ROOT, "..", "shared", "anchors", "torchrun113.py")
TORCH2_PY = os.path.join(ROOT, "tests", "torch2", "python3")
PY = "/usr/bin/python3"
ENV = dict(os.environ, PYTHON_EXEC=PY, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
TORCHRUN_CMD = [PY, TORCHRUN]  # torchrun 1.13; in the chroot part: python3 -m torch.distributed.run


def timed(cmd, env=None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env or ENV, stdout=stdout, stderr=stderr)
    return time.perf_counter() - t0, r.returncode


def median_of(n, cmd, **kw):
    times = []
    for _ in range(n):
        dt, rc = timed(cmd, **kw)
        times.append(dt)
    return statistics.median(times), rc


def ddprun_rss_kb(args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([DDPRUN, "--summary-json", f.name] + args, env=ENV,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(f.name))["launcher"]["max_rss_kb"]


def torchrun_rss_kb(args):
    """Peak RSS of torchrun (its workers run `true`): the largest waited-for descendant."""
    r = subprocess.run([sys.executable, "-c", "import resource, subprocess, sys; "
                        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"] + TORCHRUN_CMD + args,
                       env=ENV, capture_output=True, text=True)
    return int(r.stdout.strip().splitlines()[-1])


def bench_launch(runs, torch_runs):
    res = {}
    res["shell_s"], _ = median_of(runs, ["sh", "-c", "true & true & true & true & wait"])
    # In that anchor `true` is the shell's builtin: four forks, no exec. ddprun execs a real
    # program per worker, so the like-for-like anchor execs /bin/true as well.
    res["shell_exec_s"], _ = median_of(runs, ["sh", "-c", "/bin/true & /bin/true & /bin/true & /bin/true & wait"])
    res["ddprun_s"], rc = median_of(runs, [DDPRUN, "--standalone", "--nproc-per-node", "4", "--no-python", "true"])
    assert rc == 0
    res["ddprun_rss_kb"] = ddprun_rss_kb(["--standalone", "--nproc-per-node", "4", "--no-python", "true"])
    if torch_runs:
        targs = ["--standalone", "--nproc_per_node=4", "--no_python", "true"]
        res["torchrun_s"], res["torchrun_rc"] = median_of(torch_runs, TORCHRUN_CMD + targs)
        res["torchrun_rss_kb"] = torchrun_rss_kb(targs)
    return res


FAIL_WORKER = r'''#!/bin/sh
if [ "$LOCAL_RANK" = 0 ]; then
  sleep 0.3
  date +%s%N > "$STAMP"
  exit 3
fi
exec sleep 60
'''


def bench_failure(runs, torch_runs):
    d = tempfile.mkdtemp()
    worker = os.path.join(d, "fail.sh")
    open(worker, "w").write(FAIL_WORKER)
    os.chmod(worker, 0o755)
    stamp = os.path.join(d, "stamp")

    def one(cmd):
        env = dict(ENV, STAMP=stamp)
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rc = p.wait()
        t_exit = time.time_ns()
        t_fail = int(open(stamp).read())
        return (t_exit - t_fail) / 1e6, rc

    res = {}
    lat = [one([DDPRUN, "--standalone", "--nproc-per-node", "4", "--no-python", worker]) for _ in range(runs)]
    res["ddprun_ms"] = statistics.median(x for x, _ in lat)
    res["ddprun_rc"] = lat[0][1]
    if torch_runs:
        tl = [one(TORCHRUN_CMD + ["--standalone", "--nproc_per_node=4", "--no_python", worker]) for _ in range(torch_runs)]
        res["torchrun_ms"] = statistics.median(x for x, _ in tl)
        res["torchrun_rc"] = tl[0][1]
    return res


PY_WORKER = r'''import os, sys
r = os.environ.get("RANK", "?")
w = sys.stdout.write
for i in range(int(sys.argv[1])):
    w(f"rank {r} line {i}\n")
'''


def bench_output(runs, torch_runs, lines):
    d = tempfile.mkdtemp()
    worker = os.path.join(d, "lines.py")
    open(worker, "w").write(PY_WORKER)
    bare_py = " & ".join(f"RANK={r} {PY} -u {worker} {lines} > /dev/null" for r in range(4)) + " & wait"
    bare_c = " & ".join(f"RANK={r} {LINES} {lines} > /dev/null" for r in range(4)) + " & wait"
    res = {"lines_total": 4 * lines}
    res["bare_py_s"], _ = median_of(runs, ["sh", "-c", bare_py])
    # The floor any forwarder pays: the same workers, each into a pipe that cat drains.
    piped_py = " & ".join(f"RANK={r} {PY} -u {worker} {lines} | cat > /dev/null" for r in range(4)) + " & wait"
    res["pipe_cat_py_s"], _ = median_of(runs, ["sh", "-c", piped_py])
    res["ddprun_py_s"], rc = median_of(runs, [DDPRUN, "--standalone", "--nproc-per-node", "4", worker, str(lines)])
    assert rc == 0
    res["ddprun_py_rss_kb"] = ddprun_rss_kb(["--standalone", "--nproc-per-node", "4", worker, str(lines)])
    res["bare_c_s"], _ = median_of(runs, ["sh", "-c", bare_c])
    res["ddprun_c_s"], rc = median_of(runs, [DDPRUN, "--standalone", "--nproc-per-node", "4", "--no-python", LINES, str(lines)])
    res["ddprun_c_rss_kb"] = ddprun_rss_kb(["--standalone", "--nproc-per-node", "4", "--no-python", LINES, str(lines)])
    # Every line arrives, once: count what ddprun forwarded.
    out = subprocess.run([DDPRUN, "--standalone", "--nproc-per-node", "4", "--no-python", LINES, str(lines)],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    res["forwarded_lines"] = out.count(b"\n")
    if torch_runs:
        with tempfile.TemporaryDirectory() as logs:
            res["torchrun_tee_py_s"], _ = median_of(
                torch_runs, TORCHRUN_CMD + ["--standalone", "--nproc_per_node=4", "--tee", "3", "--log_dir", logs,
                                            worker, str(lines)])
    return res


def bench_output_vs_torchrun(runs, torch_runs, lines):
    """Only ddprun and torchrun --tee 3 with the python workers (the chroot part)."""
    d = tempfile.mkdtemp()
    worker = os.path.join(d, "lines.py")
    open(worker, "w").write(PY_WORKER)
    res = {"lines_total": 4 * lines}
    res["ddprun_py_s"], rc = median_of(runs, [DDPRUN, "--standalone", "--nproc-per-node", "4", worker, str(lines)])
    assert rc == 0
    with tempfile.TemporaryDirectory() as logs:
        res["torchrun_tee_py_s"], res["torchrun_rc"] = median_of(
            torch_runs, TORCHRUN_CMD + ["--standalone", "--nproc_per_node=4", "--tee", "3", "--log_dir", logs,
                                        worker, str(lines)])
    return res


def torch2_part(quick):
    """Runs inside the torch 2.6 chroot (sys.executable is its python3): ddprun and
    torchrun 2.6 side by side; prints one JSON line."""
    global PY, ENV, TORCHRUN_CMD
    import torch
    PY = sys.executable
    ENV = dict(ENV, PYTHON_EXEC=PY)
    TORCHRUN_CMD = [PY, "-m", "torch.distributed.run"]
    trun = 3 if quick else 5
    res = {"torch": torch.__version__,
           "launch": bench_launch(5 if quick else 21, trun),
           "failure": bench_failure(5 if quick else 15, trun),
           "output": bench_output_vs_torchrun(3 if quick else 5, 1 if quick else 3, 500000)}
    print(json.dumps(res), flush=True)


def run_torch2_part(quick):
    """The chroot part's results, or the reason it could not run."""
    script = os.path.join(ROOT, "scripts", "torch2-chroot.sh")
    if os.geteuid() != 0:
        return None, "the torch 2.6 chroot needs root"
    st = subprocess.run([script, "status"], capture_output=True, text=True)
    if st.returncode != 0:
        return None, f"{st.stdout.strip()}: run {script}"
    r = subprocess.run([TORCH2_PY, os.path.abspath(__file__), "--torch2-part"] + (["--quick"] if quick else []),
                       capture_output=True, text=True, env=dict(os.environ, DDP_TORCH2_BIND=ROOT))
    if r.returncode != 0:
        return None, f"the chroot part failed ({r.returncode}): {r.stderr.strip()[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def print_torch2_rows(T):
    L, F, O = T["launch"], T["failure"], T["output"]
    v = T["torch"]
    print(f"| launch to exit vs torchrun {v} (both in the chroot) | {L['ddprun_s']*1e3:.1f} ms"
          f" | torchrun {L['torchrun_s']:.2f} s (exit {L['torchrun_rc']}) | torchrun {L['torchrun_s']/L['ddprun_s']:.0f}x slower | |")
    print(f"| peak RSS of the launcher vs torchrun {v} | {L['ddprun_rss_kb']/1024:.1f} MB"
          f" | torchrun {L['torchrun_rss_kb']/1024:.0f} MB | {L['torchrun_rss_kb']/L['ddprun_rss_kb']:.0f}x less | |")
    print(f"| failure propagation vs torchrun {v} | {F['ddprun_ms']:.1f} ms (exit {F['ddprun_rc']})"
          f" | torchrun {F['torchrun_ms']:.0f} ms (exit {F['torchrun_rc']}) | | |")
    print(f"| output vs torchrun {v} --tee 3 (python3.13 workers) | {O['ddprun_py_s']:.3f} s"
          f" | torchrun {O['torchrun_tee_py_s']:.2f} s (exit {O['torchrun_rc']})"
          f" | torchrun {O['torchrun_tee_py_s']/O['ddprun_py_s']:.1f}x slower | |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--no-torchrun", action="store_true", help="no torchrun anchors (1.13 nor 2.6)")
    ap.add_argument("--no-torch2", action="store_true", help="no torchrun 2.6 anchor")
    ap.add_argument("--torch2-part", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.torch2_part:
        return torch2_part(a.quick)
    runs = 5 if a.quick else 21
    trun = 0 if a.no_torchrun else (1 if a.quick else 3)
    L = bench_launch(runs, trun)
    F = bench_failure(5 if a.quick else 15, trun)
    O = bench_output(3 if a.quick else 5, min(trun, 1), 500000)
    T, why_not = (None, "not asked for") if a.no_torchrun or a.no_torch2 else run_torch2_part(a.quick)
    res = {"launch": L, "failure": F, "output": O, "torch2": T}
    if a.json:
        json.dump(res, open(a.json, "w"), indent=2)
    n = O["lines_total"]
    print("| benchmark | ddprun | anchor | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| launch to exit, 4 x `true` (median of {runs}) | {L['ddprun_s']*1e3:.1f} ms | shell {L['shell_s']*1e3:.1f} ms"
          f" | {L['ddprun_s']/L['shell_s']:.2f}x shell | <= 1.5x shell |")
    print(f"| same, against the shell exec'ing /bin/true (like for like) | {L['ddprun_s']*1e3:.1f} ms"
          f" | shell {L['shell_exec_s']*1e3:.1f} ms | {L['ddprun_s']/L['shell_exec_s']:.2f}x shell | |")
    if "torchrun_s" in L:
        print(f"| launch to exit vs torchrun 1.13 | {L['ddprun_s']*1e3:.1f} ms | torchrun {L['torchrun_s']:.2f} s"
              f" | torchrun {L['torchrun_s']/L['ddprun_s']:.0f}x slower | |")
        print(f"| peak RSS of the launcher | {L['ddprun_rss_kb']/1024:.1f} MB | torchrun {L['torchrun_rss_kb']/1024:.0f} MB"
              f" | {L['torchrun_rss_kb']/L['ddprun_rss_kb']:.0f}x less | <= 10 MB |")
    else:
        print(f"| peak RSS of the launcher | {L['ddprun_rss_kb']/1024:.1f} MB | | | <= 10 MB |")
    tf = f"torchrun {F['torchrun_ms']:.0f} ms" if "torchrun_ms" in F else ""
    print(f"| failure propagation, worker `exit 3` to launcher exit | {F['ddprun_ms']:.1f} ms (exit {F['ddprun_rc']}) | {tf}"
          f" (exit {F.get('torchrun_rc', '-')}) | | <= 10 ms |")
    print(f"| output, 4 x 500k lines, python -u workers | {O['ddprun_py_s']:.3f} s = {n/O['ddprun_py_s']/1e6:.2f} M lines/s"
          f" | bare {O['bare_py_s']:.3f} s | {O['ddprun_py_s']/O['bare_py_s']:.2f}x bare | >= 2 M lines/s, <= 1.5x |")
    print(f"| same python workers, each piped into `cat > /dev/null` | | {O['pipe_cat_py_s']:.3f} s"
          f" | {O['pipe_cat_py_s']/O['bare_py_s']:.2f}x bare (ddprun {O['ddprun_py_s']/O['pipe_cat_py_s']:.2f}x of it) | |")
    if "torchrun_tee_py_s" in O:
        print(f"| output vs torchrun --tee 3 | {O['ddprun_py_s']:.3f} s | torchrun {O['torchrun_tee_py_s']:.2f} s"
              f" | torchrun {O['torchrun_tee_py_s']/O['ddprun_py_s']:.1f}x slower | |")
    print(f"| output, 4 x 500k lines, C stdio workers | {O['ddprun_c_s']:.3f} s = {n/O['ddprun_c_s']/1e6:.2f} M lines/s"
          f" | bare {O['bare_c_s']:.3f} s | {O['ddprun_c_s']/O['bare_c_s']:.2f}x bare | >= 2 M lines/s |")
    print(f"| launcher peak RSS while forwarding | py {O['ddprun_py_rss_kb']/1024:.1f} MB, C {O['ddprun_c_rss_kb']/1024:.1f} MB"
          f" | | | < 20 MB |")
    print(f"| lines forwarded (C run) | {O['forwarded_lines']} of {n} | | | all |")
    if T:
        print_torch2_rows(T)
    else:
        print(f"\n(no torchrun 2.6 anchor: {why_not})")


if __name__ == "__main__":
    main()
