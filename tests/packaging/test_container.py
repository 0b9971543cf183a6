"""ddprun as a container's ENTRYPOINT under a real runtime: rootful podman (runc), the image
built by docker/Containerfile from a Debian 12 base made by debootstrap (no registry) and the
ddprun .deb. Plain python workers (tests/packaging/workers/job.py), no torch, except in
Torch2Variant: a DDP job on torch 2.6 in docker/Containerfile.pytorch's image.

The base image and the ddprun image are built once and cached by content (the root's package
set; the Containerfile and what the packages install). Containers and the network carry this
run's unique TAG and are removed at the end; podman's state stays under DDP_TEST_CACHE.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import pkgtest
from pkgtest import TAG, run_args, scaled

sys.path.insert(0, os.path.join(pkgtest.SRC, "tests", "testlib"))
import torch_runtime  # noqa: E402

EXAMPLES = os.path.join(pkgtest.SRC, "examples", "pytorch")
NOLIBUV = os.path.join(pkgtest.SRC, "tests", "torch2", "nolibuv")

# The 2-node test runs once per rendezvous backend: the static one (a PyTorchJob's
# PET_MASTER_*) and c10d (a PyTorchJob with an elasticPolicy: PET_RDZV_*, see rdzv_env()).
RDZV_BACKENDS = ("static", "c10d")

pm = pkgtest.Podman()
IMAGE = None


def setUpModule():
    global IMAGE
    pkgtest.skip_or_fail_without_podman(pm)
    base = pm.base_image(pkgtest.debian_root("python3", "procps"))
    debs = pkgtest.debs()
    with open(os.path.join(pkgtest.SRC, "docker/Containerfile"), "rb") as f:
        containerfile = f.read()
    key = hashlib.sha256(containerfile + base.encode() + pkgtest.payload_hash(debs.values()).encode()).hexdigest()[:16]
    with tempfile.TemporaryDirectory(prefix=f"{TAG}-ctx") as ctx:
        os.makedirs(os.path.join(ctx, "packages"))
        for deb in debs.values():
            shutil.copy(deb, os.path.join(ctx, "packages"))
        IMAGE = pm.build_cached("localhost/ddprun-test", key,
                                ["-f", os.path.join(pkgtest.SRC, "docker/Containerfile"),
                                 "--build-arg", f"BASE={base}", "--build-arg", "DEBS=prebuilt"], ctx)


def tearDownModule():
    ids = pm("ps", "-aq", "--filter", f"name={TAG}", check=False).stdout.split()
    if ids:
        pm("rm", "-f", "-t", "0", *ids, check=False)
    for net in pm("network", "ls", "-q", "--filter", f"name={TAG}", check=False).stdout.split():
        pm("network", "rm", "-f", net, check=False)


_n = 0


def name(what):
    global _n
    _n += 1
    return f"{TAG}-{what}-{_n}"


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out after {scaled(timeout):.0f} s waiting for {what}")


def logs(c):
    p = pm("logs", c, check=False)
    return p.stdout + p.stderr


def exit_code(c):
    return int(pm("wait", c, timeout=60).stdout.strip())


class Pid1(unittest.TestCase):
    def test_pid1_rank_tagged_output_exit_0(self):
        pkgtest.check_tagged_job(self, pm, IMAGE, 4)

    def test_worker_exit_3_is_the_container_exit_status(self):
        p = pkgtest.check_exit_3(self, pm, IMAGE)
        self.assertIn("Root Cause", p.stderr)

    def test_missing_entrypoint_argument_one_clear_line(self):
        p = pm("run", "--rm", *run_args(), IMAGE, check=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         ["ddprun: error: the following argument is required: training_script (see ddprun --help)"])

    def test_version(self):
        p = pm("run", "--rm", "--network", "none", IMAGE, "--version")
        self.assertRegex(p.stdout, r"^ddprun \d+\.\d+\.\d+ \(commit [^)]+\)\n$")


class Stop(unittest.TestCase):
    """podman stop -t 10: one SIGTERM per worker, exit 143 well within the grace period, and
    every line the workers wrote (also during the grace period) in the --log-dir files."""

    def stop_and_check(self, *run_extra, entry_args=()):
        logdir = tempfile.mkdtemp(prefix=f"{TAG}-logs")
        self.addCleanup(shutil.rmtree, logdir, True)
        c = name("stop")
        pm("run", "-d", "--name", c, *run_args("-v", f"{logdir}:/logs", *run_extra), IMAGE, *entry_args,
           "--nproc-per-node", "2", "--log-dir", "/logs", "--tee", "3", "/w/job.py", "term")
        wait_for(lambda: logs(c).count("]:ready") == 2, 30, f"both workers ready in {c}")
        t0 = time.monotonic()
        pm("stop", "-t", "10", c, timeout=60)
        elapsed = time.monotonic() - t0
        out = logs(c)
        self.assertEqual(exit_code(c), 143, out)
        self.assertLess(elapsed, 8.0, f"stop took {elapsed:.1f} s of the 10 s grace period\n{out}")
        for r in range(2):
            self.assertIn(f"[rank{r}]:bye sigterms=1", out)
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(logdir) for f in fs if f == "stdout.log")
        self.assertEqual(len(files), 2, files)
        for path in files:
            with open(path) as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0], "ready")
            self.assertEqual(lines[1], "got SIGTERM 1")
            self.assertEqual(lines[2:-1], [f"line {i} after SIGTERM" for i in range(200)])
            self.assertEqual(lines[-1], "bye sigterms=1")
        pm("rm", c)
        return out

    def test_podman_stop_sigterm_once_143_logs_complete(self):
        out = self.stop_and_check()
        self.assertIn("received SIGTERM: forwarding it to the workers", out)

    def test_podman_stop_with_preload_the_same(self):
        """Issue 22: workers forked by --preload's warm process (ddprun is PID 1)."""
        self.stop_and_check(entry_args=("--preload", "json"))

    def test_init_catatonit_above_ddprun(self):
        self.stop_and_check("--init")

    def test_init_tini_above_ddprun(self):
        tini = shutil.which("tini-static")
        if not tini:
            self.skipTest("tini-static is not installed (scripts/setup.sh installs tini)")
        self.stop_and_check("--init", "--init-path", tini)

    def test_inherited_signal_mask_and_ignored_signals(self):
        # The entrypoint leaves every signal blocked and SIGTERM/SIGCHLD ignored, then execs
        # ddprun: ddprun must still see the stop and its workers' exits.
        self.stop_and_check("--entrypoint", '["python3", "/w/sigwrap.py", "ddprun"]')

    def test_inherited_signal_mask_exit_status(self):
        p = pm("run", "--rm", *run_args("--entrypoint", '["python3", "/w/sigwrap.py", "ddprun"]'), IMAGE,
               "--nproc-per-node", "2", "/w/job.py", "hello", "--exit-rank", "0", "--exit-code", "3",
               check=False, timeout=60)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)

    def test_init_exit_status_passes_through(self):
        p = pm("run", "--rm", "--init", *run_args(), IMAGE, "--nproc-per-node", "2", "/w/job.py", "hello",
               "--exit-rank", "1", "--exit-code", "3", check=False)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)


