#!/usr/bin/env python3
"""A real elastic PyTorch job (gloo, checkpoint and resume: workers/elastic_train.py) under
ddprun's etcd rendezvous (issue 13), on loopback with a real etcd member started once for
the file (tests/testlib/etcd_cluster.py).

Node rank 0 (the lowest --local-addr) hosts the round's worker store (MASTER_ADDR/PORT).
SIGKILL that host, its ddprun and its workers: with c10d that would be the end of the job
when the rendezvous lives there; with etcd the survivor re-forms as the new rank 0, hosts
a new worker store, and the job resumes from its checkpoint at the smaller world.
"""
import os
import sys
import unittest

import ddprun_testlib as lib
import test_elastic_pytorch as base  # its class is not imported by name: unittest would run it here too
from test_elastic_pytorch import CONF, EPOCHS, TRAIN, Node

sys.path.insert(0, os.path.join(lib.HERE, "..", "testlib"))
import etcd_cluster  # noqa: E402

_etcd = None


def tearDownModule():
    if _etcd:
        _etcd.stop()


class EtcdElasticPytorch(base.ElasticPytorch):
    # The c10d file's tests are not repeated here.
    test_lose_a_host_survivor_resumes_smaller = None
    test_add_a_host_world_grows = None

    @classmethod
    def setUpClass(cls):
        global _etcd
        super().setUpClass()
        if not etcd_cluster.find_etcd():
            raise unittest.SkipTest("no etcd binary (Debian package etcd-server)")
        if _etcd is None:
            _etcd = etcd_cluster.EtcdCluster(1)

    def start_node(self, name, addr, conf):
        import subprocess
        argv = [lib.DDPRUN, "--log-level", "info", "--rdzv-backend", "etcd", "--rdzv-endpoint", _etcd.endpoints(),
                "--rdzv-id", f"elastic-{os.getpid()}-{self._testMethodName}", "--nnodes", "1:2",
                "--nproc-per-node", "2", "--max-restarts", "3", "--local-addr", addr, "--rdzv-conf", conf,
                TRAIN, "--checkpoint", self.ckpt, "--record", self.rec, "--epochs", str(EPOCHS)]
        out, err = (os.path.join(self.tmp, f"{name}.{s}") for s in ("out", "err"))
        fo, fe = open(out, "w"), open(err, "w")
        self._files += [fo, fe]
        proc = subprocess.Popen(argv, cwd=self.tmp, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                env=lib.job_env(TMPDIR=self.tmp, GLOO_SOCKET_IFNAME="lo"), start_new_session=True)
        node = Node(name, addr, proc, out, err)
        self.nodes.append(node)
        return node

    def test_lose_the_rank0_host_survivor_resumes_as_rank0(self):
        a = self.start_node("A", "127.0.0.2", CONF)
        b = self.start_node("B", "127.0.0.3", CONF)
        self.wait_for(lambda: len(self.epochs_done(4)) >= 2 and self.saved_epoch() >= 1, 120,
                      "two epochs at world 4, both in the checkpoint")
        starts4 = [r for r in self.lines("start") if r["world"] == 4]
        self.assertTrue(all(r["master"].split(":")[0] == "127.0.0.2" for r in starts4), self.describe())
        # A is node rank 0 (ranks 0, 1) and hosts the workers' store: it goes, all at once.
        # B becomes the new node rank 0: it hosts the new round's store.
        resumed = self.lose_host_and_check_resume(a, (0, 1), b, "127.0.0.3", exact_restarts=False)
        print(f"\netcd: rank-0 host lost -> survivor's workers resumed after {resumed:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    lib.main()
