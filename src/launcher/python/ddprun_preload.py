# ddprun's warm Python process for --preload (docs/preload.md). One per node: ddprun starts
# it as `PYTHON_EXEC -u ddprun_preload.py FD DDPRUN_PID MODULES SPARES REFILL [-m] SCRIPT ARGS`
# with a worker's environment minus the per-rank variables, and sys.path[0] and sys.argv as
# the workers will have them (so a module next to the script can be preloaded, and one that
# parses the arguments at import sees the script's). It imports MODULES once,
# tells ddprun it is ready (or why not), then forks one worker per request that ddprun sends
# over the socket FD. A worker then runs its script exactly as `python -u script args` would
# have.
#
# Messages on FD (a Unix stream socket): a 4-byte big-endian length, then that many bytes.
#   from ddprun: first the environment it started this process with ("K=V" entries joined
#               by NUL), then one request per attempt (or per 64 workers): the count, then
#               per worker "m" (-m) or "s", the argument count, the arguments, the
#               environment's count and entries, all joined by NUL, with three descriptors
#               per worker (stdin, stdout, stderr) attached to the length
#   from here:  JSON {"ready": true, "seconds": S, "threads": [...]} | {"error": "..."},
#               then {"pids": [...]} per request, in its order (-1: not forked, start it cold)
# (Arguments and environments are bytes, as the kernel has them: no encoding is assumed.)
# The socket's end (ddprun gone or done) ends this process.
#
# Each worker is a grandchild: a child between forks it and leaves, so that it is adopted
# by ddprun (a child subreaper), which reaps it, signals its process group and reads its
# exit status exactly as for a worker it started itself. To keep forks off a restart's
# path, SPARES workers are forked ahead (once ready, and after each request when REFILL is
# 1, once this process has been idle for a moment): they wait for their requests, and a
# request they can serve costs a message each.

import os
import socket
import struct
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_SIGNALS = {}  # signal number -> disposition at start-up, before any preloaded module ran
_BATCH = 64  # workers in one request at most (ddprun's kBatch)
_ACK_SECONDS = 2.0  # a spare handed a request says it took it within this (else it is killed)
_LIBC = []  # libc (ctypes), looked up once (not in every worker)
_KEEP = []  # this file's module, once a worker's __main__ replaced it
_BOOTSTRAP = []  # (path, code) of the stack-dump bootstrap, compiled before any fork
_ENV_CHANGES = {}  # name -> (value at start, value now; None: unset): what start-up and preload changed
_START = []  # the working folder this process started in (a relative script's base)
_WARM_MODULES = set()  # sys.modules' names in the warm process: not finalized by a worker
_SEEDED = {}  # generator module -> its state: the global generators the preloaded imports set
_WARM_FILES = []  # weak references to the buffered files the preloaded imports left open
# The interpreter's argv[0] as ddprun gave it (PYTHON_EXEC, "python3" by default): a cold
# worker's sys.orig_argv[0], which sys.executable (its resolved path) is not.
_ARGV0 = getattr(sys, "orig_argv", [sys.executable])[0]


def _send(sock, obj):
    import json

    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace")  # (no lone surrogates)
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv(sock):
    """One message and its descriptors; None at the socket's end."""
    head, fds, _, _ = socket.recv_fds(sock, 4, 3 * _BATCH)
    data = bytearray()
    if len(head) == 4:
        (size,) = struct.unpack(">I", head)
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) == size:
            return bytes(data), fds
    for fd in fds:
        os.close(fd)
    return None, []


def _environment(entries):
    return dict(e.split(b"=", 1) for e in entries if b"=" in e)


def _batch(data):
    """An attempt's workers (or a part of them): [(module?, argv as str, environment as bytes,
    the CPUs it runs on: a set, empty for the warm process's own)]."""
    parts = data.split(b"\0")
    out, i = [], 1
    for _ in range(int(parts[0])):
        module, argc = parts[i] == b"m", int(parts[i + 1])
        argv = [os.fsdecode(a) for a in parts[i + 2:i + 2 + argc]]
        i += 2 + argc
        envc = int(parts[i])
        env = _environment(parts[i + 1:i + 1 + envc])
        i += 1 + envc
        cpus = {int(c) for c in parts[i].split(b",") if c}
        out.append((module, argv, env, cpus))
        i += 1
    return out


