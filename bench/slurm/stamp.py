#!/usr/bin/python3
"""A worker that only says when it started: writes time.time() to DIR/<rank>. usage: stamp.py DIR"""
import os
import sys
import time

t = time.time()
with open(os.path.join(sys.argv[1], os.environ.get("RANK", "x")), "w") as f:
    f.write(f"{t:.6f}\n")
