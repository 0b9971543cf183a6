"""Shared helpers for ddprun's launcher integration tests.

Every test runs the built ddprun (path in $DDPRUN, set by ctest) in a temporary folder,
with worker scripts from ./workers run by PYTHON_EXEC = RUNTIME.python: Debian's
/usr/bin/python3 (torch 1.13), or torch 2.6's in the chroot when ctest runs the file as
*.torch2 (DDP_TORCH=torch2, see tests/testlib/torch_runtime.py), and cleans up every
process it started, by pid.

Every timeout a helper here takes is a hang guard in seconds, multiplied by
DDP_TEST_TIMEOUT_SCALE inside the helper; tests scale their own bounds with scaled().
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
from test_timeouts import scaled  # noqa: E402,F401  (DDP_TEST_TIMEOUT_SCALE; tests import it from here)

WORKERS = os.path.join(HERE, "workers")
sys.path.insert(0, os.path.join(HERE, "..", "..", "testlib"))
from ports import free_port  # noqa: E402,F401  (tests/testlib: one pick for every test)
import torch_runtime  # noqa: E402

RUNTIME = torch_runtime.current()
TORCH_EXIT_ABORT, torch_exit_abort = torch_runtime.TORCH_EXIT_ABORT, torch_runtime.torch_exit_abort
PYTHON = RUNTIME.python


def timeout_scale():
    """DDP_TEST_TIMEOUT_SCALE (default 1) multiplies hang-guard timeouts."""
    return torch_runtime.timeout_scale()


def _default_ddprun():
    root = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    for build in ("build-tests", "build"):
        cand = os.path.join(root, build, "bin", "ddprun")
        if os.path.exists(cand):
            return cand
    return os.path.join(root, "build", "bin", "ddprun")


DDPRUN = os.environ.get("DDPRUN") or _default_ddprun()


def worker(name):
    return os.path.join(WORKERS, name)


def read_text(path):
    with open(path, errors="replace") as f:
        return f.read()


def _no_core_dumps():
    # Workers that die of SIGSEGV must not leave core files behind (limits are inherited).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # A test runner under nohup must not make every ddprun ignore SIGHUP (ddprun keeps nohup's).
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def clean_env(**extra):
    """The test's environment without anything that would steer ddprun (PET_*, TORCHELASTIC_*),
    with PYTHON_EXEC pointing at the torch-enabled python and PET_MASTER_PORT at a free
    port, plus extra (None removes a variable)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "TORCH_ELASTIC_"))
           and k not in ("OMP_NUM_THREADS", "LOGLEVEL", "DDPRUN")}
    env["PYTHON_EXEC"] = PYTHON
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Node 0 hosts a store at the master port: tests running in parallel (and anything else
    # on this machine) must not all fight for the default 29500.
    env["PET_MASTER_PORT"] = str(free_port())
    # A test file run again with --preload (the *.preload tests): every job's Python
    # workers come from a warm process that imported these modules.
    if os.environ.get("DDP_TEST_PRELOAD"):
        env["PET_PRELOAD"] = os.environ["DDP_TEST_PRELOAD"]
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def process_state(pid):
    """The state letter of /proc/pid/stat (R, S, T: stopped, Z...), "" once pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return ""


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    return process_state(pid) not in ("", "Z", "X")


def process_tree(root):
    """Lines "pid ppid state wchan: command" for root and every process below it."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{name}/wchan") as f:
                wchan = f.read().strip() or "-"
        except OSError:
            continue
        procs[int(name)] = (int(fields[1]), fields[0], wchan, cmd[:200])
    lines, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in procs:
            ppid, state, wchan, cmd = procs[pid]
            lines.append(f"{pid} {ppid} {state} {wchan}: {cmd}")
            todo += sorted(q for q, v in procs.items() if v[0] == pid)
    return "\n".join(lines)


