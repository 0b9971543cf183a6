"""Every descriptor ddprun opens is close-on-exec: a worker starts with exactly its stdin,
stdout and stderr plus what ddprun itself inherited (here one file the test passes on
purpose), and ddprun, while the workers run, holds no other descriptor without O_CLOEXEC. A leaked descriptor is not harmless: the store's listening socket in a worker (or
in a daemon it leaves behind) keeps the port bound and lets it accept() store clients.

Each launch path is one entry of LAUNCHES: (name, nodes, argv of node i). The c10d path runs
two nodes, node 0 hosting the store and node 1 joining it: the agent holds more than the
static one (the store's listening socket and its connections on the host, a lease
connection and an event connection to the store, eventfds, threads), none of it the workers'.
The etcd path (when Debian's etcd is installed) runs the same two nodes against one etcd
member: HTTP connections to etcd (state, watches, the lease) and, on the round's rank 0, the
workers' store.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, free_port, read_text, timeout_scale, worker  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testlib"))
import etcd_cluster  # noqa: E402

NPROC = 2


def static_args(nnodes, node, port):
    return ["--nnodes", str(nnodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--rdzv-conf", "join_timeout=20"]


def c10d_args(node, port):
    return ["--log-level", "info", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "fds",
            "--local-addr", f"127.0.0.{2 + node}", "--rdzv-conf", f"is_host={int(node == 0)},join_timeout=20"]


def etcd_args(node, endpoints):
    return ["--log-level", "info", "--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoints,
            "--rdzv-id", f"fds{os.getpid()}", "--local-addr", f"127.0.0.{2 + node}", "--rdzv-conf", "join_timeout=20"]


# (name, nodes, argv of node i, what node i's stderr says: the path really taken)
LAUNCHES = [
    ("static single-node", 1, lambda node, port: static_args(1, node, port), {}),
    ("standalone", 1, lambda node, port: ["--standalone"], {}),
    ("static multi-node", 2, lambda node, port: static_args(2, node, port), {}),
    ("c10d", 2, lambda node, port: c10d_args(node, port),
     {0: "this node hosts the c10d store", 1: "joining the c10d store"}),
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

    def check_launch(self, name, nodes, argv_of, says):
        # A descriptor ddprun inherits without close-on-exec stays the workers'.
        inherited = self.path("inherited.txt")
        fd = os.open(inherited, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            world = self.launch(nodes, argv_of, fd)
        finally:
            os.close(fd)
        for node, text in says.items():
            self.assertIn(text, read_text(self.path(f"node{node}.stderr")), f"{name}: node {node}")
        for rank in range(world):
            with open(self.path(f"fds_{rank}.json")) as f:
                fds = json.load(f)
            # ddprun itself, while its workers run: nothing it opened (store, connections,
            # eventfds, pipes, log files) could reach a worker it starts later (a restart).
            parent = {int(k): v for k, v in fds.pop("ddprun").items()}
            self.assertEqual(sorted(parent), [0, 1, 2, fd], f"{name}: ddprun (of rank {rank}) holds {parent} "
                                                            "without close-on-exec")
            fds = {int(k): v for k, v in fds.items()}
            self.assertEqual(sorted(fds), [0, 1, 2, fd],
                             f"{name}: rank {rank} started with descriptors {fds}")
            self.assertEqual(fds[fd], inherited, name)
            self.assertEqual(fds[0], "/dev/null", name)
            for out in (1, 2):  # ddprun's per-worker pipes
                self.assertTrue(fds[out].startswith("pipe:"), f"{name}: rank {rank} fd {out} -> {fds[out]}")
            os.unlink(self.path(f"fds_{rank}.json"))

    def test_every_launch_path(self):
        for name, nodes, argv_of, says in LAUNCHES:
            with self.subTest(launch=name):
                self.check_launch(name, nodes, argv_of, says)

    def test_etcd(self):
        if not etcd_cluster.find_etcd():
            self.skipTest("no etcd (Debian's etcd-server; scripts/setup.sh installs it)")
        cluster = etcd_cluster.EtcdCluster(1)
        try:
            self.check_launch("etcd", 2, lambda node, port: etcd_args(node, cluster.endpoints()), {})
        finally:
            cluster.stop()


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
