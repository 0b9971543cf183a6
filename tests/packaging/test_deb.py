"""The .debs (fixture package.build_debs): right names, versions and Depends, nothing from the
build tree inside, and they install into a clean Debian 12 root (debootstrap minbase plus a
compiler, cmake and man-db; cached) where ddprun runs a job, man finds its page and
examples/consumer builds against the installed libddp and runs under ddprun."""
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import pkgtest
from pkgtest import TAG, run
from test_install import baked_paths

VERSION = re.search(r"project\(ddp VERSION (\S+)", open(os.path.join(pkgtest.SRC, "CMakeLists.txt")).read()).group(1)


def field(deb, name):
    return run(["dpkg-deb", "-f", deb, name], timeout=30).stdout.strip()


def depends(deb):
    return {re.split(r"[ (]", d.strip())[0] for d in field(deb, "Depends").split(",") if d.strip()}


class Metadata(unittest.TestCase):
    def test_names_versions_depends(self):
        debs = pkgtest.debs()
        for pkg, deb in debs.items():
            self.assertEqual(os.path.basename(deb), f"{pkg}_{VERSION}_amd64.deb")
            self.assertEqual(field(deb, "Version"), VERSION)
            self.assertEqual(field(deb, "Architecture"), "amd64")
        # What dpkg-shlibdeps found: Debian's C and C++ runtime, nothing from the build machine.
        self.assertEqual(depends(debs["ddprun"]), {"libc6", "libgcc-s1", "libstdc++6"})
        self.assertLessEqual(depends(debs["libddp0"]), {"libc6", "libgcc-s1", "libstdc++6", "libfmt9"})
        self.assertIn(f"libddp0 (= {VERSION})", field(debs["libddp-dev"], "Depends"))

    def test_contents_nothing_of_the_build_tree(self):
        with tempfile.TemporaryDirectory(prefix=TAG) as d:
            for deb in pkgtest.debs().values():
                run(["dpkg-deb", "-x", deb, d], timeout=60)
            self.assertEqual(sorted(os.listdir(d)), ["usr"])
            self.assertEqual(baked_paths(d), [])
            self.assertTrue(os.path.exists(os.path.join(d, "usr/share/man/man1/ddprun.1.gz")))
            self.assertTrue(os.path.exists(os.path.join(d, "usr/share/doc/ddprun/copyright")))


# Runs inside a private mount and PID namespace: the overlay over the cached root and the
# mounts under it vanish with the namespace. $1 = work folder, $2 = the cached root.
IN_ROOT = pkgtest.ROOT_PRELUDE + r"""
mkdir -p $r/tmp/debs; cp $w/debs/*.deb $r/tmp/debs/
echo "== apt-get install ./*.deb"
inroot sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends /tmp/debs/*.deb' >$w/apt.log 2>&1 || { tail -20 $w/apt.log; exit 1; }
echo "== ddprun --version"; inroot ddprun --version
echo "== job"; inroot ddprun --standalone --nproc-per-node 2 --no-python /bin/sh -c 'echo "hello rank=$RANK world=$WORLD_SIZE"'
echo "== man -w"; inroot man -w ddprun
echo "== consumer"
inroot sh -c 'cp -r /usr/share/doc/ddprun/examples/consumer /tmp/consumer &&
  cmake -S /tmp/consumer -B /tmp/consumer-build -DCMAKE_BUILD_TYPE=Release >/tmp/cmake.log &&
  cmake --build /tmp/consumer-build >>/tmp/cmake.log' || { tail -30 $r/tmp/cmake.log; exit 1; }
inroot ddprun --standalone --nproc-per-node 2 /tmp/consumer-build/consumer
echo "== done"
"""


class CleanRoot(unittest.TestCase):
    def test_install_into_clean_debian_root(self):
        if os.geteuid() != 0:
            self.skipTest("needs root (debootstrap, chroot, mount namespaces)")
        root = pkgtest.debian_root(*pkgtest.DEB_ROOT_PACKAGES)
        w = tempfile.mkdtemp(prefix=f"{TAG}-deb", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, w, True)
        os.makedirs(os.path.join(w, "debs"))
        for deb in pkgtest.debs().values():
            shutil.copy(deb, os.path.join(w, "debs"))
        p = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private",
                            "bash", "-c", IN_ROOT, "in-root", w, root],
                           capture_output=True, text=True, timeout=pkgtest.scaled(600))
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertRegex(out, rf"== ddprun --version\nddprun {re.escape(VERSION)} \(commit [^)]+\)\n")
        hello = sorted(l for l in out.splitlines() if "]:hello" in l)
        self.assertEqual(hello, ["[rank0]:hello rank=0 world=2", "[rank1]:hello rank=1 world=2"])
        self.assertIn("== man -w\n/usr/share/man/man1/ddprun.1.gz\n", out)
        self.assertIn("[rank0]:consumer: world 2 all_reduce ok (3)", out)
        self.assertIn("== done", out)


if __name__ == "__main__":
    pkgtest.main()
