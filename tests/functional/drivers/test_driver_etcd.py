"""The etcd watch driver with real etcd servers: topics, bad input, a restarted server, compaction, leases, fork."""

import itertools
import os
import threading
import time
import urllib.request

import grpc
import msgpack
import pytest
from aetcd import rpc
from dfpubsub.drivers.etcd_watch import EtcdWatchDriver

from dfpubsub import (
    ClosedError,
    ConfigError,
    Publisher,
    PublisherOptions,
    TransportError,
)
from dfpubsub.codec import BatchHeader, encode_batch, pack_event
from dfpubsub.metrics import Stats
from dfpubsub.publisher import _QUIET
from dfpubsub.testing.servers import free_port
from dfpubsub.transport import SubscriberTransport
from tests.conftest import reap, wait_for
from tests.functional.sink_helpers import RecordingSink, light_traffic_while_stopped

_n = itertools.count()


def driver(server, **options):
    """A driver on ``server`` under a key prefix of the test's own."""
    return EtcdWatchDriver(server.url, {"prefix": f"t{next(_n)}-{os.getpid()}", **options})


def make_pub(drv, name="pub", **opts):
    stats = Stats("publisher", name)
    options = PublisherOptions(**{"batch_linger": 0.001, "max_idle_time": 0.3, **opts})
    return Publisher(drv.publisher(stats), name, options, stats)


class Sink(RecordingSink):
    """A core Subscriber that records events, resync requests and resyncs."""

    def __init__(self, transport, topics, stats=None, **opts):
        super().__init__(transport, topics, stats, **{"max_idle_time": 0.5, **opts})

    @classmethod
    def on(cls, drv, topics, **opts):
        stats = Stats("subscriber", "sink")
        return cls(drv.subscriber(stats), topics, stats, **opts)

    def start(self):
        self.sub.start()
        assert self.sub.wait_synced(10)
        return self


def ready(pub, *sinks):
    """Say hello until every subscriber heard one: its watch is live."""
    for s in sinks:
        wait_for(lambda: pub.hello() or s.stats.get("hellos_in") > 0, what="the subscriber to hear a hello")


class RawEtcd:
    """A plain gRPC client, for what no publisher would write and for admin calls."""

    def __init__(self, server):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)

    def put(self, key, value):
        self.kv.Put(rpc.PutRequest(key=key.encode(), value=value), timeout=5)

    def revision(self):
        return self.kv.Range(rpc.RangeRequest(key=b"\0"), timeout=5).header.revision

    def keys(self, prefix):
        start = prefix.encode()
        return self.kv.Range(rpc.RangeRequest(key=start, range_end=start[:-1] + b"0", keys_only=True), timeout=5).kvs

    def close(self):
        self.channel.close()


def raw_envelope(topic, seq, key):
    return encode_batch(BatchHeader("raw-pub", "raw", topic), seq, 1.0, [pack_event("t", key, "create", 1, None, 0.0)])


# -- options -------------------------------------------------------------------------------


def test_bad_options_and_urls_are_config_errors():
    for options in ({"lease_ttl": 0}, {"timeout": -1}, {"prefix": "a/b"}, {"prefix": ""}, {"nope": 1},
                    {"max_pending_bytes": 0}, {"lease_ttl": "soon"}):
        with pytest.raises(ConfigError):
            EtcdWatchDriver("etcd://127.0.0.1:2379", options)
    for url in (None, "etcd://", "etcd://host", "etcd://host:port", "redis://h:1"):
        with pytest.raises(ConfigError):
            EtcdWatchDriver(url, {})
    drv = EtcdWatchDriver("etcd://127.0.0.1:1,127.0.0.1:2", {"lease_ttl": 10})
    assert drv.name == "etcd" and drv.etcd_options.lease_ttl == 10 and drv.etcd_options.prefix == "dfpubsub"


# -- 1. topics -----------------------------------------------------------------------------


