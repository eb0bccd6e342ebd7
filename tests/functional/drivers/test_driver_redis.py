"""The Redis Streams driver against private redis-servers (never the machine's own Redis)."""

import threading
import time
import uuid

import msgpack
import pytest

redis = pytest.importorskip("redis")

from dfpubsub.drivers.redis_streams import RedisStreamsDriver  # noqa: E402

from dfpubsub import ClosedError, ConfigError, Publisher, PublisherOptions  # noqa: E402
from dfpubsub.codec import BatchHeader, decode, encode_batch, pack_event  # noqa: E402
from dfpubsub.metrics import Stats  # noqa: E402
from tests.conftest import wait_for  # noqa: E402
from tests.functional.sink_helpers import (  # noqa: E402
    GatedSink,
    assert_outage_accounted,
    publishing_forever,
    record_lost,
    recv_all,
)


def new_prefix():
    return f"test-{uuid.uuid4().hex[:8]}"


def fsync_always(server):
    """Make every acknowledged write survive a SIGKILL (with ``everysec`` Redis may postpone
    writing its AOF while an fsync runs, and a kill then loses writes it acknowledged)."""
    client = redis.Redis.from_url(server.url)
    client.config_set("appendfsync", "always")
    client.close()


def make_pub(server, prefix, name="pub", options=None, **opts):
    stats = Stats("publisher", name)
    transport = RedisStreamsDriver(server.url, {"prefix": prefix, **(options or {})}).publisher(stats)
    return Publisher(transport, name, PublisherOptions(**{"batch_linger": 0.001, **opts}), stats)


class Sink(GatedSink):
    """A subscriber recording events, resyncs and resync requests; ``gate.clear()`` stops its recv()."""

    def __init__(self, server, prefix, topics, options=None, **opts):
        stats = Stats("subscriber", "sink")
        transport = RedisStreamsDriver(server.url, {"prefix": prefix, **(options or {})}).subscriber(stats)
        super().__init__(transport, topics, stats, **opts)


def test_events_flow_to_two_subscribers_with_different_topics_without_false_gaps(shared_redis):
    prefix = new_prefix()
    pub = make_pub(shared_redis, prefix, batch_max_events=16)
    s1 = Sink(shared_redis, prefix, ["a", "b"])
    s2 = Sink(shared_redis, prefix, ["b", "c"])
    s1.sub.start()
    s2.sub.start()  # positions are fixed when start() returns: nothing published from here is missed
    wait_for(lambda: pub.stats.get("subscribers_joined") >= 2, what="the publisher to see both join")
    for i in range(3000):
        pub.publish("abc"[i % 3], "t", f"k{i}", "update", i + 1)
    pub.flush()
    wait_for(lambda: len(s1.keys()) == 2000 and len(s2.keys()) == 2000)
    pub.close()
    wait_for(lambda: s1.stats.get("hellos_in") >= 2 and s2.stats.get("hellos_in") >= 2)  # the bye
    for s, topics in ((s1, {"a", "b"}), (s2, {"b", "c"})):
        assert {e.topic for e in s.events} == topics
        for topic in topics:
            assert s.seqs(topic, pub.id) == list(range(1, 1001))
            assert s.keys(topic) == [f"k{i}" for i in range(3000) if "abc"[i % 3] == topic]
        assert s.stats.get("gaps") == 0 and s.gaps == [] and s.stats.get("duplicates") == 0
        assert s.stats.get("drops") == 0 and s.stats.get("decode_errors") == 0
        s.close()


def raw_envelope(topic, seq, key, version=1):
    return encode_batch(BatchHeader("raw-pub", "raw", topic), seq, 1.0, [pack_event("t", key, "create", version, None, 0.0)])