class Signals(unittest.TestCase):
    def test_usr1_forwarded_job_keeps_running(self):
        c = name("usr1")
        pm("run", "-d", "--name", c, *run_args(), IMAGE, "--nproc-per-node", "2", "/w/job.py", "usr1")
        wait_for(lambda: logs(c).count("]:ready") == 2, 30, "both workers ready")
        pm("kill", "-s", "USR1", c)
        self.assertEqual(exit_code(c), 0, logs(c))
        out = logs(c)
        for r in range(2):
            self.assertIn(f"[rank{r}]:got SIGUSR1", out)
            self.assertIn(f"[rank{r}]:done", out)
        pm("rm", c)

    def test_quit_shows_every_ranks_stack_and_the_job_runs_on(self):
        """Issue 21: `podman kill -s QUIT` reaches ddprun (PID 1), which shows every rank's
        Python stack (the bootstrap the image installs with the .deb) and the job runs on."""
        c = name("quit")
        pm("run", "-d", "--name", c, *run_args(), IMAGE, "--nproc-per-node", "2", "/w/job.py", "usr1")
        wait_for(lambda: logs(c).count("]:ready") == 2, 30, "both workers ready")
        pm("kill", "-s", "QUIT", c)
        wait_for(lambda: "[ddprun] where each rank is" in logs(c), 30, "the dump")
        out = logs(c)
        self.assertRegex(out, r"SIGQUIT \(dump 1 asked on node 0 \(\S+\)\): the stacks of 2 ranks")
        for r in range(2):
            self.assertRegex(out, rf"\[rank{r}\]:  File \"/w/job.py\", line \d+ in <module>")
        pm("kill", "-s", "USR1", c)
        self.assertEqual(exit_code(c), 0, logs(c))
        pm("rm", c)

    def test_orphaned_grandchild_reaped_no_zombie(self):
        c = name("orphan")
        # The orphan lives long enough for `podman logs` and `podman exec ps` to see it on a
        # busy machine (1.5 s was not: each podman call can take a second there).
        seconds = float(scaled(6))  # job.py passes str(float) to sleep: "sleep 6.0"
        pm("run", "-d", "--name", c, *run_args(), IMAGE, "--nproc-per-node", "2", "/w/job.py", "orphan",
           "--seconds", str(seconds))
        wait_for(lambda: "orphan started" in logs(c), 30, "the orphan")

        def ps():
            rows = pm("exec", c, "ps", "-eo", "pid=,ppid=,stat=,args=").stdout.splitlines()
            return [r.split(None, 3) for r in rows]

        orphan = [r for r in ps() if r[3] == f"sleep {seconds}"]
        self.assertEqual(len(orphan), 1, ps())
        self.assertEqual(orphan[0][1], "1", "the orphan is reparented to ddprun, PID 1")
        wait_for(lambda: not any(r[3] == f"sleep {seconds}" for r in ps()), 20, "the orphan to exit")
        time.sleep(0.3)
        rows = ps()
        self.assertFalse([r for r in rows if r[2].startswith("Z")], f"zombies: {rows}")
        self.assertEqual(exit_code(c), 0, logs(c))
        pm("rm", c)


