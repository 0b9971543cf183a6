"""Lines for --duplicate-std{out,err}-filters: on stdout 'step 1 loss 0.5', 'other',
'a,b here' and 'loss late' (its first two bytes written 0.4 s before the rest, so ddprun
flushes them alone while idle); on stderr 'warn x' and 'nothing'."""
import sys
import time

for line in ("step 1 loss 0.5", "other", "a,b here"):
    print(line, flush=True)
sys.stdout.write("lo")
sys.stdout.flush()
time.sleep(0.4)
print("ss late", flush=True)
for line in ("warn x", "nothing"):
    print(line, file=sys.stderr, flush=True)
