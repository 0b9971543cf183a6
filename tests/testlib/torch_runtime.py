"""Which PyTorch a test runs against, so that one test runs on both with one line.

  host:   the host's torch: Debian 12's python3-torch 1.13 (/usr/bin/python3) here and in
          CI, a pip torch 2.x on a GPU machine (scripts/gpu-check.sh); the default;
  torch2: Debian 13's python3-torch 2.6 in the chroot that scripts/torch2-chroot.sh builds,
          entered through tests/torch2/python3 (a drop-in interpreter: same environment,
          working directory and pid; the chroot sees /tmp and this checkout at their paths).

ctest runs every PyTorch test twice: tests/CMakeLists.txt's ddp_add_torch_test(NAME x ...)
registers x and x.torch2 (label torch2), the latter with DDP_TORCH=torch2. A test reads
the runtime with

    import torch_runtime
    rt = torch_runtime.current()      # from $DDP_TORCH
    rt.skip_reason()                  # None, or why it cannot run here (then skip: 77)
    subprocess.run([rt.python, ...])  # or PYTHON_EXEC=rt.python for ddprun's workers
    rt.version                        # "1.13.1", "2.6.0+debian"

and so needs nothing else to cover torch 2.x: ddprun itself and every other tool the test
uses stay on the host; only Python processes that import torch run in the chroot (the
worker that ddprun starts is then the chroot's python3, with ddprun's environment).

Environment: DDP_TORCH (host | torch2); DDP_TORCH_PYTHON or PYTHON_EXEC overrides host's
interpreter, DDP_TORCH2_PYTHON torch2's; DDP_TORCH2_SHIM=0 runs torch2 without the test-only
use_libuv shim (tests/torch2/nolibuv/sitecustomize.py says why it exists).
"""
import functools
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "common"))
import test_timeouts  # noqa: E402
SOURCE_DIR = os.path.dirname(TESTS)
TORCH2_WRAPPER = os.path.join(TESTS, "torch2", "python3")
CHROOT_SCRIPT = os.path.join(SOURCE_DIR, "scripts", "torch2-chroot.sh")
PROBE = ("import torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available(), "
         "'no gloo'; print(torch.__version__)")


def timeout_scale():
    """DDP_TEST_TIMEOUT_SCALE (default 1): multiplies every hang-guard timeout
    (tests/common/test_timeouts.py reads it, and refuses a value that is not a positive number)."""
    return test_timeouts.SCALE


# torch's own exit race (pytorch/pytorch#38228, #117762): a thread of torch's C++ that takes
# the GIL while the interpreter finalizes is ended with pthread_exit, whose unwinding through
# a noexcept frame calls std::terminate: this line on stderr, then SIGABRT. ddprun reports it
# as it should (exit 134, the rank killed by SIGABRT); CI saw it once, on torch 2.6 (Python
# 3.13) under load, after train.py had printed that it was done.
TORCH_EXIT_ABORT = "terminate called without an active exception"


def torch_exit_abort(r, done):
    """Whether a finished ddprun run `r` failed only by that race: exit 134, torch's abort
    line on stderr, and `done` (what the job prints once its work is complete) on stdout."""
    return bool(done) and r.returncode == 128 + 6 and TORCH_EXIT_ABORT in r.stderr and done in r.stdout


class TorchRuntime:
    def __init__(self, name, python, label):
        self.name, self.python, self.label = name, python, label

    @property
    def is_torch2(self):
        return self.name == "torch2"

    def __repr__(self):
        return f"TorchRuntime({self.name}, {self.python})"

    @functools.cached_property
    def _probe(self):
        """(version, None) or (None, why it is unusable)."""
        if self.is_torch2:
            if os.geteuid() != 0:
                return None, "the torch 2.x chroot needs root"
            st = subprocess.run([CHROOT_SCRIPT, "status"], capture_output=True, text=True)
            if st.returncode != 0:
                return None, f"no torch 2.x chroot ({st.stdout.strip()}): run scripts/torch2-chroot.sh"
        try:
            r = subprocess.run([self.python, "-c", PROBE], capture_output=True, text=True,
                               timeout=120 * timeout_scale(), env=self.env())
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{self.python}: {e}"
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            return None, f"{self.python} has no torch with gloo: {last}"
        return r.stdout.strip().splitlines()[-1], None

    @property
    def version(self):
        return self._probe[0]

    def skip_reason(self):
        return self._probe[1]

    def env(self, base=None, shim=True):
        """base (default os.environ) with PYTHON_EXEC set to this runtime's interpreter;
        shim=False: the torch2 runs without the use_libuv shim."""
        env = dict(os.environ if base is None else base)
        env["PYTHON_EXEC"] = self.python
        if self.is_torch2:
            env["DDP_TORCH2_SHIM"] = "1" if shim else "0"
        return env


def host():
    python = os.environ.get("DDP_TORCH_PYTHON") or os.environ.get("PYTHON_EXEC") or "/usr/bin/python3"
    return TorchRuntime("host", python, "the host's torch")


def torch2():
    return TorchRuntime("torch2", os.environ.get("DDP_TORCH2_PYTHON") or TORCH2_WRAPPER,
                        "Debian 13 torch 2.6 (chroot)")


@functools.lru_cache(maxsize=None)
def current():
    """The runtime $DDP_TORCH names (host when unset)."""
    name = os.environ.get("DDP_TORCH", "host")
    if name == "host":
        return host()
    if name == "torch2":
        return torch2()
    raise SystemExit(f"DDP_TORCH={name!r}: expected host or torch2")
