"""Publisher and subscriber end to end on the in-process memory driver."""

import itertools
import threading
import time

import pytest

from dfpubsub import (
    ClosedError,
    InvalidEvent,
    PayloadTooLarge,
    Publisher,
    PublisherOptions,
    Subscriber,
    SubscriberOptions,
    VersionedCache,
    VersionedObject,
    load_driver,
)
from dfpubsub.metrics import Stats
from dfpubsub.publisher import _BATCH_FROM, _QUIET
from dfpubsub.testing import LossyTransport, drop_nth
from dfpubsub.transport import PublisherTransport
from tests.conftest import wait_for

_bus = itertools.count()


class DB:
    """A tiny source of truth for resync, as the store will be."""

    def __init__(self):
        self.rows = {}
        self.version = 0
        self.lock = threading.Lock()

    def write(self, topic, key, value):
        with self.lock:
            self.version += 1
            self.rows[key] = VersionedObject(topic, "tbl", key, self.version, value)
            return self.version

    def list(self, topics):
        with self.lock:
            return [o for o in self.rows.values() if o.topic in topics]


class Node:
    def __init__(self, driver, topics, db=None, **opts):
        self.cache = VersionedCache()
        self.events = []
        self.resyncs = []
        self.gaps = []
        self.db = db
        self.sub = Subscriber(
            driver.subscriber(Stats("t", "t")), topics, self.on_event,
            self.on_resync if db is not None else None,
            SubscriberOptions(**{"message_delay_window": 0.2, **opts}), on_gap=self.gaps.append,
        )

    def on_event(self, e):
        self.events.append(e)
        self.cache.apply(e)

    def on_resync(self, topics):
        self.resyncs.append(set(topics))
        self.cache.reconcile(topics, self.db.list(topics))


@pytest.fixture
def driver():
    return load_driver(f"memory://test-{next(_bus)}")


def publisher(driver, transport=None, **opts):
    stats = Stats("p", "p")
    return Publisher(transport or driver.publisher(stats), "pub", PublisherOptions(**opts), stats)


def test_events_flow_in_order_with_batching(driver):
    node = Node(driver, ["port"])
    node.sub.start()
    pub = publisher(driver, batch_max_events=10, batch_linger=1.0, batch_pause=0)
    with pub._lock:  # as if the last rate window had been busy: batch from the first event
        pub._busy, pub._window_end = True, float("inf")
    for i in range(95):
        pub.publish("port", "tbl", f"k{i}", "create", i + 1, {"i": i})
    wait_for(lambda: len(node.events) == 90, what="9 full batches")
    assert pub.stats.get("envelopes_out") == 9
    pub.flush()
    wait_for(lambda: len(node.events) == 95)
    assert [e.seq for e in node.events] == list(range(1, 96))
    assert node.events[5].value == {"i": 5} and node.events[5].publisher_id == pub.id
    pub.close()
    node.sub.close()


def test_linger_flushes_a_partial_batch_and_zero_linger_turns_batching_off(driver):
    node = Node(driver, ["t"])
    node.sub.start()
    pub = publisher(driver, batch_linger=0.05)
    pub.publish("t", "tbl", "k", "create", 1)
    wait_for(lambda: len(node.events) == 1, timeout=2, what="the linger to flush")
    pub.close()
    pub = publisher(driver, batch_linger=0)
    for i in range(5):
        pub.publish("t", "tbl", "k", "update", i + 2)
    assert pub.stats.get("envelopes_out") == 5
    pub.close()
    node.sub.close()


