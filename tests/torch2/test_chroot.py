#!/usr/bin/python3
"""The torch 2.x chroot as the tests use it (scripts/torch2-chroot.sh, tests/torch2/python3):
a drop-in interpreter that keeps the caller's pid, environment and working directory, sees
/tmp and the checkout at their host paths, resolves names through the caller's /etc/hosts,
has the use_libuv shim unless DDP_TORCH2_SHIM=0,
and leaves no mount behind, even when the process in it is killed. Exits 77 without root or
without the chroot (scripts/torch2-chroot.sh builds it)."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testlib"))
import torch_runtime  # noqa: E402

RT = torch_runtime.torch2()
CHROOT = torch_runtime.CHROOT_SCRIPT
TIMEOUT = 120 * torch_runtime.timeout_scale()
PROBE_LIBUV = ("import datetime, torch.distributed as d\n"
               "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)\n"
               "print('libuv', s.libuvBackend)")


def mounts():
    """The host's mounts inside the chroot (other tests' mounts elsewhere come and go)."""
    root = subprocess.run([CHROOT, "path"], capture_output=True, text=True).stdout.strip()
    with open("/proc/self/mounts") as f:
        return sorted(l for l in f.read().splitlines() if root and root in l)


class Torch2Chroot(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("the chroot needs root")
        if subprocess.run([CHROOT, "status"], capture_output=True).returncode != 0:
            raise unittest.SkipTest("no chroot: run scripts/torch2-chroot.sh")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddp_torch2_t14_")
        self.before = mounts()

    def tearDown(self):
        subprocess.run(["rm", "-rf", "--one-file-system", self.tmp])
        self.assertEqual(mounts(), self.before, "a mount outlived the command")

    def py(self, code, **env):
        return subprocess.run([RT.python, "-c", code], capture_output=True, text=True, cwd=self.tmp,
                              env=dict(os.environ, **env), timeout=TIMEOUT)

    def test_pid_env_cwd_tmp_kept(self):
        p = subprocess.Popen([RT.python, "-c", "import os, sys; print(os.getpid(), os.getcwd(), os.environ['T14_VAR'], "
                              "sys.version_info[:2], open('from_host').read()); open('from_chroot', 'w').write('c')"],
                             stdout=subprocess.PIPE, text=True, cwd=self.tmp, env=dict(os.environ, T14_VAR="kept"))
        with open(os.path.join(self.tmp, "from_host"), "w") as f:
            f.write("h")
        out, _ = p.communicate(timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual(out.split(), [str(p.pid), self.tmp, "kept", "(3,", "13)", "h"])
        with open(os.path.join(self.tmp, "from_chroot")) as f:
            self.assertEqual(f.read(), "c")

    def test_killed_command_leaves_no_mount(self):
        p = subprocess.Popen([RT.python, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, cwd=self.tmp)
        self.assertEqual(p.stdout.readline().strip(), "up")
        os.kill(p.pid, signal.SIGKILL)  # the chroot's python itself: the wrapper exec'd into it
        self.assertEqual(p.wait(timeout=TIMEOUT), -signal.SIGKILL)
        # tearDown checks the mount table

    def test_torch_2_and_the_use_libuv_shim(self):
        r = self.py("import torch; print(torch.__version__)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("2."), r.stdout)
        r = self.py(PROBE_LIBUV)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "libuv False"), r.stderr)
        r = self.py(PROBE_LIBUV, DDP_TORCH2_SHIM="0")
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("use_libuv was requested but PyTorch was build without libuv support", r.stderr)

    def test_names_resolve_as_the_caller_sees_them(self):
        # A Slurm test node is a namespace with its own /etc/hosts (tests/slurm/slurm_cluster.py);
        # its workers must resolve the node names the same inside the chroot.
        hosts = os.path.join(self.tmp, "hosts")
        with open("/etc/hosts") as f, open(hosts, "w") as out:
            out.write(f.read() + "127.0.0.77 t14-node t14-node.ddptest.local\n")
        code = "import socket; print(socket.gethostbyname('t14-node.ddptest.local'))"
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                            'mount --bind "$1" /etc/hosts && shift && exec "$@"', "sh", hosts, RT.python, "-c", code],
                           capture_output=True, text=True, cwd=self.tmp, timeout=TIMEOUT)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "127.0.0.77"), r.stderr)

    def test_parallel_commands(self):
        t0 = time.monotonic()
        procs = [subprocess.Popen([RT.python, "-c", f"import time; time.sleep(1); print({i})"], stdout=subprocess.PIPE,
                                  text=True, cwd=self.tmp) for i in range(6)]
        outs = [p.communicate(timeout=TIMEOUT)[0].strip() for p in procs]
        self.assertEqual(outs, [str(i) for i in range(6)])
        self.assertLess(time.monotonic() - t0, 30 * torch_runtime.timeout_scale())


if __name__ == "__main__":
    r = unittest.main(verbosity=2, exit=False).result
    sys.exit(1 if not r.wasSuccessful() else 77 if r.skipped and len(r.skipped) >= r.testsRun else 0)
