"""Writes 'xé€😀' then '\n' one byte at a time, pausing longer than ddprun's idle flush."""
import os
import time

for b in "xé€😀\n".encode():
    os.write(1, bytes([b]))
    time.sleep(0.13)
