"""One set of tests that every driver must pass: memory, zmq, etcd, redis, nats.

Each harness makes a publisher transport and a subscriber transport wired to
it; the core Publisher and Subscriber run on top, so the tests check what the
users of any driver rely on: per-topic order, exact topics, hellos and gap
handling, resync, malformed input, and surviving a server restart.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.metrics import Stats
from dfpubsub.testing import LossyTransport, drop_nth
from tests.conftest import undetected, wait_for
from tests.functional.sink_helpers import RecordingSink

_n = itertools.count()


class Harness:
    """Makes transports of one driver; ``server`` is set for drivers with a server to kill."""

    name = ""
    server = None

    def publisher_transport(self, stats):
        raise NotImplementedError

    def subscriber_transport(self, stats, publisher_transport):
        raise NotImplementedError

    def raw_transport(self, sink):
        """A publisher transport for writing arbitrary frames that ``sink`` receives."""
        return self.publisher_transport(Stats("raw", "raw"))


class MemoryHarness(Harness):
    name = "memory"

    def __init__(self, request):
        self.driver = load_driver(f"memory://conformance-{next(_n)}")

    def publisher_transport(self, stats):
        return self.driver.publisher(stats)

    def subscriber_transport(self, stats, publisher_transport):
        return self.driver.subscriber(stats)


class ZmqHarness(Harness):
    name = "zmq"

    def __init__(self, request):
        pass

    def publisher_transport(self, stats):
        return load_driver("zmq+tcp://127.0.0.1:*").publisher(stats)

    def subscriber_transport(self, stats, publisher_transport):
        t = load_driver("zmq").subscriber(stats)
        t.connect(publisher_transport.uri)
        return t

    def raw_transport(self, sink):
        raw = self.publisher_transport(Stats("raw", "raw"))
        sink.sub.connect(raw.uri)
        wait_for(lambda: raw.new_subscribers(), what="the subscriber to join the raw socket")
        return raw


class ServerHarness(Harness):
    """etcd, redis and nats: the driver URL is a private server's; keys (subjects) under a prefix of the
    test's own."""

    def __init__(self, request):
        self.server = request.getfixturevalue(f"{self.name}_server")
        self.options = {"prefix": f"conf{next(_n)}"}

    def publisher_transport(self, stats):
        return load_driver(self.server.url, self.options).publisher(stats)

    def subscriber_transport(self, stats, publisher_transport):
        return load_driver(self.server.url, self.options).subscriber(stats)


class EtcdHarness(ServerHarness):
    name = "etcd"


class RedisHarness(ServerHarness):
    name = "redis"


class NatsHarness(ServerHarness):
    name = "nats"

    def __init__(self, request):
        super().__init__(request)
        self.options["stream"] = self.options["prefix"].upper()


HARNESSES = {h.name: h for h in (MemoryHarness, ZmqHarness, EtcdHarness, RedisHarness, NatsHarness)}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request):
    return HARNESSES[request.param](request)


class Sink(RecordingSink):
    def __init__(self, harness, pub_transport, topics, resync=None, window=0.2):
        stats = Stats("subscriber", "sink")
        super().__init__(harness.subscriber_transport(stats, pub_transport), topics, stats, resync or True,
                         message_delay_window=window, max_idle_time=0.5)


def make_publisher(harness, wrap=None, **opts):
    stats = Stats("publisher", "conf")
    transport = harness.publisher_transport(stats)
    if wrap is not None:
        transport = wrap(transport)
    options = PublisherOptions(**{"batch_linger": 0, "max_idle_time": 0.3, **opts})
    return Publisher(transport, "conf", options, stats), transport


def ready(pub, sink, topic="warm"):
    """Publish on a warm-up topic until the subscriber hears it (transports connect asynchronously)."""
    wait_for(lambda: pub.hello() or sink.stats.get("hellos_in") > 0, what="the subscriber to hear a hello")


def test_per_topic_order_and_exact_topics(harness):
    pub, transport = make_publisher(harness, batch_linger=0.001, batch_max_events=7)
    a = Sink(harness, transport, ["port", "net"])
    b = Sink(harness, transport, ["portbinding"])
    for s in (a, b):
        s.sub.start()
        assert s.sub.wait_synced(10)
    ready(pub, a)
    ready(pub, b)
    for i in range(300):
        pub.publish(("port", "net", "portbinding", "po")[i % 4], "t", f"k{i}", "update", i + 1)
    pub.flush()
    wait_for(lambda: len(a.seqs("port")) == 75 and len(a.seqs("net")) == 75 and len(b.seqs("portbinding")) == 75)
    assert a.seqs("port") == list(range(1, 76)) and a.seqs("net") == list(range(1, 76))
    assert b.seqs("portbinding") == list(range(1, 76))
    assert {e.topic for e in a.events} == {"port", "net"} and {e.topic for e in b.events} == {"portbinding"}
    for s in (a, b):
        assert s.stats.get("gaps") == 0 and s.gaps == []
    pub.close()
    a.sub.close()
    b.sub.close()


