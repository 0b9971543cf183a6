"""A slow console: sleeps, then reads stdin to the end and prints, as JSON, how many
'[rankR]:rR ' lines it saw per rank, the total line count, any unfinished tail, and when
(time.monotonic(), a clock all processes share) it began to read."""
import json
import sys
import time

time.sleep(float(sys.argv[1]))
began = time.monotonic()
ranks = int(sys.argv[2])
counts = [0] * ranks
lines = 0
rest = b""
f = sys.stdin.buffer.raw
while True:
    chunk = f.read(1 << 20)
    if not chunk:
        break
    data = rest + chunk
    cut = data.rfind(b"\n") + 1
    complete, rest = data[:cut], data[cut:]
    for r in range(ranks):
        counts[r] += complete.count(b"[rank%d]:r%d " % (r, r))
    lines += complete.count(b"\n")
print(json.dumps({"counts": counts, "lines": lines, "rest": len(rest), "began": began}))