def test_batching_adapts_to_the_rate(driver):
    node = Node(driver, ["t"])
    node.sub.start()
    pub = publisher(driver, batch_max_events=128, batch_linger=0.2)
    pub.publish("t", "tbl", "k", "create", 1)
    # Light traffic: the event leaves at once, whatever the linger.
    assert pub.stats.get("envelopes_out") == 1
    wait_for(lambda: len(node.events) == 1, timeout=2, what="the lone event")
    # A burst far above the light-traffic rate is batched after its first events.
    for i in range(2000):
        pub.publish("t", "tbl", f"k{i}", "update", i + 2)
    wait_for(lambda: len(node.events) == 2001, timeout=2, what="the burst and its last batch's linger")
    assert pub.stats.get("envelopes_out") < 100
    assert [e.seq for e in node.events] == list(range(1, 2002))
    # After a quiet spell, traffic is light again.
    wait_for(lambda: time.monotonic() > max(pub._window_end, pub._last_send + _QUIET) + 0.002, what="a quiet spell")
    sent = pub.stats.get("envelopes_out")
    pub.publish("t", "tbl", "k", "update", 3000)
    assert pub.stats.get("envelopes_out") == sent + 1
    pub.close()
    node.sub.close()


def test_byte_limit_splits_batches(driver):
    pub = publisher(driver, batch_max_bytes=4096, batch_linger=1.0)
    for i in range(20):
        pub.publish("t", "tbl", f"k{i}", "create", 1, "x" * 1000)
    assert pub.stats.get("envelopes_out") >= 4
    pub.close()


def test_bad_events_are_rejected_with_typed_errors(driver):
    pub = publisher(driver, max_message_bytes=2048, batch_max_bytes=2048)
    with pytest.raises(PayloadTooLarge):
        pub.publish("t", "tbl", "k", "create", 1, "x" * 4000)
    with pytest.raises(InvalidEvent):
        pub.publish("t", "tbl", "k", "explode", 1)
    with pytest.raises(InvalidEvent):
        pub.publish("t", "tbl", "k", "create", "1")
    with pytest.raises(InvalidEvent):
        pub.publish("$ctl", "tbl", "k", "create", 1)
    with pytest.raises(InvalidEvent):
        pub.publish("a\x00b", "tbl", "k", "create", 1)
    with pytest.raises(InvalidEvent):
        pub.publish("t", "tbl", "k", "create", 1, {1, 2})
    assert pub.sequences() == {}  # nothing rejected took a sequence number
    pub.close()
    with pytest.raises(ClosedError):
        pub.publish("t", "tbl", "k", "create", 1)


def test_lost_message_is_detected_and_resynced_for_exactly_its_topic(driver):
    db = DB()
    node = Node(driver, ["a", "b"], db)
    node.sub.start()
    assert node.sub.wait_synced(5)
    stats = Stats("p", "p")
    lossy = LossyTransport(driver.publisher(stats), drop_nth("a", 3))
    pub = publisher(driver, lossy, batch_linger=0)
    for i in range(10):
        for topic in ("a", "b"):
            key = f"{topic}{i % 4}"
            pub.publish(topic, "tbl", key, "update", db.write(topic, key, i), i)
    wait_for(lambda: len(node.resyncs) == 2, what="the gap resync")
    assert node.resyncs == [{"a", "b"}, {"a"}]
    assert [(g.topic, g.reason, g.missing) for g in node.gaps] == [("a", "gap_expired", (3, 3))]
    wait_for(lambda: {(o.key, o.version) for o in node.cache.items()} == {(o.key, o.version) for o in db.list({"a", "b"})})
    assert node.sub.stats.get("gaps") == 1
    pub.close()
    node.sub.close()


def test_loss_of_the_last_message_is_found_by_the_idle_hello(driver):
    db = DB()
    node = Node(driver, ["a"], db)
    node.sub.start()
    node.sub.wait_synced(5)
    lossy = LossyTransport(driver.publisher(Stats("p", "p")), drop_nth("a", 2))
    pub = publisher(driver, lossy, batch_linger=0, max_idle_time=0.2)
    pub.publish("a", "tbl", "k", "create", db.write("a", "k", 1))
    pub.publish("a", "tbl", "k", "update", db.write("a", "k", 2))  # lost, and nothing follows
    wait_for(lambda: len(node.resyncs) == 2, what="the idle hello to reveal the loss")
    assert node.gaps[0].missing == (2, 2)
    assert node.cache.get("tbl", "k").version == 2
    pub.close()
    node.sub.close()