def test_two_subscribers_get_exactly_their_topics_in_order_without_false_gaps(shared_etcd):
    drv = driver(shared_etcd)
    pub = make_pub(drv, batch_max_events=16)
    topics = ("port", "portbinding", "po", "a", "a/b")  # prefixes of each other, and a slash
    s1 = Sink.on(drv, ["port", "a"]).start()
    s2 = Sink.on(drv, ["portbinding", "a/b"]).start()
    ready(pub, s1, s2)
    for i in range(3000):
        pub.publish(topics[i % 5], "t", f"k{i}", "update", i + 1)
    pub.flush()
    wait_for(lambda: all(len(s.seqs(t)) == 600 for s, ts in ((s1, ("port", "a")), (s2, ("portbinding", "a/b")))
                         for t in ts), what="every event")
    for s, ts in ((s1, {"port", "a"}), (s2, {"portbinding", "a/b"})):
        assert {e.topic for e in s.events} == ts
        assert all(s.seqs(t) == list(range(1, 601)) for t in ts)
        assert s.stats.get("gaps") == 0 and s.gaps == [] and s.stats.get("duplicates") == 0
        assert s.stats.get("drops") == 0  # the driver's own filter was exact: nothing reached the core's check
        assert s.resyncs == [ts]  # the initial sync only
    pub.close()
    wait_for(lambda: s1.stats.get("hellos_in") >= 2)  # the bye
    s1.sub.close()
    s2.sub.close()


# -- 2. bad input ----------------------------------------------------------------------------


def test_malformed_values_put_under_the_prefix_are_counted_and_skipped(shared_etcd):
    drv = driver(shared_etcd)
    root = f"/{drv.etcd_options.prefix}/ps"
    pub = make_pub(drv)
    sink = Sink.on(drv, ["a"], max_message_bytes=64 * 1024).start()
    ready(pub, sink)
    raw = RawEtcd(shared_etcd)
    bad = {
        "not_msgpack": b"\xc1 not msgpack",
        "schema_version": msgpack.packb({"v": 99, "kind": "event"}),
        "truncated": raw_envelope("a", 10_000, "big")[:-5],
        "oversize": b"\x00" * (100 * 1024),
        "malformed": b"\x93\x01\x02\x03",
        "empty": b"",
    }
    for i in range(10):
        for reason, value in bad.items():
            raw.put(f"{root}/a/raw-{reason}-{i}", value)
        raw.put(f"{root}/a/raw-foreign-{i}", raw_envelope("zzz", i + 1, "wrong-topic-inside"))
        raw.put(f"{root}/zzz/raw-{i}", raw_envelope("a", i + 1, "under-another-topic"))  # not ours: not even read
        raw.put(f"{root}/a", b"\xc1 a key with no topic part")
        raw.kv.DeleteRange(rpc.DeleteRangeRequest(key=f"{root}/a/raw-empty-{i}".encode()), timeout=5)
        pub.publish("a", "t", f"good{i}", "create", i + 1)
    wait_for(lambda: len(sink.seqs("a", pub.id)) == 10)
    wait_for(lambda: sink.stats.get("decode_errors") == 10 * 6 and sink.stats.get("drops", "foreign_topic") >= 10)
    s = sink.stats
    for reason, n in (("not_msgpack", 10), ("schema_version", 10), ("truncated", 20), ("oversize", 10),
                      ("malformed", 10)):  # an empty value is a truncated one
        assert s.get("decode_errors", reason) == n, reason
    assert [e.key for e in sink.events if e.publisher_id == pub.id] == [f"good{i}" for i in range(10)]
    assert not [e for e in sink.events if e.key == "under-another-topic"]
    assert sink.gaps == []
    raw.close()
    pub.close()
    sink.sub.close()


# -- 3. a restarted server --------------------------------------------------------------------


