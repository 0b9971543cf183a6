"""Writes N numbered lines to stdout and N to stderr, interleaved, in random-sized writes
that split lines anywhere: 'o r<rank> <i> <pad>' / 'e r<rank> <i> <pad>'.
usage: flood.py N [exit-early-rank]
"""
import os
import random
import sys

n = int(sys.argv[1])
rank = int(os.environ["RANK"])
if len(sys.argv) > 2 and int(sys.argv[2]) == rank:
    sys.exit(0)  # this rank leaves at once while the others flood
rnd = random.Random(rank)


def blob(kind):
    pad = "abcdefghijklmnopqrstuvwxyz"
    return "".join(f"{kind} r{rank} {i} {pad[: i % 27]}\n" for i in range(n)).encode()


bufs = {1: memoryview(blob("o")), 2: memoryview(blob("e"))}
pos = {1: 0, 2: 0}
while any(pos[fd] < len(bufs[fd]) for fd in bufs):
    fd = rnd.choice([fd for fd in bufs if pos[fd] < len(bufs[fd])])
    size = rnd.choice((1, 7, 100, 1000, 4096, 65536, 200000))
    chunk = bufs[fd][pos[fd]:pos[fd] + size]
    written = os.write(fd, chunk)
    pos[fd] += written
