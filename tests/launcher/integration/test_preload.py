"""Issue 22: --preload MODULES, warm Python workers. One warm process per node imports the
modules once and forks every worker from it, restarts too; a worker sees what `python -u
script` would have shown it. Run on the host's torch 1.13 and on torch 2.6 (the .torch2
variant). Other test files run again in this mode too (their *.preload variants)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DDPRUN, DdprunTestCase, clean_env, pid_alive, read_text, scaled, worker  # noqa: E402
import test_c10d  # noqa: E402

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# Imported by the warm process: counts its imports (one line per importing process).
PROBE = """
import os
with open(os.environ["PROBE_LOG"], "a") as f:
    f.write(f"{os.getpid()}\\n")
"""

# Stands in for a module that initialises CUDA at import (no GPU here).
FAKE_CUDA = """
import torch
torch.cuda._initialized = True
"""

# Starts a thread at import, as some libraries do.
THREADER = """
import threading, time
threading.Thread(target=time.sleep, args=(60,), name="telemetry-flusher", daemon=True).start()
"""

# What a worker sees of itself: compared between a cold and a warm start.
VIEW = r"""
import json, os, signal, sys
def disp(s):
    h = signal.getsignal(s)
    return getattr(h, "__name__", str(h))
view = {
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path0": sys.path[0], "path": sys.path,
    "file": __file__, "name": __name__, "spec": __spec__ and (__spec__.name, __spec__.origin), "executable": sys.executable,
    "cwd": os.getcwd(), "pgid_is_pid": os.getpgid(0) == os.getpid(),
    "sid_is_pid": os.getsid(0) == os.getpid(),
    "parent_is_ddprun": os.getppid() == int(os.environ["EXPECT_PARENT"]) if "EXPECT_PARENT" in os.environ else None,
    "env": {k: v for k, v in os.environ.items()
            if k not in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")},
    "signals": {str(int(s)): disp(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD,
                                               signal.SIGUSR1, signal.SIGHUP)},
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "stdin_fd": os.fstat(0).st_mode, "buffered": [sys.stdout.write_through, sys.stderr.write_through],
    "main_keys": sorted(k for k in globals() if k.startswith("__")),
}
with open(os.path.join(os.environ["OUT"], "view_" + os.environ["RANK"]), "w") as f:
    json.dump(view, f, sort_keys=True)
"""

# Single-process defaults a helper module sets at import, as many codebases do, and a variable
# it sets and one it removes.
ENV_DEFAULTS = """
import os
for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "localhost"),
             ("MASTER_PORT", "1")):
    os.environ.setdefault(k, v)
os.environ["SET_AT_IMPORT"] = "yes"
os.environ.pop("UNSET_AT_IMPORT", None)
"""

# A rank's variables and random states, after importing ENV_DEFAULTS.
SEEN = r"""
import json, multiprocessing, os
import torch, env_defaults
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SET_AT_IMPORT", "UNSET_AT_IMPORT")
with open(os.path.join(os.environ["OUT"], f"seen_{os.getpid()}"), "w") as f:
    json.dump({"env": {k: os.environ.get(k) for k in names}, "torch_seed": torch.initial_seed(),
               "authkey": multiprocessing.current_process().authkey.hex()}, f)
"""

# A config module that seeds every global generator at import (a `set_seed(1234)` at the top
# of a utils module), and a script that draws from each.
SEEDS_AT_IMPORT = "import random, numpy, torch\nrandom.seed(1234); numpy.random.seed(1234); torch.manual_seed(1234)\n"
# One that draws from each generator and reseeds each at random, seeding none.
DRAWS_AT_IMPORT = ("import random, numpy, torch\nrandom.random(); numpy.random.rand(); torch.rand(1)\n"
                   "random.seed(); numpy.random.seed(); torch.seed()\n")
DRAWS = r"""
import json, os, random
import numpy, torch, importlib
importlib.import_module(os.environ["AT_IMPORT"])
with open(os.path.join(os.environ["OUT"], "drew_" + os.environ["RANK"]), "w") as f:
    json.dump([random.random(), numpy.random.rand(), torch.rand(1).item()], f)
"""

# A helper module that opens a log at import, and a script that writes to it and never
# flushes: Python's finalization flushes it at exit.
OPENS_LOG = "import os\nLOG = open(os.path.join(os.environ['OUT'], 'shared_log'), 'a')\n"
WRITES_LOG = "import os, opens_log\nopens_log.LOG.write('rank %s\\n' % os.environ['RANK'])\n"

# A config module: notes the arguments it sees at import, parses them strictly.
ARGV_CONFIG = """
import argparse, json, os, sys
with open(os.path.join(os.environ["OUT"], "import_argv_" + os.environ.get("RANK", "warm")), "w") as f:
    json.dump(sys.argv, f)
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("rest", nargs="*")
ARGS = parser.parse_args()
"""
USES_CONFIG = "import argv_config\nprint('lr', argv_config.ARGS.lr, argv_config.ARGS.rest == ['\\udcff'])\n"

# A helper module the script imports (not preloaded): a log file opened at import and never
# closed, an object whose finalizer prints, one whose finalizer raises.
HELPER = """
import os, sys
LOG = open(os.path.join(os.environ["OUT"], "helper_log"), "w")
class Noisy:
    def __init__(self, fail):
        self.fail = fail
    def __del__(self):
        print("helper finalized", self.fail, file=sys.stderr, flush=True)
        if self.fail:
            raise RuntimeError("finalizer failed")
_quiet, _failing = Noisy(False), Noisy(True)
"""
CLOSES_STDOUT = """
import sys, helper_mod
helper_mod.LOG.write("buffered, never closed\\n")
print("bye", flush=True)
sys.stdout.close()
"""

# Attempt 0: rank 1 fails once both ranks logged their start; attempt 1: every rank
# succeeds. Each start is logged.
RESTART = """
import os, sys, time
import probe_mod
starts = os.path.join(os.environ["OUT"], "starts")
with open(starts, "a") as f:
    f.write(f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['RANK']} {os.getpid()}\\n")
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
    while sum(l.startswith("0 ") for l in open(starts)) < 2:
        time.sleep(0.005)
    sys.exit(3)
"""

RAISE = """
import os, sys
def train():
    raise ValueError("bad batch on rank " + os.environ["RANK"])
if os.environ["RANK"] == "1":
    train()
"""

MULTIPROC = """
import multiprocessing as mp, os, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

class Box:  # a class of the script's own: a spawn child pickles it as __mp_main__.Box
    def __init__(self, v):
        self.v = v

def square(x):
    return Box(x * x)