def test_subscribers_resume_from_their_revision_when_etcd_is_killed_and_restarted(etcd_server):
    drv = driver(etcd_server)
    pub = make_pub(drv, batch_linger=0)
    s1 = Sink.on(drv, ["a"]).start()
    s2 = Sink.on(drv, ["a", "b"]).start()
    ready(pub, s1, s2)
    stop = threading.Event()
    published = [0]

    def publish_loop():
        for i in itertools.count():
            if stop.is_set():
                return
            pub.publish("ab"[i % 2], "t", f"k{i % 50}", "update", i + 1)
            published[0] += 1
            time.sleep(0.001)

    publisher = threading.Thread(target=publish_loop)
    publisher.start()
    try:
        wait_for(lambda: len(s2.seqs("b")) >= 50, what="traffic before the kill")
        etcd_server.kill()
        wait_for(lambda: pub.stats.get("send_errors") >= 20, what="sends to fail while etcd is down")
        etcd_server.start()
        at_restart = published[0]
        wait_for(lambda: published[0] >= at_restart + 300, timeout=30, what="publishing after the restart")
    finally:
        stop.set()
        publisher.join()
    pub.flush()
    sent = pub.sequences()
    pub.hello()  # reveals losses at the very end
    for s, topics in ((s1, ("a",)), (s2, ("a", "b"))):
        wanted = {t: sent[t] for t in topics}
        wait_for(lambda: s.undetected_losses(pub.id, wanted) == {t: [] for t in topics}, timeout=20,
                 what="every sequence delivered or inside a resync request's missing range")
        assert s.stats.get("drops", "disconnected") >= 1
        # Whatever etcd accepted was delivered: only the envelopes refused while it was down are missing.
        delivered = sum(len(set(s.seqs(t, pub.id))) for t in topics)
        refused = pub.stats.get("drops")  # envelopes (of one event) refused, or in a failed transaction
        assert delivered >= sum(wanted.values()) - refused
        # Gaps, and the publisher's silence while etcd restarted (the core's own reaction): no "compacted".
        assert {g.reason for g in s.gaps} <= {"gap_expired", "hold_overflow", "publisher_lost", "first_seen"}
    assert pub.stats.get("drops") > 0  # the loss was real
    pub.close()
    s1.sub.close()
    s2.sub.close()


# -- 4. compaction ------------------------------------------------------------------------------


class Gate(SubscriberTransport):
    """Passes everything to ``inner``, except that ``recv`` is held while the gate is shut."""

    def __init__(self, inner):
        self.inner = inner
        self.open = threading.Event()
        self.open.set()
        self.parked = threading.Event()

    @property
    def on_lost(self):
        return self.inner.on_lost

    @on_lost.setter
    def on_lost(self, fn):
        self.inner.on_lost = fn

    def subscribe(self, topic):
        self.inner.subscribe(topic)

    def unsubscribe(self, topic):
        self.inner.unsubscribe(topic)

    def recv(self, timeout):
        if not self.open.is_set():
            self.parked.set()
            self.open.wait(timeout)
            return []
        return self.inner.recv(timeout)

    def close(self):
        self.open.set()
        self.inner.close()


