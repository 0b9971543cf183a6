"""Every descriptor ddprun opens is close-on-exec: a worker starts with exactly its stdin,
stdout and stderr plus what ddprun itself inherited (here one file the test passes on
purpose). A leaked descriptor is not harmless: the store's listening socket in a worker (or
in a daemon it leaves behind) keeps the port bound and lets it accept() store clients.

Each launch path is one entry of LAUNCHES: (name, nodes, argv of node i). Add a line there
for a new path (c10d: --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port}).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, free_port, read_text, timeout_scale, worker

NPROC = 2


def static_args(nnodes, node, port):
    return ["--nnodes", str(nnodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--rdzv-conf", "join_timeout=20"]


LAUNCHES = [
    ("static single-node", 1, lambda node, port: static_args(1, node, port)),
    ("standalone", 1, lambda node, port: ["--standalone"]),
    ("static multi-node", 2, lambda node, port: static_args(2, node, port)),
]


class WorkerDescriptors(DdprunTestCase):
    def launch(self, nodes, argv_of, inherited_fd):
        port = free_port()
        procs = []
        for node in range(nodes):
            out = open(self.path(f"node{node}.stdout"), "wb")
            err = open(self.path(f"node{node}.stderr"), "wb")
            self._files += [out, err]
            args = argv_of(node, port) + ["--nproc-per-node", str(NPROC), worker("fd_list.py"), self.tmp]
            procs.append(self.start(args, stdout=out, stderr=err, pass_fds=(inherited_fd,)))
        for node, p in enumerate(procs):
            rc = p.wait(timeout=60 * timeout_scale())
            self.assertEqual(rc, 0, read_text(self.path(f"node{node}.stderr")))
        return nodes * NPROC

    def check_launch(self, name, nodes, argv_of):
        # A descriptor ddprun inherits without close-on-exec stays the workers'.
        inherited = self.path("inherited.txt")
        fd = os.open(inherited, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            world = self.launch(nodes, argv_of, fd)
        finally:
            os.close(fd)
        for rank in range(world):
            with open(self.path(f"fds_{rank}.json")) as f:
                fds = {int(k): v for k, v in json.load(f).items()}
            self.assertEqual(sorted(fds), [0, 1, 2, fd],
                             f"{name}: rank {rank} started with descriptors {fds}")
            self.assertEqual(fds[fd], inherited, name)
            self.assertEqual(fds[0], "/dev/null", name)
            for out in (1, 2):  # ddprun's per-worker pipes
                self.assertTrue(fds[out].startswith("pipe:"), f"{name}: rank {rank} fd {out} -> {fds[out]}")
            os.unlink(self.path(f"fds_{rank}.json"))

    def test_every_launch_path(self):
        for name, nodes, argv_of in LAUNCHES:
            with self.subTest(launch=name):
                self.check_launch(name, nodes, argv_of)


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
