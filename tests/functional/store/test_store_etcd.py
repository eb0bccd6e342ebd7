"""etcd-specific behaviour of the store: a lost server, large listings, pagination, round trips."""

import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from dfpubsub.errors import ConfigError, NotFound, StoreUnavailable, VersionConflict
from dfpubsub.store import open_store
from dfpubsub.store.etcd import EtcdStore
from dfpubsub.testing.servers import free_port
from tests.conftest import reap

TABLES = ["port", "network"]


@pytest.fixture
def store(etcd_server):
    s = EtcdStore(etcd_server.url, TABLES, timeout=2.0)
    yield s
    s.close()


def test_lost_server_fails_fast_and_the_same_store_reconnects(etcd_server, store):
    before = store.create("port", "p1", {"mac": "aa"})
    etcd_server.kill()
    for call in (lambda: store.get("port", "p1"), lambda: store.create("port", "p2", 1), store.list):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="unavailable|did not answer"):
            call()
        assert time.monotonic() - started < store.timeout + 1
    etcd_server.start()
    assert store.get("port", "p1") == before  # the data written before the kill survived
    after = store.update("port", "p1", {"mac": "bb"}, expected_version=before.version)
    assert after.version > before.version
    assert [o.key for o in store.list("port")] == ["p1"]


def test_listing_more_than_grpcs_default_4_mib(store):
    blob = "x" * 20_000
    for i in range(300):  # 6 MB in all, above gRPC's default 4 MiB receive limit
        store.create("network", f"n{i:03d}", {"i": i, "blob": blob})
    objects = store.list("network")
    assert len(objects) == 300 and sorted(o.value["i"] for o in objects) == list(range(300))
    assert all(o.value["blob"] == blob for o in objects)


def test_listing_pages_through_many_objects(store):
    n = 5_500  # above one page of 5000 keys
    with ThreadPoolExecutor(16) as pool:  # the store is thread-safe; concurrent writes are faster
        list(pool.map(lambda j: store.create("port", f"p{j:05d}", j, topic="tenant-a" if j % 2 else "tenant-b"),
                      range(n)))
    store.create("network", "net", 0, topic="tenant-a")
    objects = store.list("port")
    assert len(objects) == n and len({o.key for o in objects}) == n
    assert sorted(o.value for o in objects) == list(range(n))
    assert len(store.list_topics(["tenant-a"])) == n // 2 + 1
    assert store.count() == n + 1
    assert store.drop_all() == n + 1 and store.list() == []


def test_prefixes_and_unknown_tables_are_kept_apart(etcd_server):
    a = open_store(etcd_server.url, ["port"], prefix="a")
    b = open_store(etcd_server.url, ["port", "legacy"], prefix="b")
    a2 = open_store(etcd_server.url, ["network"], prefix="a")  # same prefix, other schema
    try:
        a.create("port", "p", 1)
        b.create("port", "p", 2)
        b.create("legacy", "x", 3)
        assert [o.value for o in a.list()] == [1] and a2.list() == []
        assert sorted(o.value for o in b.list()) == [2, 3]
        assert a.drop_all() == 1 and [o.value for o in b.list("port")] == [2]
    finally:
        for s in (a, b, a2):
            s.close()


def test_first_answering_endpoint_is_used(etcd_server):
    dead = f"127.0.0.1:{free_port()}"
    s = EtcdStore(f"etcd://{dead},127.0.0.1:{etcd_server.port}", TABLES, timeout=2.0)
    try:
        assert s.create("port", "p", 1).value == 1
        assert s.get("port", "p").value == 1
    finally:
        s.close()
    nobody = EtcdStore(f"etcd://{dead},127.0.0.1:{free_port()}", TABLES, timeout=1.0)
    with pytest.raises(StoreUnavailable, match="none of the etcd endpoints"):
        nobody.get("port", "p")
    nobody.close()


def test_bad_urls_are_config_errors():
    for url in ("etcd://", "etcd://host", "etcd://host:port", "redis://h:1"):
        with pytest.raises(ConfigError):
            EtcdStore(url, TABLES)


@pytest.mark.own_process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_its_own_connection(store):
    store.create("port", "parent", 1)  # the parent's loop and channel exist before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report through the exit status, never return into pytest
        code = 1
        try:
            os.close(read)
            store.create("port", "child", 2)
            code = 0 if store.get("port", "parent").value == 1 else 1
        finally:
            os._exit(code)
    os.close(write)
    os.close(read)
    assert reap(pid) == 0
    assert store.get("port", "child").value == 2  # the parent's store still works too


def _kv_rpcs(server) -> int:
    """How many KV RPCs (Range, Put, DeleteRange, Txn, Compact) etcd has handled, from its own metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines
               if line.startswith("grpc_server_handled_total{") and 'grpc_service="etcdserverpb.KV"' in line)


def test_every_read_and_write_of_one_object_is_one_round_trip(etcd_server, store):
    p = store.create("port", "p", 1, topic="tenant-a")  # also connects
    q = store.create("port", "q", 1)

    def round_trips(call):
        before = _kv_rpcs(etcd_server)
        try:
            result = call()
        except (NotFound, VersionConflict) as exc:
            result = exc
        return result, _kv_rpcs(etcd_server) - before

    calls = {
        "update keeps a topic": (lambda: store.update("port", "p", 2).topic, "tenant-a"),
        "update keeps the default topic": (lambda: store.update("port", "q", 2).topic, "port"),
        "update with a version": (lambda: store.update("port", "q", 3, expected_version=q.version), VersionConflict),
        "update of a missing object": (lambda: store.update("port", "nope", 1), NotFound),
        "update with a new topic": (lambda: store.update("port", "q", 4, topic="tenant-b").topic, "tenant-b"),
        "get": (lambda: store.get("port", "q").topic, "tenant-b"),
        "delete with a version": (lambda: store.delete("port", "p", expected_version=p.version), VersionConflict),
        "delete": (lambda: store.delete("port", "p").topic, "tenant-a"),
        "delete of a missing object": (lambda: store.delete("port", "p"), NotFound),
        "create": (lambda: store.create("port", "p", 5).topic, "port"),  # the old topic went with the object
    }
    for what, (call, expected) in calls.items():
        result, n = round_trips(call)
        assert n == 1, f"{what}: {n} round trips"
        assert (type(result) if isinstance(result, Exception) else result) == expected, what


def test_topics_back_to_the_tables_name_and_across_re_creates(store):
    store.create("port", "p", 1, topic="tenant-a")
    store.create("network", "n", 1, topic="tenant-a")
    assert store.update("port", "p", 2, topic="port").topic == "port"  # back to the default
    assert store.update("port", "p", 3).topic == "port"
    assert [o.key for o in store.list_topics(["tenant-a"])] == ["n"]
    assert {(o.key, o.topic) for o in store.list()} == {("p", "port"), ("n", "tenant-a")}
    store.delete("network", "n")
    assert store.create("network", "n", 2).topic == "network"
    assert store.list_topics(["tenant-a"]) == [] and store.get("network", "n").topic == "network"
    assert store.drop_all() == 2 and store.list() == []