def test_a_subscriber_behind_a_compaction_resyncs_its_topics_and_goes_on(etcd_server):
    drv = driver(etcd_server, max_pending_bytes=2000)
    pub = make_pub(drv, batch_linger=0, max_idle_time=1.0)
    stats = Stats("subscriber", "sink")
    inner = drv.subscriber(stats)
    gate = Gate(inner)
    sink = Sink(gate, ["a"], stats, max_idle_time=1.0).start()
    ready(pub, sink)
    for i in range(10):
        pub.publish("a", "t", f"before{i}", "create", i + 1)
    wait_for(lambda: len(sink.seqs("a")) == 10)
    gate.open.clear()
    wait_for(gate.parked.is_set)
    for i in range(200):  # ~200 bytes each: the inbox fills with 2000 and the watch pauses
        pub.publish("a", "t", f"stalled{i}", "create", i + 1)
    wait_for(lambda: inner.paused, what="the watch to pause")
    raw = RawEtcd(etcd_server)
    for i in range(20):  # written after the pause for sure: the watch has not seen them
        pub.publish("a", "t", f"unseen{i}", "create", i + 1)
    pub.flush()
    wait_for(lambda: raw.revision() > inner.revision, what="revisions the paused watch has not received")
    raw.kv.Compact(rpc.CompactionRequest(revision=raw.revision(), physical=True), timeout=5)
    gate.open.set()
    # Longer than the default: on a loaded CI machine a physical compaction stalls etcd, and the
    # watch's first attempts after it can fail and back off before one sees the compaction.
    wait_for(lambda: any(g.reason == "compacted" for g in sink.gaps), timeout=30,
             what="the compaction to be noticed")
    assert [(g.topic, g.reason) for g in sink.gaps if g.reason == "compacted"] == [("a", "compacted")]
    wait_for(lambda: len(sink.resyncs) >= 2 and "a" in sink.resyncs[-1], what="a resync of the topic")
    for i in range(10):
        pub.publish("a", "t", f"after{i}", "update", i + 2)
    wait_for(lambda: [e.key for e in sink.events[-10:]] == [f"after{i}" for i in range(10)], what="traffic after")
    sent = pub.sequences()
    assert len(sink.seqs("a")) < sent["a"]  # the loss was real: part of the stalled events were compacted away
    wait_for(lambda: sink.undetected_losses(pub.id, sent) == {"a": []}, what="the rest of the loss to be a gap")
    raw.close()
    pub.close()
    sink.sub.close()


# -- leases, close, fork ------------------------------------------------------------------------


def test_envelopes_expire_with_their_lease_and_deletions_are_not_delivered(shared_etcd):
    drv = driver(shared_etcd, lease_ttl=1)  # etcd's shortest lease is about 2 s anyway
    transport = drv.publisher(Stats("publisher", "p"))
    sub = drv.subscriber(Stats("subscriber", "s"))
    sub.subscribe("a")
    raw = RawEtcd(shared_etcd)
    prefix = f"/{drv.etcd_options.prefix}/ps/"
    for i in range(5):
        transport.send("a", b"frame%d" % i)
    wait_for(lambda: len(raw.keys(prefix)) == 5)
    keys = raw.keys(prefix)
    assert all(k.key.decode().startswith(f"{prefix}a/") for k in keys)
    got = []
    wait_for(lambda: got.extend(sub.recv(0.1)) or len(got) == 5)
    assert got == [b"frame%d" % i for i in range(5)]
    wait_for(lambda: not raw.keys(prefix), timeout=15, interval=0.2, what="the lease to expire")
    assert sub.recv(0.3) == []  # the deletions are not frames
    transport.send("a", b"later")  # a fresh lease, as the old one is gone
    wait_for(lambda: got.extend(sub.recv(0.1)) or got[-1] == b"later")
    wait_for(lambda: len(raw.keys(prefix)) == 1)
    transport.close()
    sub.close()
    raw.close()