def test_lost_envelope_is_detected_and_only_its_topic_resynced(harness):
    pub, transport = make_publisher(harness, wrap=lambda t: LossyTransport(t, drop_nth("a", 3)))
    sink = Sink(harness, transport, ["a", "b"])
    sink.sub.start()
    sink.sub.wait_synced(10)
    ready(pub, sink)
    for i in range(10):
        pub.publish("a", "t", f"a{i}", "create", i + 1)
        pub.publish("b", "t", f"b{i}", "create", i + 1)
    wait_for(lambda: len(sink.resyncs) >= 2, what="the gap resync")
    assert sink.resyncs[1] == {"a"}
    assert [(g.topic, g.missing) for g in sink.gaps if g.reason == "gap_expired"] == [("a", (3, 3))]
    assert sink.seqs("b") == list(range(1, 11))
    pub.close()
    sink.sub.close()


def test_loss_of_the_last_message_is_found_by_a_hello(harness):
    pub, transport = make_publisher(harness, wrap=lambda t: LossyTransport(t, drop_nth("a", 2)))
    sink = Sink(harness, transport, ["a"])
    sink.sub.start()
    sink.sub.wait_synced(10)
    ready(pub, sink)
    pub.publish("a", "t", "k", "create", 1)
    pub.publish("a", "t", "k", "update", 2)  # lost, and nothing follows it
    wait_for(lambda: any(g.reason == "gap_expired" for g in sink.gaps), what="an idle hello to reveal it")
    pub.close()
    sink.sub.close()


def test_initial_sync_comes_before_events(harness):
    order = []
    release = threading.Event()

    def resync(topics):
        order.append("sync")
        release.wait(5)

    pub, transport = make_publisher(harness)
    sink = Sink(harness, transport, ["a"], resync=resync)
    sink.sub.on_event = lambda e: order.append(e.seq)
    sink.sub.start()
    wait_for(lambda: order == ["sync"])
    wait_for(lambda: pub.hello() or sink.stats.get("hellos_in") > 0, what="the subscription to be live")
    pub.publish("a", "t", "k", "create", 1)
    wait_for(lambda: sink.stats.get("envelopes_in") >= 1)
    assert order == ["sync"]
    release.set()
    wait_for(lambda: order == ["sync", 1])
    pub.close()
    sink.sub.close()


def test_malformed_frames_are_counted_and_skipped(harness):
    pub, transport = make_publisher(harness)
    sink = Sink(harness, transport, ["a"])
    sink.sub.start()
    sink.sub.wait_synced(10)
    ready(pub, sink)
    raw = harness.raw_transport(sink)
    for garbage in (b"\xc1 not msgpack", b"\x93\x01\x02\x03", b""):
        raw.send("a", garbage)
    for i in range(5):
        pub.publish("a", "t", f"k{i}", "create", i + 1)
    wait_for(lambda: len(sink.seqs("a")) == 5)
    wait_for(lambda: sink.stats.get("decode_errors") >= 3)
    raw.close()
    pub.close()
    sink.sub.close()


def test_subscriber_resumes_after_the_server_restarts(harness):
    if harness.server is None:
        pytest.skip(f"{harness.name} has no server to restart")
    pub, transport = make_publisher(harness)
    sink = Sink(harness, transport, ["a"])
    sink.sub.start()
    sink.sub.wait_synced(10)
    ready(pub, sink)
    for i in range(20):
        pub.publish("a", "t", f"k{i}", "create", i + 1)
    wait_for(lambda: len(sink.seqs("a")) == 20)
    harness.server.kill()
    for i in range(20, 25):
        pub.publish("a", "t", f"k{i}", "create", i + 1)  # the server is down: lost, never raised
    harness.server.start()

    def after_restart():
        pub.publish("a", "t", "after", "update", 100)
        return sink.seqs("a") and sink.seqs("a")[-1] > 25

    wait_for(after_restart, timeout=30, interval=0.2, what="traffic after the restart")

    def all_accounted():
        holes = [g.missing for g in list(sink.gaps) if g.topic == "a"]
        return undetected(sink.seqs("a"), holes, pub.sequences()["a"]) == []

    wait_for(all_accounted, timeout=10, what="every sequence delivered or covered by a resync")
    pub.close()
    sink.sub.close()