def rdzv_env(backend, master):
    if backend == "static":
        return {"PET_NNODES": "2", "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "29500"}
    # elasticPolicy minReplicas:maxReplicas; the endpoint is node 0's service name: the pod
    # that the name resolves to hosts the store (it is its own hostname), the other joins.
    return {"PET_NNODES": "2:2", "PET_RDZV_BACKEND": backend, "PET_RDZV_ENDPOINT": f"{master}:29400",
            "PET_RDZV_ID": TAG, "PET_LOG_LEVEL": "info"}


class TwoNodes(unittest.TestCase):
    """Two containers on one podman network, one 2-node job, configured as a Kubernetes
    PyTorchJob configures its pods: PET_* variables and no flags. The pods' own RANK,
    WORLD_SIZE, LOCAL_RANK (as the operator sets them) must not reach the workers."""

    @classmethod
    def setUpClass(cls):
        cls.net = f"{TAG}-net"
        pm("network", "create", cls.net)

    def test_two_nodes(self):
        for backend in RDZV_BACKENDS:
            with self.subTest(backend=backend):
                self.two_nodes(backend)

    def two_nodes(self, backend):
        master = name(f"{backend}-n0")
        nodes = [master, name(f"{backend}-n1")]
        for i, c in enumerate(nodes):
            env = {"PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(i),
                   **rdzv_env(backend, master), "RANK": str(7 + i), "WORLD_SIZE": "2", "LOCAL_RANK": "5",
                   "MASTER_ADDR": "pod-leak.invalid", "PYTHONUNBUFFERED": "1"}
            envargs = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
            pm("run", "-d", "--name", c, "--hostname", c, *run_args(*envargs, network=self.net), IMAGE,
               "/w/job.py", "hello")
        outs = []
        for c in nodes:
            rc = exit_code(c)
            outs.append(logs(c))
            self.assertEqual(rc, 0, outs[-1])
        seen = {}
        for i, out in enumerate(outs):
            for m in re.finditer(r"\[rank(\d)\]:env RANK=(\d+) LOCAL_RANK=(\d+) WORLD_SIZE=(\d+) "
                                 r"LOCAL_WORLD_SIZE=2 GROUP_RANK=(\d+) GROUP_WORLD_SIZE=2 MASTER_ADDR=(\S+)", out):
                tag, rank, local, world, group, maddr = m.groups()
                self.assertEqual(tag, rank)
                self.assertEqual((world, group, int(local)), ("4", str(i), int(rank) - 2 * i))
                self.assertNotEqual(maddr, "pod-leak.invalid")
                seen[int(rank)] = i
        # c10d orders the nodes by address (here the hostname), and n0 sorts first.
        self.assertEqual(seen, {0: 0, 1: 0, 2: 1, 3: 1}, outs)
        if backend == "c10d":
            self.assertIn("this node hosts the c10d store on port 29400", outs[0])
            self.assertIn(f"joining the c10d store at {master}:29400", outs[1])
            self.assertNotIn("hosts the c10d store", outs[1])
        pm("rm", *nodes)

    @classmethod
    def tearDownClass(cls):
        pm("network", "rm", "-f", cls.net, check=False)


def pytorch_variant(repo, pytorch_image):
    """docker/Containerfile.pytorch on pytorch_image (a local image standing in for a PyTorch
    image: no registry here), built once per content as repo:<key>."""
    containerfile = os.path.join(pkgtest.SRC, "docker/Containerfile.pytorch")
    with open(containerfile, "rb") as f:
        key = hashlib.sha256(f.read() + IMAGE.encode() + pytorch_image.encode()).hexdigest()[:16]
    with tempfile.TemporaryDirectory(prefix=f"{TAG}-ctx") as ctx:
        return pm.build_cached(repo, key, ["-f", containerfile, "--build-arg", f"DDPRUN_IMAGE={IMAGE}",
                                           "--build-arg", f"PYTORCH_IMAGE={pytorch_image}"], ctx)


class PytorchVariant(unittest.TestCase):
    """docker/Containerfile.pytorch layers ddprun on another distribution's image. Here Debian
    11's python3 stands in for it: glibc 2.31, older than the 2.36 ddprun is built against,
    like the Ubuntu of the official PyTorch images. (Torch2Variant: a real torch in it.)"""

    @classmethod
    def setUpClass(cls):
        cls.image = pytorch_variant("localhost/ddprun-test-pytorch",
                                    pm.base_image(pkgtest.debian_root_suite("bullseye", "python3")))

    def test_runs_on_an_older_c_library(self):
        p = pm("run", "--rm", "--network", "none", "--entrypoint", "ldd", self.image, "--version")
        self.assertIn("2.31", p.stdout.splitlines()[0])
        p = pm("run", "--rm", *run_args(), self.image, "--nproc-per-node", "2", "/w/job.py", "hello", check=False)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for r in range(2):
            self.assertRegex(p.stdout, rf"\[rank{r}\]:env RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 .* ppid=1 ")
        p = pm("run", "--rm", *run_args(), self.image, "--nproc-per-node", "2", "/w/job.py", "hello",
               "--exit-rank", "1", "--exit-code", "3", check=False)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        p = pm("run", "--rm", "--network", "none", "--entrypoint", "ddprun", self.image, "--version")
        self.assertRegex(p.stdout, r"^ddprun \d+\.\d+\.\d+ \(commit ")


class Torch2Variant(unittest.TestCase):
    """docker/Containerfile.pytorch on an image with a real PyTorch 2.x: the tests' torch 2.6
    root (Debian 13's python3-torch, scripts/torch2-chroot.sh) imported as a local image.
    ddprun is PID 1 and trains examples/pytorch/train.py on 2 gloo ranks.

    Debian's torch 2.6 is built without libuv, yet its TCPStore asks for libuv by default, so
    every worker would fail at init_process_group: the training run mounts the tests' shim
    (tests/torch2/nolibuv/sitecustomize.py) on PYTHONPATH, as the other torch 2.6 tests do;
    the run without it checks that ddprun's failure summary names that cause."""

    @classmethod
    def setUpClass(cls):
        rt = torch_runtime.torch2()
        if rt.skip_reason():
            raise unittest.SkipTest(rt.skip_reason())
        root = subprocess.run([torch_runtime.CHROOT_SCRIPT, "path"], capture_output=True, text=True,
                              check=True).stdout.strip()
        with open(os.path.join(root, ".ddprun-torch2"), "rb") as f:  # the root's build stamp
            key = "torch2-" + hashlib.sha256(f.read()).hexdigest()[:16]
        cls.image = pytorch_variant("localhost/ddprun-test-torch2", pm.base_image(root, key=key))

    def train(self, *extra):
        out = tempfile.mkdtemp(prefix=f"{TAG}-train")
        self.addCleanup(shutil.rmtree, out, True)
        p = pm("run", "--rm", *run_args("-v", f"{EXAMPLES}:/job:ro", "-v", f"{out}:/out", "-e", "OMP_NUM_THREADS=1",
                                        *extra),
               self.image, "--nproc-per-node", "2", "/job/train.py", "--epochs", "2", "--samples", "512",
               "--checkpoint", "/out/ckpt.pt", check=False, timeout=300)
        return p, out

    def test_trains_ddp_on_torch2_as_pid1(self):
        p, out = self.train("-v", f"{NOLIBUV}:/nolibuv:ro", "-e", "PYTHONPATH=/nolibuv")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("[rank0]:parameters identical on all 2 ranks", p.stdout)
        self.assertIn("[rank0]:epoch 1", p.stdout)
        self.assertGreater(os.path.getsize(os.path.join(out, "ckpt.pt")), 0)

    def test_trains_ddp_on_torch2_as_pid1_with_preload(self):
        """Issue 22: PET_PRELOAD set in the container's environment."""
        p, out = self.train("-v", f"{NOLIBUV}:/nolibuv:ro", "-e", "PYTHONPATH=/nolibuv", "-e", "PET_PRELOAD=torch",
                            "-e", "LOGLEVEL=info")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("[rank0]:parameters identical on all 2 ranks", p.stdout)
        self.assertIn("--preload: imported torch in", p.stderr)

    def test_torch_without_libuv_is_named_in_the_summary(self):
        p, out = self.train()
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("use_libuv was requested but PyTorch was build without libuv support", p.stderr)
        self.assertIn("hint: this PyTorch was built without libuv", p.stderr)
        self.assertEqual(os.listdir(out), [])


class BadInput(unittest.TestCase):
    def test_log_dir_on_read_only_mount_one_clear_line(self):
        ro = tempfile.mkdtemp(prefix=f"{TAG}-ro")
        self.addCleanup(shutil.rmtree, ro, True)
        p = pm("run", "--rm", *run_args("-v", f"{ro}:/logs:ro"), IMAGE, "--log-dir", "/logs", "/w/job.py",
               "hello", check=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)  # a usage error, found before the job
        self.assertEqual(p.stderr, "ddprun: error: --log-dir: cannot write in '/logs': Read-only file system\n")
        self.assertEqual(os.listdir(ro), [])


if __name__ == "__main__":
    pkgtest.main()
