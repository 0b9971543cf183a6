"""Slurm's signals and ddprun, as test cases shared by the proctrack/cgroup and
proctrack/linuxproc clusters (test_slurm_signals*.py). What Slurm delivers to whom differs
(see src/launcher/slurm_signals.hpp); what must hold under both:

- scancel: each worker gets exactly one SIGTERM; ddprun exits 143 on both nodes; no process
  of the step is left on any node, well within KillWait; the same on the c10d line (node 0
  hosting the store: the nodes stop together, none re-forms a round without the others);
- scancel -s USR2: each worker gets USR2 exactly once and the job runs on (and succeeds);
- scancel -s URG: each node shows its ranks' stacks (issue 21) and the job runs on;
- --signal=USR1@N with a 1-minute limit: each worker sees USR1 once and keeps running until
  the time limit's SIGTERM; ddprun is not made to kill at once by Slurm's second SIGTERM and
  exits 143.

Under proctrack/cgroup Slurm signals ddprun alone, so the workers' signals come from ddprun.
Under proctrack/linuxproc Slurm signals every process itself, so they come from slurmstepd
and ddprun must add none (at a time limit Slurm itself sends its SIGTERM twice).

The time limit's case cannot take less than about 90 s of the cluster's life: slurmctld looks
at time limits every 30 s from its start (PERIODIC_TIMEOUT), so a 1-minute job started in the
first 30 s ends at the check 90 s in, and each check the job starts after adds 30 s. Its first
job is therefore submitted as the cluster starts (setUpClass), on nodes of its own (n3, n4), and
the other cases run beside it on n1 and n2; the case itself then only checks what that job did.
"""
import contextlib
import os
import re
import signal
import sys
import time

import slurm_testlib as lib


