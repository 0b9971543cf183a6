"""Real etcd members (Debian's etcd-server) for the Python tests and benchmarks: started on
loopback at free ports under a temporary folder, stopped by pid. The C++ twin is
tests/rendezvous/etcd_harness.hpp.

    c = EtcdCluster(3)              # waits until every member answers and there is a leader
    c.endpoints()                   # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
    c.leader(); c.kill(i); c.start(i); c.stop()
    pki = TestPki(folder)           # openssl: a CA, another CA, server and client certificates
    EtcdCluster(1, tls=pki)         # https members that require a client certificate

Start one per test file (setUpModule / setUpClass), not per test: a member takes about a
second to start on 2 cores.
"""
import base64
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import test_timeouts
from ports import free_port


def find_etcd():
    e = os.environ.get("DDP_ETCD")
    if e:
        return e
    return shutil.which("etcd") or ""


class TestPki:
    """Certificates made with openssl for 127.0.0.1: ca (signs server and client), other_ca
    (signs nothing used here: the wrong CA), server_cert/key, client_cert/key."""

    def __init__(self, folder):
        self.dir = folder
        f = lambda n: os.path.join(folder, n)  # noqa: E731
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, cwd=folder)  # noqa: E731
        for ca in ("ca", "other-ca"):
            run("openssl", "req", "-x509", *ec, "-keyout", f(f"{ca}.key"), "-out", f(f"{ca}.crt"), "-days", "3",
                "-subj", f"/CN=ddprun-test-{ca}")
        with open(f("ext"), "w") as fh:
            fh.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
        for name in ("server", "client"):
            run("openssl", "req", *ec, "-keyout", f(f"{name}.key"), "-out", f(f"{name}.csr"), "-subj",
                f"/CN=ddprun-test-{name}")
            run("openssl", "x509", "-req", "-in", f(f"{name}.csr"), "-CA", f("ca.crt"), "-CAkey", f("ca.key"),
                "-CAcreateserial", "-out", f(f"{name}.crt"), "-days", "3", "-extfile", f("ext"))
        self.ca, self.other_ca = f("ca.crt"), f("other-ca.crt")
        self.server_cert, self.server_key = f("server.crt"), f("server.key")
        self.client_cert, self.client_key = f("client.crt"), f("client.key")


def _die_with_parent(parent):
    """preexec_fn: the member gets SIGKILL when the test process ends, however it ends (a
    ctest timeout's SIGKILL skips tearDownModule, and the member would outlive the test)."""
    def arm():
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the test died before the signal was armed
            os._exit(1)
    return arm


class EtcdCluster:
    def __init__(self, n, tls=None, ready_timeout=30):
        self.etcd = find_etcd()
        if not self.etcd:
            raise RuntimeError("no etcd binary (Debian package etcd-server)")
        self.tls = tls
        # On tmpfs when there is one: etcd fsyncs every write, and a disk that other tests
        # keep busy can stall an fsync for seconds (leases then end late).
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
        self.root = tempfile.mkdtemp(prefix="ddprun-etcd-it-", dir=shm)
        self.token = f"ddprun-it-{os.getpid()}-{time.monotonic_ns()}"
        self.members = []
        for i in range(n):
            self.members.append({"name": f"m{i}", "data": os.path.join(self.root, f"m{i}"),
                                 "log": os.path.join(self.root, f"m{i}.log"), "client": free_port(),
                                 "peer": free_port(), "proc": None})
        self.initial = ",".join(f"{m['name']}=http://127.0.0.1:{m['peer']}" for m in self.members)
        t0 = time.monotonic()
        for i in range(n):
            self.start(i, wait=False)
        self.wait_ready(ready_timeout)
        self.start_time = time.monotonic() - t0

    def endpoint(self, i):
        return f"127.0.0.1:{self.members[i]['client']}"

    def endpoints(self):
        return ",".join(self.endpoint(i) for i in range(len(self.members)))

    def start(self, i, wait=True):
        m = self.members[i]
        scheme = "https" if self.tls else "http"
        url = f"{scheme}://127.0.0.1:{m['client']}"
        args = [self.etcd, "--name", m["name"], "--data-dir", m["data"], "--listen-client-urls", url,
                "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{m['peer']}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{m['peer']}", "--initial-cluster", self.initial,
                "--initial-cluster-token", self.token, "--initial-cluster-state", "new", "--logger", "zap",
                "--log-level", "warn", "--log-outputs", "stderr"]
        if self.tls:
            args += ["--cert-file", self.tls.server_cert, "--key-file", self.tls.server_key, "--trusted-ca-file",
                     self.tls.ca, "--client-cert-auth"]
        log = open(m["log"], "ab")
        m["proc"] = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                     preexec_fn=_die_with_parent(os.getpid()))
        log.close()
        if wait:
            self.wait_ready(30)

    def running(self, i):
        p = self.members[i]["proc"]
        return p is not None and p.poll() is None

    def kill(self, i):
        p = self.members[i]["proc"]
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()

    def stop(self):
        for i in range(len(self.members)):
            self.kill(i)
        if not os.environ.get("DDP_KEEP_ETCD_DATA"):
            shutil.rmtree(self.root, ignore_errors=True)

    def _post(self, i, path, body, timeout=2.0):
        if self.tls:
            raise RuntimeError("plain-http helper used on a TLS member")
        req = urllib.request.Request(f"http://{self.endpoint(i)}/v3/{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def _port_open(self, i):
        try:
            socket.create_connection(("127.0.0.1", self.members[i]["client"]), timeout=0.5).close()
            return True
        except OSError:
            return False

    def wait_ready(self, timeout):
        """Every running member answers a linearizable read (so there is a leader)."""
        deadline = time.monotonic() + test_timeouts.scaled(timeout)
        while True:
            ok = True
            for i in range(len(self.members)):
                if not self.running(i):
                    continue
                if self.tls:
                    ok = ok and self._port_open(i)
                    continue
                try:
                    self._post(i, "kv/range", {"key": base64.b64encode(b"ddprun-ready").decode()})
                except Exception:  # noqa: BLE001 (not up yet)
                    ok = False
            if ok:
                if self.tls:
                    time.sleep(0.5)  # the port opens a moment before the member serves
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd members not ready after {timeout} s: " + self.logs())
            time.sleep(0.1)

    def leader(self):
        """The index of the leader, or -1."""
        ids, leader = {}, 0
        for i in range(len(self.members)):
            if not self.running(i):
                continue
            try:
                st = self._post(i, "maintenance/status", {})
                ids[i] = int(st["header"]["member_id"])
                leader = int(st.get("leader", 0)) or leader
            except Exception:  # noqa: BLE001
                pass
        for i, mid in ids.items():
            if leader and mid == leader:
                return i
        return -1

    def keys(self, i, prefix):
        """Keys under prefix (plain http), for assertions."""
        p = prefix.encode()
        end = p[:-1] + bytes([p[-1] + 1])
        r = self._post(i, "kv/range", {"key": base64.b64encode(p).decode(), "range_end": base64.b64encode(end).decode(),
                                       "keys_only": True})
        return [base64.b64decode(kv["key"]).decode() for kv in r.get("kvs", [])]

    def logs(self):
        out = []
        for m in self.members:
            try:
                with open(m["log"], errors="replace") as f:
                    out.append(f"--- {m['name']}:\n{f.read()[-2000:]}")
            except OSError:
                pass
        return "\n".join(out)
