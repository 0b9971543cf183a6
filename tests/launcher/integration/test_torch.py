"""Real PyTorch 1.13 workers (PYTHON_EXEC=/usr/bin/python3): a @record failure shows its
traceback in ddprun's summary and error file; gloo all_reduce works under --standalone
and static rendezvous."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, PYTHON, clean_env, free_port, read_text, worker

import subprocess

HAVE_TORCH = subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True).returncode == 0


@unittest.skipUnless(HAVE_TORCH, f"{PYTHON} has no torch")
class TorchTest(DdprunTestCase):
    def test_record_traceback_in_summary(self):
        err_file = self.path("root_cause.json")
        env = clean_env(TORCHELASTIC_ERROR_FILE=err_file)
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", worker("torch_record.py")], env=env,
                              timeout=60)
        self.assertEqual(res.rc, 1, res)
        summary = self.summary_block(res.stderr)
        root = summary[summary.index("Root Cause"):]
        self.assertIn("ValueError: bad batch 7", root)
        self.assertIn("rank      : 0 (local_rank: 0)", root)
        self.assertIn("exitcode  : 1 (pid: ", root)
        self.assertRegex(root, r"error_file: /\S+/attempt_0/0/error.json")
        self.assertIn("Traceback", root)
        # ddprun's own error file carries the worker's record plus errorCode.
        j = self.load_json(err_file)
        self.assertEqual(j["message"]["errorCode"], 1)
        self.assertIn("bad batch 7", j["message"]["message"])
        self.assertIn("ValueError: bad batch 7", j["message"]["extraInfo"]["py_callstack"])

    def test_gloo_all_reduce_standalone(self):
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", worker("torch_allreduce.py"), self.tmp],
                              timeout=60)
        self.assertEqual(res.rc, 0, res)
        for r in range(2):
            self.assertEqual(read_text(self.path(f"sum_{r}")).split(), ["3.0", "3.0"])

    def test_gloo_all_reduce_static(self):
        res = self.run_ddprun(["--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                               "--nproc-per-node", "2", worker("torch_allreduce.py"), self.tmp], timeout=60)
        self.assertEqual(res.rc, 0, res)
        for r in range(2):
            self.assertEqual(read_text(self.path(f"sum_{r}")).split(), ["3.0", "3.0"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