def test_initial_sync_runs_before_buffered_events_are_applied(driver):
    db = DB()
    order = []
    release = threading.Event()

    def on_resync(topics):
        order.append("sync")
        release.wait(5)

    sub = Subscriber(driver.subscriber(Stats("t", "t")), ["a"], lambda e: order.append(e.seq), on_resync)
    sub.start()
    pub = publisher(driver, batch_linger=0)
    wait_for(lambda: order == ["sync"])
    pub.publish("a", "tbl", "k", "create", db.write("a", "k", 1))
    wait_for(lambda: sub.stats.get("envelopes_in") == 1, what="the event to be received and queued")
    assert order == ["sync"] and not sub.synced.is_set()
    release.set()
    wait_for(lambda: order == ["sync", 1])
    assert sub.synced.is_set()
    pub.close()
    sub.close()


def test_overflow_of_the_bounded_queue_requests_resync(driver):
    db = DB()
    gate = threading.Event()
    node = Node(driver, ["a"], db, queue_size=4)
    node.sub.start()
    node.sub.wait_synced(5)
    slow = node.on_event
    node.sub.on_event = lambda e: (gate.wait(5), slow(e))
    pub = publisher(driver, batch_linger=0)
    for i in range(50):
        pub.publish("a", "tbl", f"k{i}", "create", db.write("a", f"k{i}", i))
    wait_for(lambda: node.sub.stats.get("drops", "overflow") > 0)
    gate.set()
    wait_for(lambda: len(node.cache) == 50, what="the overflow resync to repair the cache")
    assert node.sub.stats.get("resync_requests", "overflow") > 0
    pub.close()
    node.sub.close()


def test_handler_error_is_counted_and_its_topic_resynced(driver):
    db = DB()
    node = Node(driver, ["a"], db)
    node.sub.start()
    node.sub.wait_synced(5)
    good = node.on_event

    def flaky(e):
        if e.key == "bad":
            raise RuntimeError("boom")
        good(e)

    node.sub.on_event = flaky
    pub = publisher(driver, batch_linger=0)
    pub.publish("a", "tbl", "bad", "create", db.write("a", "bad", 1))
    pub.publish("a", "tbl", "ok", "create", db.write("a", "ok", 1))
    wait_for(lambda: len(node.resyncs) == 2 and node.cache.get("tbl", "bad") is not None)
    assert node.sub.stats.get("handler_errors") == 1 and node.cache.get("tbl", "ok")
    pub.close()
    node.sub.close()


def test_runtime_subscribe_and_unsubscribe(driver):
    db = DB()
    node = Node(driver, ["a"], db)
    node.sub.start()
    node.sub.wait_synced(5)
    pub = publisher(driver, batch_linger=0)
    db.write("b", "early", 0)
    pub.publish("b", "tbl", "x", "create", db.write("b", "x", 0))
    node.sub.subscribe("b")
    wait_for(lambda: node.sub.is_synced("b"))
    assert node.cache.get("tbl", "early") is not None  # brought in by the subscribe resync
    pub.publish("b", "tbl", "y", "create", db.write("b", "y", 0))
    wait_for(lambda: node.cache.get("tbl", "y") is not None)
    node.sub.unsubscribe("b")
    pub.publish("b", "tbl", "z", "create", db.write("b", "z", 0))
    pub.publish("a", "tbl", "w", "create", db.write("a", "w", 0))
    wait_for(lambda: node.cache.get("tbl", "w") is not None)
    assert node.cache.get("tbl", "z") is None
    pub.close()
    node.sub.close()