def test_malformed_entries_are_counted_and_skipped_while_valid_traffic_flows(shared_redis):
    prefix = new_prefix()
    raw = redis.Redis.from_url(shared_redis.url)
    stream, ctl = f"{prefix}:ps:a", f"{prefix}:ps:$ctl"
    pub = make_pub(shared_redis, prefix)
    sink = Sink(shared_redis, prefix, ["a"])
    sink.sub.start()
    bad = [
        (stream, {"x": b"no e field"}),
        (stream, {"x": b"1", "y": b"2"}),
        (stream, {"e": b"\xc1 not msgpack"}),
        (stream, {"e": msgpack.packb({"v": 99, "kind": "event"})}),
        (stream, {"e": raw_envelope("zzz", 1, "wrong-topic-inside")}),
        (ctl, {"hello": b"no e"}),
        (ctl, {"e": b"garbage hello"}),
    ]
    for i in range(20):
        for key, fields in bad:
            raw.xadd(key, fields)
        # An extra field beside a sound "e" is tolerated.
        raw.xadd(stream, {"e": raw_envelope("a", i + 1, f"raw{i}"), "note": b"extra"})
        pub.publish("a", "t", f"good{i}", "create", i + 1)
        pub.flush()
    wait_for(lambda: len([k for k in sink.keys("a") if k.startswith("good")]) == 20)
    wait_for(lambda: sink.stats.get("decode_errors") >= 20 * 6)
    s = sink.stats
    assert s.get("decode_errors", "bad_frames") == 20 * 3  # counted by the driver
    assert s.get("decode_errors", "not_msgpack") == 20  # the rest by the core
    assert s.get("decode_errors", "malformed") == 20
    assert s.get("decode_errors", "schema_version") == 20
    assert s.get("drops", "foreign_topic") == 20
    assert [k for k in sink.keys("a") if k.startswith("good")] == [f"good{i}" for i in range(20)]
    assert [k for k in sink.keys("a") if k.startswith("raw")] == [f"raw{i}" for i in range(20)]
    assert sink.seqs("a", pub.id) == list(range(1, 21))
    pub.close()
    sink.close()
    raw.close()


def test_server_killed_and_restarted_while_publishing(redis_server):
    fsync_always(redis_server)
    prefix = new_prefix()
    pub = make_pub(redis_server, prefix)
    live = Sink(redis_server, prefix, ["a", "b"])
    paused = Sink(redis_server, prefix, ["a", "b"])  # does not read across the outage
    live.sub.start()
    paused.sub.start()
    with publishing_forever(pub):
        wait_for(lambda: len(live.keys()) >= 2000, what="traffic before the outage")
        paused.gate.clear()
        mark = len(live.keys())
        wait_for(lambda: len(live.keys()) >= mark + 2000, what="traffic the paused subscriber has not read")
        before = {t: max(live.seqs(t, pub.id)) for t in "ab"}  # in the stream, acknowledged
        redis_server.kill()
        wait_for(lambda: pub.stats.get("send_errors") >= 3, what="the publisher to notice")
        time.sleep(0.3)
        redis_server.start()
        mark = len(live.keys())
        wait_for(lambda: len(live.keys()) >= mark + 2000, timeout=20, what="traffic after the restart")
        paused.gate.set()
        mark = len(paused.keys())
        wait_for(lambda: len(paused.keys()) >= mark + 2000, timeout=20, what="the paused subscriber to resume")
    pub.close()
    assert_outage_accounted(pub, live, paused)
    for s in (live, paused):
        assert not [g for g in s.gaps if g.reason in ("trimmed", "reset", "subscribe_delayed")]
    for t in "ab":
        # What the stream held at the kill reached the paused subscriber from the stream itself.
        got = set(paused.seqs(t, pub.id))
        assert all(seq in got for seq in range(1, before[t] + 1))
    live.close()
    paused.close()


