"""A slow console: sleeps, then reads stdin to the end and prints, as JSON, how many
'[rankR]:rR ' lines it saw per rank, the total line count, any unfinished tail, and when
(time.monotonic(), a clock all processes share) it began to read.
usage: count_reader.py PAUSE RANKS [CHUNK SLEEP]: CHUNK bytes a read (1 MiB), SLEEP s after
each (0): a reader that keeps reading, slowly."""
import json
import sys
import time

time.sleep(float(sys.argv[1]))
began = time.monotonic()
ranks = int(sys.argv[2])
chunk_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 20
nap = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
counts = [0] * ranks
lines = 0
rest = b""
f = sys.stdin.buffer.raw
while True:
    chunk = f.read(chunk_bytes)
    if not chunk:
        break
    if nap:
        time.sleep(nap)
    data = rest + chunk
    cut = data.rfind(b"\n") + 1
    complete, rest = data[:cut], data[cut:]
    for r in range(ranks):
        counts[r] += complete.count(b"[rank%d]:r%d " % (r, r))
    lines += complete.count(b"\n")
print(json.dumps({"counts": counts, "lines": lines, "rest": len(rest), "began": began}))
