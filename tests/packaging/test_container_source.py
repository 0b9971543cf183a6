"""docker/Containerfile as the README gives it: `podman build -f docker/Containerfile -t ddprun .`
from the top of a checkout, where the build stage compiles the sources (DEBS=build, the
default) and installs its compilers and libraries from Debian's mirror. The context is a
clean export of the checkout's tracked files (as they are in the working tree: no build
tree, no prebuilt packages, nothing untracked). Two differences from the README's line, both
forced by this machine: BASE names a local Debian 12 image (no registry here; the one
test_container.py uses), and a compiler cache is mounted at /ccache (the Containerfile's
documented option), so that a changed tree recompiles only what changed. podman's layer
cache (DDP_TEST_CACHE/podman) skips the compile altogether for an unchanged tree.
"""
import os
import shutil
import sys
import tempfile
import time
import unittest

import pkgtest
from pkgtest import TAG

pm = pkgtest.Podman()
IMAGE = f"localhost/ddprun-test-source:{TAG}"
CCACHE = os.path.join(pkgtest.CACHE, "ccache-container")
FIXED_MTIME = 1577836800  # every exported file's: the layer cache must not see a fresh copy as a change
built = False


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
    global built
    pkgtest.skip_or_fail_without_podman(pm)
    base = pm.base_image(pkgtest.debian_root("python3", "procps"))
    # Images of earlier trees (untagged) serve as the layer cache; those unused for a week go.
    pm("image", "prune", "-f", "--filter", "until=168h", check=False, timeout=300)
    with tempfile.TemporaryDirectory(prefix=f"{TAG}-src") as ctx:
        export_tracked(ctx)
        t0 = time.monotonic()
        # The README's line, run in the export.
        pm("build", "-f", "docker/Containerfile", "-t", IMAGE, "--build-arg", f"BASE={base}",
           "-v", f"{ccache_dir()}:/ccache", ".", cwd=ctx, timeout=1500)
        print(f"podman build from the sources took {time.monotonic() - t0:.0f} s", file=sys.stderr)
    built = True


def tearDownModule():
    if built:
        pm("untag", IMAGE, check=False)  # the image stays, untagged, as the next run's layer cache


class FromSource(unittest.TestCase):
    def test_two_workers_exit_0_tagged_output(self):
        pkgtest.check_tagged_job(self, pm, IMAGE, 2)

    def test_the_readmes_run_line(self):
        # README, "Containers": podman run --rm ddprun --nproc-per-node 4 --no-python sh -c '...'
        p = pm("run", "--rm", "--network", "none", IMAGE, "--nproc-per-node", "4", "--no-python", "sh", "-c",
               'echo "rank $RANK of $WORLD_SIZE"', check=False)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(sorted(l for l in p.stdout.splitlines() if l.startswith("[rank")),
                         [f"[rank{r}]:rank {r} of 4" for r in range(4)])

    def test_worker_exit_3_is_the_container_exit_status(self):
        pkgtest.check_exit_3(self, pm, IMAGE)

    def test_no_build_tree_in_the_image(self):
        p = pm("run", "--rm", "--network", "none", "--entrypoint", "sh", IMAGE, "-c",
               "ls -d /src /build /debs /tmp/debs 2>/dev/null; command -v ddprun c++ cmake || true", check=False)
        self.assertEqual(p.stdout.split(), ["/usr/bin/ddprun"], "only the runtime stage: ddprun, no sources or compiler")


if __name__ == "__main__":
    pkgtest.main()