def test_trimmed_history_of_a_stalled_subscriber_is_reported_and_resynced(shared_redis):
    prefix = new_prefix()
    raw = redis.Redis.from_url(shared_redis.url)
    pub = make_pub(shared_redis, prefix, options={"maxlen": 10}, batch_linger=0)  # one entry per event
    sink = Sink(shared_redis, prefix, ["a", "b"])
    sink.sub.start()
    wait_for(lambda: sink.resyncs, what="the initial sync")
    for i in range(20):
        pub.publish("a", "t", f"early{i}", "create", i + 1)
    wait_for(lambda: len(sink.keys("a")) == 20)
    sink.gate.clear()  # the receive thread stops calling recv()
    time.sleep(0.15)  # (a recv() in progress returns within block_ms)
    for i in range(2000):
        pub.publish("a", "t", f"late{i}", "update", i + 100)
        pub.publish("b", "t", f"late{i}", "update", i + 100)
    assert raw.xlen(f"{prefix}:ps:a") < 1000  # trimmed behind the subscriber's back
    time.sleep(0.3)  # stalled long enough for the driver to probe before it reads on
    resyncs_before = len(sink.resyncs)
    sink.gate.set()
    wait_for(lambda: {"a", "b"} <= {g.topic for g in sink.gaps if g.reason == "trimmed"}, what="the trim reported")
    wait_for(lambda: {"a", "b"} <= set().union(*sink.resyncs[resyncs_before:]), what="a resync of both")
    wait_for(lambda: sink.keys("a")[-1:] == ["late1999"], what="the newest events")
    assert len(sink.keys("a")) < 20 + 2000  # the loss was real
    assert sink.stats.get("resync_requests", "trimmed") == 2
    pub.close()
    sink.close()
    raw.close()


def raw_transport(server, prefix, **options):
    t = RedisStreamsDriver(server.url, {"prefix": prefix, **options}).subscriber(Stats("subscriber", "raw"))
    return t, record_lost(t)


def test_trim_detection_is_exact(shared_redis):
    prefix = new_prefix()
    raw = redis.Redis.from_url(shared_redis.url)
    key = f"{prefix}:ps:a"
    ids = [raw.xadd(key, {"e": b"before"}) for _ in range(3)]
    t, lost = raw_transport(shared_redis, prefix)
    t.subscribe("a")
    ids = [raw.xadd(key, {"e": b"%d" % i}) for i in range(10)]
    assert recv_all(t, 10) == [b"%d" % i for i in range(10)]
    # Only entries already read are trimmed: nothing is lost, even though the first is past ours.
    ids += [raw.xadd(key, {"e": b"%d" % i}) for i in range(10, 20)]
    raw.xtrim(key, minid=ids[10], approximate=False)
    time.sleep(0.3)  # recv() was not called for a while: it probes
    assert recv_all(t, 10) == [b"%d" % i for i in range(10, 20)] and lost == []
    # Unread entries trimmed: reported once, and the rest still delivered.
    ids += [raw.xadd(key, {"e": b"%d" % i}) for i in range(20, 40)]
    raw.xtrim(key, maxlen=5, approximate=False)
    time.sleep(0.3)
    assert recv_all(t, 5) == [b"%d" % i for i in range(35, 40)] and lost == [("a", "trimmed")]
    assert t.recv(0.05) == [] and lost == [("a", "trimmed")]
    # A lagging reader (full reads) probes without being idle.
    t2, lost2 = raw_transport(shared_redis, prefix, count=4)
    t2.subscribe("a")
    for i in range(40, 48):
        raw.xadd(key, {"e": b"%d" % i})
    assert recv_all(t2, 4) == [b"%d" % i for i in range(40, 44)] and lost2 == []
    for i in range(48, 60):
        raw.xadd(key, {"e": b"%d" % i}, maxlen=12, approximate=False)  # 44..47 go unread
    assert t2.recv(0.1) == [b"%d" % i for i in range(48, 52)] and lost2 == [("a", "trimmed")]
    # The stream went back (deleted and recreated, as by a server that lost its data).
    raw.delete(key)
    raw.xadd(key, {"e": b"new"}, id="1-1")
    time.sleep(0.3)
    assert t.recv(0.1) == [] and lost[-1] == ("a", "reset")
    raw.xadd(key, {"e": b"newer"})
    assert recv_all(t, 1) == [b"newer"]
    t.close()
    t2.close()
    raw.close()


