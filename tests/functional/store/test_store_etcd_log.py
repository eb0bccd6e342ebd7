"""The etcd store's write log (dfpubsub/store/etcd_log.py) against a private etcd: a range read of
feedlast's history gives exactly the writes the feed's watch gives, at once; what it cannot name
(an older writer's empty value, garbage, too long a span) sends the caller to the watch; compacted
revisions are history gone; and a replay over it is complete and fast."""

from __future__ import annotations

import time

import grpc
import pytest
from aetcd import rpc

from dfpubsub.backends.foreign import SKIPPED
from dfpubsub.controller import VersionedCache
from dfpubsub.controller.relist import relist
from dfpubsub.controller.replay import replay
from dfpubsub.errors import HistoryGone
from dfpubsub.events import Action
from dfpubsub.store import etcd_log
from dfpubsub.store.etcd import EtcdStore

TABLES = ["port", "network"]


@pytest.fixture
def store(etcd_server):
    s = EtcdStore(etcd_server.url, TABLES, timeout=5.0)
    s.initialize()
    yield s
    s.close()


def _watched(store, after, top):
    """The entries the feed's watch gives after ``after`` up to ``top``."""
    reader, out = store.follow_feed(after), []
    deadline = time.monotonic() + 20
    try:
        while reader.position < top and time.monotonic() < deadline:
            out.extend(reader.read(1000, 0.2))
    finally:
        reader.close()
    return out


def _raw(store, *requests):
    channel = grpc.insecure_channel(store.url[len("etcd://"):])
    kv = rpc.KVStub(channel)
    for request in requests:
        kv.Compact(request) if isinstance(request, rpc.CompactionRequest) else kv.Put(request)
    channel.close()


def test_the_log_gives_the_writes_the_watch_gives(store):
    store.create("port", "before", {})
    after = store.feed_head()
    store.create("port", "a", {"i": 1}, topic="tenant-a")
    store.create("network", "n", {"i": 2})
    store.update("port", "a", {"i": 3})  # keeps its topic: the entry names the table, as the watch's does
    _raw(store, rpc.PutRequest(key=b"/somebody/else", value=b"x"))  # a revision that is no store write
    store.update("port", "a", {"i": 4}, topic="tenant-b")
    store.delete("network", "n")
    store.delete("port", "a")
    store.create("port", "a", {"i": 5})
    entries, top = store.read_writes(after)
    assert top == store.feed_last()
    assert [(e.table, e.key, e.action) for e in entries] == [
        ("port", "a", Action.CREATE), ("network", "n", Action.CREATE), ("port", "a", Action.UPDATE),
        ("port", "a", Action.UPDATE), ("network", "n", Action.DELETE), ("port", "a", Action.DELETE),
        ("port", "a", Action.CREATE)]
    watched = _watched(store, after, top)
    assert [(e.revision, e.table, e.key, e.action) for e in entries] == \
        [(e.revision, e.table, e.key, e.action) for e in watched]
    # Topics where the write knew them; the watch's delete names the topic its key held.
    assert [e.topic for e in entries] == ["tenant-a", "network", "port", "tenant-b", "network", "port", "port"]
    assert store.read_writes(top) == ([], top)  # nothing since: one range read, nothing waited for


def test_what_the_log_cannot_name_sends_the_reader_to_the_watch(store, monkeypatch):
    after = store.feed_head()
    store.create("port", "a", {})
    _raw(store, rpc.PutRequest(key=f"/{store.prefix}/feedlast".encode()))  # an older writer: empty
    assert store.read_writes(after) is None
    after = store.feed_last()
    store.create("port", "b", {})
    before = SKIPPED.get("store_feed", "malformed")
    _raw(store, rpc.PutRequest(key=f"/{store.prefix}/feedlast".encode(), value=b"u\x00nosuch\x00k\x00"))
    assert store.read_writes(after) is None
    assert SKIPPED.get("store_feed", "malformed") == before + 1
    after = store.feed_last()
    for i in range(5):
        store.create("port", f"c{i}", {})
    monkeypatch.setattr(etcd_log, "SPAN", 3)  # more revisions than a range read looks at
    assert store.read_writes(after) is None
    monkeypatch.setattr(etcd_log, "SPAN", 5)
    assert [e.key for e in store.read_writes(after)[0]] == [f"c{i}" for i in range(5)]


def test_compacted_revisions_are_history_gone(store):
    after = store.feed_head()
    for i in range(10):
        store.create("port", f"k{i}", {})
    _raw(store, rpc.CompactionRequest(revision=store.feed_head() - 3))
    with pytest.raises(HistoryGone):
        store.read_writes(after)
    assert [e.key for e in store.read_writes(store.feed_head() - 2)[0]] == ["k8", "k9"]


def test_a_replay_over_the_log_is_complete_and_takes_no_catch_up_round(store):
    for i in range(200):
        store.create("port", f"p{i}", {"i": i})
    cache = VersionedCache()
    position = relist(store, cache, {"port"}).revision
    store.update("port", "p1", {"i": -1})
    store.delete("port", "p2")
    store.create("port", "new", {"i": 0})
    times = []
    for _ in range(5):
        started = time.perf_counter()
        done = replay(store, cache, {"port"}, position, max_entries=1000)
        times.append(time.perf_counter() - started)
    assert done.complete and done.entries == 3 and done.position == store.feed_last()
    assert {(o.key, o.version) for o in cache.items()} == {(o.key, o.version) for o in store.list("port")}
    # A watch from a past revision waits for etcd's catch-up round (every 100 ms): the log does not.
    assert min(times) < 0.05, times
