#!/usr/bin/python3
"""Slurm's signals under proctrack/linuxproc (Slurm signals every process of the step, the
workers included): the same cases as test_slurm_signals.py. See signal_cases.py."""
import signal_cases
import slurm_testlib as lib


class SlurmSignalsLinuxproc(signal_cases.SignalCases, lib.SlurmTestCase):
    PROCTRACK = "linuxproc"

    # Slurm's stop a second late on the store's host: the other node's note says Slurm
    # signals the workers itself here, so the late node sends them nothing and each still
    # gets exactly one SIGTERM, Slurm's.
    def test_scancel_c10d_line_store_host_signalled_last(self):
        self.scancel_case("skew_c10d_host_last", rdzv=self.c10d_line(96), late="n1")


if __name__ == "__main__":
    lib.main()