def test_publisher_restart_and_welcome_hello(driver):
    node = Node(driver, ["a"])
    pub = publisher(driver, batch_linger=0)
    node.sub.start()
    wait_for(lambda: pub.stats.get("hellos_out", "welcome") == 1, what="a welcome hello")
    pub.publish("a", "tbl", "k", "create", 1)
    pub.close()
    pub2 = publisher(driver, batch_linger=0)
    assert pub2.id != pub.id
    pub2.publish("a", "tbl", "k", "update", 2)
    wait_for(lambda: len(node.events) == 2)
    assert [e.seq for e in node.events] == [1, 1]
    assert node.sub.stats.get("gaps") == 0 and node.sub.stats.get("resync_requests") == 0
    pub2.close()
    node.sub.close()


def test_envelopes_never_exceed_max_message_bytes(driver):
    node = Node(driver, ["t"], max_message_bytes=2048)
    node.sub.start()
    pub = publisher(driver, max_message_bytes=2048, batch_max_bytes=2048, batch_linger=1.0)
    for i in range(40):
        pub.publish("t", "tbl", f"k{i}", "create", 1, "x" * 150)
    pub.flush()
    wait_for(lambda: len(node.events) == 40)
    assert node.sub.stats.get("decode_errors") == 0
    pub.close()
    node.sub.close()


def test_timestamp_is_checked_and_deletes_carry_no_value(driver):
    node = Node(driver, ["t"])
    node.sub.start()
    pub = publisher(driver, batch_linger=0)
    with pytest.raises(InvalidEvent):
        pub.publish("t", "tbl", "k", "create", 1, None, timestamp="yesterday")
    pub.publish("t", "tbl", "k", "delete", 2, {"stale": True}, timestamp=12)
    wait_for(lambda: len(node.events) == 1)
    assert node.events[0].value is None and node.events[0].timestamp == 12
    pub.close()
    node.sub.close()


def test_hellos_of_many_topics_are_split_to_fit(driver):
    topics = [f"topic-{i:04d}-" + "x" * 40 for i in range(200)]
    node = Node(driver, topics, max_message_bytes=8192)
    pub = publisher(driver, max_message_bytes=8192, batch_max_bytes=4096, batch_linger=0)
    for t in topics:
        pub.publish(t, "tbl", "k", "create", 1)
    node.sub.start()
    pub.hello()
    wait_for(lambda: len(getattr(node.sub.tracker.peers.get(pub.id), "streams", ())) == 200,
             what="every topic's sequence to arrive in some hello")
    assert node.sub.stats.get("decode_errors") == 0 and node.sub.stats.get("hellos_in") > 2
    pub.close()
    node.sub.close()


def test_envelope_with_a_bad_event_is_counted_and_its_topic_resynced(driver):
    import msgpack

    db = DB()
    node = Node(driver, ["a"], db)
    node.sub.start()
    node.sub.wait_synced(5)
    raw = driver.publisher(Stats("raw", "raw"))
    frame = msgpack.packb({"v": 1, "kind": "event", "pub": "rogue", "name": "", "topic": "a", "seq": 1,
                           "sent_at": 0.0, "events": [["tbl", "k", "create", "not-a-version", None, 0.0]]})
    raw.send("a", frame)
    wait_for(lambda: len(node.resyncs) == 2, what="the bad event's resync")
    assert node.sub.stats.get("decode_errors", "malformed") == 1
    assert [g.reason for g in node.gaps] == ["bad_event"]
    node.sub.close()


class SlowTransport:
    """A real memory transport whose send() takes as long as a round trip to a server."""

    def __init__(self, inner, delay):
        self.inner, self.delay = inner, delay

    def send(self, topic, frame):
        end = time.monotonic() + self.delay
        while time.monotonic() < end:  # a busy wait: sleep() would overshoot far more than 200 us
            pass
        self.inner.send(topic, frame)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_slow_transport_makes_the_publisher_batch(driver):
    """A send that waits for a server holds the event rate under the light-traffic threshold by
    itself: the time spent sending must switch batching on, or throughput collapses."""
    node = Node(driver, ["t"])
    node.sub.start()
    stats = Stats("p", "p")
    pub = Publisher(SlowTransport(driver.publisher(stats), 200e-6), "pub", PublisherOptions(batch_linger=0.002), stats)
    for i in range(1000):
        pub.publish("t", "tbl", f"k{i}", "update", i + 1)
    pub.flush()
    wait_for(lambda: len(node.events) == 1000, timeout=5, what="every event")
    assert pub.stats.get("envelopes_out") < 100  # unbatched it would take 1000 sends, 0.2 s
    pub.close()
    node.sub.close()


