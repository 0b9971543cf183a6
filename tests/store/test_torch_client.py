#!/usr/bin/python3
"""PyTorch compatibility of ddprun's store, both directions.

1. PyTorch's own client (torch.distributed.TCPStore) runs the same scenario against
   ddp-store-server and against PyTorch's own server; the results must be identical (and
   sane).
2. ddp::TcpStore, via the store_client_check program, runs against PyTorch's server and
   against ddp-store-server; the outputs must be identical and as expected.

The torch in question is tests/testlib/torch_runtime.py's current() ($DDP_TORCH): this
driver (any python3) runs ddp-store-server and store_client_check on the host, and the
torch half (this file with --torch-side PORT: torch's server and the client scenario) in
that runtime's interpreter, the torch 2.6 chroot included. The wire generation follows the
torch: 1 for torch < 2.2 (Debian 12's 1.13), 2 for torch >= 2.2 (Debian 13's 2.6), so the
same test checks generation 2 against PyTorch's own client and server.

  test_torch_client.py --server build/bin/ddp-store-server --cpp-client build/bin/store_client_check

Exits 77 (ctest SKIP_RETURN_CODE) only when the runtime's torch is unavailable.
"""
import argparse
import ast
import datetime
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from test_timeouts import scaled  # noqa: E402  (DDP_TEST_TIMEOUT_SCALE)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testlib"))
import torch_runtime  # noqa: E402

T = datetime.timedelta
HOST = "127.0.0.1"


def wire_generation(version):
    major, minor = (int(x) for x in version.split(".")[:2])
    return 2 if (major, minor) >= (2, 2) else 1


def client(port, timeout_s=scaled(30)):  # a hang guard
    import torch.distributed as dist
    return dist.TCPStore(HOST, port, None, False, T(seconds=timeout_s), wait_for_workers=False)


def scenario(port):
    """Runs every operation the 1.13 Python client has; returns comparable results."""
    r = []
    a, b = client(port), client(port)
    n0 = a.num_keys()
    r.append(("num_keys at start", n0))
    a.set("k", b"v\x00al")
    r.append(("get", a.get("k")))
    a.set("k", "")
    r.append(("get empty", a.get("k")))
    r.append(("add", a.add("n", 5), b.add("n", -2), a.add("n", 0), a.get("n")))
    r.append((
        "compare_set",
        a.compare_set("c", "exp", "des"),  # missing + non-empty expected: returns expected
        a.compare_set("c", "", "des"),     # missing + empty expected: sets
        a.compare_set("c", "nope", "x"),   # mismatch: current value
        a.compare_set("c", "des", "x"),    # match: new value
        b.get("c"),
    ))

    # wait, woken by another client (PyTorch releases the GIL in wait)
    timer = threading.Timer(0.2, lambda: b.set("w", "1"))
    t0 = time.monotonic()
    timer.start()
    a.wait(["w"])
    waited = time.monotonic() - t0
    timer.join()
    # woken ~0.2 s in, not at the timeout: the upper bound is far from both
    r.append(("wait woken", 0.1 < waited < scaled(10)))

    # wait on a key set by add, and on a key that exists already
    timer = threading.Timer(0.1, lambda: b.add("w2", 3))
    timer.start()
    a.wait(["w", "w2"])
    timer.join()
    r.append(("wait multi", a.get("w2")))

    # wait timing out: a fresh client, abandoned afterwards (1.13 leaves its wait pending)
    c = client(port)
    t0 = time.monotonic()
    try:
        c.wait(["never"], T(milliseconds=300))
        r.append(("wait timeout", "no exception"))
    except RuntimeError as e:
        r.append(("wait timeout", type(e).__name__, str(e).split("\n")[0]))
    # at the timeout, not much later (the upper bound is far from 300 ms)
    r.append(("wait timeout took ~300ms", 0.25 < time.monotonic() - t0 < scaled(10)))
    # the key appears later: the server answers the abandoned wait; others are unaffected
    b.set("never", "now")
    r.append(("after timeout", a.get("never"), b.add("n", 1)))

    # get() with a timeout on a missing key
    d = client(port)
    d.set_timeout(T(milliseconds=300))
    try:
        d.get("missing")
        r.append(("get timeout", "no exception"))
    except RuntimeError as e:
        r.append(("get timeout", type(e).__name__))

    r.append(("delete_key", a.delete_key("c"), a.delete_key("c"), b.delete_key("nothing")))
    r.append(("num_keys", a.num_keys(), a.num_keys() - n0))
    big = b"B" * (1 << 20)
    a.set("big", big)
    r.append(("big value", b.get("big") == big))
    # the same names through a second "process-like" client
    e = client(port)
    r.append(("other client", e.get("n"), e.get("w")))
    if hasattr(a, "multi_get"):  # torch >= 2.2: generation 2's operations
        r += scenario_2x(port, a, b, c)
    return r


