"""The change feed on all three backends: every committed write, in order, nothing else; bounded
history that says when it is gone; foreign entries skipped; followers woken by writers."""

import itertools
import signal
import sqlite3
import threading
import time

import grpc
import pytest
import redis
from aetcd import rpc

from dfpubsub.errors import AlreadyExists, HistoryGone, NotFound, StoreUnavailable, VersionConflict
from dfpubsub.events import Action
from dfpubsub.store import FeedRetention, open_store

TABLES = ["port", "network"]
_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def opener(request, tmp_path):
    """open(**options) -> a store on one shared location per test, per backend."""
    if request.param == "sqlite":
        url, base = f"sqlite:///{tmp_path}/nb.sqlite", {}
    else:
        server = request.getfixturevalue(f"shared_{request.param}")
        url, base = server.url, {"prefix": f"feed{next(_prefix)}-{tmp_path.name}"}
    opened = []

    def open_(**options):
        s = open_store(url, TABLES, **base, **options)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


def _all(store, after, want):
    """Read the feed until ``want`` entries came (etcd delivers history within a catch-up round)."""
    out = []
    reader = store.follow_feed(after)
    deadline = time.monotonic() + 10
    while len(out) < want and time.monotonic() < deadline:
        out += reader.read(timeout=0.5)
    reader.close()
    return out


def test_every_committed_write_is_one_entry_in_order(opener):
    store = opener()
    head = store.feed_head()
    a = store.create("port", "p1", {"n": 1})
    b = store.update("port", "p1", {"n": 2})
    c = store.create("network", "n1", {"x": 1}, topic="tenant-7")
    # Refused writes append nothing.
    with pytest.raises(AlreadyExists):
        store.create("port", "p1", {})
    with pytest.raises(VersionConflict):
        store.update("port", "p1", {}, expected_version=a.version)
    with pytest.raises(NotFound):
        store.delete("port", "nope")
    d = store.delete("network", "n1")
    e = store.delete("port", "p1", expected_version=b.version)
    entries = _all(store, head, 5)
    assert [(x.revision, x.table, x.key, x.action) for x in entries] == [
        (a.version, "port", "p1", Action.CREATE), (b.version, "port", "p1", Action.UPDATE),
        (c.version, "network", "n1", Action.CREATE), (d.version, "network", "n1", Action.DELETE),
        (e.version, "port", "p1", Action.DELETE)]
    assert entries[2].topic == entries[3].topic == "tenant-7"
    assert store.read_feed(e.version) == [] or store.backend == "etcd"
    assert store.feed_head() == e.version
    assert store.feed_skipped == 0


@pytest.mark.alone  # a bound on elapsed time
def test_a_follower_wakes_when_another_handle_writes(opener):
    reader_store, writer = opener(), opener()
    reader = reader_store.follow_feed(reader_store.feed_head())
    assert reader.read(timeout=0.3) == []
    written = []
    timer = threading.Timer(0.2, lambda: written.append(writer.create("port", "late", {})))
    timer.start()
    started = time.monotonic()
    got = reader.read(timeout=10)
    elapsed = time.monotonic() - started
    timer.join()
    reader.close()
    assert [(x.key, x.revision) for x in got] == [("late", written[0].version)]
    assert elapsed < 2, "the follower waited for its timeout instead of being woken"
    assert reader.position == written[0].version


def test_reading_below_the_retained_count_is_history_gone(opener):
    store = opener(feed_retention=FeedRetention(max_entries=100))
    if store.backend == "etcd":
        pytest.skip("etcd's history is bounded by its server's compaction (test below)")
    head = store.feed_head()
    for i in range(700):
        store.update("port", "k", {"i": i}) if i else store.create("port", "k", {"i": i})
    with pytest.raises(HistoryGone) as info:
        store.read_feed(head)
    assert info.value.horizon > head
    reader = store.follow_feed(head)
    with pytest.raises(HistoryGone):
        reader.read(timeout=1)
    recent = store.read_feed(store.feed_head() - 50)
    assert len(recent) == 50 and recent[-1].revision == store.feed_head()


