"""Writes one ~3 MiB line of mixed 1-4 byte UTF-8 characters in one write, then 'after'.
A copy of the line goes to DIR/line.bin."""
import os
import sys

d = sys.argv[1]
MAX_LINE = 1 << 20  # StreamForwarder::kMaxLine
line = "a" * (MAX_LINE - 1)  # the byte before MAX_LINE starts a 2-byte character: it straddles the cut
pattern = "é" + "x" + "€" + "😀" + "yz"
s = line.encode()
pat = pattern.encode()
buf = bytearray(s)
while len(buf) < 3 * MAX_LINE:
    buf += pat
with open(os.path.join(d, "line.bin"), "wb") as f:
    f.write(buf)
data = bytes(buf) + b"\n" + b"after\n"
view = memoryview(data)
while view:
    n = os.write(1, view)
    view = view[n:]
