#!/usr/bin/env python3
"""ddprun runs real PyTorch (gloo) jobs on one node: examples/pytorch/allreduce.py and
train.py under --standalone and under a static single-node rendezvous with torchrun's
underscore flag spellings, and a worker that raises fails the job with a summary.
On torch 1.13 and, as integration.pytorch_jobs.torch2, on torch 2.6."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import ddprun_testlib as lib

NPROC = 4
RUN_TIMEOUT = lib.scaled(120)  # a hang guard; a job here takes 2-5 s on 2 idle cores
# What "promptly" allows a whole job: torch 2.6 takes twice as long to import.
PROMPT = lib.scaled(90 if lib.RUNTIME.is_torch2 else 60)
# What the examples print once their work is done (only torch's exit is left).
TRAIN_DONE, ALLREDUCE_DONE = f"parameters identical on all {NPROC} ranks", f"all_reduce over {NPROC} ranks"


class PyTorchJobs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        lib.check_prerequisites(cls)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_it_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_ddprun(self, argv, cwd=None, timeout=RUN_TIMEOUT, done=None):
        """Runs ddprun once; once more when the run failed only by torch's exit race after
        printing `done` (lib.torch_exit_abort), saying so on stderr."""
        for attempt in range(2):
            t0 = time.monotonic()
            # TMPDIR: ddprun keeps its error-file folder after a failure; keep it in ours.
            r = subprocess.run(argv, cwd=cwd or self.tmp, env=lib.job_env(TMPDIR=self.tmp), capture_output=True,
                               text=True, timeout=timeout)
            r.elapsed = time.monotonic() - t0
            if attempt == 0 and lib.torch_exit_abort(r, done):
                print(f"\n{self.id()}: a worker aborted in torch's exit after the job was done "
                      f"({lib.TORCH_EXIT_ABORT!r}); running the job again:\n{r.stderr}", file=sys.stderr)
                continue
            return r

    def run_static(self, make_argv, cwd=None, done=None):
        """Runs a static single-node job on 12355 (the seeds' port) when free, else on a free
        port; retries once with another port if the chosen one was taken meanwhile."""
        port = 12355 if lib.port_is_free(12355) else lib.free_port()
        for _ in range(3):
            r = self.run_ddprun(make_argv(port), cwd=cwd, done=done)
            if r.returncode != 0 and "already in use" in r.stderr:
                port = lib.free_port()
                continue
            return r
        return r

    def assert_ok(self, r):
        self.assertEqual(r.returncode, 0, f"ddprun exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")

    def assert_agent_store(self, r):
        seen = [l for l in r.stdout.splitlines() if "env:" in l]
        self.assertEqual(len(seen), NPROC, r.stdout)
        for line in seen:
            self.assertIn("TORCHELASTIC_USE_AGENT_STORE=True", line)
            self.assertIn(f"WORLD_SIZE={NPROC}", line)
            # The workers ran the torch this run is meant for (2.x for *.torch2).
            self.assertIn(f" torch={lib.RUNTIME.version}", line)
            if lib.RUNTIME.is_torch2:
                self.assertTrue(lib.RUNTIME.version.startswith("2."), lib.RUNTIME.version)

    def assert_trained(self, r, checkpoint):
        loss = lib.losses(r.stdout)
        self.assertGreaterEqual(len(loss), 3, r.stdout)
        self.assertLess(loss[-1], loss[0] * 0.5, f"the loss did not fall: {loss}")
        self.assertIn(f"parameters identical on all {NPROC} ranks", r.stdout)
        self.assertTrue(os.path.isfile(checkpoint), f"no checkpoint at {checkpoint}\n{r.stdout}")
        check = subprocess.run(
            [lib.TORCH_PYTHON, "-c",
             "import sys, torch; c = torch.load(sys.argv[1]); "
             "assert set(c) == {'epoch', 'model', 'optimizer'}, c.keys(); print(sorted(c['model']))",
             checkpoint], capture_output=True, text=True, timeout=lib.scaled(60))
        self.assertEqual(check.returncode, 0, check.stderr)
        self.assertIn("0.weight", check.stdout)

    # ------------------------------------------------------------------ --standalone

    def test_allreduce_standalone(self):
        r = self.run_ddprun([lib.DDPRUN, "--standalone", "--nproc-per-node", str(NPROC),
                             os.path.join(lib.EXAMPLES, "allreduce.py"), "--debug"], done=ALLREDUCE_DONE)
        self.assert_ok(r)
        self.assertIn(f"all_reduce over {NPROC} ranks: sum = 6 (expected 6)", r.stdout)
        self.assert_agent_store(r)

    def test_train_standalone(self):
        ckpt = os.path.join(self.tmp, "out", "ckpt.pt")
        r = self.run_ddprun([lib.DDPRUN, "--standalone", "--nproc-per-node", str(NPROC),
                             os.path.join(lib.EXAMPLES, "train.py"), "--checkpoint", ckpt, "--debug"],
                            done=TRAIN_DONE)
        self.assert_ok(r)
        self.assert_agent_store(r)
        self.assert_trained(r, ckpt)

    def test_allreduce_c10d_at_localhost_port_0(self):
        """torchrun 2.x's --standalone spelled out (c10d at localhost:0: one node, its store at
        a port the system picks), as scripts copy it from torchrun's log."""
        r = self.run_ddprun([lib.DDPRUN, "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1",
                             f"--nproc_per_node={NPROC}", os.path.join(lib.EXAMPLES, "allreduce.py"), "--debug"],
                            done=ALLREDUCE_DONE)
        self.assert_ok(r)
        self.assertIn(f"all_reduce over {NPROC} ranks: sum = 6", r.stdout)
        self.assert_agent_store(r)
        self.assertNotIn("MASTER_PORT=0 ", r.stdout)

    # ------------------------------------------------------------------ static, torchrun's spelling

    def test_allreduce_static_torchrun_flags(self):
        r = self.run_static(lambda port: [
            lib.DDPRUN, f"--nproc_per_node={NPROC}", "--nnodes=1", "--node_rank=0", "--master_addr=localhost",
            f"--master_port={port}", os.path.join(lib.EXAMPLES, "allreduce.py"), "--debug"], done=ALLREDUCE_DONE)
        self.assert_ok(r)
        self.assertIn(f"all_reduce over {NPROC} ranks: sum = 6", r.stdout)
        self.assert_agent_store(r)
        self.assertIn("MASTER_ADDR=localhost", r.stdout)

    def test_train_seed_launch_line(self):
        """The seeds' line, verbatim but for the port, run from a folder laid out like the
        source tree, so that the default ./checkpoint.pt lands in that folder."""
        os.makedirs(os.path.join(self.tmp, "build", "bin"))
        os.symlink(lib.DDPRUN, os.path.join(self.tmp, "build", "bin", "ddprun"))
        os.symlink(os.path.join(lib.SOURCE_DIR, "examples"), os.path.join(self.tmp, "examples"))
        r = self.run_static(lambda port: [
            "build/bin/ddprun", "--nproc_per_node=4", "--nnodes=1", "--node_rank=0", "--master_addr=localhost",
            f"--master_port={port}", "examples/pytorch/train.py"], done=TRAIN_DONE)
        self.assert_ok(r)
        self.assert_trained(r, os.path.join(self.tmp, "checkpoint.pt"))
        self.assertLess(r.elapsed, PROMPT)

    # ------------------------------------------------------------------ failure

    def test_worker_exception_fails_the_job(self):
        r = self.run_ddprun([lib.DDPRUN, "--standalone", "--nproc-per-node", str(NPROC), "--shutdown-timeout", "5",
                             os.path.join(lib.WORKERS, "raise_error.py"), "--fail-rank", "1"])
        self.assertEqual(r.returncode, 1, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        self.assertIn("raise_error.py FAILED", r.stderr)
        self.assertIn("Root Cause (first observed failure)", r.stderr)
        self.assertRegex(r.stderr, r"rank\s*: 1 \(local_rank: 1\)")
        self.assertIn("RuntimeError: deliberate failure on rank 1", r.stderr)
        self.assertLess(r.elapsed, PROMPT, "the other ranks were not stopped promptly")


if __name__ == "__main__":
    lib.main()
