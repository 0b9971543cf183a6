"""docker/Containerfile as the README gives it: `podman build -f docker/Containerfile -t ddprun .`
from the top of a checkout, where the build stage compiles the sources (DEBS=build, the
default) and installs its compilers and libraries from Debian's mirror. The context is a
clean export of the checkout's tracked files (as they are in the working tree: no build
tree, no prebuilt packages, nothing untracked). Two differences from the README's line, both
forced by this machine: BASE names a local Debian 12 image (no registry here; the one
test_container.py uses), and a compiler cache is mounted at /ccache (the Containerfile's
documented option), so that a changed tree recompiles only what changed. podman's layer
cache (DDP_TEST_CACHE/podman) skips the compile altogether for an unchanged tree.

ReadmeLines then runs the README's four "Containers" lines exactly as written, the PyTorch
image's two included (on a local stand-in for the PyTorch image).
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
from pkgtest import TAG

sys.path.insert(0, os.path.join(pkgtest.SRC, "tests", "testlib"))
import torch_runtime  # noqa: E402

pm = pkgtest.Podman()
IMAGE = f"localhost/ddprun-test-source:{TAG}"
CCACHE = os.path.join(pkgtest.CACHE, "ccache-container")
FIXED_MTIME = 1577836800  # every exported file's: the layer cache must not see a fresh copy as a change
built = False
BASE = None  # the local Debian 12 image the build starts from
CTX = None  # the export: a clean checkout


def export_tracked(dest):
    """The checkout's tracked files, as the working tree has them, copied into dest."""
    p = pkgtest.run(["git", "-C", pkgtest.SRC, "ls-files", "-z"], timeout=60, check=False)
    if p.returncode != 0:
        raise unittest.SkipTest(f"{pkgtest.SRC} is not a git checkout: no clean export ({p.stderr.strip()})")
    for rel in filter(None, p.stdout.split("\0")):
        src, dst = os.path.join(pkgtest.SRC, rel), os.path.join(dest, rel)
        if not os.path.lexists(src):
            continue  # deleted in the working tree, not yet committed
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True)  # a submodule
        else:
            shutil.copy(src, dst)
    for dirpath, dirnames, files in os.walk(dest):
        for name in files + dirnames:
            os.utime(os.path.join(dirpath, name), (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def ccache_dir():
    os.makedirs(CCACHE, exist_ok=True)
    conf = os.path.join(CCACHE, "ccache.conf")
    if not os.path.exists(conf):
        with open(conf, "w") as f:
            f.write("max_size = 2G\n")
    return CCACHE


def setUpModule():
    global built, BASE, CTX
    pkgtest.skip_or_fail_without_podman(pm)
    BASE = pm.base_image(pkgtest.debian_root("python3", "procps"))
    # Images of earlier trees (untagged) serve as the layer cache; those unused for a week go.
    pm("image", "prune", "-f", "--filter", "until=168h", check=False, timeout=300)
    CTX = tempfile.mkdtemp(prefix=f"{TAG}-src")
    export_tracked(CTX)
    t0 = time.monotonic()
    # The README's line, run in the export.
    pm("build", "-f", "docker/Containerfile", "-t", IMAGE, "--build-arg", f"BASE={BASE}",
       "-v", f"{ccache_dir()}:/ccache", ".", cwd=CTX, timeout=1500)
    print(f"podman build from the sources took {time.monotonic() - t0:.0f} s", file=sys.stderr)
    built = True


def tearDownModule():
    if built:
        pm("untag", IMAGE, check=False)  # the image stays, untagged, as the next run's layer cache
    if CTX:
        shutil.rmtree(CTX, ignore_errors=True)


class FromSource(unittest.TestCase):
    def test_two_workers_exit_0_tagged_output(self):
        pkgtest.check_tagged_job(self, pm, IMAGE, 2)

    def test_worker_exit_3_is_the_container_exit_status(self):
        pkgtest.check_exit_3(self, pm, IMAGE)

    def test_no_build_tree_in_the_image(self):
        p = pm("run", "--rm", "--network", "none", "--entrypoint", "sh", IMAGE, "-c",
               "ls -d /src /build /debs /tmp/debs 2>/dev/null; command -v ddprun c++ cmake || true", check=False)
        self.assertEqual(p.stdout.split(), ["/usr/bin/ddprun"], "only the runtime stage: ddprun, no sources or compiler")


def readme_commands():
    """The README's "Containers" block: its commands, continuation lines joined."""
    with open(os.path.join(pkgtest.SRC, "README.md")) as f:
        text = f.read()
    section = text[text.index("\n## Containers\n"):]
    block = section[section.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


class ReadmeLines(unittest.TestCase):
    """The README's "Containers" lines as written, in the export (a clean checkout), with a bare
    `podman` that the environment points at the tests' private storage (pm.plain_env()).
    There is no registry here, so the images the lines name stand there under those names:
    Containerfile's default BASE is the tests' Debian 12 image, and the PyTorch image is the
    tests' torch 2.6 root with the tests' use_libuv shim on its PYTHONPATH (Torch2Variant in
    test_container.py says why). Nothing is pulled: podman finds each name locally. The first
    build finds every layer in the cache that setUpModule's build (with the compiler cache)
    just filled."""

    def sh(self, command, timeout):
        return subprocess.run(["bash", "-c", command], cwd=CTX, env=pm.plain_env(), capture_output=True, text=True,
                              timeout=pkgtest.scaled(timeout))

    def stand_in(self, name, base, files=None, env=None):
        """An image `name` (a registry's, here never pulled): `base`, with `files` copied in."""
        with tempfile.TemporaryDirectory(prefix=f"{TAG}-standin") as ctx:
            lines = [f"FROM {base}"]
            for dest, src in (files or {}).items():
                shutil.copytree(src, os.path.join(ctx, os.path.basename(src)))
                lines.append(f"COPY {os.path.basename(src)} {dest}")
            lines += [f"ENV {k}={v}" for k, v in (env or {}).items()]
            with open(os.path.join(ctx, "Containerfile"), "w") as f:
                f.write("\n".join(lines) + "\n")
            pm("build", "--pull=never", "--network", "none", "-t", name, ctx, timeout=600)

    def test_the_readmes_container_lines_as_written(self):
        build, run, build_pytorch, run_pytorch = readme_commands()
        with open(os.path.join(CTX, "docker", "Containerfile")) as f:
            default_base = re.search(r"^ARG BASE=(\S+)$", f.read(), re.M).group(1)
        pm("tag", BASE, default_base)
        p = self.sh(build, 1500)
        self.assertEqual(p.returncode, 0, f"{build}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        p = self.sh(run, 120)
        self.assertEqual(p.returncode, 0, f"{run}\n{p.stdout}\n{p.stderr}")
        self.assertEqual(sorted(l for l in p.stdout.splitlines() if l.startswith("[rank")),
                         [f"[rank{r}]:rank {r} of 4" for r in range(4)])

        rt = torch_runtime.torch2()
        if rt.skip_reason():
            self.skipTest(f"the PyTorch lines: {rt.skip_reason()}")
        root = subprocess.run([torch_runtime.CHROOT_SCRIPT, "path"], capture_output=True, text=True,
                              check=True).stdout.strip()
        with open(os.path.join(root, ".ddprun-torch2"), "rb") as f:  # the root's build stamp
            key = "torch2-" + hashlib.sha256(f.read()).hexdigest()[:16]
        pytorch_image = re.search(r"PYTORCH_IMAGE=(\S+)", build_pytorch).group(1)
        shim = os.path.join(pkgtest.SRC, "tests", "torch2", "nolibuv")
        self.stand_in(pytorch_image, pm.base_image(root, key=key), {"/opt/ddprun-tests/nolibuv": shim},
                      {"PYTHONPATH": "/opt/ddprun-tests/nolibuv"})
        p = self.sh(build_pytorch, 600)
        self.assertEqual(p.returncode, 0, f"{build_pytorch}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        done = "[rank0]:all_reduce over 4 ranks: sum = 6 (expected 6)"
        for attempt in (0, 1):
            p = self.sh(run_pytorch, 300)
            if attempt or not torch_runtime.torch_exit_abort(p, done):
                break
            print(f"torch's exit race ({torch_runtime.TORCH_EXIT_ABORT!r}); once more:\n{p.stderr}", file=sys.stderr)
        self.assertEqual(p.returncode, 0, f"{run_pytorch}\n{p.stdout}\n{p.stderr}")
        self.assertIn(done, p.stdout.splitlines())


if __name__ == "__main__":
    pkgtest.main()
