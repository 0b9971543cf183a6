"""Shared pieces of the Slurm tests: one cluster per test file (setUpClass), the ddprun
binary, the torch interpreter, job scripts, and the checks every test makes (nothing of the
job left running on any node).

Environment:
  DDPRUN                  ddprun's path (ctest passes it); default <source>/build/bin/ddprun
  PYTHON_EXEC             the interpreter with torch the workers run under; default /usr/bin/python3
  DDP_TORCH=torch2        the workers run on torch 2.6 in the chroot instead (torch_runtime.py)
  DDP_TEST_TIMEOUT_SCALE  multiplies every hang-guard timeout (default 1)
  DDP_SLURM_KEEP=1        keep the cluster's folder (logs, every job's files)
"""
import json
import os
import shlex
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "testlib"))
import torch_runtime  # noqa: E402
from slurm_cluster import DOMAIN, SlurmCluster, cgroup_tracking_available, unavailable_reason  # noqa: E402, F401

SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKERS = os.path.join(HERE, "workers")
TRAIN = os.path.join(SOURCE_DIR, "examples", "pytorch", "train.py")
DDPRUN = os.environ.get("DDPRUN") or os.path.join(SOURCE_DIR, "build", "bin", "ddprun")
# The workers' torch: the host's (PYTHON_EXEC, else /usr/bin/python3), or with DDP_TORCH=torch2
# Debian 13's torch 2.6 through tests/torch2/python3 (tests/testlib/torch_runtime.py).
RUNTIME = torch_runtime.current()
PYTHON = RUNTIME.python
STEP_MARKER = "DDP_TEST_STEP"  # set for a step's tasks (ddprun) and so their workers


def timeout_scale():
    """DDP_TEST_TIMEOUT_SCALE (float, default 1): every hang guard is multiplied by it."""
    try:
        return max(0.1, float(os.environ.get("DDP_TEST_TIMEOUT_SCALE", "1")))
    except ValueError:
        return 1.0


def scaled(seconds):
    return seconds * timeout_scale()


def derived_port(job_id, step_id):
    """ddprun's port for a Slurm step (src/launcher/slurm.cpp, derived_port)."""
    port = 20000 + (int(job_id) % 1595) * 8 + int(step_id) % 8
    if port >= 29400:
        port += 1
    if port >= 29500:
        port += 1
    return port


def seconds(elapsed):
    """Slurm's [D-]HH:MM:SS (RunTime, Elapsed) in seconds."""
    days, _, hms = elapsed.rpartition("-")
    total = 0
    for part in hms.split(":"):
        total = total * 60 + int(part)
    return total + 86400 * int(days or 0)


def worker(name):
    return os.path.join(WORKERS, name)


def torch_workers(test):
    """Marks a test that also runs on torch 2.6 (DDP_TORCH=torch2: slurm.test_slurm_jobs.torch2):
    its PyTorch workers do what no other marked test's do. Unmarked tests are skipped there."""
    test.torch_workers = True
    return test


class SlurmTestCase(unittest.TestCase):
    """A cluster for the whole file; each test submits sbatch jobs to it."""
    NODES = 3
    PROCTRACK = "cgroup"
    KILL_WAIT = 5
    GPUS = 0  # gres/gpu per node (stand-in device files: Slurm's bookkeeping, not real GPUs)
    NEEDS_TORCH = False
    cluster = None

    @classmethod
    def setUpClass(cls):
        why = unavailable_reason()
        if why:
            raise unittest.SkipTest(why)
        if not os.access(DDPRUN, os.X_OK):
            raise unittest.SkipTest(f"no ddprun binary at {DDPRUN} (set DDPRUN)")
        if cls.NEEDS_TORCH and RUNTIME.skip_reason():
            raise unittest.SkipTest(RUNTIME.skip_reason())
        if cls.PROCTRACK == "cgroup" and not cgroup_tracking_available():
            print("no cgroup v1 freezer here: proctrack/pgid stands in for proctrack/cgroup", file=sys.stderr)
            cls.PROCTRACK = "pgid"
        cls.cluster = SlurmCluster(nodes=cls.NODES, proctrack=cls.PROCTRACK, kill_wait=cls.KILL_WAIT, gpus=cls.GPUS)
        t0 = time.monotonic()
        cls.cluster.start()
        print(f"slurm cluster ({cls.NODES} nodes, proctrack/{cls.PROCTRACK}) up in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        if cls.cluster:
            cls.cluster.stop()

    def setUp(self):
        if RUNTIME.is_torch2 and not getattr(getattr(self, self._testMethodName), "torch_workers", False):
            self.skipTest("not marked @torch_workers: runs on the host's torch only")
        self.started = time.monotonic()

    def tearDown(self):
        print(f"{self._testMethodName}: {time.monotonic() - self.started:.1f} s", file=sys.stderr)

    # ------------------------------------------------------------------ jobs

    def script(self, body, marker=None):
        """A batch script: the environment workers need, then body (shell)."""
        marker = marker or self.id().rsplit(".", 1)[-1]
        return (
            "#!/bin/bash\n"
            f"export PYTHON_EXEC={shlex.quote(PYTHON)} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1\n"
            f"DDPRUN={shlex.quote(DDPRUN)}\n"
            f"WORKERS={shlex.quote(WORKERS)}\n"
            f"TRAIN={shlex.quote(TRAIN)}\n"
            # ddprun and its workers carry the step marker; srun and the batch shell do not
            f"export SRUN_EXPORT_ENV=ALL,{STEP_MARKER}={self.step_marker(marker)}\n"
            f"{body}\n")

    def submit(self, name, body, *sbatch_options):
        return self.cluster.sbatch(self.script(body, marker=name), *sbatch_options, name=name)

    def run_job(self, name, body, *sbatch_options, timeout=180):
        job = self.submit(name, body, *sbatch_options)
        info = self.cluster.wait(job, scaled(timeout))
        return job, info

    def job_dir(self, name):
        return self.cluster.job_dir(name)

    def read(self, name, file):
        with open(os.path.join(self.job_dir(name), file), errors="replace") as f:
            return f.read()

    def read_json_files(self, name, prefix):
        d = self.job_dir(name)
        out = []
        for f in sorted(os.listdir(d)):
            if f.startswith(prefix) and f.endswith(".json"):
                with open(os.path.join(d, f)) as fh:
                    out.append(json.load(fh))
        return out

    def step_marker(self, name):
        """The step marker's value: the job's name and this cluster's folder, so that a test
        run beside another (another checkout's) never counts the other's processes."""
        return f"{name}@{os.path.basename(self.cluster.root)}"

    def step_pids(self, name):
        return self.cluster.marked_pids(self.step_marker(name), key=STEP_MARKER)

    def assert_nothing_left(self, name, within=5):
        """No process of the job's steps (ddprun, its workers, the probe) is left on any node."""
        deadline = time.monotonic() + scaled(within)
        while True:
            left = self.step_pids(name)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(left, [], f"processes of job {name} still running: {describe(left)}")

    def job_output(self, name):
        return self.cluster.output(name)


def describe(pids):
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{p}: {cmd}")
        except OSError:
            out.append(str(p))
    return "; ".join(out)


def main():
    """unittest.main, exiting 77 (ctest: skipped) when every test was skipped."""
    prog = unittest.main(exit=False, verbosity=2)
    r = prog.result
    if not r.wasSuccessful():
        sys.exit(1)
    if r.skipped and len(r.skipped) >= r.testsRun:
        sys.exit(77)
    sys.exit(0)