def _cuda_in_use():
    """Why CUDA counts as initialised in this process ("" if it is not)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return "torch.cuda.is_initialized() is True"
    except Exception:  # noqa: BLE001
        pass
    try:
        for fd in os.listdir("/proc/self/fd"):
            target = os.readlink("/proc/self/fd/" + fd)
            if target.startswith("/dev/nvidia"):
                return "it holds " + target + " open"
    except OSError:
        pass
    return ""


def _threads():
    """The threads alive besides this one: Python's by name, the others by their comm."""
    import threading

    named = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    me = str(os.getpid())
    native = []
    try:
        for tid in sorted(os.listdir("/proc/self/task")):
            if tid == me:
                continue
            with open("/proc/self/task/%s/comm" % tid) as f:
                native.append(f.read().strip())
    except OSError:
        pass
    return named if len(named) >= len(native) else named + native[len(named):]


def _environment_changes(started_with):
    """What happened to this process's environment since ddprun made it: the interpreter
    wrapper's changes (a PYTHON_EXEC script that sets PYTHONPATH), its start-up's (a
    sitecustomize) and the preload's: {name: (value at start, value now)}, None where unset.
    A worker gets them on top of its own environment (_apply_environment_changes)."""
    now = os.environb
    return {k: (started_with.get(k), now.get(k)) for k in set(started_with) | set(now)
            if started_with.get(k) != now.get(k)}


def _apply_environment_changes(env):
    """The changes to env that the worker's own start and imports would have made, but to the
    variables this process did not start with and the rank has (RANK, MASTER_PORT, ...: the
    per-rank ones): those keep the rank's value, as `os.environ.setdefault` in a cold worker
    would have kept it. The others change as they changed here (an interpreter wrapper that
    puts a folder first on PYTHONPATH: the rank's PYTHONPATH also names ddprun's bootstrap,
    which the worker takes out again)."""
    for k, (was, now) in _ENV_CHANGES.items():
        if was is None and k in env:
            continue
        if now is None:
            env.pop(k, None)
        else:
            env[k] = now


def _preload(modules, started_with):
    import importlib
    import signal
    import time

    for s in signal.valid_signals():
        try:
            _SIGNALS[s] = signal.getsignal(s)
        except (OSError, ValueError):
            pass
    t0 = time.monotonic()
    watch = _SeedWatch()
    for name in modules:
        try:
            with watch:
                importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001  (SystemExit too: nothing may end us unexplained)
            if not (isinstance(e, ModuleNotFoundError) and e.name == name):
                import traceback

                traceback.print_exc()  # the import's own failure: its traceback helps
            return {"error": "importing %s failed: %s: %s" % (name, type(e).__name__, e)}
        why = _cuda_in_use()
        if why:
            return {"error": "importing %s initialised CUDA (%s): a forked worker cannot use a CUDA context "
                             "its parent made; preload it without initialising CUDA, or drop it from --preload"
                             % (name, why)}
    _ENV_CHANGES.update(_environment_changes(started_with))
    _SEEDED.update(watch.done())
    _WARM_FILES.extend(_open_files())
    return {"ready": True, "seconds": round(time.monotonic() - t0, 3), "threads": _threads()}


# The global generators a fresh process seeds at random (Python's `random` at import and in
# every fork child, numpy's legacy one, torch's CPU one), and the calls that seed each one
# (in the module that defines them; torch re-exports its own): a preloaded import that seeds
# one explicitly (a `set_seed(1234)` at a config module's top) hands every worker that
# state, as a cold import would; one it did not seed (left alone, drawn from, or reseeded at
# random: seed() with no seed) is reseeded in each worker.
_SEEDING = {"random": ("random", ("seed", "setstate")),
            "numpy.random": ("numpy.random", ("seed", "set_state")),
            "torch.random": ("torch", ("manual_seed", "set_rng_state"))}


