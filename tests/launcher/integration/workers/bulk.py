"""Writes MB megabytes of 1 KiB numbered lines to stdout as fast as it can."""
import os
import sys

mb = int(sys.argv[1])
rank = os.environ["RANK"]
line_len = 1024
lines_per_block = 256
n_blocks = mb * 1024 * 1024 // (line_len * lines_per_block)
for b in range(n_blocks):
    parts = []
    for k in range(lines_per_block):
        head = f"r{rank} {b * lines_per_block + k} "
        parts.append(head + "x" * (line_len - len(head) - 1) + "\n")
    data = "".join(parts).encode()
    view = memoryview(data)
    while view:
        n = os.write(1, view)
        view = view[n:]