def vm_status_kb(pid, field):
    """A size from /proc/<pid>/status ("VmHWM", "VmRSS") in kB; None when gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def vm_hwm_kb(pid):
    return vm_status_kb(pid, "VmHWM")


def vm_rss_kb(pid):
    return vm_status_kb(pid, "VmRSS")


class Result:
    def __init__(self, rc, out, err, elapsed):
        self.rc, self.out, self.err, self.elapsed = rc, out, err, elapsed

    @property
    def stdout(self):
        return self.out.decode("utf-8", "replace")

    @property
    def stderr(self):
        return self.err.decode("utf-8", "replace")

    def __repr__(self):
        def cut(b):
            t = b.decode("utf-8", "replace")
            return t if len(t) < 3000 else t[:1500] + "\n...\n" + t[-1500:]
        return f"rc={self.rc} elapsed={self.elapsed:.2f}s\n--- stdout\n{cut(self.out)}\n--- stderr\n{cut(self.err)}"


class DdprunTestCase(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        if not os.access(DDPRUN, os.X_OK):
            raise unittest.SkipTest(f"ddprun not built at {DDPRUN} (set DDPRUN)")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_it_")
        self._procs = []
        self._pids = []
        self._files = []

    def tearDown(self):
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=scaled(30))
                except subprocess.TimeoutExpired:
                    pass
        for pid in self._pids:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for f in self._files:
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers

    def path(self, *names):
        return os.path.join(self.tmp, *names)

    def track_pid(self, pid):
        """A pid this test caused to exist (a worker, a grandchild): killed in tearDown."""
        self._pids.append(pid)

    def start(self, args, env=None, stdout=None, stderr=None, cmd_prefix=(), **kw):
        """Starts ddprun in its own session; stdout/stderr default to files in the temp dir."""
        env = dict(clean_env() if env is None else env)
        # ddprun keeps error files of failed jobs under $TMPDIR/torchelastic_*: keep them in
        # this test's folder, which tearDown removes.
        env["TMPDIR"] = self.tmp
        if stdout is None:
            stdout = open(self.path("ddprun.stdout"), "wb")
            self._files.append(stdout)
        if stderr is None:
            stderr = open(self.path("ddprun.stderr"), "wb")
            self._files.append(stderr)
        p = subprocess.Popen(list(cmd_prefix) + [DDPRUN] + list(args), env=env, stdout=stdout,
                             stderr=stderr, stdin=subprocess.DEVNULL, cwd=self.tmp,
                             start_new_session=True, preexec_fn=_no_core_dumps, **kw)
        self._procs.append(p)
        return p

    def store_server(self):
        """A ddp-store-server of this test's own (no workers, on loopback): (its process, its port)."""
        err = open(self.path("store.stderr"), "wb")
        p = subprocess.Popen([os.path.join(os.path.dirname(DDPRUN), "ddp-store-server"), "--host", "127.0.0.1",
                              "--port", "0"], stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        self._procs.append(p)
        self._files += [err, p.stdout]
        line = p.stdout.readline().decode()
        self.assertTrue(line.startswith("port="), f"ddp-store-server said {line!r}")
        return p, int(line.strip().split("=")[1])

    def run_ddprun(self, args, env=None, timeout=60, cmd_prefix=()):
        """Runs ddprun to its end; `timeout` (seconds, scaled here) only guards against a hang."""
        timeout = scaled(timeout)
        out_path, err_path = self.path("ddprun.stdout"), self.path("ddprun.stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.monotonic()
            p = self.start(args, env=env, stdout=out, stderr=err, cmd_prefix=cmd_prefix)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                with open(out_path, "rb") as o, open(err_path, "rb") as e:
                    self.fail(f"ddprun did not finish within {timeout}s: {Result(None, o.read(), e.read(), timeout)}")
            elapsed = time.monotonic() - t0
        with open(out_path, "rb") as o, open(err_path, "rb") as e:
            return Result(rc, o.read(), e.read(), elapsed)

    def wait_exit(self, p, timeout):
        """p's exit status within `timeout` seconds (scaled here); else fails with what is
        left to read: ddprun's stderr, the test folder's files, and every process below p
        (state, kernel wait channel, command line), so that a rare hang explains itself."""
        timeout = scaled(timeout)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        err = read_text(self.path("ddprun.stderr")) if os.path.exists(self.path("ddprun.stderr")) else ""
        self.fail(f"ddprun (pid {p.pid}) did not exit within {timeout}s\n--- files: {sorted(os.listdir(self.tmp))}"
                  f"\n--- processes below it:\n{process_tree(p.pid)}\n--- stderr (end):\n{err[-3000:]}")

    def wait_for(self, pred, timeout=30.0, what="condition"):
        """pred()'s first true value; fails after `timeout` seconds (scaled here)."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(0.02)
        self.fail(f"timed out after {timeout}s waiting for {what}")

    def wait_for_files(self, paths, timeout=30.0):
        self.wait_for(lambda: all(os.path.exists(p) for p in paths), timeout, f"files {paths}")

    def read_pid(self, path):
        self.wait_for(lambda: os.path.exists(path) and read_text(path).strip(), what=path)
        pid = int(read_text(path).strip())
        self.track_pid(pid)
        return pid

    def load_json(self, path):
        with open(path) as f:
            return json.load(f)

    def summary_block(self, stderr_text):
        """The failure summary ddprun printed (from the '=====' rule before 'FAILED')."""
        idx = stderr_text.find(" FAILED\n")
        self.assertNotEqual(idx, -1, f"no failure summary on stderr:\n{stderr_text[-3000:]}")
        start = stderr_text.rfind("=" * 60, 0, idx)
        self.assertNotEqual(start, -1, "summary lacks its opening rule")
        end = stderr_text.find("=" * 60, idx)
        self.assertNotEqual(end, -1, "summary lacks its closing rule")
        return stderr_text[start:end + 60]


def main():
    """unittest.main, exiting 77 (ctest: Skipped) when every test was skipped (a torch that
    is not available here), so that such a run never passes as a success."""
    r = unittest.main(verbosity=2, exit=False).result
    if not r.wasSuccessful():
        sys.exit(1)
    sys.exit(77 if r.skipped and len(r.skipped) >= r.testsRun else 0)


if __name__ == "__main__":
    sys.exit("import this module from a test file")
