"""The resync's relist against real stores: versions first, and truth wins up to the listing's revision."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dfpubsub.controller import VersionedCache
from dfpubsub.controller.relist import relist
from dfpubsub.events import Action, Event
from dfpubsub.store import open_store

TABLES = ["port", "network"]
TOPICS = {"port", "network"}
FORGED = (1 << 64) - 1
_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    else:
        server = request.getfixturevalue(f"shared_{request.param}")
        s = open_store(server.url, TABLES, prefix=f"rl{next(_prefix)}-{tmp_path.name}")
    yield s
    s.close()


def event(obj, action=Action.UPDATE, version=None, value=None):
    return Event(obj.topic, obj.table, obj.key, action, obj.version if version is None else version,
                 obj.value if value is None else value)


def as_dict(cache):
    return {(o.table, o.key): o for o in cache.items()}


def listing(store):
    return {(o.table, o.key): o for o in store.list_topics(TOPICS)}


def test_store_revision_covers_every_listed_write(store):
    objs = [store.create("port", f"p{i}", {"i": i}) for i in range(5)]
    store.delete("port", "p0")
    objects, revision = store.list_at(TOPICS)
    versions, revision_v = store.list_versions_at(TOPICS)
    assert sorted(objects) == sorted(store.list_topics(TOPICS))
    assert sorted(versions) == sorted((o.topic, o.table, o.key, o.version) for o in objects)
    assert revision >= max(o.version for o in objs) and revision_v >= revision
    assert store.create("network", "n", 1).version > revision_v  # a later write is above it


def test_a_forged_huge_version_is_replaced_by_the_store(store):
    real = store.create("port", "p1", {"mac": "aa"})
    store.create("port", "p2", {"mac": "bb"})
    cache = VersionedCache()
    relist(store, cache, TOPICS)
    assert cache.apply(event(real, version=FORGED, value={"mac": "evil"}))
    ghost = real._replace(key="ghost")
    assert cache.apply(event(ghost, Action.CREATE, version=FORGED, value="evil"))
    found = relist(store, cache, TOPICS)
    changes, count, changed = found.changes, found.objects, found.changed
    assert count == 2 and changed == len(changes) and as_dict(cache) == listing(store)
    assert {(c.action, c.key, c.version) for c in changes} == {
        (Action.UPDATE, "p1", real.version), (Action.DELETE, "ghost", FORGED)}
    # The ghost's tombstone does not keep the forged version: a genuine create later still applies.
    assert cache.version("port", "ghost") <= max(o.version for o in store.list_topics(TOPICS))
    created = store.create("port", "ghost", "real")
    assert cache.apply(event(created, Action.CREATE))
    # A forged tombstone is replaced too.
    assert cache.apply(event(real, Action.DELETE, version=FORGED))
    relist(store, cache, TOPICS)
    assert as_dict(cache) == listing(store)


def test_an_event_newer_than_the_listing_survives(store):
    p1 = store.create("port", "p1", 1)
    store.create("port", "p2", 2)
    cache = VersionedCache()
    relist(store, cache, TOPICS)
    cache.apply(event(store.update("port", "p2", 3)))  # the cache knows p2 but not p1's next write
    list_versions_at = store.list_versions_at
    late = []

    def listed_then_written(topics):
        # What a dispatch running beside the relist does: a write after the listing, applied at once.
        result = list_versions_at(topics)
        late.append(store.update("port", "p1", 10))
        late.append(store.create("network", "n1", 11))
        for obj in late:
            cache.apply(event(obj))
        return result

    store.list_versions_at = listed_then_written
    changes = relist(store, cache, TOPICS).changes
    assert late[0].version > p1.version and cache.get("port", "p1") == late[0]
    assert cache.get("network", "n1") == late[1]  # not in the listing, but provably newer: kept
    assert changes == []


@st.composite
def scenarios(draw):
    """Store objects, and a cache that saw some of them at their version, an older one, or not at
    all, plus objects the store no longer has."""
    n = draw(st.integers(0, 12))
    seen = draw(st.lists(st.sampled_from(["same", "older", "absent", "deleted"]), min_size=n, max_size=n))
    gone = draw(st.integers(0, 3))
    empty_cache = draw(st.booleans())
    return seen, gone, empty_cache


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_relist_equals_the_full_listing_path(scenario):
    seen, gone, empty_cache = scenario
    store = open_store("sqlite:///:memory:", TABLES)
    old, new = VersionedCache(), VersionedCache()
    try:
        for i, how in enumerate(seen):
            first = store.create(TABLES[i % 2], f"k{i}", {"v": 0})
            latest = store.update(first.table, first.key, {"v": 1})
            if how == "deleted":
                latest = store.delete(first.table, first.key)
            for cache in (old, new):
                if empty_cache or how == "absent":
                    continue
                cache.apply(event(first if how == "older" else latest,
                                  Action.DELETE if how == "deleted" else Action.UPDATE))
        for j in range(gone if not empty_cache else 0):
            obj = store.create("port", f"gone{j}", j)
            for cache in (old, new):
                cache.apply(event(obj, Action.CREATE))
            store.delete("port", f"gone{j}")
        expected = old.reconcile(TOPICS, store.list_topics(TOPICS))
        changes = relist(store, new, TOPICS).changes
        assert sorted(changes) == sorted(expected)
        assert as_dict(new) == as_dict(old) == listing(store)
    finally:
        store.close()


def test_a_controller_resync_replaces_a_forged_event(tmp_path):
    """End to end: a forged event with the highest version reaches a controller over a real
    transport; the next resync puts the store's object back, and later genuine writes apply."""
    from dfpubsub import Publisher, PublisherOptions, load_driver
    from dfpubsub.controller.runtime import Controller
    from dfpubsub.metrics import Stats
    from tests.conftest import wait_for

    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    real = store.create("port", "p1", {"mac": "aa"})
    driver = load_driver(f"memory://relist-{tmp_path.name}")
    ctrl = Controller(store, driver.subscriber(Stats("s", "s")), TOPICS).start()
    stats = Stats("p", "p")
    pub = Publisher(driver.publisher(stats), "forger", PublisherOptions(batch_linger=0), stats)
    try:
        assert ctrl.synced.wait(10) and ctrl.cache.get("port", "p1") == real
        pub.publish("port", "port", "p1", "update", FORGED, {"mac": "evil"})
        wait_for(lambda: ctrl.cache.version("port", "p1") == FORGED, what="the forged event applied")
        ctrl.subscriber.request_resync(TOPICS, reason="test")
        wait_for(lambda: ctrl.cache.get("port", "p1") == real, what="the resync to restore the store's object")
        newer = store.update("port", "p1", {"mac": "bb"})
        pub.publish("port", "port", "p1", "update", newer.version, newer.value)
        wait_for(lambda: ctrl.cache.get("port", "p1") == newer, what="the genuine update to apply")
    finally:
        pub.close()
        ctrl.stop()
        store.close()
