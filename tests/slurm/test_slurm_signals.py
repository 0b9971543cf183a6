#!/usr/bin/python3
"""Slurm's signals under proctrack/cgroup (Slurm signals only the task, ddprun): scancel
(also on the c10d line, and with the nodes signalled a second apart), scancel -s USR2 and a
time limit with --signal=USR1@45. See signal_cases.py."""
import signal_cases
import slurm_testlib as lib


class SlurmSignalsCgroup(signal_cases.SignalCases, lib.SlurmTestCase):
    PROCTRACK = "cgroup"

    # Slurm's stop reaching the nodes a second apart (each node's slurmd gets its own
    # message; here one is held): the late node must not take the early one's exit (or the
    # loss of the store it hosted) for a failure of the job. Each node still exits 143 and
    # each worker gets one SIGTERM.
    def test_scancel_c10d_line_store_host_signalled_first(self):
        self.scancel_case("skew_c10d_host_first", rdzv=self.c10d_line(95), late="n2")

    def test_scancel_c10d_line_store_host_signalled_last(self):
        self.scancel_case("skew_c10d_host_last", rdzv=self.c10d_line(96), late="n1")

    def test_scancel_static_line_store_host_signalled_last(self):
        self.scancel_case("skew_static_host_last", late="n1")


if __name__ == "__main__":
    lib.main()