def scenario_2x(port, a, b, timed_out):
    """The operations torch 2.x's client adds (APPEND, MULTI_GET/SET, CHECK; a wait that
    timed out is cancelled with CANCEL_WAIT, so that client stays usable)."""
    r = [("2.x: client after its wait timed out", timed_out.add("after-cancel", 7), timed_out.get("n"))]
    a.append("ap", "ab")
    b.append("ap", b"cd")
    r.append(("2.x: append", a.get("ap")))
    a.multi_set(["m1", "m2", "m3"], ["1", b"22", ""])
    r.append(("2.x: multi_get", b.multi_get(["m1", "m2", "m3", "ap"]), b.multi_get([])))
    r.append(("2.x: check", a.check(["m1", "ap"]), a.check(["m1", "nope"])))
    for name, wake in (("append", lambda: b.append("wa", "x")), ("multi_set", lambda: b.multi_set(["wm"], ["y"]))):
        key = "wa" if name == "append" else "wm"
        timer = threading.Timer(0.2, wake)
        timer.start()
        a.wait([key])
        timer.join()
        r.append((f"2.x: wait woken by {name}", a.get(key)))
    late = client(port)
    late.set_timeout(T(milliseconds=300))
    try:
        late.multi_get(["m1", "never2"])
        r.append(("2.x: multi_get timeout", "no exception"))
    except RuntimeError as e:
        r.append(("2.x: multi_get timeout", type(e).__name__))
    r.append(("2.x: num_keys", a.num_keys()))
    return r


def start_ddp_server(binary):
    p = subprocess.Popen([binary], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("port="):
        p.kill()
        raise SystemExit(f"ddp-store-server printed {line!r} instead of port=N")
    return p, int(line.split("=", 1)[1])


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=scaled(30))
    except subprocess.TimeoutExpired:
        p.kill()
        raise SystemExit("ddp-store-server did not stop on SIGTERM")
    if rc != 0:
        raise SystemExit(f"ddp-store-server exited with {rc}")


def run_cpp(binary, port, gen):
    out = subprocess.run([binary, HOST, str(port), str(gen)], capture_output=True, text=True,
                         timeout=scaled(120))
    return out.returncode, out.stdout.splitlines(), out.stderr


def torch_side(ddp_port):
    """In the runtime's interpreter: torch's server, then the scenario against both servers;
    keeps torch's server up until the driver closes stdin."""
    import torch
    import torch.distributed as dist
    server = dist.TCPStore(HOST, 0, None, True, T(seconds=30), wait_for_workers=False)
    print(f"torch_port={server.port} version={torch.__version__}", flush=True)
    expect = scenario(server.port)
    got = scenario(ddp_port)
    print("results " + repr([expect, got]), flush=True)
    sys.stdin.read()
    return 0


