"""Run as PID 1 of a pid namespace of its own (unshare --pid --fork --mount-proc), where
/proc/sys/kernel/ns_last_pid chooses the next pid: starts `ddprun ... early_exit.py DIR`,
waits until ddprun has reaped rank 1, starts an unrelated process group (`sleep`, in a
session of its own) whose number is rank 1's old pid, and then ends the job: with "end", rank
0 exits and the attempt ends; with "kill9", ddprun is SIGKILLed (its guardian then kills the
groups it holds). Prints one JSON line: whether the number was taken, whether that group
outlived the end, ddprun's exit status, and whether rank 0 is gone.

usage: reuse_number.py DIR end|kill9 DDPRUN_ARGV...
"""
import json
import os
import signal
import subprocess
import sys
import time

d, how, argv = sys.argv[1], sys.argv[2], sys.argv[3:]


def wait_until(cond, seconds=60):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def read_pid(rank):
    path = os.path.join(d, f"pid_{rank}")
    wait_until(lambda: os.path.exists(path))
    with open(path) as f:
        return int(f.read())


def gone(pid):  # no process, or only its zombie
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def take_number(pid):
    """A `sleep` leading a session (and group) numbered pid; None if others took the number first."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        p = subprocess.Popen(["sleep", "120"], start_new_session=True)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


ddprun = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
rank0, rank1 = read_pid(0), read_pid(1)
wait_until(lambda: not os.path.exists(f"/proc/{rank1}"))  # exited and reaped by ddprun
bystander = take_number(rank1)
if how == "end":
    open(os.path.join(d, "go"), "w").close()
else:
    ddprun.send_signal(signal.SIGKILL)
rc = ddprun.wait(timeout=60)
wait_until(lambda: gone(rank0), 20)
time.sleep(0.5)  # a late SIGKILL of the group would land within this
print(json.dumps({"reused": bystander is not None, "bystander_alive": bystander is not None and bystander.poll() is None,
                  "rc": rc, "rank0_gone": gone(rank0)}), flush=True)
if bystander is not None:
    bystander.kill()
    bystander.wait()
