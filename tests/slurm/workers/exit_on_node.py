#!/usr/bin/python3
"""usage: exit_on_node.py GROUP_RANK CODE: local rank 0 of node GROUP_RANK exits CODE two
seconds in; every other rank sleeps (up to 120 s, exit 0)."""
import os
import sys
import time

node, code = int(sys.argv[1]), int(sys.argv[2])
if int(os.environ["GROUP_RANK"]) == node and int(os.environ["LOCAL_RANK"]) == 0:
    time.sleep(2)
    print(f"rank {os.environ['RANK']} on node {node}: exiting with {code}", flush=True)
    sys.exit(code)
time.sleep(120)
