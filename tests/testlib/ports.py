"""Ports for the tests' servers (ddprun's stores, etcd members, Slurm daemons).

A port picked by binding port 0 comes from the kernel's ephemeral range, from which every
outgoing connection of this machine also takes its own port: between the pick and the
server's bind, any connection of another test may take it (a daemon that then fails with
"Address already in use", seen under scripts/test.sh --stress). free_port() picks at random
below that range, where only an explicit bind takes a port, and checks that nobody holds it;
and below the ports ddprun derives from Slurm job ids (20000 and up, src/launcher/slurm.cpp
derived_port), which the Slurm tests' jobs bind without a pick: a test's server there took a
job's port (CI: a slurmd of a Slurm test's cluster on the port its job derived, the job
failing with "the port is already in use by pid ... (slurmd)"). tests/common/ports.hpp is
the C++ twin.
"""
import random
import socket

_LOW = 10000  # above the ports that services commonly use
_SLURM_DERIVED = 20000  # ddprun's ports derived from Slurm job ids start here


def ephemeral_range():
    """(low, high) of /proc/sys/net/ipv4/ip_local_port_range (Linux's default without it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port):
    """Nobody holds the port on any IPv4 address (the servers bind one address or all)."""
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # no SO_REUSEADDR: a port in TIME_WAIT is passed over too
            return True
        except OSError:
            return False


def free_port(host="127.0.0.1"):
    """A TCP port of `host` that nobody holds now, below the ephemeral range and ddprun's
    Slurm ports when there is room there (else the kernel's pick)."""
    top = min(ephemeral_range()[0], _SLURM_DERIVED)
    rng = random.SystemRandom()
    if top - _LOW >= 1000:
        for _ in range(200):
            port = rng.randrange(_LOW, top)
            if _bindable(port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
