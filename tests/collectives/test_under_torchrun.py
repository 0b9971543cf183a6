#!/usr/bin/python3
"""A C++ worker on libddp, launched by PyTorch's own torchrun (1.13, the anchor's) instead of
ddprun: a drop-in launcher works both ways.

torchrun 1.13's default (static) rendezvous gives the workers its agent's TCPStore
(TORCHELASTIC_USE_AGENT_STORE=True), which speaks wire generation 1: libddp finds that
itself (WireGeneration::kAuto) and trains. Before, its generation-2 handshake got the
connection reset, and the VALIDATE it then sent alone stalled torch's store for every
client until the worker's next request.

  test_under_torchrun.py --train-linear build/bin/train_linear
Exits 77 (ctest SKIP_RETURN_CODE) without the anchor or torch.
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from test_timeouts import scaled  # noqa: E402  (DDP_TEST_TIMEOUT_SCALE)

PYTHON = "/usr/bin/python3"
TORCHRUN113 = "/work/shared/anchors/torchrun113.py"
TRAIN_LINEAR = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_"))}


def torchrun(*args, cwd):
    """torchrun 1.13 with one libddp worker per rank: (rc, output, seconds)."""
    env = clean_env()
    t0 = time.monotonic()
    r = subprocess.run([PYTHON, TORCHRUN113, *args, "--no_python", TRAIN_LINEAR, "--steps", "300",
                        "--out", os.path.join(cwd, "model.txt")],
                       cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=scaled(120))
    return r.returncode, r.stdout, time.monotonic() - t0


class UnderTorchrun113(unittest.TestCase):
    def setUp(self):
        self.tmp = self.mkdtemp()

    def mkdtemp(self):
        d = tempfile.mkdtemp(prefix="ddp-torchrun-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_default_static_launch_trains_on_the_agents_generation1_store(self):
        rc, out, took = torchrun("--nproc_per_node", "2", "--master_port", str(free_port()), cwd=self.tmp)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"final loss \S+ over 2 ranks; weights identical on all ranks", out)
        # torchrun's own start-up is most of it; 60 s would be the old handshake's timeout.
        self.assertLess(took, scaled(45), out)

    def test_two_static_nodes_train_across_both_agents(self):
        port = str(free_port())
        common = ["--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", port]
        tmp1 = self.mkdtemp()
        procs = []
        for rank, cwd in ((0, self.tmp), (1, tmp1)):
            procs.append(subprocess.Popen(
                [PYTHON, TORCHRUN113, *common, "--node_rank", str(rank), "--no_python", TRAIN_LINEAR,
                 "--steps", "300", "--out", os.path.join(cwd, "model.txt")],
                cwd=cwd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=scaled(120))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
        self.assertEqual([p.returncode for p in procs], [0, 0], outs)
        self.assertRegex(outs[0], r"final loss \S+ over 2 ranks; weights identical on all ranks", outs)

    def test_standalone_launch_is_refused_saying_why(self):
        # torchrun 1.13's c10d rendezvous (--standalone) shares no store with its workers
        # (TORCHELASTIC_USE_AGENT_STORE=False): rank 0 would have to host one, which libddp
        # does not. One clear error per rank, not a hang.
        rc, out, took = torchrun("--standalone", "--nproc_per_node", "2", cwd=self.tmp)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("TORCHELASTIC_USE_AGENT_STORE is not True: libddp never hosts a store", out)
        self.assertIn("or under torchrun's static launch", out)
        self.assertLess(took, scaled(45), out)


def main():
    global TRAIN_LINEAR
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-linear", required=True)
    args, rest = ap.parse_known_args()
    TRAIN_LINEAR = os.path.abspath(args.train_linear)
    if not os.path.exists(TORCHRUN113):
        print(f"SKIP: no {TORCHRUN113}")
        return 77
    if subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True).returncode != 0:
        print(f"SKIP: {PYTHON} has no torch")
        return 77
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