def test_compaction_by_age_raises_the_horizon(opener):
    store = opener(feed_retention=FeedRetention(max_entries=1000, max_age=0.0))
    if store.backend == "etcd":
        assert store.compact_feed() == 0
        return
    head = store.feed_head()
    store.create("port", "a", {})
    store.create("port", "b", {})
    time.sleep(1.1)  # entries carry whole seconds: both are now older than max_age
    assert store.compact_feed() == 2
    with pytest.raises(HistoryGone):
        store.read_feed(head)
    store.create("port", "c", {})
    assert [x.key for x in store.read_feed(store.feed_head() - 1)] == ["c"]


def test_etcd_compaction_below_a_cursor_is_history_gone(etcd_server):
    store = open_store(etcd_server.url, TABLES)
    try:
        head = store.feed_head()
        for i in range(20):
            store.create("port", f"k{i}", {})
        channel = grpc.insecure_channel(f"127.0.0.1:{etcd_server.port}")
        rpc.KVStub(channel).Compact(rpc.CompactionRequest(revision=store.feed_head() - 5))
        channel.close()
        with pytest.raises(HistoryGone):
            store.read_feed(head)
        assert [x.key for x in store.read_feed(store.feed_head() - 3)] == ["k17", "k18", "k19"]
    finally:
        store.close()


def test_foreign_entries_are_skipped_and_counted(opener, tmp_path):
    store = opener()
    head = store.feed_head()
    store.create("port", "before", {})
    if store.backend == "sqlite":
        with sqlite3.connect(f"{tmp_path}/nb.sqlite") as raw:
            raw.execute("UPDATE nb_meta SET value = value + 2 WHERE name = 'revision'")
            rev = raw.execute("SELECT value FROM nb_meta WHERE name = 'revision'").fetchone()[0]
            raw.execute("INSERT INTO nb_feed (rev, topic, tbl, key, action) VALUES (?, 'x', 'port', 'k', 'explode')",
                        (rev - 1,))
            raw.execute("INSERT INTO nb_feed (rev, topic, tbl, key, action) VALUES (?, 'x', 'nosuch', 'k', 'create')",
                        (rev,))
    elif store.backend == "redis":
        raw = redis.Redis.from_url(store.url)
        rev = raw.incrby(f"{store.prefix}:nb:rev", 2)
        raw.xadd(f"{store.prefix}:nb:feed", {"junk": b"\xff\x00"}, id=f"{rev - 1}-0")
        raw.xadd(f"{store.prefix}:nb:feed", {"p": "x", "t": "port", "k": "", "a": "create"}, id=f"{rev}-0")
        raw.close()
    else:
        channel = grpc.insecure_channel(store.url[len("etcd://"):])
        kv = rpc.KVStub(channel)
        kv.Put(rpc.PutRequest(key=f"/{store.prefix}/nb/nosuch/k".encode(), value=b"\xc1"))
        kv.Put(rpc.PutRequest(key=f"/{store.prefix}/nb/\xff-not-a-table".encode("latin-1"), value=b""))
        channel.close()
    store.create("port", "after", {})
    entries = _all(store, head, 2)
    assert [x.key for x in entries] == ["before", "after"]
    assert store.feed_skipped == 2


def test_an_etcd_that_goes_silent_fails_the_follower_instead_of_hanging_it(etcd_server):
    """A member alive but cut off answers nothing (SIGSTOP stands in for it): the follower's
    progress requests go unanswered, it drops the stream, and the next read watches again."""
    store = open_store(etcd_server.url, TABLES, timeout=1.0)
    reader = store.follow_feed(store.feed_head())
    try:
        store.create("port", "before", {})
        assert [x.key for x in _read_until(reader, 1)] == ["before"]
        etcd_server.proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            while time.monotonic() - started < 20:
                reader.read(timeout=0.5)
        assert time.monotonic() - started < 10
        etcd_server.proc.send_signal(signal.SIGCONT)
        store.create("port", "after", {})
        assert [x.key for x in _read_until(reader, 1)] == ["after"]
    finally:
        etcd_server.proc.send_signal(signal.SIGCONT)
        reader.close()
        store.close()


def _read_until(reader, want):
    out, deadline = [], time.monotonic() + 15
    while len(out) < want and time.monotonic() < deadline:
        try:
            out += reader.read(timeout=0.5)
        except StoreUnavailable:
            time.sleep(0.1)
    return out
