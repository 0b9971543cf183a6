"""Real PyTorch workers, on torch 1.13 and (as launcher.integration.test_torch.torch2) on
torch 2.6: a @record failure shows its traceback in ddprun's summary and error file; gloo
all_reduce works under --standalone and static rendezvous; and on torch 2.6 without the
tests' use_libuv shim, the summary names Debian's libuv-less build as the cause."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, RUNTIME, clean_env, free_port, main, read_text, timeout_scale, worker

LIBUV_ERROR = "use_libuv was requested but PyTorch was build without libuv support"
# torch 2.6 takes ~2 s to import on 2 cores, 1.13 ~1 s; a job here takes 3-8 s.
JOB_TIMEOUT = 90


class TorchTest(DdprunTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        why = RUNTIME.skip_reason()
        if why:
            raise unittest.SkipTest(f"{RUNTIME.name}: {why}")

    def run_job(self, args, env=None):
        return self.run_ddprun(args, env=env, timeout=JOB_TIMEOUT * timeout_scale())

    def assert_sums(self, res):
        self.assertEqual(res.rc, 0, res)
        for r in range(2):
            self.assertEqual(read_text(self.path(f"sum_{r}")).split(), ["3.0", "3.0"])
        # The workers ran the torch this run is meant for (2.x for *.torch2).
        self.assertIn(f"[rank0]:torch {RUNTIME.version}\n", res.stdout)
        if RUNTIME.is_torch2:
            self.assertTrue(RUNTIME.version.startswith("2."), RUNTIME.version)

    def test_record_traceback_in_summary(self):
        err_file = self.path("root_cause.json")
        env = clean_env(TORCHELASTIC_ERROR_FILE=err_file)
        res = self.run_job(["--standalone", "--nproc-per-node", "2", worker("torch_record.py")], env=env)
        self.assertEqual(res.rc, 1, res)
        summary = self.summary_block(res.stderr)
        root = summary[summary.index("Root Cause"):]
        self.assertIn("ValueError: bad batch 7", root)
        self.assertIn("rank      : 0 (local_rank: 0)", root)
        self.assertIn("exitcode  : 1 (pid: ", root)
        self.assertRegex(root, r"error_file: /\S+/attempt_0/0/error.json")
        self.assertIn("Traceback", root)
        self.assertIn('torch_record.py", line', root)
        self.assertNotIn("hint:", summary)
        # ddprun's own error file carries the worker's record plus errorCode.
        j = self.load_json(err_file)
        self.assertEqual(j["message"]["errorCode"], 1)
        self.assertIn("bad batch 7", j["message"]["message"])
        self.assertIn("ValueError: bad batch 7", j["message"]["extraInfo"]["py_callstack"])

    def test_gloo_all_reduce_standalone(self):
        res = self.run_job(["--standalone", "--nproc-per-node", "2", worker("torch_allreduce.py"), self.tmp])
        self.assert_sums(res)

    def test_gloo_all_reduce_static(self):
        res = self.run_job(["--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                            "--nproc-per-node", "2", worker("torch_allreduce.py"), self.tmp])
        self.assert_sums(res)

    def test_gloo_all_reduce_not_sharing_the_agents_store(self):
        """TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as torchrun 2.4+ reads it: c10d and --standalone
        workers get no agent store, and rank 0's worker hosts theirs on MASTER_PORT (a free port,
        not the rendezvous's); a static job shares node 0's store whatever it says."""
        # USE_LIBUV=0: rank 0's env:// store passes use_libuv itself, which the tests' shim for
        # Debian's libuv-less torch 2.6 cannot default (a pip wheel of torch needs neither).
        env = clean_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", USE_LIBUV="0")
        rdzv_port = free_port()
        for line in (["--standalone"],
                     ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}"]):
            with self.subTest(line=line):
                res = self.run_job(["--log-level", "info", *line, "--nproc-per-node", "2", worker("torch_allreduce.py"),
                                    self.tmp], env=env)
                self.assert_sums(res)
                port = re.search(r"\[rank0\]:agent store False at port (\d+)\n", res.stdout)
                self.assertIsNotNone(port, res)
                self.assertNotEqual(int(port.group(1)), rdzv_port)
                self.assertIn("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers get no agent store", res.stderr)
        master_port = free_port()
        res = self.run_job(["--log-level", "info", "--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port",
                            str(master_port), "--nproc-per-node", "2", worker("torch_allreduce.py"), self.tmp],
                           env=env)
        self.assert_sums(res)
        self.assertIn(f"[rank0]:agent store True at port {master_port}\n", res.stdout)
        self.assertIn("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ignored: a static job's workers share", res.stderr)

    @unittest.skipUnless(RUNTIME.is_torch2, "torch 2.x only (1.13 has no use_libuv)")
    def test_missing_libuv_is_named_in_the_summary(self):
        """Debian's torch 2.6 without the tests' shim: every worker's init_process_group
        fails; the summary shows the error and one hint line with the cause and the fix."""
        env = clean_env(DDP_TORCH2_SHIM="0")
        res = self.run_job(["--standalone", "--nproc-per-node", "2", worker("torch_allreduce.py"), self.tmp],
                           env=env)
        self.assertEqual(res.rc, 1, res)
        summary = self.summary_block(res.stderr)
        self.assertIn(LIBUV_ERROR, summary)
        hints = [l for l in summary.splitlines() if l.startswith("hint:")]
        self.assertEqual(len(hints), 1, summary)
        self.assertIn("without libuv", hints[0])
        self.assertIn("use_libuv=False", hints[0])


if __name__ == "__main__":
    main()
