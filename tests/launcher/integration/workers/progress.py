"""A progress bar with '\r' and no final newline, then a pause: DIR/bar_done marks when
the bar is written; the worker exits once DIR/release exists (or 300 s later)."""
import os
import sys
import time

d = sys.argv[1]
for pct in (10, 50, 100):
    os.write(1, f"progress {pct}%\r".encode() if pct < 100 else f"progress {pct}%".encode())
    time.sleep(0.05)
open(os.path.join(d, "bar_done"), "w").close()
deadline = time.monotonic() + 300
while time.monotonic() < deadline and not os.path.exists(os.path.join(d, "release")):
    time.sleep(0.02)
