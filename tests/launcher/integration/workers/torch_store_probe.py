"""Reads a key of a TCPStore with PyTorch's own client (torch 1.13 here).

usage: torch_store_probe.py PORT KEY
Waits until KEY holds something other than torchrun's "no state yet" sentinel, prints
"value <its first 16 characters>", then prints it again for every line read from stdin.
"""
import sys
import time
from datetime import timedelta

import torch.distributed as dist

port, key = int(sys.argv[1]), sys.argv[2]
store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
deadline = time.time() + 60
while True:
    v = store.get(key).decode("ascii", "replace")
    if v != "Y2FuaW1hZGFt" or time.time() > deadline:
        break
    time.sleep(0.05)
print("value", v[:16], flush=True)
for _ in sys.stdin:
    print("value", store.get(key).decode("ascii", "replace")[:16], flush=True)