if __name__ == "__main__":
    out = {"mp_main": sys.modules.get("__mp_main__") is sys.modules["__main__"]}
    for method in ("spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as pool:
            out[method] = [b.v for b in pool.map_async(square, [1, 2, 3]).get(timeout=60)]
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, num_workers=2)
    out["dataloader"] = sum(float(b[0].sum()) for b in loader)
    with open(os.path.join(os.environ["OUT"], "mp_" + os.environ["RANK"]), "w") as f:
        f.write(repr(out))
"""

# How a worker ends: what Python's exit does (a file left open, atexit, a thread still
# running, a global's finalizer), for each way out. Compared between a cold and a warm start.
ENDINGS = """
import atexit, os, sys, threading, time
out = open(os.path.join(os.environ["OUT"], "left_open_" + os.environ["RANK"]), "w")
out.write("written, never closed\\n")
atexit.register(lambda: print("atexit ran", flush=True))
class Finalized:
    def __del__(self):
        print("__del__ ran", flush=True)
kept = Finalized()
def late():
    time.sleep(0.3)
    print("thread ended", flush=True)
threading.Thread(target=late).start()
how = sys.argv[1]
if how == "exit":
    sys.exit(int(sys.argv[2]))
if how == "exit-text":
    sys.exit("goodbye text")
if how == "raise":
    raise ValueError("boom")
if how == "interrupt":
    raise KeyboardInterrupt
"""

# Attempt 0: rank 0 fails once the test says so (it has seen the spare workers); every
# worker of either attempt logs its pid.
SPARE_RESTART = """
import os, sys, time
with open(os.path.join(os.environ["OUT"], "starts"), "a") as f:
    f.write(f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['RANK']} {os.getpid()}\\n")
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    while not os.path.exists(os.path.join(os.environ["OUT"], "fail_now")):
        time.sleep(0.01)
    if os.environ["RANK"] == "0":
        sys.exit(3)
    time.sleep(60)
"""

SLEEPER = """
import os, signal, sys, time
def on_term(*_):
    open(os.path.join(os.environ["OUT"], "term_" + os.environ["RANK"]), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(os.environ["OUT"], "ready_" + os.environ["RANK"]), "w").close()
