"""A ZeroMQ publisher's tcp peers held to a budget (drivers/zeromq/peers.py, issue 31): one that
floods subscriptions or never reads is cut off and counted, and a real subscriber is served
throughout. The flood from another process, three rounds, measured: tests/chaos/test_subscription_flood.py."""

from __future__ import annotations

import zmq

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.codec import topic_frame
from dfpubsub.metrics import Stats
from tests.conftest import wait_for
from tests.functional.zmq_helpers import Sink


def _victim(**options):
    stats = Stats("publisher", "victim")
    transport = load_driver("zmq+tcp://127.0.0.1:*", {"heartbeat_ivl": 0, **options}).publisher(stats)
    return Publisher(transport, "victim", PublisherOptions(max_idle_time=0.5), stats), stats


def _raw_peer(uri: str, *topics: str) -> zmq.Socket:
    """An XSUB that reads (almost) nothing of what it is sent."""
    sock = zmq.Context.instance().socket(zmq.XSUB)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(uri)
    for topic in topics:
        sock.send(b"\x01" + topic_frame(topic))
    return sock


def _served_throughout(pub, sink, until) -> None:
    """Publish to the real subscriber until ``until()``; it must get every event from its first."""
    n = 0

    def step() -> bool:
        nonlocal n
        n += 1
        pub.publish("port", "port", f"k{n}", "create", n, {"v": "x" * 4000})
        return bool(until())

    wait_for(step, timeout=30, interval=0.002, what="the peer to be cut off")
    wait_for(lambda: sink.keys()[-1:] == [f"k{n}"], what="the real subscriber's last event")
    first = int(sink.keys()[0][1:])
    assert sink.keys() == [f"k{i}" for i in range(first, n + 1)]


def test_a_peer_that_never_reads_is_cut_off_and_counted():
    pub, stats = _victim(peer_stall_timeout=1.0)
    sink = Sink(["port"], [pub.transport.uri])
    sink.sub.start()
    peer = _raw_peer(pub.transport.uri, "port")
    try:
        assert sink.sub.wait_synced(10)
        _served_throughout(pub, sink, lambda: stats.get("peers_cut", "stalled") >= 1)
        assert stats.get("peers_cut", "flood") == 0
    finally:
        peer.close(0)
        sink.sub.close()
        pub.close()


def test_a_peer_that_sends_more_than_its_budget_is_cut_off_and_a_real_subscriber_is_not():
    pub, stats = _victim(max_peer_bytes=64 * 1024)
    sink = Sink(["port"], [pub.transport.uri])
    sink.sub.start()
    peer = _raw_peer(pub.transport.uri)
    try:
        assert sink.sub.wait_synced(10)
        for i in range(5000):  # ~500 KB of distinct subscriptions, ~20 MB in libzmq if it took them all
            peer.send(b"\x01" + topic_frame(f"flood-{i:06d}".ljust(94, "x")))
        _served_throughout(pub, sink, lambda: stats.get("peers_cut", "flood") >= 1)
    finally:
        peer.close(0)
        sink.sub.close()
        pub.close()
