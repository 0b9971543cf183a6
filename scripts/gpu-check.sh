#!/usr/bin/env bash
# The GPU half of issue 5, in one run on a machine with a GPU (device tool: carry
# [".gpu-kit"] made by scripts/gpu-kit.sh, command "scripts/gpu-check.sh"). Each step has its
# own time limit and its output file under $OUT; a failing step does not stop the others.
#   1 test_nccl          libddp's NCCL tests on the real library (world size 1 per GPU)
#   2 nccl_overhead      ddp-bench --backend nccl under ddprun against a bare ncclAllReduce loop
#   3 torch_client       the store against this machine's torch 2.x client (wire generation 2)
#   4 pytorch_jobs       real PyTorch 2.x jobs (gloo) under ddprun
#   5 launch             ddprun against python3 -m torch.distributed.run, same job, same run
#   6 train_nccl         examples/train_linear --backend nccl under ddprun
#   7 numa_binding       --numa-binding's CPUs for every GPU and mode against torch's own
#                        (torch.numa.binding, torch 2.9+), and what the GPU query costs a launch
# Exits non-zero when any step failed; summary.txt lists each step's status and time.
set -uo pipefail
cd "$(dirname "$0")/.."
kit=${DDP_GPU_KIT:-.gpu-kit}
out=${OUT:-/tmp/ddp-gpu-out}
py=${DDP_TORCH_PYTHON:-python3}
mkdir -p "$out"
[[ -x $kit/bin/ddprun ]] || { echo "gpu-check: no $kit/bin/ddprun: run scripts/gpu-kit.sh and carry .gpu-kit" >&2; exit 2; }
kit=$(cd "$kit" && pwd)

# CUDA's runtime and NCCL: the toolkit's, else the ones torch's wheels carry.
libs=$kit/lib
for d in /usr/local/cuda/lib64 $("$py" - <<'PY' 2>/dev/null
import importlib, os
for m in ("nvidia.nccl", "nvidia.cuda_runtime", "nvidia.cu13", "nvidia.cuda_runtime.lib"):
    try:
        for p in importlib.import_module(m).__path__:
            for sub in ("lib", "lib64", ""):
                if os.path.isdir(os.path.join(p, sub)):
                    print(os.path.join(p, sub))
    except Exception:
        pass
PY
); do libs=$libs:$d; done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DDPRUN=$kit/bin/ddprun PYTHON_EXEC=$py OMP_NUM_THREADS=1

{
  date -u; nvidia-smi -L 2>&1; "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$kit/lib/libddp.so.0"
} > "$out/summary.txt" 2>&1

status=0
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  ((rc == 0)) || status=1
  printf '%-16s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$out/summary.txt"
}

step test_nccl 180 "$kit/bin/test_nccl"
step nccl_overhead 300 bench/ddp-bench/gpu.sh "$kit"
step torch_client 150 "$py" tests/store/test_torch_client.py \
  --server "$kit/bin/ddp-store-server" --cpp-client "$kit/bin/store_client_check"
step pytorch_jobs 240 "$py" tests/integration/test_pytorch_jobs.py
step launch 120 "$py" - <<'PY'
import os, statistics, subprocess, sys, time
def med(cmd, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ts.append(time.perf_counter() - t0)
        if r.returncode != 0:
            print(f"FAILED: {' '.join(cmd)} exited {r.returncode}")
            return None
    return statistics.median(ts)
ddp = med([os.environ["DDPRUN"], "--standalone", "--nproc-per-node", "4", "--no-python", "true"], 21)
sh = med(["sh", "-c", "/bin/true & /bin/true & /bin/true & /bin/true & wait"], 21)
print("| launch to exit, 4 workers running true | median |")
print("|---|---|")
print(f"| ddprun | {ddp*1e3:.1f} ms |")
print(f"| sh, four /bin/true | {sh*1e3:.1f} ms (ddprun {ddp/sh:.2f}x) |", flush=True)
tr = med([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
          "--no_python", "true"], 5)
if tr is None:
    sys.exit(1)
print(f"| python3 -m torch.distributed.run | {tr*1e3:.0f} ms (ddprun {tr/ddp:.0f}x faster) |")
PY
step train_nccl 120 "$kit/bin/ddprun" --standalone --nproc-per-node 1 "$kit/bin/train_linear" \
  --backend nccl --steps 300 --out "$out/linear_model.txt"
step numa_binding 120 "$py" - <<'PY'
import os, re, statistics, subprocess, sys, time
ddprun = os.environ["DDPRUN"]
n = len(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines())
try:
    import torch.numa.binding as b
except ImportError:
    b = None
failed = False
for mode in ("node", "socket", "exclusive", "core-complex"):
    r = subprocess.run([ddprun, "--nproc-per-node", str(n), "--numa-binding", mode, "--log-level", "info",
                        "--no-python", "sh", "-c", "grep Cpus_allowed_list: /proc/self/status"],
                       capture_output=True, text=True)
    got = dict(re.findall(r"local rank (\d+) runs on CPUs (\S+)", r.stderr))
    print(f"{mode}: rc={r.returncode} ddprun: {got}")
    if r.returncode != 0:
        print(r.stderr)
        failed = True
        continue
    if b is None:
        continue
    want = {}
    for i in range(n):
        cpus = b._get_logical_cpus_to_bind_to(gpu_index=i, numa_options=b.NumaOptions(affinity_mode=b.AffinityMode(mode)))
        want[str(i)] = b._get_ranges_str_from_ints(cpus)
    same = {k: got.get(k) == v for k, v in want.items()}
    print(f"{mode}: torch: {want} same: {all(same.values())}")
    failed |= not all(same.values())
def med(cmd, k=15):
    ts = []
    for _ in range(k):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
plain = med([ddprun, "--standalone", "--nproc-per-node", str(n), "--no-python", "true"])
bound = med([ddprun, "--standalone", "--nproc-per-node", str(n), "--numa-binding", "node", "--no-python", "true"])
print(f"launch, {n} x true: {plain*1e3:.1f} ms; with --numa-binding node {bound*1e3:.1f} ms ({bound/plain:.2f}x)")
sys.exit(1 if failed else 0)
PY
cat "$out/summary.txt"
exit $status
