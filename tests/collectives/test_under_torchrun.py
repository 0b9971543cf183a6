#!/usr/bin/python3
"""A C++ worker on libddp, launched by PyTorch's own torchrun instead of ddprun: a drop-in
launcher works both ways. Registered twice (tests/CMakeLists.txt, ddp_add_torch_test):

- host: torchrun 1.13 (the anchor's). Its default (static) rendezvous gives the workers its
  agent's TCPStore (TORCHELASTIC_USE_AGENT_STORE=True), which speaks wire generation 1:
  libddp finds that itself (WireGeneration::kAuto) and trains. Before, its generation-2
  handshake got the connection reset, and the VALIDATE it then sent alone stalled torch's
  store for every client until the worker's next request. Its c10d (--standalone, or two
  agents) shares no store (TORCHELASTIC_USE_AGENT_STORE=False): the worker of rank 0 hosts
  one, as PyTorch's env:// does, and the others connect to it.
- torch2: torchrun 2.6 in the chroot of scripts/torch2-chroot.sh (torch_runtime.py), whose
  static and c10d rendezvous (--standalone) both share a generation-2 agent store. The
  worker is this build's binary run inside the chroot: the libraries it links that the
  chroot lacks come along (chroot_worker below).

  test_under_torchrun.py --train-linear build/bin/train_linear
Exits 77 (ctest SKIP_RETURN_CODE) without that torch (or, on the host, the anchor).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "testlib"))
from ports import free_port  # noqa: E402
from test_timeouts import scaled  # noqa: E402  (DDP_TEST_TIMEOUT_SCALE)
import torch_runtime  # noqa: E402

PYTHON = "/usr/bin/python3"
TORCHRUN113 = "/work/shared/anchors/torchrun113.py"
TRAIN_LINEAR = None


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_"))}


def torchrun(*args, cwd):
    """torchrun 1.13 with one libddp worker per rank: (rc, output, seconds)."""
    env = clean_env()
    t0 = time.monotonic()
    r = subprocess.run([PYTHON, TORCHRUN113, *args, "--no_python", TRAIN_LINEAR, "--steps", "300",
                        "--out", os.path.join(cwd, "model.txt")],
                       cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=scaled(120))
    return r.returncode, r.stdout, time.monotonic() - t0


class UnderTorchrun113(unittest.TestCase):
    def setUp(self):
        self.tmp = self.mkdtemp()

    def mkdtemp(self):
        d = tempfile.mkdtemp(prefix="ddp-torchrun-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_default_static_launch_trains_on_the_agents_generation1_store(self):
        rc, out, took = torchrun("--nproc_per_node", "2", "--master_port", str(free_port()), cwd=self.tmp)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"final loss \S+ over 2 ranks; weights identical on all ranks", out)
        # torchrun's own start-up is most of it; 60 s would be the old handshake's timeout.
        self.assertLess(took, scaled(45), out)

    def two_agents(self, *rendezvous):
        """Two torchrun 1.13 agents of one worker each: (return codes, outputs)."""
        tmp1 = self.mkdtemp()
        procs = []
        for rank, cwd in ((0, self.tmp), (1, tmp1)):
            procs.append(subprocess.Popen(
                [PYTHON, TORCHRUN113, "--nnodes", "2", "--nproc_per_node", "1", *rendezvous,
                 "--node_rank", str(rank), "--no_python", TRAIN_LINEAR,
                 "--steps", "300", "--out", os.path.join(cwd, "model.txt")],
                cwd=cwd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=scaled(120))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
        return [p.returncode for p in procs], outs

    def test_two_static_nodes_train_across_both_agents(self):
        rcs, outs = self.two_agents("--master_addr", "127.0.0.1", "--master_port", str(free_port()))
        self.assertEqual(rcs, [0, 0], outs)
        self.assertRegex(outs[0], r"final loss \S+ over 2 ranks; weights identical on all ranks", outs)

    def test_standalone_launch_trains_on_the_store_rank_0_hosts(self):
        # torchrun 1.13's c10d rendezvous (--standalone) shares no store with its workers
        # (TORCHELASTIC_USE_AGENT_STORE=False): rank 0 hosts the job's store on MASTER_PORT.
        rc, out, took = torchrun("--standalone", "--nproc_per_node", "2", cwd=self.tmp)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"final loss \S+ over 2 ranks; weights identical on all ranks", out)
        self.assertLess(took, scaled(45), out)

    def test_two_c10d_agents_train_on_the_store_rank_0_hosts(self):
        # The second agent's worker reaches rank 0's store at the address the first agent
        # published (its host name), not through a store of its own agent.
        rcs, outs = self.two_agents("--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
                                    "--rdzv_id", "libddp")
        self.assertEqual(rcs, [0, 0], outs)
        self.assertRegex("".join(outs), r"final loss \S+ over 2 ranks; weights identical on all ranks", outs)


def chroot_worker(binary, libs):
    """How the torch 2.x chroot runs `binary`: (the command's prefix, DDP_TORCH2_BIND). The
    libraries it links from the host's system folders that the chroot lacks (libfmt 9: the
    chroot is Debian 13) are copied into `libs` (under /tmp, which the chroot sees); a folder
    of any other library it links (this build's, CUDA's) is bound into the chroot. The chroot
    drops LD_LIBRARY_PATH on entry, so the command sets it itself."""
    root = subprocess.run([torch_runtime.CHROOT_SCRIPT, "path"], capture_output=True, text=True,
                          check=True).stdout.strip()
    binds = [d for d in os.environ.get("DDP_TORCH2_BIND", "").split(":") if d]
    path = [libs]
    for line in subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        name, arrow, where = line.strip().partition(" => ")
        where = where.split(" (")[0]
        if not arrow or not where.startswith("/"):
            continue
        if where.startswith(("/lib/", "/lib64/", "/usr/lib/")):
            if not any(os.path.exists(f"{root}{d}/{name}") for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")):
                shutil.copy(where, os.path.join(libs, name))
            continue
        folder = os.path.dirname(os.path.realpath(where))
        if folder not in binds:
            binds.append(folder)
        path.append(folder)
    return ["env", "LD_LIBRARY_PATH=" + ":".join(path)], ":".join(binds)


class UnderTorchrun2(unittest.TestCase):
    """torchrun 2.x (its python -m torch.distributed.run) in the chroot."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddp-torchrun2-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        libs = os.path.join(self.tmp, "libs")
        os.mkdir(libs)
        self.prefix, self.binds = chroot_worker(TRAIN_LINEAR, libs)

    def torchrun(self, *args, **extra_env):
        rt = torch_runtime.current()
        env = rt.env({**clean_env(), **extra_env})
        env["DDP_TORCH2_BIND"] = self.binds
        r = subprocess.run([rt.python, "-m", "torch.distributed.run", *args, "--no_python", *self.prefix,
                            TRAIN_LINEAR, "--steps", "300", "--out", os.path.join(self.tmp, "model.txt")],
                           cwd=self.tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=scaled(120))
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertRegex(r.stdout, r"final loss \S+ over 2 ranks; weights identical on all ranks", r.stdout)

    def test_static_launch_trains_on_the_agents_store(self):
        self.torchrun("--nproc_per_node", "2", "--master_port", str(free_port()))

    def test_standalone_launch_trains_on_the_agents_store(self):
        # c10d shares its agent's store with the workers from torch 2.4 on.
        self.torchrun("--standalone", "--nproc_per_node", "2")

    def test_standalone_launch_not_sharing_its_store_trains_on_rank_0s(self):
        # Told not to share it, torchrun sets TORCHELASTIC_USE_AGENT_STORE=False: rank 0 hosts.
        self.torchrun("--standalone", "--nproc_per_node", "2", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


def main():
    global TRAIN_LINEAR
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-linear", required=True)
    args, rest = ap.parse_known_args()
    TRAIN_LINEAR = os.path.abspath(args.train_linear)
    rt = torch_runtime.current()
    if rt.is_torch2:
        why = rt.skip_reason()
        if why:
            print(f"SKIP: {why}")
            return 77
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(UnderTorchrun2)
    else:
        if not os.path.exists(TORCHRUN113):
            print(f"SKIP: no {TORCHRUN113}")
            return 77
        if subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True).returncode != 0:
            print(f"SKIP: {PYTHON} has no torch")
            return 77
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(UnderTorchrun113)
    if rest:
        suite = unittest.defaultTestLoader.loadTestsFromNames(rest, sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