time.sleep(60)
"""


def pids_cgroup(test):
    """A new cgroup (v1 pids controller) for `test`, removed once the test is over; skips the
    test where none can be made (no such controller, no root)."""
    root = "/sys/fs/cgroup/pids"
    path = os.path.join(root, f"ddprun-test-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
    except OSError as e:
        raise unittest.SkipTest(f"no pids cgroup to limit the warm process's forks: {root}: {e.strerror}")

    def remove():
        for _ in range(100):  # its processes exit with ddprun
            try:
                os.rmdir(path)
                return
            except OSError:
                time.sleep(0.05)
        os.rmdir(path)

    test.addCleanup(remove)
    return path


class PreloadTest(DdprunTestCase):
    def setUp(self):
        super().setUp()
        self.mods = self.path("mods")
        os.mkdir(self.mods)
        for name, text in (("probe_mod", PROBE), ("fake_cuda", FAKE_CUDA), ("threader", THREADER)):
            self.write(os.path.join("mods", name + ".py"), text)
        self.probe_log = self.path("probe.log")

    def write(self, name, text):
        p = self.path(name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def env(self, **extra):
        e = clean_env(PYTHONPATH=self.mods, PROBE_LOG=self.probe_log, OUT=self.tmp, **extra)
        e.pop("PET_PRELOAD", None)  # each test says itself whether it preloads
        return e

    def probe_imports(self):
        return read_text(self.probe_log).split() if os.path.exists(self.probe_log) else []

    def job(self, script, *args, preload=None, flags=(), nproc=2, env=None, timeout=120):
        pre = ["--preload", preload] if preload else []
        return self.run_ddprun(["--standalone", "--nproc-per-node", str(nproc), *pre, *flags, script, *args],
                               env=env or self.env(), timeout=timeout)

    # -- a real job

    def test_ddp_trains_with_one_import_per_node(self):
        res = self.job(worker("torch_allreduce.py"), self.tmp, preload="torch,probe_mod", nproc=4,
                       flags=("--log-level", "info"))
        self.assertEqual(res.rc, 0, res)
        for r in range(4):
            self.assertEqual(read_text(self.path(f"sum_{r}")).split(), ["10.0", "10.0"])
        imports = self.probe_imports()
        self.assertEqual(len(imports), 1, res)
        warm = re.search(r"--preload: imported torch,probe_mod in [\d.]+ s \(warm process pid (\d+)\)", res.stderr)
        self.assertIsNotNone(warm, res)
        self.assertEqual(imports, [warm.group(1)])

    def test_a_restart_forks_from_the_warm_process(self):
        script = self.write("restart.py", RESTART)
        res = self.job(script, preload="probe_mod", flags=("--max-restarts", "1"))
        self.assertEqual(res.rc, 0, res)
        starts = [l.split() for l in read_text(self.path("starts")).splitlines()]
        self.assertEqual(sorted((a, r) for a, r, _ in starts), [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")])
        self.assertEqual(len({p for _, _, p in starts}), 4)  # four processes ...
        self.assertEqual(len(self.probe_imports()), 1)  # ... one import
        self.assertNotIn("warm Python process", res.stderr)

    def test_a_crash_loop_leaves_no_zombies_under_the_warm_process(self):
        # Workers that fail at once never leave the warm process idle: it reaped its children
        # between only when idle for 0.3 s, and kept one zombie per restart until the loop ended.
        script = self.write("fail.py", "import sys\nsys.exit(3)\n")
        p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "probe_mod", "--max-restarts", "40",
                        "--log-level", "info", script], env=self.env())
        m = self.wait_for(lambda: re.search(r"warm process pid (\d+)", read_text(self.path("ddprun.stderr"))),
                          what="the warm process's pid")
        warm, most = int(m.group(1)), 0
        deadline = time.monotonic() + scaled(120)
        while p.poll() is None and time.monotonic() < deadline:
            try:
                kids = [c for t in os.listdir(f"/proc/{warm}/task")
                        for c in read_text(f"/proc/{warm}/task/{t}/children").split()]
            except OSError:
                kids = []
            zombies = 0
            for c in kids:
                try:
                    zombies += read_text(f"/proc/{c}/stat").rsplit(")", 1)[1].split()[0] == "Z"
                except OSError:
                    pass
            most = max(most, zombies)
            time.sleep(0.02)
        self.assertEqual(p.wait(timeout=scaled(30)), 3, read_text(self.path("ddprun.stderr")))
        err = read_text(self.path("ddprun.stderr"))
        self.assertEqual(err.count("restarting all workers"), 40, err)
        self.assertLessEqual(most, 8, "zombies under the warm process at once (one a restart before)")

    def spares(self, warm):
        """The spare workers waiting under the warm process (children of its child between,
        a `cat` by then)."""
        def children(pid):
            try:
                return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                        for c in read_text(f"/proc/{pid}/task/{t}/children").split()]
            except OSError:
                return []

        def comm(pid):
            try:
                return read_text(f"/proc/{pid}/comm").strip()
            except OSError:
                return ""

        return sorted(s for c in children(warm) if comm(c) == "cat" for s in children(c))

    def kill_spares(self, pids):
        """SIGKILLs spares (forked for this test) and waits until each is dead: a kill only
        queues the signal, and a spare that still runs when the restart asks for it takes
        the work and dies with it."""
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        self.wait_for(lambda: not any(pid_alive(pid) for pid in pids), what=f"spares {pids} to die")

    def restart_from_spares(self, script_text=SPARE_RESTART, env=None, before_restart=lambda warm, spares: None,
                            cold=False):
        """SPARE_RESTART's job: once two spares wait under the warm process, rank 0 of attempt
        0 fails (after before_restart(the warm process's pid, spares)); the job must succeed
        with one import, and nothing cold unless `cold`. Returns the spares and the pids of
        attempt 1's workers."""
        script = self.write("spare.py", script_text)
        p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "probe_mod", "--max-restarts", "1",
                        "--log-level", "info", script], env=env or self.env())
        m = self.wait_for(lambda: re.search(r"warm process pid (\d+)", read_text(self.path("ddprun.stderr"))),
                          what="the warm process's pid")
        warm = int(m.group(1))

        def attempt_0():  # its workers: spares taken, children of their child between until it is gone
            if not os.path.exists(self.path("starts")):
                return set()
            return {int(pid) for a, _, pid in (l.split() for l in read_text(self.path("starts")).splitlines())
                    if a == "0"}

        self.wait_for(lambda: len(attempt_0()) == 2, what="attempt 0's workers")

        def new_spares():
            found = [pid for pid in self.spares(warm) if pid not in attempt_0()]
            return len(found) == 2 and found

        spares = self.wait_for(new_spares, what="two spare workers")
        before_restart(warm, spares)
        open(self.path("fail_now"), "w").close()
        self.assertEqual(p.wait(timeout=scaled(60)), 0, read_text(self.path("ddprun.stderr")))
        self.assertEqual(len(self.probe_imports()), 1)
        self.assertEqual("start cold" in read_text(self.path("ddprun.stderr")), cold,
                         read_text(self.path("ddprun.stderr")))
        restarted = sorted(int(pid) for a, _, pid in
                           (l.split() for l in read_text(self.path("starts")).splitlines()) if a == "1")
        return spares, restarted

    def test_a_restart_is_served_by_spare_workers(self):
        # While attempt 0 runs, two spares wait under the warm process; attempt 1's workers
        # are those two processes (nothing forked on the restart's path), with one import.
        spares, restarted = self.restart_from_spares()
        self.assertEqual(restarted, spares)

    def first_spare_replaced(self, harm):
        """restart_from_spares with harm(pid) done to the first spare before the restart: that
        rank must be forked from the warm process at the request (no second import) and the
        other be the second spare. Returns the first spare's pid."""
        spares, restarted = self.restart_from_spares(before_restart=lambda warm, spares: harm(spares[0]))
        self.assertEqual(len(restarted), 2)
        self.assertIn(spares[1], restarted)
        self.assertNotIn(spares[0], restarted)
        return spares[0]

    def test_a_spare_killed_before_the_restart_is_replaced_by_a_fork(self):
        # The spare is dead before the restart asks for it.
        self.first_spare_replaced(lambda pid: self.kill_spares([pid]))

    def test_a_spare_killed_as_the_restart_asks_for_it_is_replaced_by_a_fork(self):
        # The kill only queues the signal, and the restart goes at once: the dying spare may
        # still be handed rank 0's request, but it cannot say it took it, so that rank is
        # forked from the warm process instead (it took the work and died with it before).
        self.first_spare_replaced(lambda pid: os.kill(pid, signal.SIGKILL))

    def test_a_spare_frozen_before_the_restart_is_killed_and_replaced_by_a_fork(self):
        # A stopped spare cannot take its request (a worker that never runs, and a job that
        # never ends, before): the warm process waits 2 s for it to say it took it, kills it
        # and forks that rank instead. Nothing starts cold, and the frozen spare is gone.
        frozen = self.first_spare_replaced(lambda pid: os.kill(pid, signal.SIGSTOP))
        self.wait_for(lambda: not pid_alive(frozen), what=f"the frozen spare {frozen} to be gone")

    def test_a_fork_that_fails_starts_the_workers_cold(self):
        # The warm process cannot fork any more (a pids cgroup of its own, full), and the
        # spares are gone before the restart asks for them: the restart's workers start cold,
        # ddprun says so, and the job succeeds as it would have without --preload.
        cgroup = pids_cgroup(self)

        def no_more_forks(warm, spares):
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(warm))  # the warm process alone: ddprun and the spares stay where they were
            with open(os.path.join(cgroup, "pids.max"), "w") as f:
                f.write(read_text(os.path.join(cgroup, "pids.current")).strip())
            self.kill_spares(spares)

        spares, restarted = self.restart_from_spares(before_restart=no_more_forks, cold=True)
        self.assertEqual(len(restarted), 2)
        self.assertFalse(set(restarted) & set(spares))
        self.assertRegex(read_text(self.path("ddprun.stderr")),
                         r"--preload: (2 worker\(s\) could not be forked|the warm Python process did not fork "
                         r"the workers \(.*\)): they start cold")

    def test_an_environment_too_large_for_a_spare_is_forked_at_the_request(self):
        # 600 kB of environment does not fit in one message to a spare (a socket's buffer):
        # the restart's workers are forked from the warm process at the request instead,
        # see all of it, and nothing starts cold.
        big = {f"BIG_{i}": chr(ord("a") + i) * 100_000 for i in range(6)}
        spares, restarted = self.restart_from_spares(SPARE_RESTART.replace("import os, sys, time\n", """import os, sys, time
with open(os.path.join(os.environ["OUT"], "big_" + os.environ["TORCHELASTIC_RESTART_COUNT"] + os.environ["RANK"]),
          "w") as f:
    f.write(" ".join(f"{k}={len(v)}{v[:1]}" for k, v in sorted(os.environ.items()) if k.startswith("BIG_")))
"""), env=self.env(**big))
        want = " ".join(f"BIG_{i}=100000{chr(ord('a') + i)}" for i in range(6))
        for r in range(2):
            self.assertEqual(read_text(self.path(f"big_1{r}")), want)
        self.assertEqual(len(restarted), 2)
        self.assertFalse(set(restarted) & set(spares), "the spares could not take the request")

    def test_spares_do_not_outlive_ddprun(self):
        script = self.write("sleeper.py", SLEEPER)
        p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "json", "--max-restarts", "1",
                        "--log-level", "info", script], env=self.env())
        self.wait_for_files([self.path("ready_0"), self.path("ready_1")])
        warm = int(re.search(r"warm process pid (\d+)", read_text(self.path("ddprun.stderr"))).group(1))
        spares = self.wait_for(lambda: len(self.spares(warm)) == 2 and self.spares(warm), what="two spare workers")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=scaled(30)), 143)

        def alive(pid):
            try:
                return read_text(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False

        self.assertEqual([s for s in spares if alive(s)], [])

    def test_no_spares_wait_when_no_attempt_can_follow(self):
        # --max-restarts 0 on one node: no restart, no new round; the first attempt's spares
        # were used, and no new ones are forked.
        script = self.write("sleeper.py", SLEEPER)
        p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "json", "--log-level", "info", script],
                       env=self.env())
        self.wait_for_files([self.path("ready_0"), self.path("ready_1")])
        warm = int(re.search(r"warm process pid (\d+)", read_text(self.path("ddprun.stderr"))).group(1))
        time.sleep(1.0)  # the warm process forks new spares 0.3 s after a request, if any
        self.assertEqual(self.spares(warm), [])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=scaled(30)), 143)

    def test_a_dead_warm_process_is_replaced_and_said(self):
        # The warm process is killed while attempt 0 runs; attempt 1's workers come from a
        # new one (a second import), and ddprun says so. Rank 1 fails once ddprun said that
        # the warm process died (the test creates DIE_NOW then; DIE_AFTER: a hang guard).
        script = self.write("restart.py", RESTART.replace(
            'sys.exit(3)', 'end = time.monotonic() + float(os.environ["DIE_AFTER"])\n'
                           '    while not os.access(os.environ["DIE_NOW"], os.F_OK) and time.monotonic() < end: '
                           'time.sleep(0.05)\n    sys.exit(3)'))
        p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "probe_mod", "--max-restarts", "1",
                        "--log-level", "info", script], env=self.env(DIE_AFTER=scaled(5),
                                                                     DIE_NOW=self.path("die_now")))
        m = self.wait_for(lambda: re.search(r"warm process pid (\d+)", read_text(self.path("ddprun.stderr"))),
                          what="the warm process's pid")
        warm = int(m.group(1))
        self.wait_for(lambda: os.path.exists(self.path("starts")) and len(read_text(self.path("starts")).split("\n"))
                      > 2, what="attempt 0's workers")
        os.kill(warm, signal.SIGKILL)  # ddprun's child, started for this test
        died = (f"--preload: the warm Python process (pid {warm}) was killed by SIGKILL: the next workers "
                "come from a new one")
        self.wait_for(lambda: died in read_text(self.path("ddprun.stderr")), what="ddprun to see the warm process die")
        open(self.path("die_now"), "w").close()
        self.assertEqual(p.wait(timeout=scaled(60)), 0)
        err = read_text(self.path("ddprun.stderr"))
        self.assertIn(died, err)
        self.assertIn("--preload: started a new warm Python process", err)
        self.assertEqual(len(self.probe_imports()), 2)

    def test_an_import_stuck_past_the_hang_timeout_gives_up_the_warm_process(self):
        """--hang-timeout covers the warm process's import as it covers a cold worker's:
        a preloaded module stuck for 60 s, --hang-timeout 2: the warm process is stopped with
        a warning naming it, and the workers start cold (this script does not import it: the
        job ends with exit 0 in seconds). Before, ddprun waited the whole minute, silent."""
        with open(os.path.join(self.mods, "stuck_mod.py"), "w") as f:
            f.write("import time\ntime.sleep(60)\n")
        script = self.write("hello.py", "print('hello')\n")
        res = self.job(script, preload="stuck_mod", flags=("--hang-timeout", "2"), timeout=40)
        self.assertEqual(res.rc, 0, res)
        self.assertLess(res.elapsed, scaled(20), res)
        self.assertRegex(res.stderr, r"--preload: the warm Python process \(pid \d+\) did not import stuck_mod within "
                                     r"--hang-timeout 2 s: it is stopped, and this job's workers start cold")
        self.assertEqual(res.stdout.count("hello"), 2, res)
        # Where the import was stuck, first (before: no stack at all).
        self.assertRegex(res.stderr, r"no import ended within --hang-timeout 2 s: no worker runs yet: the warm Python "
                                     r"process \(pid \d+, --preload\) is importing stuck_mod; where it is")
        self.assertRegex(res.stderr, r'File ".*stuck_mod.py", line 2 in <module>')

    def test_a_dump_during_the_preload_import_shows_where_it_is(self):
        """SIGQUIT (or ddprun --dump-stacks) while the warm process imports, before any worker
        runs: its stack, then the job goes on. Before: "no worker is running", and nothing."""
        with open(os.path.join(self.mods, "slow_mod.py"), "w") as f:
            # Until the test says, once it saw the dump (30 s: a hang guard). (One line, the
            # marker's too: the dump may come while the marker is still being written.)
            f.write("import os, time; end = time.monotonic() + 30; out = os.environ['OUT']\n"
                    "while not os.access(os.path.join(out, 'done'), os.F_OK) and time.monotonic() < end: "
                    "time.sleep(0.05) if os.access(os.path.join(out, 'importing'), os.F_OK) else "
                    "open(os.path.join(out, 'importing'), 'w').close()\n")
        script = self.write("hello.py", "print('hello')\n")
        err_path = self.path("ddprun.stderr")
        with open(err_path, "w") as err:
            p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "slow_mod", script],
                           env=self.env(), stdout=subprocess.DEVNULL, stderr=err)
            deadline = time.monotonic() + scaled(20)
            while not os.path.exists(self.path("importing")) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(p.pid, signal.SIGQUIT)
            self.wait_for(lambda: re.search(r'File ".*slow_mod.py", line \d+ in <module>', read_text(err_path)),
                          what="the warm process's stack")
            open(self.path("done"), "w").close()
            self.assertEqual(p.wait(timeout=scaled(30)), 0)
        err = read_text(err_path)
        self.assertRegex(err, r"SIGQUIT: no worker runs yet: the warm Python process \(pid \d+, --preload\) is "
                              r"importing slow_mod; where it is")
        self.assertRegex(err, r'File ".*slow_mod.py", line 2 in <module>')
        self.assertNotIn("no worker is running", err)

    def test_a_warm_process_killed_with_a_worker_is_replaced_before_the_restart(self):
        """The warm process and rank 1 are SIGKILLed at the same moment (an OOM kill of both,
        `kill -9` of several pids): the restart's workers come from a new warm process. (QA saw,
        with torch preloaded, 1 run in 3 send the restart's request to the dead one: "did not
        fork the workers (no answer): they start cold"; not reproduced here: ddprun now reaps
        a warm process that died before it asks it, which covers an end read after rank 1's.)"""
        script = self.write("sleeper.py", "import os, sys, time\n"
                                          "with open(os.path.join(os.environ['OUT'], 'starts'), 'a') as f:\n"
                                          "    f.write(f\"{os.environ['TORCHELASTIC_RESTART_COUNT']} "
                                          "{os.environ['RANK']} {os.getpid()}\\n\")\n"
                                          "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                                          "    time.sleep(60)\n")
        for run in range(3):
            with self.subTest(run=run):
                if os.path.exists(self.path("starts")):
                    os.remove(self.path("starts"))
                p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "probe_mod", "--max-restarts",
                                "1", "--log-level", "info", script], env=self.env())
                def first_attempt():
                    if not os.path.exists(self.path("starts")):
                        return None
                    lines = [l.split() for l in read_text(self.path("starts")).splitlines()]
                    return {int(r): int(pid) for n, r, pid in lines if n == "0"} if len(lines) >= 2 else None
                pids = self.wait_for(first_attempt, what="attempt 0's workers")
                warm = int(re.search(r"warm process pid (\d+)", read_text(self.path("ddprun.stderr"))).group(1))
                rank = pids[1]
                os.kill(warm, signal.SIGKILL)  # ddprun's child, started for this test
                os.kill(rank, signal.SIGKILL)  # the worker it forked for this test
                self.assertEqual(p.wait(timeout=scaled(60)), 0)
                err = read_text(self.path("ddprun.stderr"))
                self.assertNotIn("they start cold", err)
                self.assertIn("--preload: started a new warm Python process", err)

    def test_a_warm_process_that_dies_answering_leaves_no_rank_twice(self):
        # The warm process forks (or hands spares) a request's workers and dies before its
        # reply (DDPRUN_TEST_WARM_DIES_ANSWERING: killed mid-request, by the OOM killer say):
        # the workers start cold, and the forks nobody was told of exit without running their
        # ranks beside them (before: each rank ran twice). Both attempts' requests die so;
        # the restart's warm process is a new one.
        script = self.write("ranks.py", "import os, sys, time\n"
                                        "a = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
                                        "print('rank', os.environ['RANK'], 'attempt', a, flush=True)\n"
                                        "time.sleep(1)\n"
                                        "sys.exit(3 if a == '0' and os.environ['RANK'] == '0' else 0)\n")
        res = self.job(script, preload="json", flags=["--max-restarts", "1"],
                       env=self.env(DDPRUN_TEST_WARM_DIES_ANSWERING="1"))
        self.assertEqual(res.rc, 0, res)
        lines = sorted(l.split(":", 1)[1] for l in res.stdout.splitlines())
        self.assertEqual(lines, ["rank 0 attempt 0", "rank 0 attempt 1", "rank 1 attempt 0", "rank 1 attempt 1"], res)
        self.assertEqual(res.stderr.count("did not fork the workers"), 2, res)

    # -- what a worker sees

    def view(self, flags, env, script):
        res = self.job(script, "a", "--b", "\udcff", preload=flags, env=env)  # (b"\xff": not UTF-8)
        self.assertEqual(res.rc, 0, res)
        views = [json.loads(read_text(self.path(f"view_{r}"))) for r in range(2)]
        for r in range(2):
            os.unlink(self.path(f"view_{r}"))
        return views

    def test_a_worker_sees_what_python_u_script_shows(self):
        script = self.write("view.py", VIEW)
        # PYTHON_EXEC as most have it, a name found on PATH: sys.orig_argv[0] is that name, cold
        # and warm (before, the warm workers' was sys.executable, its path; under the torch 2
        # runtime's wrapper both are the path the wrapper runs).
        python = clean_env()["PYTHON_EXEC"]
        env = self.env(NOT_UTF8="\udcfe", PYTHON_EXEC=os.path.basename(python),
                       PATH=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
        cold, warm = self.view(None, env, script), self.view("json,probe_mod", env, script)
        for c, w in zip(cold, warm):
            self.assertEqual(c, w)
        self.assertEqual(warm[1]["argv"], [script, "a", "--b", "\udcff"])
        self.assertEqual(warm[1]["env"]["NOT_UTF8"], "\udcfe")
        self.assertEqual(warm[1]["name"], "__main__")
        self.assertTrue(warm[1]["pgid_is_pid"])
        self.assertTrue(warm[1]["sid_is_pid"])

    def test_a_script_path_is_opened_as_python_opens_it(self):
        """`lnk/../x.py` with lnk a symlink to real/deep is real/x.py to the kernel and to
        Python, and __file__ keeps the path as given (`./x.py` too); the warm process tidied
        it as text: another file (the one beside lnk), or none."""
        os.makedirs(self.path("real", "deep"))
        os.symlink(self.path("real", "deep"), self.path("lnk"))
        self.write(os.path.join("real", "x.py"), VIEW)
        self.write("x.py", "raise SystemExit('the wrong x.py ran')\n")
        self.write("view.py", VIEW)
        env = self.env()
        for script in ("lnk/../x.py", "./view.py"):
            cold, warm = self.view(None, env, script), self.view("json", env, script)
            self.assertEqual(cold, warm, script)
            self.assertEqual(warm[0]["file"], os.path.join(self.tmp, script))

    def test_a_worker_sees_what_python_u_m_module_shows(self):
        self.write(os.path.join("mods", "view_mod.py"), VIEW)
        env = self.env()
        runs = []
        for pre in ([], ["--preload", "json"]):
            res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", *pre, "-m", "view_mod", "x"], env=env)
            self.assertEqual(res.rc, 0, res)
            runs.append(json.loads(read_text(self.path("view_1"))))
        self.assertEqual(runs[0], runs[1])
        self.assertEqual(runs[1]["argv"], [self.path("mods", "view_mod.py"), "x"])

    def test_a_preloaded_import_leaves_each_rank_its_variables_and_fresh_seeds(self):
        # A preloaded module's os.environ.setdefault("RANK", "0") (...) must not override the
        # rank's own values (before: every rank saw RANK 0, WORLD_SIZE 1); a variable it sets
        # or removes that ddprun did not set is set or removed as cold. torch's generator and
        # multiprocessing's authkey are each rank's own (before: the warm process's, in all).
        script = self.write("seen.py", SEEN)
        self.write(os.path.join("mods", "env_defaults.py"), ENV_DEFAULTS)
        env = self.env(UNSET_AT_IMPORT="x")
        runs = []
        for pre in (None, "torch,env_defaults"):
            res = self.job(script, preload=pre, env=env)
            self.assertEqual(res.rc, 0, res)
            seen = [self.path(n) for n in os.listdir(self.tmp) if n.startswith("seen_")]
            runs.append(sorted((json.loads(read_text(p)) for p in seen), key=lambda s: s["env"]["RANK"]))
            for p in seen:
                os.unlink(p)
        cold, warm = runs
        with self.subTest("the rank's own variables"):
            ports = [{s["env"].pop("MASTER_PORT") for s in run} for run in runs]  # (each job's own)
            self.assertEqual([s["env"] for s in warm], [s["env"] for s in cold])
            self.assertEqual(len(ports[1]), 1)
            self.assertNotEqual(ports[1], {"1"})
        with self.subTest("fresh random states"):
            self.assertEqual([warm[0][k] == warm[1][k] for k in ("torch_seed", "authkey")], [False, False])

    def test_seeds_a_preloaded_import_sets_reach_every_rank(self):
        # A preloaded module that seeds random, numpy and torch at import hands every rank
        # those states, as a cold import does (before: each rank's were reseeded at random).
        # One that draws from them, or reseeds them at random, seeds none: each rank's own
        # states, as cold (a review found the first take of this fix gave every rank the same).
        self.write(os.path.join("mods", "seeds_at_import.py"), SEEDS_AT_IMPORT)
        self.write(os.path.join("mods", "draws_at_import.py"), DRAWS_AT_IMPORT)
        script = self.write("draws.py", DRAWS)

        def drawn(pre, module):
            res = self.job(script, preload=pre, env=self.env(AT_IMPORT=module))
            self.assertEqual(res.rc, 0, res)
            return [json.loads(read_text(self.path(f"drew_{r}"))) for r in range(2)]

        cold = drawn(None, "seeds_at_import")
        self.assertEqual(cold[0], cold[1])
        for pre in ("seeds_at_import", "torch,seeds_at_import"):
            self.assertEqual(drawn(pre, "seeds_at_import"), cold, pre)
        for pre in (None, "draws_at_import", "torch,draws_at_import"):
            ranks = drawn(pre, "draws_at_import")
            self.assertEqual([a == b for a, b in zip(*ranks)], [False, False, False], pre)

    def test_a_preloaded_lazy_proxy_is_left_alone(self):
        # An object whose __class__ raises until configured (Django's lazy settings): the
        # warm process's look for open files asks no object's __class__ (a review found
        # isinstance() would, and the exception ended the warm process).
        self.write(os.path.join("mods", "lazy_mod.py"),
                   "class Lazy:\n    @property\n    def __class__(self):\n        raise RuntimeError('not configured')\n"
                   "SETTINGS = Lazy()\n")
        res = self.job(self.write("hello.py", "print('hello')\n"), preload="lazy_mod")
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.stdout.count("hello"), 2, res)
        self.assertNotIn("start cold", res.stderr, res)

    def test_what_a_worker_writes_to_a_file_a_preloaded_module_opened_is_flushed(self):
        # Before, a warm worker's exit left those writes in its buffer: lost, with exit 0.
        self.write(os.path.join("mods", "opens_log.py"), OPENS_LOG)
        script = self.write("writes_log.py", WRITES_LOG)
        for pre in (None, "opens_log"):
            res = self.job(script, preload=pre)
            self.assertEqual(res.rc, 0, res)
            self.assertEqual(sorted(read_text(self.path("shared_log")).splitlines()), ["rank 0", "rank 1"], pre)
            os.unlink(self.path("shared_log"))

    def test_a_preloaded_import_sees_the_script_arguments(self):
        # A config module that parses sys.argv at import sees the script's arguments, as when
        # the script imports it cold (before: the bootstrap's, and SystemExit from argparse).
        self.write(os.path.join("mods", "argv_config.py"), ARGV_CONFIG)
        self.write("cfg.py", USES_CONFIG)
        self.write(os.path.join("mods", "cfg_mod.py"), USES_CONFIG)
        for target in (["cfg.py"], ["-m", "cfg_mod"]):
            with self.subTest(target=target):
                runs = []
                for pre, seen in ((None, "import_argv_0"), ("argv_config", "import_argv_warm")):
                    res = self.job(*target, "--lr", "0.5", "\udcff", preload=pre, nproc=1)
                    argv = json.loads(read_text(self.path(seen))) if os.path.exists(self.path(seen)) else None
                    runs.append((res.rc, res.stdout, argv))
                self.assertEqual(runs[0], runs[1])
                self.assertEqual(runs[1][1], "[rank0]:lr 0.5 True\n")

    def test_a_zipapp_a_folder_and_a_relative_path_run_as_python_runs_them(self):
        # A zipapp and a folder with __main__.py run their __main__ (before: the zip was
        # compiled as source, the folder failed); a relative script path is the folder
        # ddprun started in even when a preloaded module changed the working folder; a script
        # that cannot be opened exits 2 with Python's message (before: a traceback from the
        # bootstrap, exit 1).
        import zipfile

        self.write(os.path.join("mods", "to_root.py"), "import os\nos.chdir('/')\n")
        view = "import to_root\n" + VIEW
        self.write("view.py", view)
        with zipfile.ZipFile(self.path("app.pyz"), "w") as z:
            z.writestr("__main__.py", view)
        os.mkdir(self.path("appdir"))
        self.write(os.path.join("appdir", "__main__.py"), view)
        env = self.env()
        for target in ("view.py", "app.pyz", "appdir"):
            with self.subTest(target=target):
                cold, warm = self.view(None, env, target), self.view("json,to_root", env, target)
                self.assertEqual(cold, warm)
                self.assertEqual(warm[0]["cwd"], "/")
        with self.subTest(target="gone.py"):  # (attempt 0 removes it: attempt 1 cannot open it)
            runs = []
            for pre in (None, "json,to_root"):
                self.write("gone.py", "import os, sys\nos.unlink(__file__)\nsys.exit(3)\n")
                res = self.job("gone.py", preload=pre, nproc=1, env=env, flags=("--max-restarts", "1"))
                runs.append((res.rc, [l for l in res.stderr.splitlines() if l.startswith("[rank0]:")]))
            self.assertEqual(runs[0], runs[1])
            # (the interpreter's name as it was run: PYTHON, or the chroot's own behind a wrapper)
            self.assertEqual(runs[1][0], 2)
            self.assertRegex("\n".join(runs[1][1]), r"^\[rank0\]:\S+: can't open file %s: \[Errno 2\] No such file "
                             r"or directory$" % re.escape(repr(self.path("gone.py"))))

    def test_modules_the_script_imports_are_finalized_and_a_closed_stdout_is_no_error(self):
        # A module the script imported after the fork is released at exit as Python releases
        # it: its open file's buffer is written, its objects' finalizers run, and one that
        # raises is reported, not an error (before: nothing written, no finalizer). A stdout
        # the script closed is not flushed (before: exit 120).
        self.write(os.path.join("mods", "helper_mod.py"), HELPER)
        script = self.write("closes.py", CLOSES_STDOUT)
        runs = []
        for pre in (None, "json"):
            res = self.job(script, preload=pre, nproc=1, flags=("--no-stack-dumps",))
            lines = [re.sub(r"0x[0-9a-f]+", "0x", l) for l in res.stdout.splitlines() + res.stderr.splitlines()
                     if l.startswith("[rank0]:") and not l.startswith("[rank0]:    ")]  # (cold: no source line)
            log = self.path("helper_log")
            runs.append((res.rc, sorted(lines), read_text(log) if os.path.exists(log) else None))
        with self.subTest("finalized"):
            self.assertEqual(runs[0][1:], runs[1][1:])
            self.assertEqual(runs[1][2], "buffered, never closed\n")
            self.assertIn("[rank0]:Exception ignored in: <function Noisy.__del__ at 0x>", runs[1][1])
        with self.subTest("exit status"):
            self.assertEqual((runs[0][0], runs[1][0]), (0, 0))

    def test_multiprocessing_spawn_forkserver_and_dataloader_workers(self):
        script = self.write("mp.py", MULTIPROC)
        res = self.job(script, preload="torch")
        self.assertEqual(res.rc, 0, res)
        for r in range(2):
            self.assertEqual(read_text(self.path(f"mp_{r}")),
                             "{'mp_main': True, 'spawn': [1, 4, 9], 'forkserver': [1, 4, 9], 'dataloader': 28.0}")

    # -- failures, signals: as without --preload

    def test_a_failing_rank_gives_the_same_summary_and_status(self):
        script = self.write("raise.py", RAISE)
        cold, warm = self.job(script), self.job(script, preload="torch")
        self.assertEqual((cold.rc, warm.rc), (1, 1), warm)

        def root(res):  # the root cause's lines but its time and pid
            block = self.summary_block(res.stderr)
            lines = block[block.index("Root Cause"):].splitlines()[1:]
            lines = lines[:next(i for i, l in enumerate(lines) if l.startswith(("---", "===", "Where")))]
            return [re.sub(r"\(pid: \d+\)", "", l) for l in lines if not l.lstrip().startswith("time")]

        self.assertEqual(root(cold), root(warm))
        self.assertIn('File "%s", line 4, in train' % script, warm.stderr)
        self.assertNotIn("ddprun_preload", warm.stderr)

    def test_exit_codes_and_signals_of_workers(self):
        for how, rc in (("import sys; sys.exit(7)", 7), ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
                                                         139), ("raise KeyboardInterrupt", 130)):
            script = self.write("die.py", how + "\n")
            res = self.job(script, preload="json", nproc=1)
            self.assertEqual(res.rc, rc, (how, res))

    def test_a_worker_ends_as_python_does(self):
        # A warm worker skips tearing down the preloaded modules, not what a script sees of
        # Python's exit: its output, its status and its open file's data are a cold worker's.
        script = self.write("endings.py", ENDINGS)
        for how in (["ok"], ["exit", "3"], ["exit", "256"], ["exit-text"], ["raise"], ["interrupt"]):
            runs = []
            for pre in (None, "json"):
                res = self.job(script, *how, preload=pre, nproc=1, flags=("--no-stack-dumps",))
                lines = [l for l in res.stdout.splitlines() + res.stderr.splitlines() if l.startswith("[rank0]:")]
                runs.append((res.rc, lines, read_text(self.path("left_open_0"))))
            self.assertEqual(runs[0], runs[1], how)
            self.assertIn("[rank0]:__del__ ran", runs[1][1], how)
            self.assertEqual(runs[1][2], "written, never closed\n", how)
        self.assertEqual(runs[1][0], 130)

    def test_a_signal_while_the_warm_process_imports_stops_at_once(self):
        self.write(os.path.join("mods", "slow_import.py"), "import os, time\n"
                   "open(os.path.join(os.environ['OUT'], 'importing'), 'w').close()\ntime.sleep(60)\n")
        p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "slow_import",
                        self.write("ok.py", "pass\n")], env=self.env())
        self.wait_for_files([self.path("importing")])
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=scaled(30)), 143)
        self.assertLess(time.monotonic() - t0, 2.0)  # a quiet machine: about 10 ms

    def test_sigterm_reaches_the_workers(self):
        script = self.write("sleeper.py", SLEEPER)
        p = self.start(["--standalone", "--nproc-per-node", "2", "--preload", "json", script], env=self.env())
        self.wait_for_files([self.path("ready_0"), self.path("ready_1")])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(self.wait_exit(p, 30), 143)
        self.assertTrue(os.path.exists(self.path("term_0")) and os.path.exists(self.path("term_1")))

    # -- refused, with a clear error

    def test_a_module_that_initialises_cuda_is_refused(self):
        res = self.job(worker("torch_allreduce.py"), self.tmp, preload="torch,fake_cuda")
        self.assertEqual(res.rc, 1, res)
        self.assertIn("ddprun: error: --preload: importing fake_cuda initialised CUDA "
                      "(torch.cuda.is_initialized() is True)", res.stderr)
        self.assertFalse(os.path.exists(self.path("sum_0")))

    def test_a_missing_or_broken_module_is_an_error(self):
        res = self.job(worker("torch_allreduce.py"), self.tmp, preload="json,no_such_module_x")
        self.assertEqual(res.rc, 1, res)
        self.assertEqual(res.stderr.splitlines()[-1], "ddprun: error: --preload: importing no_such_module_x "
                         "failed: ModuleNotFoundError: No module named 'no_such_module_x'")
        self.write(os.path.join("mods", "broken.py"), "import json\nraise RuntimeError('config missing')\n")
        res = self.job(worker("torch_allreduce.py"), self.tmp, preload="broken")
        self.assertEqual(res.rc, 1, res)
        self.assertIn("RuntimeError: config missing", res.stderr)  # its traceback first
        self.assertIn("ddprun: error: --preload: importing broken failed: RuntimeError: config missing",
                      res.stderr)

    def test_bad_flag_values_are_usage_errors(self):
        for args, msg in ((["--preload", "torch,,x"], "--preload: '' is not a Python module name"),
                          (["--preload", "torch-x"], "--preload: 'torch-x' is not a Python module name"),
                          (["--preload", "json", "--no-python"], "--preload imports Python modules for Python "
                                                                 "workers; --no-python runs none")):
            r = subprocess.run([DDPRUN, *args, "true"], capture_output=True, text=True, env=self.env(),
                               timeout=scaled(30))
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertTrue(r.stderr.startswith("ddprun: error: " + msg), (args, r.stderr))
        # PET_PRELOAD (set for every job, say) leaves --no-python jobs alone.
        r = subprocess.run([DDPRUN, "--no-python", "true"], capture_output=True, text=True,
                           env=self.env(PET_PRELOAD="json"), timeout=scaled(30))
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_threads_alive_in_the_warm_process_are_named(self):
        res = self.job(self.write("ok.py", "pass\n"), preload="threader")
        self.assertEqual(res.rc, 0, res)
        self.assertIn("--preload: 1 thread(s) run in the warm process after importing threader, and a forked worker "
                      "has none of them: telemetry-flusher", res.stderr)

    def test_a_cold_python_exec_failure_is_reported_as_without_preload(self):
        env = self.env(PYTHON_EXEC="/nonexistent/python3.99")
        res = self.job(self.write("ok.py", "pass\n"), preload="json", env=env)
        self.assertEqual(res.rc, 127, res)
        self.assertIn("cannot execute /nonexistent/python3.99: No such file or directory", res.stderr)


