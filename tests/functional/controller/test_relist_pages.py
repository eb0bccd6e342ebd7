"""A relist read in pages against real stores (SQLite, a shared etcd and Redis): with creates, updates
and deletes made between the pages, the cache equals the store once the events of those writes
arrive, whether it started empty or held stale, forged and vanished objects (truth wins across
pages); and a controller's first sync in pages, then a periodic relist that reads versions only."""

from __future__ import annotations

import pytest

from dfpubsub import SubscriberOptions, load_driver
from dfpubsub.controller import Controller, RelistAdmission, VersionedCache
from dfpubsub.controller.relist import relist
from dfpubsub.errors import StoreUnavailable
from dfpubsub.events import Action, Event
from dfpubsub.metrics import Stats
from tests.conftest import wait_for
from tests.functional.store_helpers import backend_store

TABLES = ["port", "network"]
TOPICS = {"port", "network", "tenant-a"}
FORGED = (1 << 64) - 1


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def store(request, tmp_path):
    s = backend_store(request, tmp_path, TABLES, "pages")
    yield s
    s.close()


def _event(obj, action):
    return Event(obj.topic, obj.table, obj.key, action, obj.version, obj.value)


def _state(items):
    return sorted((o.table, o.key, o.topic, o.version, repr(o.value)) for o in items)


def _fill(store):
    for i in range(120):
        store.create(TABLES[i % 2], f"k{i:03d}", {"i": i}, topic="tenant-a" if i % 7 == 0 else None)
    store.create("port", "elsewhere", {"i": -1}, topic="not-listed")  # a topic the relist does not take


def _interleave(store, monkeypatch, writes):
    """Between every two pages the store reads, ``writes`` (a list of callables) run in turn; the
    objects they return become the events a controller would receive after the relist."""
    real = store.list_pages_at
    events: list[Event] = []
    turns = iter(writes)

    def list_pages_at(topics, page_size, values=True):
        revision, pages = real(topics, page_size, values)

        def interleaved():
            for page in pages:
                yield page
                write = next(turns, None)
                if write is not None:
                    events.extend(write())

        return revision, interleaved()

    monkeypatch.setattr(store, "list_pages_at", list_pages_at)
    return events


def _writes(store):
    def upd(table, key, value, topic=None):
        return lambda: [_event(store.update(table, key, value, topic=topic), Action.UPDATE)]

    def dele(table, key):
        return lambda: [_event(store.delete(table, key), Action.DELETE)]

    def new(table, key, topic=None):
        return lambda: [_event(store.create(table, key, {"new": key}, topic=topic), Action.CREATE)]

    # Both behind the pages already read (low keys) and ahead of them (high keys).
    return [upd("port", "k000", {"i": "late"}), dele("port", "k118"), new("port", "k119a"),
            dele("network", "k001"), upd("network", "k117", {"i": "ahead"}, topic="tenant-a"),
            new("network", "a-first", topic="tenant-a"), upd("port", "k002", {"i": "moved"}, topic="tenant-a"),
            dele("port", "k116"), new("port", "zzz")] + [upd("port", f"k{i:03d}", {"i": "more"}) for i in range(10, 30, 2)]


@pytest.mark.parametrize("start", ["empty", "held"])
def test_a_paged_relist_equals_the_store_with_writes_and_deletes_between_its_pages(store, monkeypatch, start):
    _fill(store)
    cache = VersionedCache()
    if start == "held":  # a cache that went astray: stale, forged, vanished, tombstoned
        relist(store, cache, TOPICS)
        cache.apply(Event("port", "port", "k004", Action.UPDATE, FORGED, {"forged": True}))
        cache.apply(Event("port", "port", "ghost", Action.CREATE, 5, {"gone": True}))
        cache.apply(Event("network", "network", "k005", Action.DELETE, FORGED))
        for i in range(6, 100):  # most of it changed behind its back: the full listing, in pages
            store.update(TABLES[i % 2], f"k{i:03d}", {"i": "missed"})
    events = _interleave(store, monkeypatch, _writes(store))
    found = relist(store, cache, TOPICS, page_size=7)
    assert found.pages > 10 and events, "the writes ran between pages"
    for event in events:  # what the controller receives after its relist
        cache.apply(event)
    assert _state(cache.items()) == _state(o for o in store.list() if o.topic in TOPICS)
    if start == "held":
        assert cache.get("port", "ghost") is None and cache.get("network", "k005") is not None
        assert cache.get("port", "k004").version < FORGED


def _failing(store):
    def fail():
        raise StoreUnavailable("the store went away between two pages")
    return fail


@pytest.mark.parametrize("start", ["empty", "held"])
def test_a_listing_that_fails_part_way_puts_back_what_its_pages_changed(store, monkeypatch, start):
    _fill(store)
    cache = VersionedCache()
    if start == "held":
        relist(store, cache, TOPICS)
        for i in range(0, 120, 2):  # most changed: the full listing, in pages
            store.update(TABLES[i % 2], f"k{i:03d}", {"i": "changed"})
        store.delete("network", "k001")
    before = _state(cache.items())
    real = store.list_pages_at
    _interleave(store, monkeypatch, [lambda: [], lambda: [], _failing(store)])
    with pytest.raises(StoreUnavailable):
        relist(store, cache, TOPICS, page_size=7)
    assert _state(cache.items()) == before  # nothing the failed relist found is lost
    monkeypatch.setattr(store, "list_pages_at", real)
    found = relist(store, cache, TOPICS, page_size=7)  # the retry finds every change
    expected = {(o.table, o.key) for o in store.list() if o.topic in TOPICS} ^ {(o.table, o.key) for o in cache.items()}
    assert _state(cache.items()) == _state(o for o in store.list() if o.topic in TOPICS)
    assert len(found.changes) >= 60 if start == "held" else len(found.changes) == 120
    assert expected <= {(c.table, c.key) for c in found.changes}


def test_a_controller_syncs_and_repairs_in_pages(store):
    _fill(store)
    admission = RelistAdmission(None, page_size=9, jitter=0.0)
    ctrl = Controller(store, load_driver("zmq").subscriber(Stats("s", "pages")), sorted(TOPICS), None,
                      SubscriberOptions(), "pages", admission=admission).start()
    try:
        assert ctrl.synced.wait(20)
        first = ctrl.stats.get("relist_pages")
        assert first >= 120 // 9
        assert _state(ctrl.cache.items()) == _state(o for o in store.list() if o.topic in TOPICS)
        store.delete("port", "k010")
        store.update("network", "k011", {"i": "changed"})
        # Most objects as cached: the periodic relist reads versions (small), and values only where
        # they differ, not in pages.
        ctrl.subscriber.request_resync(sorted(TOPICS), reason="periodic")
        wait_for(lambda: ctrl.stats.get("relists", "periodic") == 1, timeout=20, what="the periodic relist")
        assert ctrl.stats.get("relist_pages") == first
        wait_for(lambda: _state(ctrl.cache.items()) == _state(o for o in store.list() if o.topic in TOPICS),
                 timeout=20, what="the cache to equal the store")
    finally:
        ctrl.stop()
