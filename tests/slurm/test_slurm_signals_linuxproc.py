#!/usr/bin/python3
"""Slurm's signals under proctrack/linuxproc (Slurm signals every process of the step, the
workers included): the same cases as test_slurm_signals.py. See signal_cases.py."""
import signal_cases
import slurm_testlib as lib


class SlurmSignalsLinuxproc(signal_cases.SignalCases, lib.SlurmTestCase):
    PROCTRACK = "linuxproc"


if __name__ == "__main__":
    lib.main()