class TorchSide:
    """The torch half, started in rt's interpreter (see torch_side)."""

    def __init__(self, rt, ddp_port):
        self.p = subprocess.Popen([rt.python, os.path.abspath(__file__), "--torch-side", str(ddp_port)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=rt.env())
        self.timer = threading.Timer(scaled(120), self.p.kill)  # hang guard
        self.timer.start()

    def line(self, prefix):
        line = self.p.stdout.readline()
        if not line.startswith(prefix):
            raise SystemExit(f"torch side printed {line!r} instead of {prefix}... (exit {self.p.poll()})")
        return line[len(prefix):].strip()

    def close(self):
        self.p.stdin.close()
        rc = self.p.wait()
        self.timer.cancel()
        return rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server")
    ap.add_argument("--cpp-client")
    ap.add_argument("--torch-side", type=int, metavar="DDP_PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_side:
        return torch_side(args.torch_side)
    if not (args.server and args.cpp_client):
        ap.error("--server and --cpp-client are required")
    rt = torch_runtime.current()
    why = rt.skip_reason()
    if why:
        print(f"SKIP: {rt.name}: {why}")
        return 77
    failures = []
    gen = wire_generation(rt.version)
    print(f"{rt.label}: torch {rt.version}: wire generation {gen}")

    ddp_proc, ddp_port = start_ddp_server(args.server)
    side = None
    try:
        side = TorchSide(rt, ddp_port)
        torch_port = int(side.line("torch_port=").split()[0])
        # 1. PyTorch's client against both servers.
        expect, got = ast.literal_eval(side.line("results "))
        for e, g in zip(expect, got):
            status = "ok " if e == g else "DIFF"
            print(f"{status} torch-server={e!r} ddp-server={g!r}")
            if e != g:
                failures.append(f"torch client: {e!r} (torch server) != {g!r} (ddp server)")
        if len(expect) != len(got):
            failures.append("torch client: scenarios differ in length")
        sanity = dict((x[0], x[1:]) for x in got)
        must = {
            "get": (b"v\x00al",),
            "add": (5, 3, 3, b"3"),
            "compare_set": (b"exp", b"des", b"des", b"x", b"x"),
            "wait woken": (True,),
            "wait multi": (b"3",),
            "wait timeout took ~300ms": (True,),
            "after timeout": (b"now", 4),
            "delete_key": (True, False, False),
            "big value": (True,),
        }
        if gen == 2:
            must.update({
                "2.x: client after its wait timed out": (7, b"4"),
                "2.x: append": (b"abcd",),
                "2.x: multi_get": ([b"1", b"22", b"", b"abcd"], []),
                "2.x: check": (True, False),
                "2.x: wait woken by append": (b"x",),
                "2.x: wait woken by multi_set": (b"y",),
            })
        elif any(x[0].startswith("2.x") for x in got):
            failures.append("torch < 2.2 ran the 2.x operations")
        for k, v in must.items():
            if sanity.get(k) != v:
                failures.append(f"ddp server, torch client: {k} = {sanity.get(k)!r}, expected {v!r}")

        # 2. ddp::TcpStore against both servers, in torch's wire generation.
        rc_t, out_t, err_t = run_cpp(args.cpp_client, torch_port, gen)
        rc_d, out_d, err_d = run_cpp(args.cpp_client, ddp_port, gen)
        print("C++ client vs torch server:", out_t, err_t.strip())
        print("C++ client vs ddp server:  ", out_d, err_d.strip())
        if rc_t != 0 or rc_d != 0:
            failures.append(f"store_client_check failed: torch server rc={rc_t}, ddp server rc={rc_d}")
        if out_t != out_d:
            failures.append("store_client_check: outputs differ between the servers")
        expected_cpp = [
            "get: true",
            "add: 5 3 3",
            "compare_set: exp des des x x",
            "check: true false",
            "wait-woken: true",
            "wait-timeout: TimeoutError names key: true",
            "after-timeout: 4 4",
            "delete: true false",
            "num_keys: 4",
            "big: true",
        ]
        if out_t != expected_cpp:
            failures.append(f"store_client_check vs torch server: {out_t} != {expected_cpp}")

        # 3. ddp::TcpStore finding the generation itself (kAuto: what libddp's workers use,
        # under any torchrun): torch's own on torch's server, 2 on ddp-store-server.
        for name, port, want in (("torch", torch_port, gen), ("ddp", ddp_port, 2)):
            rc, out, err = run_cpp(args.cpp_client, port, "auto")
            print(f"C++ client (auto) vs {name} server:", out, err.strip())
            if rc != 0 or out != expected_cpp + [f"generation: {want}"]:
                failures.append(f"store_client_check auto vs {name} server: rc={rc} {out} {err.strip()}")
        if gen == 1:
            # Generation 2 asked of a generation-1 server fails at once, saying why, and
            # leaves that server serving (the handshake's bytes never stall its daemon).
            t0 = time.monotonic()
            rc, out, err = run_cpp(args.cpp_client, torch_port, 2)
            took = time.monotonic() - t0
            print(f"C++ client (2) vs torch 1.x server: rc={rc} in {took:.1f} s:", out)
            if rc == 0 or not any("speaks only wire generation 1" in x for x in out) or took > scaled(10):
                failures.append(f"generation 2 against torch {rt.version}'s server: rc={rc} after {took:.1f} s: {out}")
            rc, out, err = run_cpp(args.cpp_client, torch_port, 1)
            if rc != 0:
                failures.append(f"torch's server after the refused handshake: rc={rc} {out} {err.strip()}")
    finally:
        if side:
            rc = side.close()
            if rc != 0:
                failures.append(f"the torch side exited {rc}")
        stop(ddp_proc)

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"PASS ({rt.name}, torch {rt.version}): torch client and ddp::TcpStore agree on both servers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
