"""The attacks of issue 17 from raw pyzmq sockets, without authentication: each ends with bounded
memory and a cache equal to the store (docs/security.md, "Bounded damage")."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import resource
import time
from collections.abc import Callable, Iterator

import zmq

from dfpubsub import Hello, TrackerLimits, load_driver
from dfpubsub.codec import MAX_SEQ, BatchHeader, encode_batch, encode_hello, pack_event, topic_frame
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store
from tests.conftest import wait_for
from tests.functional.controller_helpers import TABLES, Node
from tests.functional.zmq_helpers import Sink, joined, make_pub


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _live_mb() -> float:
    """RSS once the garbage is collected and the C heap has handed back what it holds free: what
    is kept, not what the allocator keeps around (frames of a megabyte pass through it)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _rss_mb()


def _attacker(ctrl) -> tuple[zmq.Socket, str]:
    """A PUB socket the controller also listens to (a rogue row in discovery, say)."""
    sock = zmq.Context.instance().socket(zmq.PUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    ctrl.connect(f"tcp://127.0.0.1:{port}")
    return sock, f"tcp://127.0.0.1:{port}"


def _send_until(sock: zmq.Socket, topic: str, frame: bytes, seen) -> None:
    """Send until the victim has taken it (a PUB drops what it sends before the SUB joined)."""
    def sent() -> bool:
        sock.send_multipart([topic_frame(topic), frame])
        return seen()
    wait_for(sent, what="the victim to take the forged frame")


def test_forged_sequence_and_version_leave_the_cache_equal_to_the_store(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    pub = make_pub(max_idle_time=0.3)
    node = Node(store, pub.transport.uri)
    api = NbApi(store, pub)
    sock = None
    try:
        assert node.ctrl.synced.wait(10)
        for i in range(5):
            api.create("port", f"p{i}", {"i": i})
        wait_for(lambda: node.converged(store), what="the first writes")
        sock, _ = _attacker(node.ctrl)
        sub = node.ctrl.subscriber
        # The real publisher's id, the largest sequence and a version of 2^64-1 for a real key.
        forged = encode_batch(BatchHeader(pub.id, pub.name, "port"), MAX_SEQ, time.time(),
                              [pack_event("port", "p0", "update", 2**64 - 1, {"owned": True}, time.time())])
        # A gap like any other: held, resynced, delivered; then the real publisher's next hello,
        # far below, restarts the stream.
        _send_until(sock, "port", forged, lambda: sub.stats.get("resync_requests", "gap_expired") > 0)
        wait_for(lambda: sub.stats.get("streams_restarted") > 0, what="the real publisher to restart the stream")
        # Within the jump bound, as a hello: a gap, given up on, then the real numbers step it down.
        expired = sub.stats.get("resync_requests", "gap_expired")
        hello = Hello(pub.id, pub.name, time.time(), {"port": 50_000}, "idle", 0.3, "h")
        _send_until(sock, CONTROL_TOPIC, encode_hello(hello),
                    lambda: sub.stats.get("resync_requests", "gap_expired") > expired)
        for i in range(5):
            api.update("port", f"p{i}", {"i": i, "real": True})
        api.create("port", "after", {})
        wait_for(lambda: node.converged(store), timeout=20, what="the cache to equal the store")
        assert node.ctrl.cache.get("port", "p0").version < 2**64 - 1
    finally:
        if sock is not None:
            sock.close(0)
        node.ctrl.stop()
        pub.close()
        store.close()


@contextlib.contextmanager
def _hello_attack(limits: TrackerLimits | None = None) -> Iterator[tuple[Sink, Callable[..., None]]]:
    """A real publisher, a subscriber of it, and ``send(pid, name)``: a hello from an attacker's
    PUB socket the subscriber also reaches, with max_idle -1 (never taken as dead). The real
    publisher's event must get through at the end."""
    pub = make_pub(max_idle_time=0.3)
    sink = Sink(["port"], [pub.transport.uri], max_idle_time=0.3, limits=limits or TrackerLimits())
    attacker = zmq.Context.instance().socket(zmq.PUB)
    attacker.setsockopt(zmq.SNDHWM, 0)
    port = attacker.bind_to_random_port("tcp://127.0.0.1")
    sink.sub.connect(f"tcp://127.0.0.1:{port}")
    sink.sub.start()

    def send(pid: str, name: str = "f") -> None:
        attacker.send_multipart([topic_frame(CONTROL_TOPIC), encode_hello(
            Hello(pid, name, time.time(), {"port": 3}, "idle", -1.0, name[:1000]))])

    try:
        joined(pub)
        wait_for(lambda: (send("probe"), "probe" in sink.sub.tracker.peers)[1],
                 what="the attacker to reach the subscriber")
        yield sink, send
        pub.publish("port", "t", "k", "create", 1, {"v": 1})
        wait_for(lambda: "k" in sink.keys(), what="the real publisher's event")
    finally:
        attacker.close(0)
        sink.sub.close()
        pub.close()


def test_a_flood_of_fake_publishers_costs_bounded_memory_and_bounded_resyncs():
    with _hello_attack(TrackerLimits(max_publishers=1000)) as (sink, send):
        runs = sink.stats.get("resyncs")
        started = time.monotonic()
        for i in range(100_000):  # fake ids whose hellos turn dead-publisher detection off
            send(f"fake{i}")
            if i % 1000 == 999:  # at the pace the subscriber takes them (ZeroMQ drops beyond its HWMs)
                wait_for(lambda n=i: sink.stats.get("hellos_in") > n - 5000, what="the subscriber to keep up")
        wait_for(lambda: sink.stats.get("drops", "publisher_evicted") >= 50_000, timeout=60,
                 what="the fakes to be evicted")
        elapsed = time.monotonic() - started
        assert len(sink.sub.tracker.peers) <= 1000
        # Every fake asked for a resync (first contact); the scheduler's backoff spaced them.
        spacing = sink.sub.options.resync_max_interval
        assert sink.stats.get("resyncs") - runs <= 8 + elapsed / spacing


def test_megabyte_names_and_ids_in_hellos_are_not_kept():
    """Issue 31: 50 hellos from fake ids with a 1 MB name held 61 MB after they went silent."""
    with _hello_attack() as (sink, send):
        tracker = sink.sub.tracker
        before = _live_mb()
        for i in range(50):
            send(f"fake{i}", "n" * 1_000_000)
            send(f"{i}-" + "i" * 1_000_000)
        # The real publisher, the probe and the 100 fakes.
        wait_for(lambda: len(tracker.peers) >= 102, timeout=30, what="the hellos to be taken")
        assert max(len(pid) for pid in list(tracker.peers)) <= 128
        assert sink.stats.get("strings_clamped", "pub") == 50
        # Kept, the strings would hold 100 MB; frames still passing through libzmq's and the
        # allocator's buffers hold some for a moment.
        wait_for(lambda: _live_mb() - before <= 16, timeout=10, interval=0.2, what="the megabyte strings to go")


def test_a_subscription_flood_costs_the_publisher_bounded_memory():
    stats = Stats("publisher", "victim")
    # The cap on topics taken, apart from the peers' byte budgets (which would cut this peer off
    # long before: tests/chaos/test_subscription_flood.py).
    transport = load_driver("zmq+tcp://127.0.0.1:*", {"max_subscriptions": 1000, "max_peer_bytes": 1 << 30,
                                                      "max_peers_bytes": 1 << 30}).publisher(stats)
    transport.sock.setsockopt(zmq.RCVHWM, 0)  # the attacker's every message reaches it
    xsub = zmq.Context.instance().socket(zmq.XSUB)
    xsub.setsockopt(zmq.SNDHWM, 0)
    xsub.connect(transport.uri)
    sink = Sink(["port"], [transport.uri])
    sink.sub.start()

    def served(seq: int, key: str) -> None:
        frame = encode_batch(BatchHeader("real", "real", "port"), seq, time.time(),
                             [pack_event("port", key, "create", 1, {}, time.time())])
        wait_for(lambda: (transport.new_subscribers(), transport.send("port", frame), key in sink.keys())[2],
                 what="a real subscriber to be served")

    try:
        served(1, "k1")
        before = _rss_mb()
        big = "x" * 200
        for i in range(100_000):
            xsub.send(b"\x01" + topic_frame(f"{big}{i}"))
            if i % 5000 == 4999:
                wait_for(lambda n=i: (transport.new_subscribers(),
                                      stats.get("drops", "subscription_cap") >= n - 1000 - 5000)[1],
                         what="the publisher to read the flood")
        for junk in (b"\x01", b"\x01no-nul", b"\x05port\x00", b"\x01\xff\x00", b"\x01$other\x00"):
            xsub.send(junk)
        wait_for(lambda: (transport.new_subscribers(), stats.get("drops", "subscription_cap") >= 99_000
                          and stats.get("drops", "subscription_invalid") >= 5)[1],
                 timeout=60, what="the flood and the junk to be read")
        assert stats.get("drops", "subscription_invalid") == 5
        # 100,000 subscriptions of 200 bytes taken would cost libzmq well over 100 MB.
        assert _rss_mb() - before < 60
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before < 200
        served(2, "k2")
    finally:
        xsub.close(0)
        sink.sub.close()
        transport.close()