class SignalCases:
    NPROC = 2
    NODES = 4               # n1, n2: every case's job; n3, n4: the time limit's (see the module's note)
    JOB_NODES = "n1,n2"     # (the skewed cases hold n1's or n2's slurmd)
    TIME_LIMIT_NODES = "n3,n4"
    TIME_LIMIT_OPTIONS = ("--time=1", "--signal=USR1@45")
    early_time_limit_job = None  # the time limit case's first job, submitted by setUpClass

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.early_time_limit_job = None
        try:
            first = cls("test_time_limit_usr1_then_one_stop")
            cls.early_time_limit_job = first.submit_signal_job(
                "timelimit0", "hold", *cls.TIME_LIMIT_OPTIONS, nodes=cls.TIME_LIMIT_NODES)
        except BaseException:
            cls.tearDownClass()
            raise

    def sender(self):
        return "slurmstepd" if self.PROCTRACK == "linuxproc" else "ddprun"

    def submit_signal_job(self, name, mode, *sbatch_options, rdzv="", flags="", nodes=JOB_NODES):
        d = self.job_dir(name)
        return self.submit(name, f"""
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 --output={d}/task_%t.out --error={d}/task_%t.err \\
     $DDPRUN --log-level info {rdzv} {flags} --nproc-per-node {self.NPROC} $WORKERS/sig_worker.py {d} {mode}
""", "-N2", "-w", nodes, *sbatch_options)

    def start_signal_job(self, name, mode, *sbatch_options, rdzv="", flags="", early_signal_ok=False, job=None,
                         nodes=JOB_NODES):
        """Submits the job (or takes `job`, submitted earlier under `name`) and waits until its
        workers are ready; with early_signal_ok, returns (job, None) when Slurm's USR1 came
        before them."""
        d = self.job_dir(name)
        submitted_earlier = job is not None
        if not submitted_earlier:
            job = self.submit_signal_job(name, mode, *sbatch_options, rdzv=rdzv, flags=flags, nodes=nodes)
        ranks = 2 * self.NPROC
        deadline = time.monotonic() + lib.scaled(60)
        while True:
            ready = all(os.path.exists(os.path.join(d, f"ready_{r}")) for r in range(ranks))
            if ready and not submitted_earlier:
                break
            info = self.cluster.job(job)
            if early_signal_ok and ((info["JobState"] == "SIGNALING" and not ready) or
                                    "User defined signal 1" in self.job_output(name) or
                                    any("SIGUSR1 reached no worker" in log for log in self.ddprun_logs(d))):
                return job, None  # (the caller tries again: see test_time_limit_usr1_then_one_stop)
            if ready:  # (a job submitted earlier: its ready workers, and no early signal, checked once)
                break
            self.assertIn(info["JobState"], ("PENDING", "RUNNING"), self.job_story(name, d))
            self.assertLess(time.monotonic(), deadline, f"workers never got ready: {self.job_story(name, d)}")
            time.sleep(0.1)
        return job, d

    def signals(self, d):
        """rank -> [(time, signal, sender comm)]; printed, as the measured record."""
        out = {}
        for r in range(2 * self.NPROC):
            with open(os.path.join(d, f"sig_{r}.log")) as f:
                rows = [line.split() for line in f if line.strip()]
            out[r] = [(float(t[0]), t[1], t[3] if len(t) > 3 else "") for t in rows]
            t0 = out[r][0][0] if out[r] else 0
            seen = ", ".join(f"+{t - t0:.2f}s {s} from {who}" if who else f"+{t - t0:.2f}s {s}" for t, s, who in out[r])
            print(f"  proctrack/{self.PROCTRACK} {self._testMethodName}: rank {r}: {seen}", file=sys.stderr)
        return out

    def job_story(self, name, d):
        """The job's output and each node's ddprun log: why a job ended before its workers were ready."""
        logs = "".join(f"\n--- ddprun on node {t} (task_{t}.err):\n{log}" for t, log in enumerate(self.ddprun_logs(d)))
        return self.job_output(name) + logs

    def ddprun_logs(self, d):
        """Each task's ddprun log ("" before srun has created it)."""
        logs = []
        for t in range(2):
            try:
                with open(os.path.join(d, f"task_{t}.err"), errors="replace") as f:
                    logs.append(f.read())
            except FileNotFoundError:
                logs.append("")
        return logs

    def wait_gone(self, name, since, budget):
        """Asserts that no process of the step is left budget - 1 s after `since` (before
        Slurm's SIGKILL at KillWait could do it); returns how long it took."""
        deadline = time.monotonic() + lib.scaled(budget + 10)
        late = None  # what was still running when it should all have been gone
        while self.step_pids(name) and time.monotonic() < deadline:
            if late is None and time.monotonic() > since + budget - 1:
                late = lib.describe(self.step_pids(name))
            time.sleep(0.05)
        took = time.monotonic() - since
        if self.step_pids(name) or late:
            self.fail(f"the step of {name} ran on {took:.1f} s after Slurm's signal (KillWait {budget} s); "
                      f"at {budget - 1} s: {late}\n{self.diagnostics(name)}")
        return took

    def wait_all_signalled(self, d, sig, timeout):
        """Waits until every worker has logged sig; returns when the first one did (monotonic)."""
        deadline = time.monotonic() + lib.scaled(timeout)
        while True:
            firsts = []
            for r in range(2 * self.NPROC):
                with open(os.path.join(d, f"sig_{r}.log")) as f:
                    t = [float(line.split()[0]) for line in f if f" {sig} " in line]
                firsts.append(t[0] if t else None)
            if all(firsts):
                return min(firsts)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def diagnostics(self, name):
        """The job's output, ddprun's logs and the slurmd logs' ends, for a failure message."""
        d = self.job_dir(name)
        parts = [f"--- job output\n{self.job_output(name)}"]
        for f in sorted(os.listdir(d)):
            if f.endswith((".err", ".log", ".out")):
                with open(os.path.join(d, f), errors="replace") as fh:
                    parts.append(f"--- {f}\n{fh.read()[-3000:]}")
        logdir = os.path.join(self.cluster.root, "log")
        for f in sorted(os.listdir(logdir)):
            if f.endswith(".log") and f.startswith(("slurmd", "slurmctld")):
                with open(os.path.join(logdir, f), errors="replace") as fh:
                    parts.append(f"--- {f} (end)\n" + "".join(fh.readlines()[-25:]))
        return "\n".join(parts)

    def test_scancel_one_sigterm_per_worker_exit_143(self):
        self.scancel_case("scancel")

    def test_scancel_c10d_line_one_sigterm_per_worker_exit_143(self):
        self.scancel_case("scancel_c10d", rdzv=self.c10d_line(94))

    def c10d_line(self, n):
        """pytorch/examples' c10d flags; the endpoint on the job's first node (n1), a port of this cluster's."""
        port = lib.derived_port(self.cluster.first_job_id + n, 5)
        return f"--nnodes 2 --rdzv-backend c10d --rdzv-endpoint $HEAD:{port} --rdzv-id $SLURM_JOB_ID"

    def test_scancel_preload_one_sigterm_per_worker_exit_143(self):
        """Issue 22: workers forked by --preload's warm process, the same result."""
        self.scancel_case("scancel_preload", flags="--preload json")

    def scancel_case(self, name, rdzv="", late=None, flags=""):
        """scancel of a 2-node job; with `late`, that node's slurmd is held (SIGSTOP) for a
        second meanwhile, so Slurm's signal reaches it a second after the other node."""
        job, d = self.start_signal_job(name, "term", rdzv=rdzv, flags=flags)
        t0 = time.monotonic()
        if late:
            slurmd = self.cluster.procs[f"slurmd-{late}"].pid
            os.kill(slurmd, signal.SIGSTOP)
            try:
                self.cluster.run("scancel", str(job))
                time.sleep(1)
            finally:
                os.kill(slurmd, signal.SIGCONT)
        else:
            self.cluster.run("scancel", str(job))
        self.wait_gone(name, t0, self.KILL_WAIT)
        for rank, sigs in self.signals(d).items():
            terms = [s for s in sigs if s[1] == "SIGTERM"]
            self.assertEqual(len(terms), 1, f"rank {rank}: {sigs}")
            self.assertEqual(terms[0][2], self.sender(), f"rank {rank}: {sigs}")
            self.assertFalse([s for s in sigs if s[2] == "ddprun" and s[1] != "SIGTERM"], sigs)
        late_task = {"n1": 0, "n2": 1}.get(late)
        for t, log in enumerate(self.ddprun_logs(d)):
            if t == late_task:  # stopped on the other node's note, maybe before Slurm's signal came
                self.assertIn("Slurm is stopping step", log, f"task {t}: {log}")
                self.assertIn("so this node stops too", log, f"task {t}: {log}")
                self.assertNotIn("failed on another node", log, f"task {t}: {log}")
            else:
                self.assertIn("Slurm sent SIGTERM", log, f"task {t}")
            self.assertIn("at Slurm's KillWait, when that comes first)", log, f"task {t}: {log}")
            self.assertIn("exiting with 143", log, f"task {t}: {log}")
            self.assertNotIn("killing the workers now", log)
            if flags:
                self.assertIn("--preload: imported json", log, f"task {t}: {log}")
            if rdzv:  # the host is SLURM_NODEID 0 (task 0); nobody tries another round
                self.assertIn("this node hosts the c10d store" if t == 0 else "joining the c10d store", log)
                self.assertNotIn("forming the next", log, f"task {t}")
        info = self.cluster.wait(job, lib.scaled(30))
        self.assertEqual(info["JobState"], "CANCELLED")

    def test_scancel_urg_shows_every_ranks_stack_and_job_runs_on(self):
        """Issue 21: `scancel -s URG` (docs/stacks.md: the trigger that is safe under Slurm)
        makes each node's ddprun show its ranks' Python stacks; the job runs on and
        succeeds (USR2 then ends it, as in the case below)."""
        name = "urg"
        job, d = self.start_signal_job(name, "notify")
        self.cluster.run("scancel", "-s", "URG", str(job))
        # Each node's own dump (Slurm signals the nodes one by one; a node may show the
        # other's, relayed through the rendezvous, first, and its own then shares those
        # stacks instead of showing them twice).
        own = re.compile(r"SIGURG \(dump 1 asked on node \d \(\S+\)\): (?:the stacks of 2 ranks(?:.*\n)+?\[ddprun\] where"
                         r"|the stacks of this node's ranks shown \d+\.\d+ s ago, for dump 1 asked on node \d)")
        deadline = time.monotonic() + lib.scaled(30)
        while not all(own.search(log) for log in self.ddprun_logs(d)):
            self.assertLess(time.monotonic(), deadline, self.diagnostics(name))
            time.sleep(0.1)
        for t, log in enumerate(self.ddprun_logs(d)):
            for r in (2 * t, 2 * t + 1):
                self.assertRegex(log, rf"\[rank{r}\]:  File \".*sig_worker.py\", line \d+ in <module>", f"task {t}")
        self.cluster.run("scancel", "-s", "USR2", str(job))
        info = self.cluster.wait(job, lib.scaled(60))
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), self.diagnostics(name))
        self.assert_nothing_left(name)

    def test_scancel_usr2_reaches_each_worker_once_and_job_runs_on(self):
        name = "usr2"
        job, d = self.start_signal_job(name, "notify")
        self.cluster.run("scancel", "-s", "USR2", str(job))
        info = self.cluster.wait(job, lib.scaled(60))
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), self.job_output(name))
        for rank, sigs in self.signals(d).items():
            usr2 = [s for s in sigs if s[1] == "SIGUSR2"]
            self.assertEqual(len(usr2), 1, f"rank {rank}: {sigs}")
            self.assertEqual(usr2[0][2], self.sender(), f"rank {rank}: {sigs}")
        for t, log in enumerate(self.ddprun_logs(d)):
            self.assertIn("Slurm sent SIGUSR2", log, f"task {t}")
            self.assertNotIn("stopped after", log)
        self.assert_nothing_left(name)

    def before_its_time_limit(self, name, job):
        """The job still runs and no worker of it has had a SIGTERM yet."""
        if self.cluster.job(job)["JobState"] not in ("PENDING", "RUNNING"):
            return False
        d = self.job_dir(name)
        for r in range(2 * self.NPROC):
            with contextlib.suppress(FileNotFoundError), open(os.path.join(d, f"sig_{r}.log")) as f:
                if " SIGTERM " in f.read():
                    return False
        return True

    def test_time_limit_usr1_then_one_stop(self):
        # A 1-minute limit: Slurm checks every 30 s (from slurmctld's start), so USR1 (45 s
        # before the end) comes at the first check after the job starts, and the time limit's
        # SIGTERM at the check 60-90 s after that start.
        # Slurm may send the signal "up to 60 seconds earlier than specified" (sbatch(1)), so
        # with a 1-minute limit it can come before ddprun has started (it then dies of it, as
        # any program whose start Slurm signals), or before its workers have (ddprun says it
        # reached no worker): such a job is cancelled and another tried (left to its time limit,
        # it ran 60-90 s more: a wait of 60 s for it failed once).
        # Under load a job has also reached its limit with no USR1 heard by any ddprun (sent, it
        # seems, before srun had started the step, as it usually comes at once): its stop is
        # checked, and another job tried for the USR1.
        # The first job was submitted with the cluster (setUpClass): taken when its time limit's
        # SIGTERM is still to come, so that its stop is watched as it happens; else (the other
        # cases ran that long) cancelled, and a job of the case's own tried in its place.
        early, type(self).early_time_limit_job = type(self).early_time_limit_job, None
        for attempt in range(3):
            name = f"timelimit{attempt}"
            job = None
            if attempt == 0 and early is not None:
                if self.before_its_time_limit(name, early):
                    job = early
                else:
                    print(f"  {name}: job {early} (submitted with the cluster) reached its time limit before "
                          f"this test began: trying a new one", file=sys.stderr)
                    self.cluster.run("scancel", str(early))
                    self.cluster.wait(early, lib.scaled(150))
                    name += "_again"
            job, d = self.start_signal_job(name, "hold", *self.TIME_LIMIT_OPTIONS, early_signal_ok=True, job=job,
                                           nodes=self.TIME_LIMIT_NODES)
            if d is None:
                print(f"  {name}: Slurm signalled job {job} before its workers started: trying again", file=sys.stderr)
                self.cluster.run("scancel", str(job))
                # (once, beside the other Slurm test file: still COMPLETING after 60 s)
                self.cluster.wait(job, lib.scaled(150))
                continue
            info = self.cluster.wait(job, lib.scaled(150), states=("TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"))
            self.assertEqual(info["JobState"], "TIMEOUT", self.job_output(name))
            # Slurm's SIGTERM follows the TIMEOUT state; from it, the step must end within KillWait.
            term = self.wait_all_signalled(d, "SIGTERM", 60)
            self.assertIsNotNone(term,
                                 f"no SIGTERM reached every worker after the time limit\n{self.diagnostics(name)}")
            self.wait_gone(name, term, self.KILL_WAIT)
            if any("Slurm sent SIGUSR1" in log for log in self.ddprun_logs(d)):
                break
            print(f"  {name}: Slurm sent job {job} no USR1 before its time limit: trying again", file=sys.stderr)
            d = None
        self.assertIsNotNone(d, "Slurm signalled three jobs before their workers started or not at all")
        for rank, sigs in self.signals(d).items():
            usr1 = [s for s in sigs if s[1] == "SIGUSR1"]
            terms = [s for s in sigs if s[1] == "SIGTERM"]
            self.assertEqual(len(usr1), 1, f"rank {rank}: {sigs}\n{self.diagnostics(name)}")
            self.assertEqual(usr1[0][2], self.sender(), f"rank {rank}: {sigs}")
            self.assertTrue(terms, f"rank {rank} never got SIGTERM: {sigs}")
            self.assertTrue(all(s[2] == self.sender() for s in terms), f"rank {rank}: {sigs}")
            if self.PROCTRACK != "linuxproc":
                self.assertEqual(len(terms), 1, f"rank {rank}: {sigs}")  # Slurm's second TERM stops at ddprun
            self.assertGreater(terms[0][0] - usr1[0][0], 5, f"rank {rank} did not run on after USR1: {sigs}")
            self.assertTrue(any(s[1] == "EXIT" for s in sigs), f"rank {rank} was killed, not stopped: {sigs}")
        for t, log in enumerate(self.ddprun_logs(d)):
            self.assertIn("Slurm sent SIGUSR1", log, f"task {t}")
            self.assertIn("exiting with 143", log, f"task {t}: {log}")
            self.assertNotIn("killing the workers now", log)
