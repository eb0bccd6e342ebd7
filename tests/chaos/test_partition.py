"""A controller cut off by a real network partition (a veth pair into a network namespace, the
link taken down) from a writer that writes and exits meanwhile: its cache converges."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfpubsub.store import open_store
from tests.conftest import wait_for
from tests.functional.controller_helpers import Node
from tests.functional.feed_helpers import FeedThread

HERE = Path(__file__).parent


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def far_side():
    """(namespace, this side's interface, the far side's address) of a veth pair into a fresh
    network namespace; skipped where namespaces cannot be made (no CAP_NET_ADMIN)."""
    n = os.getpid() % 200 + 20
    ns, here, there = f"dfps{os.getpid()}", f"dfa{os.getpid()}"[:15], f"dfb{os.getpid()}"[:15]
    try:
        _ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a network namespace here: {getattr(exc, 'stderr', exc)}")
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"10.231.{n}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"10.231.{n}.2/30", "dev", there)
        _ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, here, f"10.231.{n}.2"
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_a_writer_that_writes_and_exits_during_a_partition_reaches_the_controller(far_side, tmp_path):
    ns, link, far = far_side
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(url, ["port", "network"])
    feed = FeedThread(store)  # df-feed, on this side: what closes the hole
    writer = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(HERE / "partition_writer.py"), url,
                               f"tcp://{far}:*"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(HERE.parents[1])})
    node = Node(store, feed.endpoint)
    try:
        assert writer.stdout is not None and writer.stdin is not None
        node.ctrl.connect(writer.stdout.readline().strip())  # the writer's own endpoint, across the link

        def write(prefix: str) -> None:
            writer.stdin.write(f"{prefix} 5\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "done"

        write("before")
        wait_for(lambda: node.converged(store), timeout=30, what="the writes before the partition")
        _ip("link", "set", link, "down")
        write("during")
        writer.stdin.write("exit\n")
        writer.stdin.flush()
        assert writer.wait(30) == 0
        _ip("link", "set", link, "up")
        wait_for(lambda: node.converged(store), timeout=30, what="the writes made during the partition")
        assert len(store.list()) == 10
    finally:
        writer.kill()
        node.ctrl.stop()
        feed.close()
        store.close()