class Signals(PublisherTransport):
    """A real memory transport declaring the cost signals a driver declares, counting its requests
    (a send, or a send_many of several envelopes at once)."""

    def __init__(self, inner, delay=0.0, backlog=0):
        self.inner, self.delay, self._backlog, self.requests = inner, delay, backlog, 0

    @property
    def backlog(self):
        return self._backlog

    def send(self, topic, frame):
        self.requests += 1
        if self.delay:
            time.sleep(self.delay)  # a round trip, and the wait for the CPU of a starved process
        self.inner.send(topic, frame)

    def send_many(self, frames):
        self.requests += 1
        for topic, frame in frames:
            self.inner.send(topic, frame)
        return [None] * len(frames)

    def close(self):
        self.inner.close()


class ServerRoundTrips(Signals):
    send_waits = True


class ServerWrites(Signals):
    envelope_cost = 200e-6


def burst(pub, n):
    for i in range(n):
        pub.publish("t", "tbl", f"k{i}", "update", i + 1)


def signalled(driver, cls, linger=0.002, **kwargs):
    stats = Stats("p", "p")
    transport = cls(driver.publisher(stats), **kwargs)
    return Publisher(transport, "pub", PublisherOptions(batch_linger=linger), stats), transport


def test_a_publisher_starved_while_it_waits_for_its_server_batches(driver):
    """Sixteen subscribers on two cores: each XADD's round trip ends only when the publisher gets
    the CPU again, milliseconds later; its rate falls to one event per send. Every send's whole
    time counts on a transport that waits for a server, so it batches (it sent every event alone)."""
    node = Node(driver, ["t"])
    node.sub.start()
    pub, _ = signalled(driver, ServerRoundTrips, delay=0.002)
    burst(pub, 200)
    pub.flush()
    wait_for(lambda: len(node.events) == 200, timeout=5, what="every event")
    assert pub.stats.get("envelopes_out") < 20
    assert [e.seq for e in node.events] == list(range(1, 201))
    pub.close()
    # A transport that does not wait (ZeroMQ): a long send is the OS preempting the process,
    # no reason to batch light traffic.
    pub, _ = signalled(driver, Signals, delay=0.002)
    burst(pub, 20)
    assert pub.stats.get("envelopes_out") == 20
    pub.close()
    node.sub.close()


def test_a_busy_spell_keeps_batching_across_a_short_gap(driver):
    """A publisher starved of CPU publishes in spells: a gap shorter than _QUIET after a busy window
    (the wait for the CPU) keeps it batching; a longer quiet spell makes traffic light again."""
    pub = publisher(driver, batch_linger=1.0, batch_pause=0)

    def busy_window_ended(ago):
        with pub._lock:
            pub._in_window, pub._window_end = _BATCH_FROM + 1, time.monotonic() - ago
            pub._last_send = pub._window_end

    busy_window_ended(0.005)  # five windows ago: the process waited for the CPU since
    sent = pub.stats.get("envelopes_out")
    pub.publish("t", "tbl", "k", "update", 1)
    assert pub.stats.get("envelopes_out") == sent  # batched: its linger is 1 s
    pub.flush()
    busy_window_ended(_QUIET + 0.005)
    sent = pub.stats.get("envelopes_out")
    pub.publish("t", "tbl", "k", "update", 2)
    assert pub.stats.get("envelopes_out") == sent + 1
    pub.close()