class ForkBetween(unittest.TestCase):
    """The warm process's fork through a child between (ddprun_preload._fork_between), run
    in this process: the pids come back while a child is stopped before it ran."""

    def test_a_child_stopped_before_it_ran_does_not_hold_back_its_pids(self):
        # Each grandchild stops itself (SIGSTOP) at its first close, before it closes its
        # copy of the pipe the child between tells the pids through: as a spare that
        # test_a_spare_frozen_before_the_restart_is_killed_and_replaced_by_a_fork froze
        # before it ever ran (CI: the warm process waited for that pipe's end, and ddprun
        # started the workers cold 10 s later). It notes its pid first, to be killed by it.
        import gc
        import importlib.util
        import select

        spec = importlib.util.spec_from_file_location(
            "ddprun_preload_under_test", os.path.join(SOURCE, "src", "launcher", "python", "ddprun_preload.py"))
        preload = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(preload)
        me, real_close = os.getpid(), os.close
        note_r, note_w = os.pipe()

        def close(fd):
            if os.getpid() != me and os.getppid() != me:  # a grandchild (a worker, a spare)
                os.write(note_w, f"{os.getpid()}\n".encode())
                os.kill(os.getpid(), signal.SIGSTOP)
                os._exit(0)  # (never continued: killed below)
            real_close(fd)

        def on_alarm(*_):
            raise TimeoutError("the pids did not come back within 5 s")

        def noted(count, timeout):  # (not to the pipe's end: the stopped ones hold it)
            text, deadline = b"", time.monotonic() + timeout
            while len(text.split()) < count and time.monotonic() < deadline:
                if select.select([note_r], [], [], 0.05)[0]:
                    text += os.read(note_r, 4096)
            return [int(x) for x in text.split()]

        old_alarm = signal.signal(signal.SIGALRM, on_alarm)
        os.close = close  # (in the module too: its os is this process's)
        try:
            signal.alarm(max(1, int(scaled(5))))
            forked, got = preload._fork_between(2, lambda i, gone: i)
            if forked:  # (a grandchild never gets here: it stops at its first close)
                os._exit(0)
        finally:
            signal.alarm(0)
            os.close = real_close
            signal.signal(signal.SIGALRM, old_alarm)
            gc.unfreeze()
            stopped = noted(2, scaled(5))
            for pid in stopped:  # ours: forked above
                os.kill(pid, signal.SIGKILL)
            os.close(note_r)
            os.close(note_w)
        between, pids, go_w = got
        os.close(go_w)
        os.waitpid(between, 0)
        self.assertEqual(len(pids), 2)
        self.assertEqual(sorted(pids), sorted(stopped), "the pids told are those of the children stopped")


