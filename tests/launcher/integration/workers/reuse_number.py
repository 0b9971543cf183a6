"""Run as PID 1 of a pid namespace of its own (unshare --pid --fork --mount-proc), where
/proc/sys/kernel/ns_last_pid chooses the next pid: starts `ddprun ... early_exit.py DIR`,
waits until ddprun has reaped rank 1, starts an unrelated process group (`sleep`, in a
session of its own) whose number is rank 1's old pid, and then ends the job: with "end", rank
0 exits and the attempt ends; with "kill9", ddprun is SIGKILLed (its guardian then kills the
groups it holds). With "warm" (a --preload job), the number given away is the warm Python
process's, SIGKILLed here and reaped by ddprun, and then ddprun is SIGKILLed. Prints one
JSON line: whether the number was taken, whether that group outlived the end, ddprun's exit
status, and whether rank 0 is gone.

usage: reuse_number.py DIR end|kill9|warm DDPRUN_ARGV...
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


def warm_process(ddprun_pid):
    """ddprun's child that runs ddprun_preload.py."""
    for kids in os.listdir(f"/proc/{ddprun_pid}/task"):
        with open(f"/proc/{ddprun_pid}/task/{kids}/children") as f:
            for pid in map(int, f.read().split()):
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    if b"ddprun_preload.py" in c.read():
                        return pid
    raise SystemExit("no warm process under ddprun")


ddprun = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
rank0, rank1 = read_pid(0), read_pid(1)
given = warm_process(ddprun.pid) if how == "warm" else rank1
if how == "warm":
    os.kill(given, signal.SIGKILL)  # the warm process of the ddprun started above
wait_until(lambda: not os.path.exists(f"/proc/{given}"))  # exited and reaped by ddprun
bystander = take_number(given)
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