def test_envelope_cost_and_backlog_switch_batching_on(driver):
    # Each envelope costs the server 0.2 ms: after three in a millisecond the rest are batched.
    pub, _ = signalled(driver, ServerWrites, linger=1.0)
    burst(pub, 25)  # under the light-traffic rate, which alone sent every one at once
    pub.flush()
    assert pub.stats.get("envelopes_out") <= 6
    pub.close()
    # Envelopes wait unwritten in the transport: a new one would wait behind them anyway.
    pub, _ = signalled(driver, Signals, linger=1.0, backlog=1)
    burst(pub, 10)
    assert pub.stats.get("envelopes_out") == 0
    pub.flush()
    assert pub.stats.get("envelopes_out") == 1 and pub.stats.get("events_out") == 10
    pub.close()


def test_batches_due_together_leave_in_one_request(driver):
    node = Node(driver, ["a", "b", "c", "d"])
    node.sub.start()
    pub, transport = signalled(driver, Signals, linger=1.0, backlog=1)  # batching from the first event
    requests = transport.requests
    for i, topic in enumerate("abcd" * 3):
        pub.publish(topic, "tbl", f"k{i}", "update", i + 1)
    pub.flush()
    assert transport.requests == requests + 1 and pub.stats.get("envelopes_out") == 4
    wait_for(lambda: len(node.events) == 12, what="every event")
    assert {e.topic: e.seq for e in node.events} == {"a": 3, "b": 3, "c": 3, "d": 3}
    pub.close()
    node.sub.close()


def test_a_full_batch_takes_the_pending_ones_along_where_they_can_share_its_round_trip(driver):
    node = Node(driver, ["a", "b", "c", "d"])
    node.sub.start()
    stats = Stats("p", "p")
    transport = ServerRoundTrips(driver.publisher(stats), backlog=1)  # batching from the first event
    pub = Publisher(transport, "pub", PublisherOptions(batch_max_events=4, batch_linger=1.0), stats)
    requests = transport.requests
    for i, topic in enumerate("abcd" * 4):
        pub.publish(topic, "tbl", f"k{i}", "update", i + 1)
    # "a" filled up first, with three events in each other batch: all four left in one request.
    assert transport.requests == requests + 1 and pub.stats.get("envelopes_out") == 4
    pub.flush()
    assert transport.requests == requests + 2 and pub.stats.get("events_out") == 16
    wait_for(lambda: len(node.events) == 16, what="every event")
    assert all([e.seq for e in node.events if e.topic == t] == [1, 2, 3, 4] for t in "abcd")
    pub.close()
    node.sub.close()


def test_a_burst_that_does_not_fill_its_batches_leaves_when_its_caller_pauses(driver):
    """A burst of a few hundred events, its batches partial: once no event has come for
    batch_pause they leave, long before the linger; not while the transport holds a backlog,
    and not with a pause of 0."""
    node = Node(driver, ["a", "b"])
    node.sub.start()
    stats = Stats("p", "p")
    transport = Signals(driver.publisher(stats))
    pub = Publisher(transport, "pub", PublisherOptions(batch_linger=30.0, batch_pause=0.005), stats)
    with pub._lock:  # a busy window just ended: batch
        pub._busy, pub._window_end = True, float("inf")
    for i in range(200):
        pub.publish("ab"[i % 2], "tbl", f"k{i}", "update", i + 1)
    wait_for(lambda: len(node.events) == 200, timeout=10, what="the pause to send the partial batches")
    assert pub.stats.get("envelopes_out") == 2  # one a topic: the burst was not cut up
    transport._backlog = 1  # envelopes wait unwritten: a send now would wait behind them
    pub.publish("a", "tbl", "k", "update", 1000)
    time.sleep(0.2)  # forty pauses
    assert pub.stats.get("envelopes_out") == 2
    pub.close()
    pub = publisher(driver, batch_linger=30.0, batch_pause=0)
    with pub._lock:
        pub._busy, pub._window_end = True, float("inf")
    pub.publish("a", "tbl", "k", "update", 1)
    time.sleep(0.2)
    assert pub.stats.get("envelopes_out") == 0  # waits out its linger
    pub.close()
    node.sub.close()


