#!/usr/bin/python3
"""PyTorch compatibility of ddprun's store, both directions.

1. PyTorch's own client (torch.distributed.TCPStore) runs the same scenario against
   ddp-store-server and against PyTorch's own server; the results must be identical (and
   sane).
2. ddp::TcpStore, via the store_client_check program, runs against PyTorch's server and
   against ddp-store-server; the outputs must be identical and as expected.

The wire generation follows the installed torch: 1 for torch < 2.2 (Debian's 1.13 here),
2 for torch >= 2.2, whose client and (libuv) server speak generation 2 -- so on a machine
with torch 2.x the same test checks generation 2 against PyTorch.

  test_torch_client.py --server build/bin/ddp-store-server --cpp-client build/bin/store_client_check

Exits 77 (ctest SKIP_RETURN_CODE) only when this interpreter has no torch.
"""
import argparse
import datetime
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from test_timeouts import scaled  # noqa: E402  (DDP_TEST_TIMEOUT_SCALE)

try:
    import torch.distributed as dist
except ImportError as e:  # truly unavailable: skip
    print(f"SKIP: torch.distributed is not importable from {sys.executable}: {e}")
    sys.exit(77)

T = datetime.timedelta
HOST = "127.0.0.1"


def torch_wire_generation():
    import torch
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return 2 if (major, minor) >= (2, 2) else 1


def client(port, timeout_s=scaled(30)):  # a hang guard
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--cpp-client", required=True)
    args = ap.parse_args()
    failures = []
    gen = torch_wire_generation()
    import torch
    print(f"torch {torch.__version__}: wire generation {gen}")

    torch_server = dist.TCPStore(HOST, 0, None, True, T(seconds=scaled(60)), wait_for_workers=False)
    ddp_proc, ddp_port = start_ddp_server(args.server)
    try:
        # 1. PyTorch's client against both servers.
        expect = scenario(torch_server.port)
        got = scenario(ddp_port)
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
        for k, v in must.items():
            if sanity.get(k) != v:
                failures.append(f"ddp server, torch client: {k} = {sanity.get(k)!r}, expected {v!r}")

        # 2. ddp::TcpStore against both servers, in torch's wire generation.
        rc_t, out_t, err_t = run_cpp(args.cpp_client, torch_server.port, gen)
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
    finally:
        stop(ddp_proc)

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASS: torch client and ddp::TcpStore agree on both servers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
