"""Shared by the packaging and container tests: paths, timeouts, cached Debian roots and a
podman that keeps its state private.

Environment (set by tests/packaging/CMakeLists.txt):
  DDP_SOURCE_DIR, DDP_BUILD_DIR   the checkout and its build
  DDP_DEBS_DIR                    the .debs (fixture package.build_debs)
  DDP_TEST_CACHE                  cached Debian roots and podman storage, outside any checkout
                                  (default /var/cache/ddprun-tests)
  DDP_TEST_TIMEOUT_SCALE          multiplies every hang-guard timeout (default 1)
"""
import hashlib
import os
import secrets
import shutil
import sys
import subprocess
import tempfile
import unittest

SRC = os.environ.get("DDP_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILD = os.environ.get("DDP_BUILD_DIR", os.path.join(SRC, "build"))
DEBS = os.environ.get("DDP_DEBS_DIR", os.path.join(BUILD, "test-debs"))
CACHE = os.environ.get("DDP_TEST_CACHE", "/var/cache/ddprun-tests")
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
# Unique per run: containers, networks and temp folders carry it.
TAG = f"ddp12-{os.getpid()}-{secrets.token_hex(2)}"


sys.path.insert(0, os.path.join(HERE, "..", "common"))
from test_timeouts import SCALE, scaled  # noqa: E402,F401  (DDP_TEST_TIMEOUT_SCALE)


def timeout_scale():
    return SCALE


def run(cmd, timeout, check=True, **kw):
    """subprocess.run with text capture and a scaled hang guard; a failure shows everything."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(timeout), **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


# The start of a bash script that runs in a private mount and PID namespace (unshare --mount
# --pid --fork --propagation private) with $w a work folder and $lower a cached clean root
# (debian_root) set: $r is a writable overlay of that root, set up as an installed system
# would be (/proc, /dev's nodes, resolv.conf, hosts), and `inroot CMD...` runs CMD in it with
# a clean environment. The overlay and every mount vanish with the namespace.
ROOT_PRELUDE = r"""
set -eu
w=$1; lower=$2; r=$w/root
mkdir -p $w/upper $w/work $r
mount -t overlay overlay -o lowerdir=$lower,upperdir=$w/upper,workdir=$w/work $r
mount -t proc proc $r/proc
mount -t tmpfs tmpfs $r/dev/shm 2>/dev/null || { mkdir -p $r/dev/shm; mount -t tmpfs tmpfs $r/dev/shm; }
for n in null zero random urandom; do [ -e $r/dev/$n ] || { touch $r/dev/$n; mount --bind /dev/$n $r/dev/$n; }; done
cp /etc/resolv.conf $r/etc/resolv.conf
# debootstrap writes no /etc/hosts (an installed system and every container have one)
[ -e $r/etc/hosts ] || printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' > $r/etc/hosts
inroot() { chroot $r /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
"""
# The packages of the root that the .deb tests install into (one cached root for all).
DEB_ROOT_PACKAGES = ("g++", "cmake", "make", "man-db")


def debian_root(*packages):
    """A cached clean Debian 12 minbase root with these packages (scripts/debian-root.sh)."""
    return debian_root_suite("bookworm", *packages)


def debian_root_suite(suite, *packages):
    """The same for another Debian release (e.g. bullseye: an older C library)."""
    p = run([os.path.join(SRC, "scripts/debian-root.sh"), *packages], timeout=900,
            env={**os.environ, "DDP_TEST_CACHE": CACHE, "DDP_ROOT_SUITE": suite})
    return p.stdout.strip().splitlines()[-1]


def debs():
    found = {}
    for name in os.listdir(DEBS):
        if name.endswith(".deb"):
            found[name.split("_")[0]] = os.path.join(DEBS, name)
    for pkg in ("ddprun", "libddp0", "libddp-dev"):
        if pkg not in found:
            raise AssertionError(f"{pkg}_*.deb missing in {DEBS} (fixture package.build_debs)")
    return found


def payload_hash(deb_paths):
    """Hash of what the packages install (names, modes, contents; not cpack's timestamps)."""
    h = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix=TAG) as tmp:
        for deb in sorted(deb_paths):
            run(["dpkg-deb", "-x", deb, tmp], timeout=60)
            h.update(run(["dpkg-deb", "-f", deb], timeout=30).stdout.encode())
        for dirpath, dirnames, files in os.walk(tmp):
            dirnames.sort()
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                h.update(os.path.relpath(path, tmp).encode() + b"\0")
                if os.path.islink(path):
                    h.update(os.readlink(path).encode())
                else:
                    with open(path, "rb") as fh:
                        h.update(fh.read())
    return h.hexdigest()[:16]


class Podman:
    """Rootful podman with private storage under CACHE/podman: the host's /var/lib/containers
    and containers.conf are never used. The settings this VM needs (shared/reference/
    containers.md): runc (crun refuses a hybrid cgroup host), cgroupfs and file events (no
    systemd), and ulimits no higher than this process's own (no CAP_SYS_RESOURCE)."""

    def __init__(self):
        self.dir = os.path.join(CACHE, "podman")
        try:
            os.makedirs(os.path.join(self.dir, "tmp"), exist_ok=True)
        except OSError:
            pass  # unusable() says why
        nofile = subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
        nofile = "1048576" if nofile in ("", "unlimited") else nofile
        with open("/proc/sys/kernel/pid_max") as f:
            nproc = min(int(f.read()), 32768)
        conf = (f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
                '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
        self.conf = self._conf_file("containers", conf)
        d = self.dir
        # The same, for a bare `podman` (the README's lines as written): the storage and the
        # folders that self.base gives on the command line.
        self._plain = {"CONTAINERS_CONF": self._conf_file("containers-plain", conf.replace(
                           "[engine]\n", f'[engine]\ntmp_dir = "{d}/tmp"\n') + f'[network]\nnetwork_config_dir = "{d}/net"\n'),
                       "CONTAINERS_STORAGE_CONF": self._conf_file("storage", (
                           f'[storage]\ndriver = "overlay"\ngraphroot = "{d}/root"\nrunroot = "{d}/run"\n'))}
        self.base = ["podman", "--root", f"{d}/root", "--runroot", f"{d}/run", "--tmpdir", f"{d}/tmp",
                     "--network-config-dir", f"{d}/net", "--storage-driver", "overlay",
                     "--cgroup-manager", "cgroupfs", "--events-backend", "file", "--runtime", "runc"]
        self.env = {**os.environ, "CONTAINERS_CONF": self.conf}

    def _conf_file(self, name, text):
        """A configuration file under self.dir named by its content (written once, atomically)."""
        path = os.path.join(self.dir, f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.conf")
        if not os.path.exists(path) and os.access(self.dir, os.W_OK):
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        return path

    def plain_env(self):
        """An environment in which a bare `podman`, with no options, uses this private storage
        and these settings: for command lines run exactly as a user types them."""
        return {**os.environ, **self._plain}

    def __call__(self, *args, timeout=120, check=True, input=None, cwd=None):
        p = subprocess.run(self.base + list(args), capture_output=True, text=True, input=input,
                           timeout=scaled(timeout), env=self.env, cwd=cwd)
        if check and p.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def unusable(self):
        """Why podman cannot run here, or None."""
        if os.geteuid() != 0:
            return "the container tests need root (rootful podman)"
        if not shutil.which("podman"):
            return "podman is not installed (scripts/setup.sh installs it)"
        if not shutil.which("runc"):
            return "runc is not installed (scripts/setup.sh installs it)"
        p = self("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
        if p.returncode != 0:
            return f"podman info failed: {p.stderr.strip()[-300:]}"
        return None

    def exists(self, image):
        return self("image", "exists", image, check=False).returncode == 0

    def base_image(self, root, key=None):
        """The Debian root as a local image (no registry): localhost/ddprun-test-base:<key>,
        by default the root's own key (the end of its folder name)."""
        ref = f"localhost/ddprun-test-base:{key or os.path.basename(root).split('-')[-1]}"
        if not self.exists(ref):
            tar = subprocess.Popen(["tar", "-C", root, "--exclude=./debootstrap.log", "-c", "."],
                                   stdout=subprocess.PIPE)
            p = subprocess.run(self.base + ["import", "-", ref], stdin=tar.stdout, capture_output=True,
                               text=True, timeout=scaled(300), env=self.env)
            tar.stdout.close()
            tar.wait()
            if p.returncode != 0:
                raise AssertionError(f"podman import failed: {p.stderr}")
        return ref

    def build_cached(self, repo, key, args, context):
        """podman build once per content key: repo:key; older tags of repo are removed."""
        ref = f"{repo}:{key}"
        if not self.exists(ref):
            self("build", "--pull=never", "--layers=false", "--network", "none", "-t", ref, *args, context, timeout=600)
            for line in self("images", "--format", "{{.Repository}}:{{.Tag}}", repo).stdout.split():
                if line != ref:
                    self("rmi", line, check=False)  # in use by another run: kept
        return ref


def run_args(*extra, network="none"):
    """podman run's options for a job on the workers (tests/packaging/workers at /w)."""
    return ["--network", network, "--no-hosts", "-v", f"{WORKERS}:/w:ro", *extra]


def check_tagged_job(tc, pm, image, nproc):
    """ddprun as the image's PID 1 runs nproc workers of workers/job.py: exit 0, one line of
    each rank's environment, tagged by rank, with ddprun as PID 1 and the workers' parent."""
    p = pm("run", "--rm", *run_args(), image, "--nproc-per-node", str(nproc), "/w/job.py", "hello", check=False)
    tc.assertEqual(p.returncode, 0, p.stdout + p.stderr)
    for r in range(nproc):
        line = [l for l in p.stdout.splitlines() if l.startswith(f"[rank{r}]:env ")]
        tc.assertEqual(len(line), 1, p.stdout)
        tc.assertIn(f"RANK={r} LOCAL_RANK={r} WORLD_SIZE={nproc}", line[0])
        tc.assertIn("ppid=1 pid1=ddprun", line[0])
    return p


def check_exit_3(tc, pm, image):
    """A worker's exit 3 is the container's exit status, named on stderr."""
    p = pm("run", "--rm", *run_args(), image, "--nproc-per-node", "2", "/w/job.py", "hello",
           "--exit-rank", "1", "--exit-code", "3", check=False)
    tc.assertEqual(p.returncode, 3, p.stdout + p.stderr)
    tc.assertIn("[rank1]:rank 1 fails with 3", p.stderr)
    return p


def skip_or_fail_without_podman(pm):
    why = pm.unusable()
    if why:
        raise unittest.SkipTest(why)


def main():
    """unittest.main for these files; exits 77 (ctest: skipped) when everything was skipped."""
    prog = unittest.main(module="__main__", exit=False, verbosity=2)
    r = prog.result
    if not r.wasSuccessful():
        raise SystemExit(1)
    if r.skipped and len(r.skipped) >= r.testsRun:
        raise SystemExit(77)
