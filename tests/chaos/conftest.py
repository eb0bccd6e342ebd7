import fcntl
import os
import subprocess
import tempfile

import pytest

from tests.chaos.netns import ip

zmq = pytest.importorskip("zmq")


@pytest.fixture
def far_side():
    """(namespace, this side's interface, the far side's address, this side's address) of a veth
    pair into a fresh network namespace; skipped where namespaces cannot be made (no
    CAP_NET_ADMIN)."""
    ns, here, there = f"dfps{os.getpid()}", f"dfa{os.getpid()}"[:15], f"dfb{os.getpid()}"[:15]
    try:
        ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a network namespace here: {getattr(exc, 'stderr', exc)}")
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        # A /30 no other link on the host has, chosen and taken under a lock of the machine's:
        # another test run picking one by its pid (as this did) got the same one, the host then had
        # two routes to it, and this test's etcd client reached the other run's server.
        with open(os.path.join(tempfile.gettempdir(), "dfpubsub-netns.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            taken = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True,
                                   text=True, timeout=30).stdout
            n = next(n for n in range(20, 250) if f" 10.231.{n}." not in taken)
            ip("addr", "add", f"10.231.{n}.1/30", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"10.231.{n}.2/30", "dev", there)
        ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, here, f"10.231.{n}.2", f"10.231.{n}.1"
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
