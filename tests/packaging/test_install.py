"""cmake --install puts everything in its place, with nothing of the build tree baked in;
ddprun --version names the commit (or says that it is unknown, never failing)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import pkgtest
from pkgtest import BUILD, SRC, TAG, run

EXPECTED = [
    "bin/ddprun", "bin/ddp-store-server", "share/ddprun/python/sitecustomize.py",
    "share/ddprun/python/ddprun_preload.py", "lib/ddprun/etcd-http.so",
    "lib/libddp.so", "lib/libddp.so.0", "include/ddp/ddp.hpp", "include/ddp/process_group.hpp",
    "lib/cmake/ddp/ddpConfig.cmake", "lib/cmake/ddp/ddpConfigVersion.cmake", "lib/cmake/ddp/ddpTargets.cmake",
    "share/man/man1/ddprun.1.gz",
    "share/bash-completion/completions/ddprun", "share/zsh/vendor-completions/_ddprun",
    "share/doc/ddprun/copyright", "share/doc/ddprun/README.md",
    "share/doc/ddprun/examples/consumer/CMakeLists.txt", "share/doc/ddprun/examples/consumer/main.cpp",
    "share/doc/ddprun/examples/pytorch/train.py", "share/doc/ddprun/examples/docker/Containerfile",
    "share/doc/ddprun/examples/kubernetes/pytorchjob.yaml",
]


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def baked_paths(root):
    """Installed files that mention the build or source tree (RPATHs, __FILE__, configs)."""
    needles = {os.path.realpath(BUILD).encode(), os.path.realpath(SRC).encode(), BUILD.encode(), SRC.encode()}
    found = []
    for d, _, files in os.walk(root):
        for f in files:
            path = os.path.join(d, f)
            if os.path.islink(path):
                continue
            with open(path, "rb") as fh:
                data = fh.read()
            found += [f"{os.path.relpath(path, root)} contains {n.decode()}" for n in needles if n in data]
            if is_elf(path):
                dyn = run(["readelf", "-d", path], timeout=30).stdout
                found += [f"{os.path.relpath(path, root)}: {l.strip()}" for l in dyn.splitlines()
                          if "RPATH" in l or "RUNPATH" in l]
    return found


def git_commit(src):
    p = subprocess.run(["git", "-C", src, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix=f"{TAG}-install")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        run(["cmake", "--install", BUILD, "--prefix", cls.prefix], timeout=120)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_layout(self):
        missing = [f for f in EXPECTED if not os.path.exists(os.path.join(self.prefix, f))]
        self.assertEqual(missing, [])
        self.assertTrue(os.access(os.path.join(self.prefix, "bin/ddprun"), os.X_OK))

    def test_nothing_of_the_build_tree_baked_in(self):
        self.assertEqual(baked_paths(self.prefix), [])

    def test_installed_ddprun_runs_a_job_and_names_its_commit(self):
        ddprun = os.path.join(self.prefix, "bin/ddprun")
        out = run([ddprun, "--version"], timeout=30).stdout
        m = re.fullmatch(r"ddprun (\d+\.\d+\.\d+) \(commit ([^)]+)\)\n", out)
        self.assertIsNotNone(m, out)
        with open(os.path.join(SRC, "CMakeLists.txt")) as f:
            self.assertIn(f"VERSION {m.group(1)}", f.read())
        head = git_commit(SRC)
        if head:
            self.assertRegex(m.group(2), rf"^{head}(-dirty)?$")
        p = run([ddprun, "--standalone", "--nproc-per-node", "2", "--no-python", "/bin/sh", "-c",
                 "echo rank=$RANK of $WORLD_SIZE"], timeout=60)
        self.assertEqual(sorted(l for l in p.stdout.splitlines() if "rank=" in l),
                         ["[rank0]:rank=0 of 2", "[rank1]:rank=1 of 2"])

    def test_installed_ddprun_finds_its_worker_bootstrap(self):
        """docs/stacks.md: the installed ddprun puts <prefix>/share/ddprun/python first on the
        workers' PYTHONPATH, and a Python worker's stack shows on SIGQUIT."""
        ddprun = os.path.join(self.prefix, "bin/ddprun")
        p = run([ddprun, "--standalone", "--no-python", "/bin/sh", "-c", 'echo "pp=$PYTHONPATH"'], timeout=60)
        self.assertIn(f"[rank0]:pp={self.prefix}/share/ddprun/python", p.stdout)
        job = subprocess.Popen([ddprun, "--standalone", "/usr/bin/python3", "-c",
                                "import time; print('up', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PET_NO_PYTHON="1"))
        try:
            self.assertEqual(job.stdout.readline(), "[rank0]:up\n")
            time.sleep(0.3)  # the bootstrap ran before the script printed
            job.send_signal(signal.SIGQUIT)
            err = ""
            for line in job.stderr:
                err += line
                if line.startswith("[ddprun] where each rank is"):
                    break
            self.assertRegex(err, r"\[rank0\]:  File \"<string>\", line 1 in <module>")
        finally:
            job.kill()
            job.wait()
            job.stdout.close()
            job.stderr.close()


    def test_installed_ddprun_finds_its_warm_process(self):
        """docs/preload.md: --preload's warm process comes from <prefix>/share/ddprun/python."""
        ddprun = os.path.join(self.prefix, "bin/ddprun")
        script = os.path.join(self.tmp, "preloaded.py")
        with open(script, "w") as f:
            f.write("import sys; print('json' in sys.modules)\n")
        p = run([ddprun, "--standalone", "--nproc-per-node", "2", "--preload", "json", "--log-level", "info",
                 script], timeout=60,
                env=dict(os.environ, PYTHON_EXEC="/usr/bin/python3"))
        self.assertIn("--preload: imported json in", p.stderr)
        self.assertEqual(sorted(l for l in p.stdout.splitlines() if l.startswith("[rank")),
                         ["[rank0]:True", "[rank1]:True"])

    def test_installed_ddprun_loads_its_etcd_transport(self):
        """docs/design.md: an etcd job loads <prefix>/lib/ddprun/etcd-http.so (HTTP, TLS). A
        port nothing listens on: the refusal comes from inside the transport, so it loaded."""
        ddprun = os.path.join(self.prefix, "bin/ddprun")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = subprocess.run([ddprun, "--rdzv-backend", "etcd", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "1",
                            "--rdzv-conf", "protocol=https,read_timeout=1", "--no-python", "true"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, rf"ddprun: error: etcd at 127\.0\.0\.1:{port} \(https\): .*cannot connect to "
                                   rf"127\.0\.0\.1:{port}: Connection refused")
        self.assertNotIn("etcd transport", p.stderr)


class BuildTreeRunpath(unittest.TestCase):
    def test_no_program_or_library_of_the_build_tree_searches_the_current_folder(self):
        # An empty RUNPATH entry ("a:" as CMake pads it for install's rewrite) is the current
        # folder: libddp's made every worker started from a folder with a ./libfmt.so.9 load
        # it (QA). Every ELF file under build/bin and build/lib.
        bad = []
        for sub in ("bin", "lib"):
            for d, _, files in os.walk(os.path.join(BUILD, sub)):
                for f in files:
                    path = os.path.join(d, f)
                    if os.path.islink(path) or not is_elf(path):
                        continue
                    dyn = run(["readelf", "-d", path], timeout=30).stdout
                    for m in re.finditer(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn):
                        if "" in m.group(1).split(":"):
                            bad.append(f"{os.path.relpath(path, BUILD)}: [{m.group(1)}]")
        self.assertEqual(bad, [])


class BuildInfo(unittest.TestCase):
    """cmake/DdpBuildInfo.cmake, which writes --version's commit at every build."""

    def info(self, src, **defs):
        with tempfile.TemporaryDirectory(prefix=TAG) as d:
            out = os.path.join(d, "build_info.cpp")
            args = [f"-D{k}={v}" for k, v in {"SOURCE_DIR": src, "OUT": out, "VERSION": "9.8.7", **defs}.items()]
            run(["cmake", *args, "-P", os.path.join(SRC, "cmake/DdpBuildInfo.cmake")], timeout=60)
            with open(out) as f:
                text = f.read()
        self.assertIn('version() { return "9.8.7"; }', text)
        return re.search(r'git_commit\(\) \{ return "([^"]*)"; \}', text).group(1)

    def test_tarball_without_git_says_so(self):
        with tempfile.TemporaryDirectory(prefix=TAG) as d:
            self.assertEqual(self.info(d), "unknown, not built from a git checkout")

    def test_tarball_unpacked_inside_another_repository(self):
        if not shutil.which("git"):
            self.skipTest("no git")
        with tempfile.TemporaryDirectory(prefix=TAG) as d:
            run(["git", "init", "-q", d], timeout=30)
            run(["git", "-C", d, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                 "-m", "outer"], timeout=30)
            os.makedirs(os.path.join(d, "ddprun-0.1.0"))
            self.assertEqual(self.info(os.path.join(d, "ddprun-0.1.0")), "unknown, not built from a git checkout")
            self.assertRegex(self.info(d), r"^[0-9a-f]{12}$")

    def test_packager_override(self):
        with tempfile.TemporaryDirectory(prefix=TAG) as d:
            self.assertEqual(self.info(d, GIT_COMMIT="abc123"), "abc123")

    def test_this_checkout(self):
        head = git_commit(SRC)
        if not head:
            self.skipTest("not a git checkout")
        self.assertRegex(self.info(SRC), rf"^{head}(-dirty)?$")


if __name__ == "__main__":
    pkgtest.main()
