"""Shared helpers for the integration tests: they run the real ddprun binary on real
PyTorch workers: Debian 12's torch 1.13 (/usr/bin/python3), or Debian 13's torch 2.6 in
the chroot when ctest runs a file as *.torch2 (tests/testlib/torch_runtime.py).

Environment:
  DDPRUN       path of the ddprun binary (ctest passes $<TARGET_FILE:ddprun>);
               default <source>/build/bin/ddprun
  DDPRUN_IT_KEEP  set: keep each test's temporary folder (node output) and print its path
  DDP_TORCH    host (default) or torch2: which torch the workers get (PYTHON_EXEC)
  PYTHON_EXEC  the host torch's interpreter; default /usr/bin/python3
  DDP_TEST_TIMEOUT_SCALE  multiplies every hang guard and "fast" bound (README, "Tests")
"""
import os
import re
import socket
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from test_timeouts import scaled  # noqa: E402,F401  (DDP_TEST_TIMEOUT_SCALE; tests use lib.scaled)

SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
EXAMPLES = os.path.join(SOURCE_DIR, "examples", "pytorch")
WORKERS = os.path.join(HERE, "workers")
DDPRUN = os.environ.get("DDPRUN") or os.path.join(SOURCE_DIR, "build", "bin", "ddprun")
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "testlib"))
from ports import free_port  # noqa: E402,F401  (tests/testlib: one pick for every test)
import torch_runtime  # noqa: E402

RUNTIME = torch_runtime.current()
TORCH_EXIT_ABORT, torch_exit_abort = torch_runtime.TORCH_EXIT_ABORT, torch_runtime.torch_exit_abort
TORCH_PYTHON = RUNTIME.python

# The exit code ctest's SKIP_RETURN_CODE maps to "Skipped".
SKIP_RETURN_CODE = 77


def torch_missing_reason():
    """None when TORCH_PYTHON can import torch with gloo, else why not."""
    try:
        r = subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                           capture_output=True, text=True, timeout=scaled(60))
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{TORCH_PYTHON}: {e}"
    if r.returncode != 0:
        return f"{TORCH_PYTHON} has no torch with gloo: {r.stderr.strip().splitlines()[-1:] or r.returncode}"
    return None
def timeout_scale():
    """DDP_TEST_TIMEOUT_SCALE (default 1) multiplies hang-guard timeouts."""
    return torch_runtime.timeout_scale()


def check_prerequisites(testcase):
    if not os.access(DDPRUN, os.X_OK):
        raise unittest.SkipTest(f"no ddprun binary at {DDPRUN} (set DDPRUN)")
    why = RUNTIME.skip_reason()
    if why:
        raise unittest.SkipTest(f"{RUNTIME.name}: {why}")


def job_env(**extra):
    """The launcher's environment: ours minus anything that would steer ddprun or torch."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "GLOO_", "TP_SOCKET"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOGLEVEL")}
    env["PYTHON_EXEC"] = TORCH_PYTHON
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def port_is_free(port, host="127.0.0.1"):
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


LOSS_RE = re.compile(r"epoch (\d+) loss ([0-9.eE+-]+)")


def losses(stdout):
    """The per-epoch losses that examples/pytorch/train.py prints on rank 0."""
    return [float(m.group(2)) for m in LOSS_RE.finditer(stdout)]


def main():
    """unittest.main that exits SKIP_RETURN_CODE when every test was skipped."""
    prog = unittest.main(exit=False, verbosity=2)
    r = prog.result
    if not r.wasSuccessful():
        sys.exit(1)
    # A skip in setUpClass counts as one skip and no test run.
    if r.skipped and len(r.skipped) >= r.testsRun:
        sys.exit(SKIP_RETURN_CODE)
    sys.exit(0)
