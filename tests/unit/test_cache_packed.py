"""The cache keeps values packed: what it stores, what it decodes, the transform applied before
caching, its byte accounting and its tombstone generations (dfpubsub/controller/cache.py)."""

import sqlite3

import msgpack
import pytest

from dfpubsub.controller import VersionedCache
from dfpubsub.controller.graves import Graves
from dfpubsub.controller.relist import relist
from dfpubsub.events import Action, Event, VersionedObject
from dfpubsub.metrics import Stats, _Collector


def ev(action, version, key="k", value=None, table="port", topic=None):
    return Event(topic or table, table, key, Action(action), version, value)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def accounted(cache):
    """The bytes the cache must report, recomputed from what it returns."""
    out = {}
    for obj in cache.items():
        out[obj.table] = out.get(obj.table, 0) + len(msgpack.packb(obj.value)) + len(obj.key)
    return out


@pytest.fixture
def store(sqlite_store):
    return sqlite_store


def test_values_are_kept_as_the_stores_bytes_and_decoded_on_read(store):
    for i in range(50):
        store.create("port", f"p{i}", {"name": f"port-{i}", "ips": ["10.0.0.1"], "mtu": 1500})
    objects, blobs, revision = store.list_packed_at({"port"})
    assert blobs == [msgpack.packb(o.value) for o in objects] and revision == 50
    cache = VersionedCache(decoded=0)
    relist(store, cache, {"port"}, values=False)
    held = cache._tables["port"]
    # The very bytes objects the listing read are what the cache holds: nothing packed again.
    listed = {o.key: b for o, b in zip(objects, blobs)}
    assert all(held[k][2] == listed[k] for k in listed)
    a, b = cache.get("port", "p7"), cache.get("port", "p7")
    assert a == VersionedObject("port", "port", "p7", 8, {"name": "port-7", "ips": ["10.0.0.1"], "mtu": 1500})
    assert a is not b and a.value is not b.value  # each read decodes its own copy
    assert cache.lookup()(("port", "p7")) == a and cache.get("port", "nope") is None
    assert cache.get("nope", "p7") is None and cache.version("port", "p7") == 8
    assert sorted(cache.keys("port"))[:2] == [("port", "p0"), ("port", "p1")] and len(cache) == 50


def test_a_first_sync_without_values_carries_none_and_never_loses_a_value(store):
    store.create("port", "p1", {"a": 1})
    store.create("network", "n1", [1, 2])
    objects, blobs, _ = store.list_packed_at({"port", "network"}, values=False)
    assert [o.value for o in objects] == [None, None] and len(blobs) == 2
    cache = VersionedCache()
    changes = relist(store, cache, {"port", "network"}, values=False).changes
    assert {(c.action, c.key, c.value) for c in changes} == {(Action.CREATE, "p1", None), (Action.CREATE, "n1", None)}
    assert cache.get("port", "p1").value == {"a": 1} and cache.get("network", "n1").value == [1, 2]
    # The same listing through a cache that already holds objects decodes what changed.
    store.update("port", "p1", {"a": 2})
    store.create("port", "p2", {"a": 3})
    objects, blobs, revision = store.list_packed_at({"port", "network"}, values=False)
    changes = cache.reconcile({"port", "network"}, objects, revision, blobs=blobs, values=False)
    assert sorted((c.key, c.action, c.value) for c in changes) == [("p1", Action.UPDATE, {"a": 2}),
                                                                    ("p2", Action.CREATE, {"a": 3})]
    assert cache.get("port", "p1").value == {"a": 2}
    with pytest.raises(ValueError):
        cache.reconcile({"port"}, objects, revision, values=False)  # no values and no bytes


def test_a_foreign_row_is_skipped_in_both_lists_in_step(store, tmp_path):
    store.create("port", "good1", {"a": 1})
    store.create("port", "good2", {"a": 2})
    conn = sqlite3.connect(f"{tmp_path}/nb.sqlite")
    conn.execute("INSERT INTO nb_objects VALUES ('port', 'bad', 'port', 9, ?)", (b"\xc1garbage",))
    conn.commit()
    conn.close()
    objects, blobs, _ = store.list_packed_at({"port"})
    assert [o.key for o in objects] == ["good1", "good2"] and blobs == [msgpack.packb({"a": 1}), msgpack.packb({"a": 2})]


