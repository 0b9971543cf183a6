"""The README's Install block, run as written: its lines are read from README.md and typed,
in order, into one bash session in the checkout's root, as a user would, with nothing of
this machine changed:
  - the lines before `sudo apt install` (`cmake --install build --prefix /usr/local`, then
    cpack) run on this machine, in a private mount namespace whose /usr/local and build/
    are overlays: their writes land in a temporary folder;
  - the rest (`sudo apt install ./build/packages/ddprun_*_amd64.deb`, `ddprun --version`)
    runs in a clean Debian 12 root (test_deb.py's cached root, plus sudo) that sees the
    checkout, and the packages just made, at the checkout's own path: a fresh machine
    installing what was built. apt asks whether to install the recommended python3 too;
    the session answers Y, as the user would.
Needs root (namespaces, chroot) and build/ in the checkout (the README's paths)."""
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import pkgtest
from pkgtest import BUILD, SRC, TAG

README = os.path.join(SRC, "README.md")


def install_block():
    """The commands of the README's "## Install" sh block: comments and blank lines dropped."""
    with open(README) as f:
        text = f.read()
    m = re.search(r"^## Install\n```sh\n(.*?)^```", text, re.M | re.S)
    if not m:
        raise AssertionError("README.md has no ```sh block under '## Install'")
    lines = [re.sub(r"\s+#.*$", "", l).rstrip() for l in m.group(1).splitlines()]
    return [l for l in lines if l.strip() and not l.lstrip().startswith("#")]


# $1 work folder, $2 the cached root, $3 the checkout, $4 the lines for this machine, $5 the
# lines for the clean root (each a newline-separated session).
SESSION = pkgtest.ROOT_PRELUDE + r"""
src=$3
mkdir -p $w/local $w/local.work $w/build $w/build.work
mount -t overlay overlay -o lowerdir=/usr/local,upperdir=$w/local,workdir=$w/local.work /usr/local
mount -t overlay overlay -o lowerdir=$src/build,upperdir=$w/build,workdir=$w/build.work $src/build
echo "== this machine"
(cd $src && bash -euo pipefail -c "$4")
echo "== installed: $(command -v ddprun) $(/usr/local/bin/ddprun --version)"
mkdir -p $r$src && mount --rbind $src $r$src
inroot sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sudo' \
  >$w/apt.log 2>&1 || { tail -20 $w/apt.log; exit 1; }
echo "== the clean root"
printf 'Y\n' | inroot bash -euo pipefail -c "cd $src
$5"  # apt asks whether to go on (ddprun recommends python3): the user answers Y
echo "== done"
"""


class ReadmeInstall(unittest.TestCase):
    def test_the_install_block_as_written(self):
        if os.geteuid() != 0:
            self.skipTest("needs root (mount namespaces, overlays, chroot)")
        if os.path.realpath(BUILD) != os.path.realpath(os.path.join(SRC, "build")):
            self.skipTest(f"the README's lines use build/; this build is {BUILD}")
        lines = install_block()
        apt = next((i for i, l in enumerate(lines) if l.startswith("sudo apt install")), None)
        self.assertIsNotNone(apt, lines)
        here, there = lines[:apt], lines[apt:]
        self.assertEqual([l.split()[0] for l in here], ["cmake", "(cd"], "the README's Install block changed: "
                         f"see what this test runs where\n{lines}")
        self.assertEqual(there[-1], "ddprun --version", lines)
        packages_before = os.path.exists(os.path.join(BUILD, "packages"))
        root = pkgtest.debian_root(*pkgtest.DEB_ROOT_PACKAGES)
        w = tempfile.mkdtemp(prefix=f"{TAG}-readme", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, w, True)
        p = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "bash", "-c",
                            SESSION, "readme-install", w, root, SRC, "\n".join(here), "\n".join(there)],
                           capture_output=True, text=True, timeout=pkgtest.scaled(600))
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        version = r"ddprun \d+\.\d+\.\d+ \(commit [^)]+\)"
        # cmake --install put ddprun where a shell finds it first.
        self.assertRegex(out, rf"== installed: /usr/local/bin/ddprun {version}\n")
        # cpack made the three packages under build/packages (the overlay's upper folder).
        self.assertEqual(sorted(n.split("_")[0] for n in os.listdir(os.path.join(w, "build", "packages"))
                                if n.endswith(".deb")),
                         ["ddprun", "libddp-dev", "libddp0"])
        # apt installed the ddprun package in the clean root, and its ddprun answers.
        self.assertRegex(out, r"(?s)== the clean root\n.*Setting up ddprun ")
        self.assertRegex(out, rf"\n{version}\n== done\n")
        # Nothing of this machine changed.
        self.assertEqual(os.path.exists(os.path.join(BUILD, "packages")), packages_before)


if __name__ == "__main__":
    pkgtest.main()
