"""One contract, three backends: SQLite (embedded), etcd and Redis (real servers)."""

import json
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from dfpubsub.errors import (
    AlreadyExists,
    InvalidValue,
    NotFound,
    UnknownTable,
    ValueTooLarge,
    VersionConflict,
)
from dfpubsub.store import open_store
from tests.functional.store_helpers import backend_location

TABLES = ["port", "network", "counter"]
WORKER = Path(__file__).with_name("store_worker.py")


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def store_url(request, tmp_path):
    """(url, options) of a fresh, empty store of each backend."""
    return backend_location(request, tmp_path, "t")


@pytest.fixture
def store(store_url):
    url, opts = store_url
    s = open_store(url, TABLES, max_value_bytes=64 * 1024, **opts)
    yield s
    s.close()


def test_create_get_update_delete(store):
    a = store.create("port", "p1", {"mac": "aa", "ips": ["10.0.0.1"], "raw": b"\x00\xff", "n": 1.5})
    assert (a.table, a.key, a.topic, a.value["mac"]) == ("port", "p1", "port", "aa")
    got = store.get("port", "p1")
    assert got == a and got.value["raw"] == b"\x00\xff"
    b = store.update("port", "p1", {"mac": "bb"})
    assert b.version > a.version and store.get("port", "p1").value == {"mac": "bb"}
    d = store.delete("port", "p1")
    assert d.version > b.version and d.value is None and d.topic == "port"
    assert store.get("port", "p1") is None
    c = store.create("port", "p1", "again")
    assert c.version > d.version  # a re-create is newer than the deletion


def test_versions_are_unique_and_increasing_across_objects(store):
    versions = [store.create("network", f"n{i}", i).version for i in range(20)]
    versions += [store.update("network", f"n{i}", -i).version for i in range(20)]
    assert versions == sorted(versions) and len(set(versions)) == 40


def test_errors_are_typed(store):
    store.create("port", "p", 1)
    with pytest.raises(AlreadyExists):
        store.create("port", "p", 2)
    with pytest.raises(NotFound):
        store.update("port", "missing", 1)
    with pytest.raises(NotFound):
        store.delete("port", "missing")
    with pytest.raises(UnknownTable, match="nope"):
        store.create("nope", "k", 1)
    with pytest.raises(UnknownTable):
        store.list("nope")
    with pytest.raises(InvalidValue):
        store.create("port", "", 1)
    with pytest.raises(InvalidValue):
        store.create("port", "k", 1, topic="$ctl")


def test_compare_and_set(store):
    v1 = store.create("port", "p", 1).version
    v2 = store.update("port", "p", 2, expected_version=v1).version
    with pytest.raises(VersionConflict) as err:
        store.update("port", "p", 3, expected_version=v1)
    assert (err.value.expected, err.value.actual) == (v1, v2)
    with pytest.raises(VersionConflict):
        store.delete("port", "p", expected_version=v1)
    assert store.get("port", "p").value == 2
    store.delete("port", "p", expected_version=v2)
    assert store.get("port", "p") is None


def test_bad_values_write_nothing(store):
    store.create("port", "p", {"ok": True})
    before = store.get("port", "p")
    with pytest.raises(ValueTooLarge):
        store.update("port", "p", "x" * (65 * 1024))
    with pytest.raises(InvalidValue):
        store.update("port", "p", {"bad": object()})
    with pytest.raises(InvalidValue):
        store.create("port", "q", {1, 2, 3})
    assert store.get("port", "p") == before and store.get("port", "q") is None


