"""The replay's rules, one by one, on a real SQLite store: what it reads back, what it takes from
the entries alone, what it refuses; and that a cache equals the store afterwards whatever it held."""

import pytest

from dfpubsub.controller import TooFarBehind, VersionedCache
from dfpubsub.controller.relist import relist
from dfpubsub.controller.replay import replay
from dfpubsub.errors import HistoryGone
from dfpubsub.events import Action, Event
from dfpubsub.store import FeedRetention, open_store

TOPICS = {"port", "network"}


@pytest.fixture
def store(sqlite_store):
    return sqlite_store


def synced(store):
    """A cache listed from ``store``, and the revision it is complete up to."""
    cache = VersionedCache()
    done = relist(store, cache, TOPICS)
    cache.take_touched()
    return cache, done.revision


def event(obj, action=Action.UPDATE, version=None, value=None):
    return Event(obj.topic, obj.table, obj.key, action, obj.version if version is None else version,
                 obj.value if value is None else value)


def state(objects):
    return {(o.table, o.key): (o.version, o.value) for o in objects}


def test_a_missed_update_create_and_delete_are_read_back_and_nothing_else(store):
    objs = [store.create("port", f"p{i}", {"i": i}) for i in range(50)]
    cache, position = synced(store)
    seen = store.update("port", "p1", {"i": -1})          # the cache gets this one
    cache.apply(event(seen))
    store.update("port", "p2", {"i": -2})                  # these three it misses
    store.create("network", "n1", {"cidr": "10.0.0.0/24"})
    store.delete("port", "p3")
    done = replay(store, cache, TOPICS, position, max_entries=1000, touched=cache.take_touched())
    assert done.entries == 4
    assert done.objects == 2                               # p2 and n1: the delete needs no read
    assert {(c.action, c.key) for c in done.changes} == {(Action.UPDATE, "p2"), (Action.CREATE, "n1"),
                                                         (Action.DELETE, "p3")}
    assert state(cache.items()) == state(store.list_topics(TOPICS))
    assert done.position == store.feed_head() and len(objs) == 50


def test_a_version_no_write_explains_is_replaced_by_the_stores(store):
    p1 = store.create("port", "p1", {"ok": True})
    p2 = store.create("port", "p2", {"ok": True})
    cache, position = synced(store)
    # Forged events: one far ahead of the store, one that the store never wrote, on an object
    # that has a write since the position and one that has none.
    store.update("port", "p1", {"ok": "real"})
    cache.apply(event(p1, version=10**12, value={"forged": 1}))
    cache.apply(event(p2, version=p2.version + 1, value={"forged": 2}))
    done = replay(store, cache, TOPICS, position, max_entries=1000, touched=cache.take_touched())
    assert state(cache.items()) == state(store.list_topics(TOPICS))
    assert done.objects == 2


def test_an_event_for_an_object_the_store_never_had_is_deleted(store):
    store.create("port", "p1", {})
    cache, position = synced(store)
    cache.apply(Event("port", "port", "ghost", Action.CREATE, 10**12, {"forged": True}))
    replay(store, cache, TOPICS, position, max_entries=1000, touched=cache.take_touched())
    assert cache.get("port", "ghost") is None
    assert state(cache.items()) == state(store.list_topics(TOPICS))
    # The tombstone of the forged object does not block its genuine creation.
    assert cache.apply(event(store.create("port", "ghost", {"real": True}), Action.CREATE))


def test_an_object_that_moved_to_another_topic_leaves_the_cache(store):
    store.create("port", "p1", {}, topic="port")
    cache, position = synced(store)
    store.update("port", "p1", {"moved": True}, topic="elsewhere")
    done = replay(store, cache, TOPICS, position, max_entries=1000)
    assert cache.get("port", "p1") is None
    assert [(c.action, c.key) for c in done.changes] == [(Action.DELETE, "p1")]


def test_nothing_missed_reads_entries_and_no_object(store):
    cache, position = synced(store)
    for i in range(20):
        cache.apply(event(store.create("port", f"p{i}", {"i": i}), Action.CREATE))
    done = replay(store, cache, TOPICS, position, max_entries=1000, touched=cache.take_touched())
    assert (done.entries, done.objects, done.changes) == (20, 0, [])


def test_more_entries_than_allowed_or_history_gone_are_refused_and_change_nothing(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port"], feed_retention=FeedRetention(max_entries=10))
    store.create("port", "p0", {})
    cache, position = VersionedCache(), 0
    done = relist(store, cache, {"port"})
    position = done.revision
    for i in range(1, 30):
        store.create("port", f"p{i}", {})
    with pytest.raises(TooFarBehind):
        replay(store, cache, {"port"}, position, max_entries=5)
    store.compact_feed()
    with pytest.raises(HistoryGone):
        replay(store, cache, {"port"}, position, max_entries=1000)
    assert len(cache) == 1
    store.close()