class ReadmeLine(DdprunTestCase):
    def test_the_readme_line_as_written(self):
        readme = read_text(os.path.join(SOURCE, "README.md"))
        section = readme[readme.index("## Warm workers"):]
        block = section[section.index("```sh\n") + 6:section.index("```", section.index("```sh\n") + 6)]
        lines = [l.strip() for l in block.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("--preload torch", lines[0])
        for name in ("build", "examples"):  # the line's relative paths, from this folder
            os.symlink(os.path.join(SOURCE, name), self.path(name))
        if os.environ.get("DDPRUN"):  # the binary under test, wherever it was built
            os.unlink(self.path("build"))
            os.makedirs(self.path("build"))
            os.symlink(os.path.dirname(os.path.dirname(DDPRUN)) + "/bin", self.path("build", "bin"))
        env = clean_env()
        env.pop("PET_PRELOAD", None)
        r = subprocess.run(lines[0], shell=True, cwd=self.tmp, env=env, capture_output=True, text=True,
                           timeout=scaled(180))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertRegex(r.stdout, r"\[rank0\]:.*epoch 2")


class PreloadElasticTest(test_c10d.C10dTestCase):
    def test_host_loss_reforms_from_the_warm_process(self):
        # B is SIGKILLed; A's workers of the next round are forked from A's warm process: A
        # imported the probe once for both rounds.
        probe_dir = self.path("mods")
        os.mkdir(probe_dir)
        with open(os.path.join(probe_dir, "probe_mod.py"), "w") as f:
            f.write(PROBE)
        env = clean_env(PYTHONPATH=probe_dir, PROBE_LOG=self.path("probe_A"))
        conf = test_c10d.CONF.replace("last_call_timeout=1", "last_call_timeout=0.3")
        args = ["--sleep", "30", "--sleep-at-world", "2=0.5"]
        pre = ["--max-restarts", "1", "--preload", "probe_mod"]
        a = self.start_node("A", "127.0.0.2", args, nnodes="1:2", conf=conf + ",is_host=1", extra=pre, env=env)
        b = self.start_node("B", "127.0.0.3", args, nnodes="1:2", conf=conf + ",is_host=0", extra=pre,
                            env=clean_env(PYTHONPATH=probe_dir, PROBE_LOG=self.path("probe_B")))
        r0 = self.wait_workers(4, world=4)
        t_kill = time.time()
        b.proc.send_signal(signal.SIGKILL)
        r1 = self.wait_workers(2, world=2)
        reform = min(r["t"] for r in r1) - t_kill
        self.wait_nodes([a], 30)
        self.assertEqual(a.rc, 0, self.describe())
        self.assertEqual(len(read_text(self.path("probe_A")).split()), 1)
        self.assertLess(reform, 2.0, self.describe())
        self.assertEqual(len(r0), 4)
        print(f"\nhost loss to the survivor's new (warm) workers: {reform:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
