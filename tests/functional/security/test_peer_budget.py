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


def _served_throughout(pub, sink, until, attack=None) -> None:
    """Publish to the real subscriber until ``until()``; it must get every event from its first.
    With ``attack``, the subscriber first gets an event, then ``attack()`` starts."""
    n = 0

    def publish() -> None:
        nonlocal n
        n += 1
        pub.publish("port", "port", f"k{n}", "create", n, {"v": "x" * 4000})

    if attack is not None:
        wait_for(lambda: publish() or sink.keys(), interval=0.01, what="the real subscriber's first event")
        attack()
    wait_for(lambda: publish() or until(), timeout=30, interval=0.002, what="the peer to be cut off")
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


def test_connections_beyond_max_peers_are_cut_off_newest_first_and_the_oldest_subscriber_is_served():
    pub, stats = _victim(max_peers=2)
    sink = Sink(["port"], [pub.transport.uri])
    sink.sub.start()
    peers = []
    try:
        assert sink.sub.wait_synced(10)
        wait_for(lambda: stats.level("tcp_peers") == 1, what="the subscriber to be seen")

        def connect() -> None:
            # Four more that subscribe to nothing (so none is stalled) and reconnect when cut
            # off: one fits beside the subscriber, the others are cut each time they come back.
            peers.extend(_raw_peer(pub.transport.uri) for _ in range(4))

        # The subscriber, served since before they came, is not pushed out.
        _served_throughout(pub, sink, lambda: stats.get("peers_cut", "too_many") >= 3, connect)
        assert stats.get("peers_cut", "flood") == stats.get("peers_cut", "stalled") == 0
        assert stats.level("tcp_peers") <= 2
    finally:
        for peer in peers:
            peer.close(0)
        sink.sub.close()
        pub.close()


def test_peers_each_within_its_own_budget_are_cut_off_heaviest_first_beyond_what_all_may_send():
    pub, stats = _victim(max_peer_bytes=64 * 1024, max_peers_bytes=128 * 1024)
    sink = Sink(["port"], [pub.transport.uri])
    sink.sub.start()
    peers = []
    try:
        assert sink.sub.wait_synced(10)
        peers = [_raw_peer(pub.transport.uri) for _ in range(4)]
        for n, peer in enumerate(peers):  # ~48 KB each, within its own 64 KB; ~190 KB together
            for i in range(500):
                peer.send(b"\x01" + topic_frame(f"many-{n}-{i:06d}".ljust(94, "x")))
        _served_throughout(pub, sink, lambda: stats.get("peers_cut", "total_bytes") >= 2)
        assert stats.get("peers_cut", "flood") == 0, "no peer went over its own budget"
    finally:
        for peer in peers:
            peer.close(0)
        sink.sub.close()
        pub.close()
