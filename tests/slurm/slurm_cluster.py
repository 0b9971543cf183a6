"""A real Slurm cluster on one host, for tests: munged, slurmctld and N slurmd from Debian's
packages (slurm-wlm 22.05, built with MULTIPLE_SLURMD), everything under a temporary root.

    with SlurmCluster(nodes=3) as c:
        job = c.sbatch("#!/bin/bash\\n#SBATCH -N2\\nsrun hostname\\n")
        info = c.wait(job)                 # scontrol's view once the job has ended
        print(c.output(job), info["ExitCode"])

Each node n<i> is its own slurmd with its own port and loopback address 127.0.0.<10+i>
(NodeAddr). Every slurmd runs in a private mount and UTS namespace (unshare) where the
hostname is n<i> and /etc/hosts maps n1..nN (and n<i>.<domain>) to those addresses: the
node names resolve for the jobs, as on a real cluster, while the machine's own /etc/hosts
and hostname stay untouched. The system's /etc/slurm and munge are never used.

Job ids: each cluster takes a free slot (a lock file under /tmp) and starts its job ids at
1 + 100 * slot, so that ddprun's ports derived from job ids (20000 + ...) never meet those of
another cluster running on this machine at the same time (see src/launcher/slurm.cpp).

Teardown is by pid: every job is cancelled, then the daemons started here get SIGTERM (then
SIGKILL), then whatever still carries this cluster's marker in its environment (jobs' tasks,
slurmstepd) is killed. Nothing else on the machine is touched.

Environment: DDP_SLURM_KEEP=1 keeps the root folder (logs, job output) and prints its path.
"""
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testlib"))
from ports import free_port  # noqa: E402

SBIN = "/usr/sbin"
PLUGINDIR = "/usr/lib/x86_64-linux-gnu/slurm-wlm"
DOMAIN = "ddptest.local"
SLOTS = 15              # job id windows of 100: 15 * 100 < 1595 (the port formula's job cycle)
SLOT_DIR = "/tmp/ddprun-slurm-slots"
MARKER = "DDP_SLURM_CLUSTER"  # in every daemon's and job's environment: the teardown sweep's key


def unavailable_reason():
    """None when a cluster can be started here, else why not."""
    if os.geteuid() != 0:
        return "the test cluster runs its daemons as root"
    for exe in ("slurmctld", "slurmd", "slurmstepd", "munged", "mungekey"):
        if not os.access(os.path.join(SBIN, exe), os.X_OK):
            return f"{SBIN}/{exe} is missing (scripts/setup.sh installs slurmctld slurmd slurm-client munge)"
    for exe in ("sbatch", "srun", "scontrol", "sinfo", "scancel", "unshare"):
        if not shutil.which(exe):
            return f"{exe} is not in PATH"
    return None


def cgroup_tracking_available():
    """proctrack/cgroup as tested here: the cgroup v1 freezer hierarchy, writable (root).
    Elsewhere (cgroup v2 only) the tests use proctrack/pgid, whose signal delivery ddprun
    sees the same way (only ddprun's process group)."""
    path = "/sys/fs/cgroup/freezer"
    return os.path.isdir(path) and os.access(path, os.W_OK) and os.path.exists(os.path.join(path, "tasks"))


def parse_scontrol_record(line):
    """'JobId=5 JobName=x ... ' (scontrol -o) -> dict. Values may contain spaces only in a
    few fields we do not read; split at ' Key=' boundaries."""
    out = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z:/]+)=(.*?)(?=\s[A-Za-z:/]+=|$)", line.strip()):
        out[m.group(1)] = m.group(2)
    return out


class DaemonExited(RuntimeError):
    """A daemon of the test cluster exited while it started."""


