#!/usr/bin/python3
"""A worker that only says when it started: writes time.time() to DIR/<rank>. usage: stamp.py DIR"""
import os
import sys
import time

t = time.time()
name = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "x")  # srun alone: its task id
with open(os.path.join(sys.argv[1], name), "w") as f:
    f.write(f"{t:.6f}\n")