def test_reconnect_resumes_and_reports_what_was_trimmed_meanwhile(redis_server):
    fsync_always(redis_server)
    prefix = new_prefix()
    raw = redis.Redis.from_url(redis_server.url)
    key = f"{prefix}:ps:a"
    t, lost = raw_transport(redis_server, prefix)
    t.subscribe("a")
    raw.xadd(key, {"e": b"0"})
    assert recv_all(t, 1) == [b"0"]
    raw.xadd(key, {"e": b"1"})
    redis_server.kill()
    assert t.recv(0.1) == []  # no exception: counted, retried later
    assert t.recv(0.1) == []
    assert t.stats.get("drops", "disconnected") == 1
    redis_server.start()
    assert recv_all(t, 1) == [b"1"] and lost == []  # resumed where it was: nothing lost
    redis_server.kill()
    assert t.recv(0.1) == []
    redis_server.start()
    raw.xadd(key, {"e": b"2"})
    raw.xadd(key, {"e": b"3"})
    raw.xtrim(key, maxlen=1, approximate=False)  # before the subscriber is back
    assert recv_all(t, 1) == [b"3"] and lost == [("a", "trimmed")]
    t.close()
    raw.close()


def test_subscribe_while_the_server_is_down_resolves_later_and_reports_the_topic(redis_server):
    prefix = new_prefix()
    redis_server.kill()
    t, lost = raw_transport(redis_server, prefix)
    t.subscribe("a")  # does not raise
    assert t.recv(0.05) == []
    redis_server.start()
    raw = redis.Redis.from_url(redis_server.url)
    wait_for(lambda: t.recv(0.05) == [] and lost, what="the subscription to resolve")
    assert lost == [("a", "subscribe_delayed")]
    raw.xadd(f"{prefix}:ps:a", {"e": b"x"})
    assert recv_all(t, 1) == [b"x"]
    t.close()
    raw.close()


def test_a_key_that_is_not_a_stream_is_left_out_and_the_rest_flows(shared_redis):
    prefix = new_prefix()
    raw = redis.Redis.from_url(shared_redis.url)
    raw.set(f"{prefix}:ps:b", "another application's string")
    t, lost = raw_transport(shared_redis, prefix)
    for topic in ("a", "b", "c"):
        t.subscribe(topic)
    raw.xadd(f"{prefix}:ps:a", {"e": b"a1"})
    assert recv_all(t, 1) == [b"a1"]
    start = time.monotonic()
    assert t.recv(0.1) == [] and time.monotonic() - start >= 0.09  # blocks: no busy loop
    # A stream replaced by another type under a running subscriber: found, left out.
    raw.delete(f"{prefix}:ps:c")
    raw.set(f"{prefix}:ps:c", "x")
    raw.xadd(f"{prefix}:ps:a", {"e": b"a2"})
    assert recv_all(t, 1) == [b"a2"]
    raw.xadd(f"{prefix}:ps:a", {"e": b"a3"})
    assert recv_all(t, 1) == [b"a3"]
    assert lost == []
    t.close()
    raw.close()


