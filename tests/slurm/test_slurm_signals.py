#!/usr/bin/python3
"""Slurm's signals under proctrack/cgroup (Slurm signals only the task, ddprun): scancel,
scancel -s USR2 and a time limit with --signal=USR1@45. See signal_cases.py."""
import signal_cases
import slurm_testlib as lib


class SlurmSignalsCgroup(signal_cases.SignalCases, lib.SlurmTestCase):
    PROCTRACK = "cgroup"


if __name__ == "__main__":
    lib.main()
