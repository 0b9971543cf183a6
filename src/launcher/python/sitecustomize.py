# ddprun's bootstrap for Python workers (docs/stacks.md). ddprun puts this folder first on
# the PYTHONPATH of the workers it starts (unless --no-stack-dumps), so Python's site module
# imports this file as "sitecustomize" before the training script runs. It then:
#   1. leaves no trace: this folder leaves sys.path, PYTHONPATH gets its old value back and
#      DDPRUN_STACK_FILE, DDPRUN_PID and DDPRUN_PROGRESS_FILE leave the environment, so the
#      script, and every process it starts, sees what it would have seen without ddprun;
#   2. when started by ddprun (DDPRUN_STACK_FILE set), registers faulthandler on SIGURG for
#      every thread, and for fatal signals (unless enabled already), writing into that file
#      through a close-on-exec descriptor above 900 (the script's own files get the numbers
#      they would get), and announces it in the file's first line (the file starts afresh: a
#      Python that a wrapper script ran before this one, and that is gone, announced itself
#      there first): ddprun only ever sends SIGURG to a worker that announced (and SIGURG's
#      default action is to ignore it anyway). faulthandler's dump needs no GIL: it works
#      while a thread holds it or sits in a C call. Forked children (DataLoader workers)
#      answer into an anonymous file of their own (_forked). An uncaught
#      exception first sends SIGURG to ddprun (DDPRUN_PID), then goes on to the hook that
#      was there: ddprun takes the other ranks' stacks while they still wait for this one
#      (its sockets are still open), for the failure summary;
#   3. imports the sitecustomize that would have been imported without ddprun (the user's
#      on PYTHONPATH, Debian's in /usr/lib/python3.X), errors included, as site would.
# --preload's warm process (ddprun_preload.py) runs this file in each worker it forks, for
# steps 1-2 (its own start-up already imported the other sitecustomize).
# Nothing here may break a worker: a failure in steps 1-2 only means no stacks.

def _ddprun_bootstrap():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    stack_file = os.environ.pop("DDPRUN_STACK_FILE", None)
    ddprun_pid = os.environ.pop("DDPRUN_PID", "")
    os.environ.pop("DDPRUN_PROGRESS_FILE", None)  # libddp's (C++ workers): a Python script never sees it
    if stack_file is None:
        return
    parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    kept = [p for p in parts if os.path.abspath(p or os.curdir) != here]
    if len(kept) < len(parts):
        if any(kept):
            os.environ["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del os.environ["PYTHONPATH"]
    try:
        # Built-in modules only: `import signal` alone (its enums) would cost a few ms.
        import _signal
        import faulthandler

        fd = _high_fd(os.open(stack_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644))
        faulthandler.register(_signal.SIGURG, file=fd, all_threads=True)
        link = os.readlink("/proc/self/fd/%d" % fd)
        os.register_at_fork(after_in_child=lambda: _forked(fd, link))
        os.write(fd, b"ddprun-stacks pid=%d fd=%d\n" % (os.getpid(), fd))
        if ddprun_pid.isdigit():
            _notice_failures(int(ddprun_pid), _signal.SIGURG)
        # A fatal signal (SIGSEGV in an extension, SIGABRT) writes every thread's stack into
        # the same file, not stderr (whose last lines, the crash's own, the summary shows):
        # ddprun puts the crashing thread's in the summary. PYTHONFAULTHANDLER, -X
        # faulthandler, -X dev or the script's own faulthandler.enable() win.
        if not faulthandler.is_enabled():
            faulthandler.enable(file=fd, all_threads=True)
    except Exception:  # noqa: BLE001  (no stacks, but the worker runs)
        pass


def _forked(fd, link):
    """In a child forked from the rank's Python (a DataLoader's worker process): descriptor
    `fd`, the one faulthandler writes to, still the stack file (`link` as /proc shows it: not
    a number the script reused), now holds an anonymous file of this child's own, announced
    as the rank's file is; ddprun finds and reads it through /proc. The child's answers never
    land in the rank's file, no file is named (none is left behind), and faulthandler's
    settings (the script's own included) stay as they are."""
    import os

    try:
        if os.readlink("/proc/self/fd/%d" % fd) != link:
            raise OSError("not the stack file")
        try:
            own = os.memfd_create("ddprun-stacks", os.MFD_CLOEXEC)
        except (AttributeError, OSError):  # (a glibc without it; vm.memfd_noexec=2)
            own = os.open(os.environ.get("TMPDIR") or "/tmp", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        if own != fd:
            os.dup2(own, fd, inheritable=False)
            os.close(own)
        os.write(fd, b"ddprun-stacks pid=%d fd=%d\n" % (os.getpid(), fd))
    except BaseException:  # noqa: BLE001  (no stacks of this child: its SIGURG dump goes nowhere)
        try:
            import _signal
            import faulthandler

            faulthandler.unregister(_signal.SIGURG)
        except BaseException:  # noqa: BLE001
            pass


def _high_fd(fd):
    """fd moved far above the ones a script opens (3, 4, ...), so that it takes none of them."""
    import fcntl
    import os

    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 900)
    except OSError:  # a descriptor limit below 900
        return fd
    os.close(fd)
    return high


def _notice_failures(ddprun_pid, sig):
    import os
    import sys

    previous = sys.excepthook
    me = os.getpid()

    # A Ctrl-C while the hook runs (the job stops on it, a rank failed) must not print
    # "Error in sys.excepthook" with a traceback through this file: it is the user's exception
    # that matters (Python's own hook, written in C, is not interrupted that way).
    def excepthook(*exc_info):
        try:
            if os.getpid() == me:  # not in a forked child
                os.kill(ddprun_pid, sig)
        except BaseException:  # noqa: BLE001
            pass
        try:
            previous(*exc_info)
        except KeyboardInterrupt:
            pass

    sys.excepthook = excepthook


def _ddprun_chain(this):
    import sys

    del sys.modules["sitecustomize"]
    try:
        __import__("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = this  # there is none: site finds this (empty) module


try:
    _ddprun_bootstrap()
except Exception:  # noqa: BLE001
    pass
del _ddprun_bootstrap, _notice_failures, _high_fd  # (_forked runs in forked children)
if __name__ == "sitecustomize":  # not when --preload's warm process runs this file for a worker
    _ddprun_chain(__import__("sys").modules[__name__])