def test_envelopes_due_together_go_in_one_round_trip_and_an_error_reply_loses_only_its_own(shared_redis):
    prefix = new_prefix()
    raw = redis.Redis.from_url(shared_redis.url)
    raw.set(f"{prefix}:ps:b", "another application's string")  # XADD to it: WRONGTYPE
    pub = make_pub(shared_redis, prefix, batch_linger=5.0, batch_pause=0)
    conn = pub.transport._conn
    writes = []
    send_packed = conn.send_packed_command

    def counted(command, *args, **kwargs):  # the real connection, its requests that write counted
        packed = command if isinstance(command, bytes) else b"".join(command)
        if b"XADD" in packed:  # (not the background thread's poll of the join counter)
            writes.append(packed)
        return send_packed(command, *args, **kwargs)

    conn.send_packed_command = counted
    with pub._lock:  # as if the last window had been busy: every event waits in its batch
        pub._busy, pub._window_end = True, float("inf")
    for i, topic in enumerate("abc" * 4):
        pub.publish(topic, "t", f"k{i}", "update", i + 1)
    assert writes == []
    pub.flush()
    assert len(writes) == 1  # three XADDs, one request
    assert pub.stats.get("envelopes_out") == 2 and pub.stats.get("events_out") == 8
    assert pub.stats.get("drops", "send_failed") == 4 and pub.stats.get("send_errors") == 1
    for topic in "ac":
        (_, fields), = raw.xrange(f"{prefix}:ps:{topic}")
        envelope = decode(fields[b"e"])
        assert (envelope.topic, envelope.seq, envelope.count) == (topic, 1, 4)
    # The connection is still in step: the next envelope's reply is its own.
    pub.publish("a", "t", "k", "update", 99)
    pub.flush()
    assert raw.xlen(f"{prefix}:ps:a") == 2 and pub.stats.get("envelopes_out") == 3
    pub.close()
    raw.close()


@pytest.mark.alone  # a bound on elapsed time
def test_close_wakes_a_blocked_recv_and_later_calls_raise(shared_redis):
    t, _ = raw_transport(shared_redis, new_prefix(), block_ms=1000)
    t.subscribe("a")
    t.subscribe("$ctl")
    done = threading.Event()
    errors = []

    def loop():
        try:
            while True:
                t.recv(5.0)
        except ClosedError as exc:
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.2)
    start = time.monotonic()
    t.close()
    assert done.wait(2.0) and time.monotonic() - start < 1.5
    assert errors
    with pytest.raises(ClosedError):
        t.recv(0.1)
    with pytest.raises(ClosedError):
        t.subscribe("b")


def test_a_publisher_keeps_going_while_redis_is_down(redis_server):
    prefix = new_prefix()
    redis_server.kill()
    pub = make_pub(redis_server, prefix)  # the start hello fails: counted, not raised
    start = time.monotonic()
    for i in range(5000):
        pub.publish("a", "t", f"k{i}", "create", 1)
    pub.flush()
    assert time.monotonic() - start < 5
    assert pub.stats.get("drops", "send_failed") == 5000
    redis_server.start()
    sink = Sink(redis_server, prefix, ["a"])
    sink.sub.start()
    n = iter(range(1, 100_000))

    def arrived():
        pub.publish("a", "t", f"after{next(n)}", "create", 1)
        pub.flush()
        return sink.keys()

    wait_for(arrived, interval=0.05, what="the publisher to reconnect")
    pub.close()
    sink.close()


@pytest.mark.parametrize("url, options, match", [
    ("redis://127.0.0.1:1/0", {"nope": 1}, "nope"),
    ("redis://127.0.0.1:1/0", {"maxlen": 0}, "maxlen"),
    ("redis://127.0.0.1:1/0", {"block_ms": 5000, "timeout": 1.0}, "block_ms"),
    ("redis://127.0.0.1:1/0", {"prefix": ""}, "prefix"),
    (None, {}, "needs a URL"),
    ("tcp://127.0.0.1:1", {}, "needs a URL"),
    ("redis://127.0.0.1:notaport/0", {}, "invalid Redis URL"),
])
def test_bad_configuration_is_a_config_error(url, options, match):
    with pytest.raises(ConfigError, match=match):
        RedisStreamsDriver(url, options)


def test_uri_hides_the_password():
    driver = RedisStreamsDriver("redis://app:s3cret@127.0.0.1:1/2?password=s3cret&db=2", {"timeout": 0.2})
    pub = driver.publisher(Stats("publisher", "p"))
    assert "s3cret" not in pub.uri and pub.uri.startswith("redis://app@127.0.0.1:1/2")
    pub.close()