class SlurmCluster:
    def __init__(self, nodes=3, cpus=4, kill_wait=5, proctrack="linuxproc", name="ddptest", gpus=0):
        self.nodes = nodes
        self.gpus = gpus  # per node: gres/gpu on stand-in device files (character devices like /dev/null)
        self.cpus = cpus
        self.kill_wait = kill_wait
        self.proctrack = proctrack
        self.name = name
        self.tag = secrets.token_hex(4)
        self.root = None
        self.procs = {}          # name -> Popen of the daemons started here
        self.slot = None
        self._slot_file = None
        self.first_job_id = 1

    # ------------------------------------------------------------------ set-up

    def node_names(self):
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def node_addr(self, name):
        return f"127.0.0.{10 + int(name[1:])}"

    def _take_slot(self):
        os.makedirs(SLOT_DIR, exist_ok=True)
        for slot in range(SLOTS):
            f = open(os.path.join(SLOT_DIR, f"slot{slot}.lock"), "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            self.slot, self._slot_file = slot, f
            self.first_job_id = 1 + 100 * slot
            return
        raise RuntimeError(f"all {SLOTS} Slurm test cluster slots under {SLOT_DIR} are taken")

    def _write_files(self):
        r = self.root
        for d in ("munge", "state", "log", "spool", "run", "jobs"):
            os.makedirs(os.path.join(r, d), exist_ok=True)
        os.chmod(os.path.join(r, "munge"), 0o700)
        key = os.path.join(r, "munge", "munge.key")
        subprocess.run([os.path.join(SBIN, "mungekey"), "--create", f"--keyfile={key}"], check=True,
                       capture_output=True, timeout=30)
        os.chmod(key, 0o400)
        with open("/etc/hosts") as f:
            hosts = f.read()
        hosts += "".join(f"{self.node_addr(n)} {n} {n}.{DOMAIN}\n" for n in self.node_names())
        with open(os.path.join(r, "hosts"), "w") as f:
            f.write(hosts)
        n = self.nodes
        ports = [free_port() for _ in range(n)]
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        node_lines = "".join(
            f"NodeName={name} NodeHostname={name} NodeAddr={self.node_addr(name)} Port={port} "
            f"CPUs={self.cpus} RealMemory=1000{gres} State=UNKNOWN\n"
            for name, port in zip(self.node_names(), ports))
        if self.gpus:
            # Slurm hands out gres/gpu by device file; it needs the files to exist, not to be GPUs.
            os.makedirs(os.path.join(r, "dev"), exist_ok=True)
            for i in range(self.gpus):
                os.mknod(os.path.join(r, "dev", f"nvidia{i}"), 0o666 | 0o020000, os.makedev(1, 3))
            with open(os.path.join(r, "gres.conf"), "w") as f:
                f.write(f"AutoDetect=off\nName=gpu File={r}/dev/nvidia[0-{self.gpus - 1}]\n")
        conf = f"""ClusterName={self.name}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={self.ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
PluginDir={PLUGINDIR}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmdDebug=debug2
{"GresTypes=gpu" if self.gpus else ""}
ProctrackType=proctrack/{self.proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Schedule every second (defaults: 60 s, backfill 30 s): a requeued job starts when its
# BeginTime passes, not up to a minute later.
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait={self.kill_wait}
WaitTime=0
InactiveLimit=0
MinJobAge=600
SlurmdTimeout=30
FirstJobId={self.first_job_id}
{node_lines}PartitionName=debug Nodes=n[1-{n}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
        with open(self.conf, "w") as f:
            f.write(conf)
        # 22.05 always loads a cgroup plugin in slurmd; without systemd it needs IgnoreSystemd.
        with open(os.path.join(r, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")

    def _spawn(self, name, argv):
        log = open(os.path.join(self.root, "log", f"{name}.out"), "w")
        env = dict(os.environ, SLURM_CONF=self.conf, **{MARKER: self.root})
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def start(self):
        """Starts the daemons and waits until every node is idle. A daemon that exits while
        starting is most often one whose port (picked free, then bound by the daemon a moment
        later) was taken meanwhile by another test's connection: the cluster starts again,
        on new ports, up to twice, saying why on stderr."""
        for attempt in range(3):
            try:
                return self._start_once()
            except DaemonExited as e:
                if attempt == 2:
                    raise
                print(f"slurm test cluster: starting again: {e}", file=sys.stderr)

    def _start_once(self):
        self.procs = {}
        self._take_slot()
        self.root = tempfile.mkdtemp(prefix=f"ddp-slurm-{self.tag}-")
        self.conf = os.path.join(self.root, "slurm.conf")
        self.ctld_port = free_port()
        try:
            self._write_files()
            r = self.root
            self._spawn("munged", [os.path.join(SBIN, "munged"), "--foreground", "--force",
                                   f"--socket={r}/munge/munge.socket", f"--key-file={r}/munge/munge.key",
                                   f"--log-file={r}/log/munged.log", f"--pid-file={r}/run/munged.pid",
                                   f"--seed-file={r}/munge/munged.seed", "--num-threads=10"])
            self._wait_for(lambda: os.path.exists(f"{r}/munge/munge.socket"), 10, "munged's socket")
            self._spawn("slurmctld", [os.path.join(SBIN, "slurmctld"), "-D", "-c", "-f", self.conf])
            hosts = os.path.join(r, "hosts")
            for name in self.node_names():
                # A private /etc/hosts and hostname for this node and everything it starts.
                self._spawn(f"slurmd-{name}", [
                    "unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c",
                    'mount --bind "$1" /etc/hosts && hostname "$2" && exec "$3" -D -N "$2" -f "$4"', "sh",
                    hosts, name, os.path.join(SBIN, "slurmd"), self.conf])
            self._wait_for(self._all_idle, 60, f"{self.nodes} idle nodes")
        except BaseException:
            self.stop()
            raise
        return self

    def _all_idle(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise DaemonExited(f"{name} exited with {p.returncode}; its output and log (the folder goes "
                                   f"with the cluster):\n{self._log_tails(name)}")
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = r.stdout.split()
        return r.returncode == 0 and states.count("idle") == self.nodes

    def _log_tails(self, name, lines=15):
        """The last lines of a daemon's output and of its own log file."""
        node = name[len("slurmd-"):] if name.startswith("slurmd-") else None
        out = []
        for f in (f"{name}.out", f"slurmd-{node}.log" if node else f"{name}.log"):
            path = os.path.join(self.root, "log", f)
            with contextlib.suppress(OSError), open(path, errors="replace") as fh:
                out.append(f"--- {f}:\n" + "".join(fh.readlines()[-lines:]))
        return "".join(out) or "(no output)"

    @staticmethod
    def _wait_for(pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.1)
        raise TimeoutError(f"timed out waiting for {what}")

    # ------------------------------------------------------------------ teardown

    def stop(self):
        if self.root is None:
            return
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--partition", "debug", check=False)
            with contextlib.suppress(TimeoutError):
                self._wait_for(lambda: not self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip(),
                               self.kill_wait + 15, "the jobs to end")
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for pid in self.marked_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self._remove_cgroups()
        if self._slot_file:
            self._slot_file.close()
            self._slot_file = None
        if os.environ.get("DDP_SLURM_KEEP"):
            print(f"slurm test cluster kept at {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def _remove_cgroups(self):
        """proctrack/cgroup leaves empty slurm_n<i> folders in the cgroup hierarchies: removed
        when no other test cluster runs (their slots are free), deepest first; a folder still
        in use cannot be removed (rmdir fails), so nothing live is touched."""
        if self.proctrack != "cgroup" or not os.path.isdir("/sys/fs/cgroup"):
            return
        for slot in range(SLOTS):
            if slot == self.slot:
                continue
            with open(os.path.join(SLOT_DIR, f"slot{slot}.lock"), "w") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return  # another cluster runs
                fcntl.flock(f, fcntl.LOCK_UN)
        for controller in os.listdir("/sys/fs/cgroup"):
            for name in self.node_names():
                top = os.path.join("/sys/fs/cgroup", controller, f"slurm_{name}")
                if not os.path.isdir(top):
                    continue
                for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)

    def marked_pids(self, value=None, key=MARKER):
        """Processes whose environment has key=value (default: this cluster's marker), and
        this cluster's marker: another cluster's job of the same name (a test file running at
        the same time in another checkout) is not ours."""
        want = f"{key}={value if value is not None else self.root}".encode()
        ours = f"{MARKER}={self.root}".encode()
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if want in env and ours in env:
                found.append(int(d))
        return found

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ using it

    def env(self, **extra):
        """The environment for client commands (sbatch, srun, scontrol) and, through
        sbatch's default --export=ALL, for the jobs."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PET_", "TORCHELASTIC_", "MASTER_"))}
        env.update(SLURM_CONF=self.conf, **{MARKER: self.root})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, *argv, check=True, timeout=60, env=None):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or self.env())
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def job_dir(self, name):
        d = os.path.join(self.root, "jobs", name)
        os.makedirs(d, exist_ok=True)
        return d

    def sbatch(self, script, *options, name="job", env=None):
        """Submits script (text) with the given sbatch options; returns the job id. The job
        runs in <root>/jobs/<name>, its output goes to out.txt there."""
        d = self.job_dir(name)
        path = os.path.join(d, "job.sh")
        with open(path, "w") as f:
            f.write(script)
        os.chmod(path, 0o755)
        r = self.run("sbatch", "--parsable", f"--chdir={d}", f"--output={d}/out.txt", f"--job-name={name}",
                     *options, path, env=env)
        return int(r.stdout.strip().split(";")[0])

    def job(self, job_id):
        """scontrol's record of the job as a dict (JobState, ExitCode, NodeList, ...)."""
        r = self.run("scontrol", "show", "job", "-o", str(job_id))
        return parse_scontrol_record(r.stdout.splitlines()[0])

    def wait(self, job_id, timeout=120, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                                "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")):
        """Waits until the job is in one of states; returns its record."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {info.get('JobState')} after {timeout} s "
                                   f"(logs: {self.root}/log)")
            time.sleep(0.2)

    def output(self, name):
        """The job's output so far ("" before it starts)."""
        try:
            with open(os.path.join(self.root, "jobs", name, "out.txt"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""
