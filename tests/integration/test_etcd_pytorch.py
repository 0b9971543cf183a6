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
import signal
import sys
import time
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
        self.wait_for(lambda: len(self.epochs_done(4)) >= 2 and os.path.exists(self.ckpt), 120,
                      "two epochs at world 4")
        starts4 = [r for r in self.lines("start") if r["world"] == 4]
        self.assertTrue(all(r["master"].split(":")[0] == "127.0.0.2" for r in starts4), self.describe())
        # A is node rank 0 (ranks 0, 1) and hosts the workers' store: it goes, all at once.
        a_workers = [r["pid"] for r in starts4 if r["rank"] in (0, 1)]
        self.assertEqual(len(a_workers), 2, self.describe())
        t_kill = time.time()
        for pid in [a.proc.pid] + a_workers:
            os.kill(pid, signal.SIGKILL)
        last_at_4 = max(self.epochs_done(4))
        self.wait_exit([b], 120)
        self.assertEqual(b.proc.returncode, 0, self.describe())
        starts2 = [r for r in self.lines("start") if r["world"] == 2]
        self.assertEqual(sorted(r["rank"] for r in starts2), [0, 1], self.describe())
        for r in starts2:
            self.assertIn(r["resume_epoch"], (last_at_4, last_at_4 + 1), self.describe())
            self.assertGreaterEqual(r["resume_epoch"], 2)
            self.assertGreaterEqual(r["restart_count"], 1, "losing a host is a counted restart")
            # B is the new node rank 0: it hosts the new round's store.
            self.assertEqual(r["master"].split(":")[0], "127.0.0.3", self.describe())
        self.assertEqual(self.epochs_done(2), list(range(starts2[0]["resume_epoch"], EPOCHS)), self.describe())
        self.check_finished_at(2)
        resumed = min(r["t"] for r in starts2) - t_kill
        print(f"\netcd: rank-0 host lost -> survivor's workers resumed after {resumed:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    lib.main()