def test_a_batch_past_its_linger_leaves_with_the_next_publish(driver):
    """The background thread runs late on a loaded machine: a batch that outlived its linger
    goes with the next publish instead of waiting for it."""
    pub = publisher(driver, batch_linger=1.0, batch_pause=0)
    with pub._lock:  # a busy window just ended: batch
        pub._in_window, pub._window_end = _BATCH_FROM + 1, time.monotonic()
        pub._last_send = pub._window_end
    pub.publish("a", "tbl", "k0", "update", 1)
    with pub._lock:
        pub._topics["a"].deadline = pub._due = time.monotonic() - 0.01
    pub.publish("a", "tbl", "k1", "update", 2)
    assert pub.stats.get("envelopes_out") == 1 and pub.stats.get("events_out") == 1
    pub.close()


def test_a_batch_handler_gets_each_envelope_at_once_and_a_failure_resyncs_its_topic(driver):
    with pytest.raises(ValueError, match="one of on_event and on_events"):
        Subscriber(driver.subscriber(Stats("t", "t")), ["a"], lambda e: None, on_events=lambda events: None)
    with pytest.raises(ValueError, match="one of on_event and on_events"):
        Subscriber(driver.subscriber(Stats("t", "t")), ["a"], None)
    db = DB()
    envelopes, resyncs = [], []

    def on_events(events):
        envelopes.append([e.key for e in events])
        if len(envelopes) == 1:
            raise RuntimeError("a bug")

    sub = Subscriber(driver.subscriber(Stats("t", "t")), ["a"], None, resyncs.append, on_events=on_events)
    sub.start()
    sub.wait_synced(5)
    pub = publisher(driver, batch_linger=0.5)
    pub.publish("a", "tbl", "k0", "create", db.write("a", "k0", 1))  # alone: the handler fails on it
    wait_for(lambda: len(envelopes) == 1, what="the first envelope")
    with pub.burst():  # one envelope, whatever the machine's speed (a rate-driven batch is not)
        for i in range(1, 40):
            pub.publish("a", "tbl", f"k{i}", "create", db.write("a", f"k{i}", 1))
    wait_for(lambda: sum(map(len, envelopes)) == 40, what="every event to be handed over")
    assert len(envelopes[-1]) == 39 and sub.stats.get("events_in") == 40
    wait_for(lambda: len(resyncs) == 2, what="the failed envelope's topic to be resynced")
    assert resyncs[1] == {"a"} and sub.stats.get("handler_errors") == 1
    pub.close()
    sub.close()


def test_a_burst_leaves_in_full_batches_and_is_flushed_at_its_end(driver):
    """Publisher.burst (df-feed's pages): no event leaves alone, not even the first of a quiet spell."""
    envelopes = []
    sub = Subscriber(driver.subscriber(Stats("t", "t")), ["a", "b"], None,
                     options=SubscriberOptions(initial_sync=False), on_events=lambda evs: envelopes.append(len(evs)))
    sub.start()
    pub = publisher(driver, batch_linger=10.0, batch_pause=0)  # nothing but the burst's end sends a partial one
    try:
        with pub.burst():
            for i in range(300):
                pub.publish("ab"[i % 2], "tbl", f"k{i}", "create", i + 1)
        wait_for(lambda: sum(envelopes) == 300, what="every event, flushed by the burst's end")
        # 150 a topic: one full batch of 128 and the rest at the end, per topic.
        assert sorted(envelopes) == [22, 22, 128, 128] and pub.stats.get("envelopes_out") == 4
        pub.publish("a", "tbl", "alone", "create", 1)  # outside a burst, light traffic leaves at once
        wait_for(lambda: len(envelopes) == 5, what="the light event")
    finally:
        pub.close()
        sub.close()