def _foul(path, rows):
    """Rows another tool wrote straight into the store's file, bypassing the store's triggers (a
    foreign version would not even fit a feed entry), which its schema then puts back."""
    from dfpubsub.store.sqlite import _SCHEMA

    conn = sqlite3.connect(path)
    conn.executescript("DROP TRIGGER nb_write_on_insert; DROP TRIGGER nb_write_on_update;")
    conn.executemany("INSERT INTO nb_objects VALUES (?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.executescript(_SCHEMA)
    conn.close()


def test_a_first_sync_without_changes_fills_the_cache_as_the_store_holds_it(store, tmp_path):
    from dfpubsub.backends.foreign import SKIPPED

    for i in range(30):
        store.create("port", f"p{i}", {"i": i, "name": f"port-{i}"}, topic="tenant" if i % 3 == 0 else None)
        store.create("network", f"n{i}", [i, "x" * i], topic="tenant" if i % 3 == 0 else None)
    # Beside the ports (the networks are all sound): bad msgpack, a truncated value, a version as
    # text, a value as text, a key as a blob.
    _foul(f"{tmp_path}/nb.sqlite", [("port", "bad", "port", 99, b"\xc1"), ("port", "cut", "port", 99, b"\x92\x01"),
                                    ("port", "vtext", "port", "abc", msgpack.packb(1)),
                                    ("port", "value-text", "port", 99, "text"),
                                    ("port", b"blob-key", "port", 99, msgpack.packb(1))])
    topics = {"port", "network", "tenant"}
    skipped = SKIPPED.get("store_object")
    cache = VersionedCache(decoded=0)
    found = relist(store, cache, topics, values=False, changes=False)
    assert found.changes == [] and found.changed == found.objects == 60 and SKIPPED.get("store_object") == skipped + 5
    # The same records, byte for byte, as a first sync that builds its changes.
    built = VersionedCache(decoded=0)
    assert relist(store, built, topics).changed == 60 and cache._tables == built._tables
    assert {(o.table, o.key): o for o in cache.items()} == {(o.table, o.key): o for o in store.list_topics(topics)}
    assert cache.get("port", "p3").topic == "tenant" and cache.get("port", "p4").topic == "port"
    assert cache.get("network", "n3").topic == "tenant" and cache.get("network", "n4").topic == "network"
    assert cache.usage() == built.usage() and {t: u.bytes for t, u in cache.usage().items()} == accounted(cache)
    # The columns of SQLite's listing are those any other backend's (the base class's) cut from its objects.
    from dfpubsub.store import Store

    def rows(parts):
        return sorted((p.table, *row) for p in parts for row in zip(p.topics, p.keys, p.versions, p.blobs))

    fast, revision = store.list_packed_tables_at(topics)
    generic, generic_revision = Store._list_packed_tables_at(store, topics)
    assert rows(fast) == rows(generic) and len(rows(fast)) == 60 and revision == generic_revision


def test_a_first_sync_without_changes_applies_the_transform_and_leaves_a_held_cache_to_reconcile(store):
    store.create("port", "p1", {"mac": "m1", "description": "x" * 50})
    stripped = VersionedCache(transforms={"port": lambda v: {"mac": v["mac"]}})
    found = relist(store, stripped, {"port"}, values=False, changes=False)
    assert found.changed == 1 and stripped.get("port", "p1").value == {"mac": "m1"}
    assert stripped.usage()["port"].bytes == len(msgpack.packb({"mac": "m1"})) + len("p1")
    # A cache that holds anything is never filled: truth wins through reconcile, and its changes are built.
    cache = VersionedCache()
    cache.apply(ev("create", 2**63, key="p1", value="forged"))
    cache.apply(ev("create", 2**63, key="ghost", value="forged"))
    assert cache.fill([]) is None
    found = relist(store, cache, {"port"}, changes=False)
    assert sorted((c.action, c.key) for c in found.changes) == [(Action.DELETE, "ghost"), (Action.UPDATE, "p1")]
    assert found.changed == 2 and cache.items() == store.list_topics({"port"})
    # Nothing but tombstones: reconciled too, and a tombstone of the store's object goes.
    graves = VersionedCache()
    graves.apply(ev("delete", 2**63, key="p1"))
    found = relist(store, graves, {"port"}, changes=False)
    assert found.changed == 1 and graves.items() == store.list_topics({"port"})


def test_the_last_objects_written_are_read_decoded_and_never_stale():
    cache = VersionedCache(decoded=2)
    for i in range(3):
        cache.apply(ev("create", i + 1, key=f"k{i}", value={"i": i}))
    # k1 and k2 are the last two written: reads return them as applied; k0 is decoded again.
    assert cache.get("port", "k2") is cache.get("port", "k2")
    assert cache.get("port", "k0") is not cache.get("port", "k0")
    assert cache.get("port", "k0").value == {"i": 0}
    cache.apply(ev("update", 10, key="k2", value={"i": "new"}))
    assert cache.get("port", "k2").value == {"i": "new"} and cache.get("port", "k2").version == 10
    cache.apply(ev("delete", 11, key="k2"))
    assert cache.get("port", "k2") is None
    # A relist and a replay's correction replace a decoded object too.
    changes = cache.reconcile({"port"}, [VersionedObject("port", "port", "k1", 20, "listed")], revision=20)
    assert cache.get("port", "k1").value == "listed" and {c.key for c in changes} == {"k1", "k0"}
    cache.correct({"port"}, [VersionedObject("port", "port", "k1", 21, "fetched")], [])
    assert cache.get("port", "k1") == VersionedObject("port", "port", "k1", 21, "fetched")
    cache.correct({"port"}, [], [(("port", "k1"), 22)])
    assert cache.get("port", "k1") is None and cache.version("port", "k1") == 22


def test_a_transform_applies_before_caching_on_every_path(store):
    strip = {"port": lambda v: {"mac": v["mac"]}}
    store.create("port", "p1", {"mac": "fa:16:3e:00:00:01", "description": "x" * 100})
    cache = VersionedCache(transforms=strip)
    changes = relist(store, cache, {"port"}, values=False).changes
    assert cache.get("port", "p1").value == {"mac": "fa:16:3e:00:00:01"} and changes[0].value == {"mac": "fa:16:3e:00:00:01"}
    assert cache.usage()["port"].bytes == len(msgpack.packb({"mac": "fa:16:3e:00:00:01"})) + len("p1")
    # An event, a relist that finds a change, and a replay's correction: each keeps the stripped value.
    assert cache.apply(ev("update", 5, key="p1", value={"mac": "m5", "description": "y"}))
    assert cache.get("port", "p1").value == {"mac": "m5"}
    store.update("port", "p1", {"mac": "m2", "description": "z"})
    changes = relist(store, cache, {"port"}).changes
    assert [c.value for c in changes] == [{"mac": "m2"}] and cache.get("port", "p1").value == {"mac": "m2"}
    cache.correct({"port"}, [VersionedObject("port", "port", "p1", 9, {"mac": "m9", "description": "w"})], [])
    assert cache.get("port", "p1").value == {"mac": "m9"}
    # Versions decide: a relist of an unchanged store finds nothing, whatever the transform dropped.
    store.update("port", "p1", {"mac": "m3", "description": "q"})
    relist(store, cache, {"port"})
    assert relist(store, cache, {"port"}).changes == []
    # Tables without a transform keep their values whole.
    assert cache.apply(ev("create", 30, key="n1", table="network", value={"a": 1, "b": 2}))
    assert cache.get("network", "n1").value == {"a": 1, "b": 2}


def test_a_transform_that_raises_keeps_the_whole_value_and_is_counted():
    def bad(value):
        raise KeyError("mac")

    cache = VersionedCache(transforms={"port": bad})
    assert cache.apply(ev("create", 1, value={"no": "mac"}))
    assert cache.get("port", "k").value == {"no": "mac"} and cache.transform_errors == 1


def test_bytes_and_objects_are_accounted_per_table_through_every_change():
    clock = Clock()
    cache = VersionedCache(tombstone_horizon=10, clock=clock)
    for i in range(20):
        cache.apply(ev("create", i + 1, key=f"p{i}", value={"i": i, "pad": "x" * i}))
    cache.apply(ev("create", 30, key="n1", table="network", value=[1]))
    for i in range(0, 20, 3):
        cache.apply(ev("update", 100 + i, key=f"p{i}", value="short"))
    for i in range(1, 20, 4):
        cache.apply(ev("delete", 200 + i, key=f"p{i}"))
    truth = [VersionedObject("port", "port", f"p{i}", 300 + i, {"relisted": i}) for i in range(10)]
    cache.reconcile({"port"}, truth, revision=400)  # p10..p19 deleted, p0..p9 replaced
    cache.correct({"port", "network"}, [VersionedObject("network", "network", "n2", 401, "two")], [])
    usage = cache.usage()
    assert {t: u.bytes for t, u in usage.items()} == accounted(cache)
    assert usage["port"].objects == 10 and usage["network"].objects == 2
    assert usage["port"].tombstones == cache.tombstones() == 10  # p10..p19: deleted once each


def test_tombstones_live_one_horizon_to_a_quarter_more_and_are_purged_by_generation():
    clock = Clock()
    cache = VersionedCache(tombstone_horizon=100, clock=clock)
    for i in range(1000):
        clock.now = i * 0.01  # a mass delete over 10 s: three generations of 25 s at most
        cache.apply(ev("delete", i + 1, key=f"k{i}"))
    assert cache.tombstones() == 1000 and len(cache._graves.gens) == 1
    clock.now = 109.9  # the newest of the mass delete is 100 s old only now
    cache.apply(ev("delete", 5000, key="later"))
    assert cache.tombstones() == 1001 and not cache.apply(ev("update", 5, key="k4", value="late"))
    clock.now = 110.1
    cache.apply(ev("delete", 5001, key="later2"))
    assert cache.tombstones() == 2 and cache.version("port", "k4") == 0
    # A re-create forgets its tombstone; a re-delete keeps one, in the newest generation.
    assert cache.apply(ev("create", 6000, key="later", value=1))
    assert cache.tombstones() == 1 and cache.version("port", "later") == 6000
    clock.now = 140.0
    cache.apply(ev("delete", 6001, key="later"))
    cache.apply(ev("delete", 6002, key="later2"))
    assert cache.tombstones() == 2 and cache.version("port", "later2") == 6002


def test_graves_keep_every_tombstone_at_least_the_horizon():
    graves = Graves(8.0)
    for t in range(0, 40):
        graves.add("port", f"k{t}", t, float(t))
        for old in range(0, t + 1):
            if t - old < 8:
                assert graves.get("port", f"k{old}") == old, (t, old)
        assert all(graves.get("port", f"k{old}") is None for old in range(0, t + 1) if t - old > 10)
    assert graves.per_table() == {"port": len(graves)}


def test_cache_objects_and_bytes_are_exported_per_table():
    cache = VersionedCache()
    cache.apply(ev("create", 1, key="p1", value={"a": 1}))
    cache.apply(ev("create", 2, key="n1", table="network", value="v"))
    stats = Stats("controller", "export-test")
    stats.set_by("cache_bytes", "table", lambda: {t: u.bytes for t, u in cache.usage().items()})
    families = {f.name: f for f in _Collector().collect()}
    samples = {(s.labels["name"], s.labels["table"]): s.value for s in families["dfpubsub_cache_bytes"].samples}
    assert samples[("export-test", "port")] == len(msgpack.packb({"a": 1})) + 2
    assert samples[("export-test", "network")] == len(msgpack.packb("v")) + 2
    assert stats.levels_by("cache_bytes") == {"port": 6, "network": 4}


def test_indexes_keep_single_values_and_single_keys_bare_and_stay_exact():
    from dfpubsub.controller import Indexer

    idx = Indexer("port", {"by_net": lambda o: [o.value["net"]], "by_tag": lambda o: o.value["tags"]})

    def obj(key, net, tags):
        return VersionedObject("port", "port", key, 1, {"net": net, "tags": tags})

    idx.update("p1", obj("p1", "n1", ["a", "b"]))
    idx.update("p2", obj("p2", "n1", ["a"]))
    idx.update("p3", obj("p3", "n2", []))
    assert idx.keys("by_net", "n1") == ["p1", "p2"] and idx.keys("by_net", "n2") == ["p3"]
    assert idx.keys("by_tag", "a") == ["p1", "p2"] and idx.keys("by_tag", "b") == ["p1"]
    # One value per key and one key per value are kept bare, not as sets of one.
    assert idx._filed["by_net"]["p1"] == "n1" and idx._index["by_tag"]["b"] == "p1"
    assert "p3" not in idx._filed["by_tag"]
    idx.update("p1", obj("p1", "n2", ["b"]))  # moves, and a set of two shrinks to one bare key
    assert idx.keys("by_net", "n1") == ["p2"] and idx._index["by_net"]["n1"] == "p2"
    assert idx.keys("by_net", "n2") == ["p1", "p3"] and idx.keys("by_tag", "a") == ["p2"]
    idx.update("p2", None)
    idx.update("p3", None)
    assert idx.keys("by_net", "n1") == [] and idx.keys("by_net", "n2") == ["p1"]
    assert sorted(idx.values("by_tag")) == ["b"] and idx._filed["by_net"] == {"p1": "n2"}
    with pytest.raises(KeyError):
        idx.keys("nope", "x")