def test_list_by_table_and_topic(store):
    store.create("port", "p1", 1, topic="tenant-a")
    store.create("port", "p2", 2, topic="tenant-b")
    store.create("network", "n1", 3, topic="tenant-a")
    store.create("network", "n2", 4)
    assert {o.key for o in store.list("port")} == {"p1", "p2"}
    assert {o.key for o in store.list("port", topic="tenant-a")} == {"p1"}
    assert {o.key for o in store.list()} == {"p1", "p2", "n1", "n2"}
    assert {o.key for o in store.list_topics(["tenant-a", "network"])} == {"p1", "n1", "n2"}
    moved = store.update("port", "p2", 5, topic="tenant-a")
    assert moved.topic == "tenant-a"
    assert {o.key for o in store.list_topics(["tenant-a"])} == {"p1", "p2", "n1"}
    assert store.update("port", "p2", 6).topic == "tenant-a"  # the topic sticks
    assert store.count("port") == 2 and store.count() == 4
    assert store.drop_all() == 4 and store.list() == []


def test_list_versions_and_get_many_agree_with_list_topics(store):
    store.create("port", "p1", {"a": 1}, topic="tenant-a")
    store.create("port", "p2", 2, topic="tenant-b")
    store.create("network", "n1", [3], topic="tenant-a")
    for i in range(30):  # more than one chunk of etcd's transactions
        store.create("network", f"n-{i}", i)
    store.update("port", "p1", {"a": 2})
    store.delete("network", "n-7")
    topics = ["tenant-a", "network"]
    listed = store.list_topics(topics)
    assert sorted(store.list_versions(topics)) == sorted((o.topic, o.table, o.key, o.version) for o in listed)
    assert store.list_versions([]) == []
    refs = [(o.table, o.key) for o in listed] + [("network", "n-7"), ("port", "missing")]
    assert sorted(store.get_many(refs)) == sorted(listed)  # absent objects are left out
    assert store.get_many([]) == []
    with pytest.raises(UnknownTable):
        store.get_many([("nope", "k")])
    # Without decoding: the same objects carrying None, and the bytes the store holds (schema 2's df-feed).
    objects, blobs = store.get_many_packed(refs)
    assert sorted(objects) == sorted(o._replace(value=None) for o in listed)
    assert {(o.table, o.key): msgpack.unpackb(b) for o, b in zip(objects, blobs)} == {
        (o.table, o.key): o.value for o in listed}
    assert store.get_many_packed([]) == ([], [])


def test_concurrent_processes_lose_no_update_and_never_go_back(store_url):
    url, opts = store_url
    prefix = opts.get("prefix", "")
    store = open_store(url, TABLES, **opts)
    n_keys, increments, workers = 3, 60, 4
    for i in range(n_keys):
        store.create("counter", f"c{i}", {"n": 0})
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), url, prefix, str(n_keys), str(increments)],
                         stdout=subprocess.PIPE, text=True)
        for _ in range(workers)
    ]
    reports = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    total = sum(store.get("counter", f"c{i}").value["n"] for i in range(n_keys))
    assert total == workers * increments  # no lost update
    for report in reports:
        for versions in report["versions"].values():
            assert versions == sorted(versions)  # each process sees versions only move forward
    all_writes = [v for r in reports for vs in r["versions"].values() for v in vs[::2]]
    assert len(all_writes) == len(set(all_writes))  # every successful write got its own version
    store.close()


def test_a_store_is_made_by_initialize_or_by_a_write_and_stays_made(store, store_url):
    """What daemons look for before they open a store: a server store nobody made nor wrote to
    is not made (SQLite's mark is its file, looked for before opening); initialize() makes it
    without a feed entry, and a store written to before there was a mark
    (an older release's) counts as made, after drop_all too."""
    url, opts = store_url
    if url.startswith("sqlite"):
        assert store.initialized()
    else:
        assert not store.initialized()
        head = store.feed_head()
        store.initialize()
        store.initialize()
        assert store.initialized() and store.read_feed(0) == []
        assert store.feed_head() == head or not store.feed_dense  # etcd's counts every write of the cluster
        assert store.list() == []
        with open_store(url, TABLES, **{"prefix": opts["prefix"] + "-old"}) as old:
            assert not old.initialized()
            old.create("port", "p1", 1)
            assert old.initialized()
            old.drop_all()
            if old.backend == "redis":  # its revision counter outlives drop_all; etcd keeps no trace
                assert old.initialized()
    assert store.create("port", "p1", 1).version > 0