class _SeedWatch:
    """Which generators the preloaded imports seeded: while they run, each seeding call above
    is wrapped from the moment its module's import completes (a finder first on sys.meta_path
    wraps that module's loader; no other import is touched), and unwrapped after."""

    def __init__(self):
        self.seeded = set()  # generator names
        self._wrapped = []  # (module, name, original)
        for name in _SEEDING:
            if name in sys.modules:
                self._wrap(name, sys.modules[name])

    def _wrap(self, module_name, module):
        generator, names = _SEEDING[module_name]
        for name in names:
            original = getattr(module, name, None)
            if not callable(original) or getattr(original, "_ddprun_seed_watch", False):
                continue

            def watched(*args, _original=original, **kwargs):
                # (the seed or state: the first argument, whatever its name; None reseeds at random)
                first = args[0] if args else next((kwargs[k] for k in ("a", "seed", "state", "new_state")
                                                   if k in kwargs), None)
                if first is not None:
                    self.seeded.add(generator)
                return _original(*args, **kwargs)

            watched._ddprun_seed_watch = True
            watched.__wrapped__ = original
            setattr(module, name, watched)
            self._wrapped.append((module, name, original))

    # importlib's finder protocol: only the modules in _SEEDING, found by the finders after
    # this one, their loader's exec_module followed by _wrap.
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _SEEDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        # (A class as its loader, BuiltinImporter's, or one already patched: left alone.)
        if run is None or isinstance(loader, type) or "exec_module" in getattr(loader, "__dict__", {}):
            return spec

        def exec_module(module):
            try:
                del loader.exec_module  # once: a loader may serve other modules (a zip's)
            except AttributeError:
                pass
            run(module)
            self._wrap(fullname, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            pass
        return spec

    def __enter__(self):
        sys.meta_path.insert(0, self)

    def __exit__(self, *exc):
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def done(self):
        """Unwraps every seeding call (torch's re-exports too); {generator: state} for those
        seeded, `random`'s state (a fork reseeds it) or True."""
        for module, name, original in self._wrapped:
            for holder in (module, sys.modules.get("torch") if module.__name__ == "torch.random" else None):
                if holder is not None and getattr(getattr(holder, name, None), "__wrapped__", None) is original:
                    setattr(holder, name, original)
        self._wrapped.clear()
        out = {}
        for generator in self.seeded:
            try:
                out[generator] = sys.modules["random"].getstate() if generator == "random" else True
            except Exception:  # noqa: BLE001
                pass
        return out


def _fork_between(count, child, linger=None):
    """Forks a child between that forks `count` children, each in a session of its own,
    tells their pids, and leaves (after linger(gone_w), when given). In child i: (True,
    child(i, (gone_r, the child between's pid, go_r))), gone_r ending once the child between
    has left, go_r giving the child a byte once ddprun has its pid (_hand_over), or ending
    without one. Here: (False, (the child between's pid, the children's pids: fewer when a
    fork failed, go_w)). OSError when the child between cannot be forked."""
    import gc

    # What exists now is shared with the children: their collections skip it, so they do
    # not copy its pages.
    gc.freeze()
    r, w = os.pipe()
    try:
        go_r, go_w = os.pipe()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    try:
        between = os.fork()
    except OSError:
        for fd in (r, w, go_r, go_w):
            os.close(fd)
        raise
    if between == 0:
        # The warm process's SIGURG dump (_warm) is not the children's: a SIGURG before a
        # worker registers its own is ignored, as in a fresh Python.
        import faulthandler
        import signal

        faulthandler.unregister(signal.SIGURG)
        os.close(r)
        os.close(go_w)  # this process's alone: its end before the bytes says it died first
        me = os.getpid()
        gone_r, gone_w = os.pipe()  # its end tells the children they have been adopted
        pids = []
        try:
            for i in range(count):
                pid = os.fork()
                if pid == 0:
                    try:
                        os.setsid()  # a session of its own, as ddprun starts a cold worker
                        os.close(w)
                        os.close(gone_w)
                        return True, child(i, (gone_r, me, go_r))
                    except BaseException:  # noqa: BLE001  (never on as the child between)
                        os._exit(1)
                pids.append(pid)
        except BaseException:  # noqa: BLE001  (those forked so far go on)
            pass
        for pid in pids:  # each leads its group before ddprun hears of it (a setsid first thing)
            try:
                while os.getsid(pid) != pid:
                    os.sched_yield()
            except OSError:  # (gone)
                pass
        try:
            os.write(w, (" ".join(map(str, pids)) + "\n").encode())
            os.close(w)
            if linger:
                linger(gone_w)
        finally:
            os._exit(0)
    os.close(w)
    os.close(go_r)
    with os.fdopen(r, "rb") as f:
        # Up to the line's end, not the pipe's: a child stopped before it ran (SIGSTOP) holds
        # its copy of the write end, and this process would wait for it (ddprun's request
        # with it, until ddprun gave up and started the workers cold).
        return False, (between, [int(p) for p in f.readline().split()], go_w)


def _hand_over(go_w, count):
    """Lets `count` children of one child between run (ddprun has their pids, or they are
    not needed: 0), one byte each, and closes go_w."""
    data = b"g" * count
    try:
        while data:
            data = data[os.write(go_w, data):]
    except OSError:  # (none is left to read)
        pass
    os.close(go_w)


def _fork_workers(count, betweens):
    """Forks `count` workers through one child between, which leaves once they all exist
    (its pid is added to betweens, to reap): (True, (index, what _adopted waits on)) in a
    worker; here (False, (the pids: fewer when a fork failed, go_w for _hand_over))."""
    forked, got = _fork_between(count, lambda i, gone: (i, gone))
    if forked:
        return True, got
    between, pids, go_w = got
    betweens.append(between)
    return False, (pids, go_w)


class _Spares:
    """Workers forked ahead of the next request, so that its critical path forks nothing.
    Each waits on a socket of its own for one worker's request; they are children of a
    child between (a `cat` by then, so that leaving costs it nothing), and ddprun adopts
    them once it is released. A spare whose socket ends without a request exits."""

    def __init__(self, socks, release, between, pids, go_w):
        self.socks, self.release, self.between, self.pids, self.go_w = socks, release, between, pids, go_w

    def dispatch(self, reqs, fds):
        """Hands reqs[i] (with fds[3i:3i+3]) to spare i: the pids by index (None where the
        spare is gone, or the request too large for one message). Releases every spare."""
        import pickle

        sent = []
        for i, req in enumerate(reqs):
            try:
                socket.send_fds(self.socks[i], [pickle.dumps(req)], fds[3 * i:3 * i + 3])
                sent.append(i)
            except OSError:
                pass
        taken = self._taken(sent)
        self.close()
        return [self.pids[i] if i in taken else None for i in range(len(reqs))]

    def _taken(self, sent):
        """The spares of `sent` that said they took their request. A spare that is dying (a
        SIGKILL only queued when the request went) ends its socket instead, and one that does
        not answer in _ACK_SECONDS (stopped, say) is killed: neither is released, so their
        requests are forked here instead, and no rank is left to a worker that never runs."""
        import select
        import signal
        import time

        waiting = {self.socks[i].fileno(): i for i in sent}
        poll = select.poll()  # (descriptors past select's 1024 with hundreds of spares)
        for fd in waiting:
            poll.register(fd, select.POLLIN)
        taken = set()
        deadline = time.monotonic() + _ACK_SECONDS
        while waiting:
            ready = poll.poll(max(0, int((deadline - time.monotonic()) * 1000)))
            if not ready:
                break
            for fd, _ in ready:
                poll.unregister(fd)
                i = waiting.pop(fd)
                try:
                    if self.socks[i].recv(1):
                        taken.add(i)
                except OSError:
                    pass
        for i in waiting.values():
            try:
                os.kill(self.pids[i], signal.SIGKILL)  # (not released: it has run nothing)
            except OSError:
                pass
        return taken

    def close(self):
        """No more requests: the unused spares exit, the child between leaves (reaped
        later, off the request's path)."""
        for s in self.socks:
            s.close()
        os.close(self.release)


def _reap(betweens):
    """Reaps the children between that have left (the others stay listed)."""
    for pid in list(betweens):
        try:
            done = os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:
            done = True
        if done:
            betweens.remove(pid)


def _fork_spares(count, sock):
    """count spares: a _Spares here; in a spare, once it has a request: (its request, its
    three descriptors, (a pipe's read end that ends when the child between has left, that
    child's pid)). None when the fork failed, or their sockets could not be made (out of
    descriptors, say): then the requests are forked as they come."""
    import pickle

    pairs = []
    try:
        for _ in range(count):
            pairs.append(socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
        release_r, release_w = os.pipe()
    except OSError:
        for pair in pairs:
            for x in pair:
                x.close()
        return None

    def spare(i, gone):
        sock.close()  # (ddprun sees the warm process's end as soon as it ends)
        for fd in (release_r, release_w):
            os.close(fd)
        for j, pair in enumerate(pairs):
            pair[0].close()
            if j != i:
                pair[1].close()
        data, fds, _, _ = socket.recv_fds(pairs[i][1], 1 << 20, 3)
        if not data:
            os._exit(0)  # not needed
        try:
            pairs[i][1].send(b"1")  # taken (_Spares._taken)
        except OSError:
            os._exit(0)  # the warm process is gone: nobody was told this spare's pid
        pairs[i][1].close()
        return pickle.loads(data), fds, gone

    def linger(gone_w):
        sock.close()
        os.close(release_w)
        for pair in pairs:
            for x in pair:
                x.close()
        _wait_for_release(release_r, gone_w)

    try:
        forked, got = _fork_between(count, spare, linger)
    except OSError:
        for pair in pairs:
            for x in pair:
                x.close()
        for fd in (release_r, release_w):
            os.close(fd)
        return None
    if forked:
        return got
    between, pids, go_w = got
    for pair in pairs:
        pair[1].close()
    os.close(release_r)
    for pair in pairs[len(pids):]:  # (a fork failed: no spare behind them)
        pair[0].close()
    return _Spares([pair[0] for pair in pairs[:len(pids)]], release_w, between, pids, go_w)


def _wait_for_release(release_r, gone_w):
    """The child between's wait: as `cat` (holding the spares' pipe), whose exit is
    instant where this process's would unmap everything the warm process holds."""
    import shutil

    os.dup2(release_r, 0)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.set_inheritable(gone_w, True)
    cat = shutil.which("cat", path="/usr/bin:/bin")
    if cat:
        try:
            os.execv(cat, [cat])
        except OSError:
            pass
    os.read(0, 1)


def _serve(ddprun_pid, sock, spares_wanted, refill):
    """Answers requests until the socket ends; returns in a forked worker: its request,
    its three descriptors, and (a pipe's read end that ends when the child between has left,
    that child's pid). With spares_wanted, that many spares wait for each request (for later
    ones too with refill, once this process has been idle for a moment)."""
    import select

    spares, idle, betweens, due = None, 0.0, [], spares_wanted > 0
    while True:
        # Idle for a moment: the children between reaped, spares forked (if due).
        if (due or betweens) and not select.select([sock], [], [], idle)[0]:
            _reap(betweens)
            if due:
                due = False
                spares = _fork_spares(spares_wanted, sock)
                if isinstance(spares, tuple):
                    return spares
        data, fds = _recv(sock)
        if data is None:
            sys.exit(0)
        reqs = _batch(data)
        if len(fds) != 3 * len(reqs):
            for fd in fds:
                os.close(fd)
            _send(sock, {"error": "a request without its descriptors"})
            continue
        pids = [None] * len(reqs)
        go_ahead = []  # (go_w, count): who may run once ddprun has the reply (_hand_over)
        if spares is not None and len(spares.pids) >= len(reqs):
            pids = spares.dispatch(reqs, fds)
            go_ahead.append((spares.go_w, len(spares.pids)))
        elif spares is not None:
            spares.close()
            go_ahead.append((spares.go_w, 0))
        if spares is not None:
            betweens.append(spares.between)
        spares, idle = None, 0.3  # (new spares once the workers had a moment to start)
        due = refill and spares_wanted > 0
        rest = [i for i, pid in enumerate(pids) if pid is None]
        in_worker, got = False, ([], None)
        try:
            if rest:
                in_worker, got = _fork_workers(len(rest), betweens)
        except OSError:
            pass
        if in_worker:
            i, gone = got
            for go_w, _ in go_ahead:
                os.close(go_w)  # (the spares' go-ahead: the warm process's alone)
            mine = fds[3 * rest[i]:3 * rest[i] + 3]
            for fd in fds:
                if fd not in mine:
                    os.close(fd)  # another rank's pipes: their ends must close with that rank
            return reqs[rest[i]], mine, gone
        forked, go_w = got
        if go_w is not None:
            go_ahead.append((go_w, len(forked)))
        if os.environ.get("DDPRUN_TEST_WARM_DIES_ANSWERING"):  # test_preload only: killed mid-request
            os._exit(137)
        for fd in fds:
            os.close(fd)
        for i, pid in zip(rest, forked):
            pids[i] = pid
        _send(sock, {"pids": [-1 if p is None else p for p in pids]})
        for go_w, count in go_ahead:
            _hand_over(go_w, count)
        # The earlier requests' children between, after the reply: a crash loop (a request
        # within each 0.3 s) never leaves this process idle, and each left a zombie.
        _reap(betweens)


def _adopted(ddprun_pid, gone):
    """Waits for the child between to leave; True once ddprun is the parent, with the death
    signal armed, and knows this worker's pid: the warm process says so after its reply. If
    it died before (its end, no byte), ddprun starts this rank cold: this one must not run."""
    import signal

    fd, between, go_r = gone
    os.read(fd, 1)  # its end: the child between is exiting
    os.close(fd)
    while os.getppid() == between:  # its exit reparents us a moment after
        os.sched_yield()
    _LIBC[0].prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with ddprun
    if os.getppid() != ddprun_pid:  # ddprun died first (or is no subreaper)
        return False
    named = os.read(go_r, 1) == b"g"
    os.close(go_r)
    return named


def _become_worker(ddprun_pid, gone, sock, req, fds):
    """Everything a fresh `python -u` would be, but for the modules already imported. The
    set-up overlaps the child between's exit; the script runs only once ddprun adopted it."""
    import signal

    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    for s, handler in _SIGNALS.items():
        try:
            if signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        except (OSError, ValueError, TypeError):
            pass
    if req[3]:  # --numa-binding: this process has one thread, so every later one inherits it
        os.sched_setaffinity(0, req[3])
    env = dict(req[2])
    _apply_environment_changes(env)
    os.environ.clear()
    os.environb.update(env)
    _reseed()
    if not _adopted(ddprun_pid, gone):
        os._exit(128 + signal.SIGKILL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    _run_bootstrap()


def _reseed():
    """Random states a fresh process would have seeded on its own (Python's `random` reseeds
    itself at fork): numpy's and torch's global generators (torch's CUDA ones lazily: CUDA is
    not initialised), and multiprocessing's authkey; but a generator the preloaded imports
    seeded keeps that state (_SeedWatch), `random`'s put back. str's hash seed cannot change
    after start: it is the warm process's in every worker (docs/preload.md)."""
    if "random" in _SEEDED:
        sys.modules["random"].setstate(_SEEDED["random"])
    for name, reseed in (("numpy.random", lambda m: m.seed()), ("torch", lambda m: m.seed()),
                         ("multiprocessing.process",
                          lambda m: setattr(m.current_process(), "authkey", os.urandom(32)))):
        module = sys.modules.get(name)
        if module is not None and name not in _SEEDED:
            try:
                reseed(module)
            except Exception:  # noqa: BLE001
                pass


def _run_bootstrap():
    """The stack-dump bootstrap's per-rank part (sitecustomize.py, which this process did not
    run), unless --no-stack-dumps left the rank without a stack file."""
    if "DDPRUN_STACK_FILE" not in os.environ or not _BOOTSTRAP:
        return  # (not when the warm process could not read it either)
    try:
        path, code = _BOOTSTRAP[0]
        exec(code, {"__name__": "ddprun_bootstrap", "__file__": path})
    except Exception:  # noqa: BLE001  (no stacks, but the worker runs)
        pass


def _compile_bootstrap():
    """sitecustomize.py's path and code, compiled once here rather than in every worker."""
    import faulthandler  # noqa: F401  (what it imports, imported here too)
    import fcntl  # noqa: F401

    path = os.path.join(_HERE, "sitecustomize.py")
    with open(path) as f:
        return path, compile(f.read(), path, "exec")


def _fresh_main():
    """In place of this file's module, an empty __main__ as the interpreter makes one."""
    import types

    main = types.ModuleType("__main__")
    if "__annotations__" in vars(sys.modules["__main__"]):  # the interpreter's own __main__ has it
        main.__annotations__ = {}
    main.__builtins__ = __builtins__
    _KEEP.append(sys.modules["__main__"])  # (this file's functions still run)
    sys.modules["__main__"] = main
    # multiprocessing, imported by the warm modules (torch does), named this file's module
    # __mp_main__ as it does the __main__ it finds: what a spawn child pickles from the
    # script (a class of its own) is looked up there.
    if "__mp_main__" in sys.modules:
        sys.modules["__mp_main__"] = main
    return main


def _run_script(script, main):
    """`python -u script` in main (a fresh __main__): its frames are the only ones a traceback
    shows. A zipapp or a folder runs its __main__ module, as Python runs it."""
    import importlib.machinery

    path = _script_path(script)
    if _runs_as_entry(path):
        import runpy

        runpy._run_module_as_main("__main__", alter_argv=False)  # (sys.path[0] is path: _path0)
        return
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (sys.executable, path, e.errno, e.strerror))
        sys.exit(2)
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _as_uncaught(e):
    """What Python does with an exception nothing caught, minus this file's frames: its
    exit status (None: by SIGINT, for KeyboardInterrupt)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    e.__traceback__ = tb  # what Python's hook prints (not its argument) when it has one
    sys.excepthook(type(e), e, tb)
    return None if isinstance(e, KeyboardInterrupt) else 1


def _exit_status(e):
    """The status `python` exits with for SystemExit `e` (a code that is no integer is printed)."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(2**63) <= code < 2**63 else 255  # C's (int)PyLong_AsLong, or -1
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _finish(status):
    """Python's exit, less what only costs time in a fork: non-daemon threads joined, atexit
    handlers, the script's globals released, then those of the modules imported since the fork
    (their open files closed by their finalizers), stdio flushed (C's too), then the process
    ends. The preloaded modules are not torn down, nor C libraries' exit handlers run (torch's
    take 0.15-0.25 s, touching pages shared with the warm process), as in a multiprocessing
    fork child; what the worker wrote to files they opened is flushed. status None: SIGINT."""
    import atexit
    import gc
    import signal

    libc, main = _LIBC[0], sys.modules.get("__main__")
    threading = sys.modules.get("threading")
    steps = [threading._shutdown if threading else None, atexit._run_exitfuncs, _quiet_daemon_threads]
    if main is not None:
        steps.append(lambda: _release(vars(main)))
    steps += [_release_modules, gc.collect, _flush_warm_files]
    for step in steps:
        try:
            if step:
                step()
        except BaseException:  # noqa: BLE001  (as Python: reported, the exit goes on)
            try:
                sys.excepthook(*sys.exc_info())
            except BaseException:  # noqa: BLE001
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not getattr(stream, "closed", False):  # (Python skips a closed one)
                stream.flush()
        except BaseException:  # noqa: BLE001
            if stream is sys.stdout:
                status = 120  # Python's status when its stdout cannot be flushed at exit
    libc.fflush(None)
    if status is None:  # Python ends an uncaught KeyboardInterrupt by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + signal.SIGINT
    os._exit(status)


def _open_files():
    """The buffered files open in the warm process once the preload is done (a log or metrics
    file a helper module opened at import), found once here, before any fork: a worker's
    interpreter does not tear the preloaded modules down, so it flushes what it wrote to them
    at exit (_flush_warm_files), as Python's finalization would have."""
    import gc
    import io
    import weakref

    kinds = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
    std = {id(f) for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    found = []
    for o in gc.get_objects():
        # type(), not isinstance(): that asks a proxy's __class__, which may load what it
        # wraps or raise (Django's lazy settings)
        if issubclass(type(o), kinds) and id(o) not in std:
            try:
                if not o.closed:
                    found.append(weakref.ref(o))
            except Exception:  # noqa: BLE001
                pass
    return found


def _flush_warm_files():
    for ref in _WARM_FILES:
        f = ref()
        try:
            if f is not None and not f.closed:
                f.flush()
        except Exception:  # noqa: BLE001  (as a finalizer's: the exit goes on)
            pass


def _quiet_daemon_threads():
    """Only daemon threads are left: Python's finalization stops them before it releases any
    module, so one that runs into a released global here must not print a traceback that a
    cold run never shows."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading.excepthook = lambda args: None


def _release_modules():
    """The globals of the modules imported since the fork released, the newest first, as
    Python's finalization releases every module's (a log file a helper module opened is
    flushed and closed; its objects' __del__ run). A finalizer's error is printed by Python
    ("Exception ignored in ..."), and changes nothing."""
    import types

    for name in reversed([n for n in list(sys.modules) if n not in _WARM_MODULES]):
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            _release(vars(module))


def _release(names):
    """A module's globals dropped in Python's own order at exit: _names first, then the rest."""
    for private in (True, False):
        for k in list(names):
            if k != "__builtins__" and (k.startswith("_") and not k.startswith("__")) == private:
                names[k] = None


def _path0(module, script):
    """sys.path[0] of `python -m module` or `python script` (the path itself for a zipapp or
    a folder with __main__.py)."""
    if module:
        return os.getcwd()
    path = _script_path(script)
    return path if _runs_as_entry(path) else os.path.dirname(os.path.realpath(path))


def _script_path(script):
    """The script's absolute path, as Python has it: a relative one from the folder this process
    started in (a preloaded module may have changed the working folder since)."""
    return os.path.join(_START[0], script)  # not tidied as text: `lnk/../x.py` is the kernel's to resolve


def _runs_as_entry(path):
    """Whether `python path` runs path's __main__ module, path as sys.path[0] (a zipapp, a
    folder): a path hook takes it, as Python's own start-up checks."""
    import pkgutil

    return pkgutil.get_importer(path) is not None


def _module_file(name):
    """sys.argv[0] while `python -m name` runs its module: that module's file (a package's
    __main__.py), found without importing its packages here; "-m" (what Python shows
    before) where that finds none."""
    from importlib.machinery import PathFinder

    path, spec = None, None
    for full in _prefixes(name):
        if spec is not None and path is None:  # (a submodule of a module: none)
            return "-m"
        spec = PathFinder.find_spec(full, path)
        if spec is None:
            return "-m"
        path = spec.submodule_search_locations
    if path is not None:  # a package: its __main__
        spec = PathFinder.find_spec(name + ".__main__", path)
    return spec.origin if spec is not None and spec.has_location else "-m"


def _prefixes(name):
    """"a.b.c" -> "a", "a.b", "a.b.c"."""
    parts = name.split(".")
    return [".".join(parts[:i + 1]) for i in range(len(parts))]


def _preload_argv(module, target, args):
    """sys.argv (and sys.orig_argv) as the script will see them when it imports the preloaded
    modules."""
    sys.orig_argv = _orig_argv(module, [target] + args)
    sys.argv = [_module_file(target) if module else target] + args


def _orig_argv(module, argv):
    """What `python -u [-m] argv...` shows in sys.orig_argv."""
    return [_ARGV0, "-u"] + (["-m"] if module else []) + argv


def _run(req):
    module, argv = req[0], req[1]
    sys.orig_argv = _orig_argv(module, argv)
    sys.argv = list(argv)
    status = 0
    _WARM_MODULES.update(sys.modules)
    main = _fresh_main()  # (runpy runs a module in __main__'s globals too)
    try:
        if module:
            import runpy

            runpy._run_module_as_main(argv[0], alter_argv=True)
        else:
            _run_script(argv[0], main)
    except SystemExit as e:
        status = _exit_status(e)
    except BaseException as e:  # noqa: BLE001
        status = _as_uncaught(e)
    _finish(status)


def _warm(sock, ddprun_pid, modules, spares, refill):
    """The warm process's life; returns only in a worker, with its request."""
    import ctypes
    import faulthandler
    import signal

    _LIBC.append(ctypes.CDLL(None))
    # A stack dump while the import runs (no worker yet) shows where it is: ddprun sends
    # SIGURG (WarmPython::show_stack), and every thread's stack goes to this process's
    # stderr, ddprun's. Forked children drop it (_fork_between).
    try:
        faulthandler.register(signal.SIGURG, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # (a stderr without a descriptor: no such dump)
        pass
    hello, _ = _recv(sock)
    if hello is None:
        sys.exit(0)
    state = _preload(modules, _environment(hello.split(b"\0")))
    try:
        _BOOTSTRAP.append(_compile_bootstrap())
    except (OSError, SyntaxError):
        pass
    _send(sock, state)
    if "error" in state:
        sys.exit(1)
    req, fds, gone = _serve(ddprun_pid, sock, spares, refill)
    _become_worker(ddprun_pid, gone, sock, req, fds)
    return req


def main():
    fd, ddprun_pid, modules = int(sys.argv[1]), int(sys.argv[2]), [m for m in sys.argv[3].split(",") if m]
    spares, refill, module = int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6] == "-m"
    target, args = sys.argv[6 + module], sys.argv[7 + module:]
    _START.append(os.getcwd())
    sys.path[0] = _path0(module, target)
    _preload_argv(module, target, args)
    sock = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    try:
        req = _warm(sock, ddprun_pid, modules, spares, refill)
    except (BrokenPipeError, ConnectionResetError):  # ddprun is gone
        sys.exit(0)
    _run(req)


if __name__ == "__main__":
    main()