def _writes(server):
    """How many Put and Txn requests etcd has handled, from its own metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines if line.startswith("grpc_server_handled_total{")
               and ('grpc_method="Put"' in line or 'grpc_method="Txn"' in line))


def test_envelopes_queued_during_a_write_go_in_order_in_one_transaction(etcd_server):
    drv = driver(etcd_server, max_txn_ops=16)
    transport = drv.publisher(Stats("publisher", "p"))
    sub = drv.subscriber(Stats("subscriber", "s"))
    sub.subscribe("a")
    sub.subscribe("b")
    frames = [("ab"[i % 2], b"f%d" % i) for i in range(500)]
    before = _writes(etcd_server)
    for topic, frame in frames:
        transport.send(topic, frame)
    got = []
    wait_for(lambda: got.extend(sub.recv(0.1)) or len(got) >= 500)
    assert got == [f for _, f in frames]
    writes = _writes(etcd_server) - before
    assert 500 / 16 <= writes <= 100, writes
    transport.close()
    sub.close()


def test_light_traffic_is_batched_while_envelopes_wait_unwritten_behind_a_stalled_etcd(etcd_server):
    """While a transaction hangs on etcd (SIGSTOP: a server starved or stuck), what the publisher
    would send waits unwritten anyway: it batches instead of queueing an envelope per event."""
    drv = driver(etcd_server)
    pub = make_pub(drv, batch_linger=0.2)
    sink = Sink.on(drv, ["t"]).start()
    ready(pub, sink)
    wait_for(lambda: time.monotonic() > pub._last_send + _QUIET, what="a quiet spell after the hellos")
    assert light_traffic_while_stopped(pub, etcd_server) > 0
    pub.flush()
    wait_for(lambda: len(sink.seqs("t")) == 20, what="every event once etcd runs again")
    assert sink.seqs("t") == list(range(1, 21)) and sink.gaps == []
    assert pub.stats.get("envelopes_out") < 10  # one an event before
    pub.close()
    sink.sub.close()


@pytest.mark.alone  # a bound on elapsed time
def test_close_wakes_a_blocked_recv_and_later_calls_are_refused(shared_etcd):
    drv = driver(shared_etcd)
    sub = drv.subscriber(Stats("subscriber", "s"))
    sub.subscribe("a")
    outcome = []

    def receive():
        try:
            while True:
                sub.recv(30)
        except ClosedError as exc:
            outcome.append(exc)

    t = threading.Thread(target=receive)
    t.start()
    time.sleep(0.2)  # let recv block
    started = time.monotonic()
    sub.close()
    t.join(5)
    assert not t.is_alive() and outcome and time.monotonic() - started < 2
    with pytest.raises(ClosedError):
        sub.recv(0.1)
    with pytest.raises(ClosedError):
        sub.subscribe("b")
    pub = drv.publisher(Stats("publisher", "p"))
    pub.close()
    with pytest.raises(ClosedError):
        pub.send("a", b"x")


@pytest.mark.alone  # a bound on elapsed time
def test_transport_is_unavailable_not_hung_without_a_server():
    drv = EtcdWatchDriver(f"etcd://127.0.0.1:{free_port()}", {"timeout": 1.0})
    pstats = Stats("publisher", "p")
    transport = drv.publisher(pstats)
    started = time.monotonic()
    transport.send("a", b"x")  # queued: the failed transaction is told by the next send

    def refused():
        try:
            transport.send("a", b"y")
        except TransportError:
            return True
        return False

    wait_for(refused, timeout=2)
    assert time.monotonic() - started < 2 and pstats.get("drops", "txn_failed") >= 1
    stats = Stats("subscriber", "s")
    sub = drv.subscriber(stats)
    sub.subscribe("a")
    wait_for(lambda: sub.recv(0.1) == [] and stats.get("drops", "disconnected") >= 1)
    sub.close()
    transport.close()


@pytest.mark.own_process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_loses_nothing_and_the_child_publishes_on_its_own_connection(shared_etcd):
    drv = driver(shared_etcd)
    transport = drv.publisher(Stats("publisher", "p"))
    sub = drv.subscriber(Stats("subscriber", "s"))
    sub.subscribe("a")
    got = []
    transport.send("a", b"parent-1")
    wait_for(lambda: got.extend(sub.recv(0.1)) or got == [b"parent-1"])
    pid = os.fork()  # the watch is live in the parent
    if pid == 0:  # child: report through the exit status, never return into pytest
        code = 1
        try:
            transport.send("a", b"child")
            transport.close()  # writes what is queued
            code = 0
        finally:
            os._exit(code)
    transport.send("a", b"parent-2")
    assert reap(pid) == 0
    transport.send("a", b"parent-3")
    wait_for(lambda: got.extend(sub.recv(0.1)) or len(got) == 4)
    assert sorted(got) == sorted([b"parent-1", b"parent-2", b"child", b"parent-3"]) and got[-1] == b"parent-3"
    transport.close()
    sub.close()
