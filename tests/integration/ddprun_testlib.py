"""Shared helpers for the integration tests: they run the real ddprun binary on real
PyTorch workers (Debian's torch 1.13 at /usr/bin/python3).

Environment:
  DDPRUN       path of the ddprun binary (ctest passes $<TARGET_FILE:ddprun>);
               default <source>/build/bin/ddprun
  DDPRUN_IT_KEEP  set: keep each test's temporary folder (node output) and print its path
  PYTHON_EXEC  the interpreter with torch that ddprun starts workers with;
               default /usr/bin/python3
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
TORCH_PYTHON = os.environ.get("PYTHON_EXEC") or "/usr/bin/python3"

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


def check_prerequisites(testcase):
    if not os.access(DDPRUN, os.X_OK):
        raise unittest.SkipTest(f"no ddprun binary at {DDPRUN} (set DDPRUN)")
    why = torch_missing_reason()
    if why:
        raise unittest.SkipTest(why)


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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
