"""Foreign records (dfpubsub/backends/foreign.py): garbage another writer left beside valid records, written
with raw clients, is skipped and counted by every reader, and never fails a listing, a daemon or
a write; a write a foreign record would break is refused before it changes anything."""

from __future__ import annotations

import itertools
import json
import sqlite3

import msgpack
import pytest
import redis as redis_py
from aetcd import rpc
from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub import Controller, Publisher, PublisherOptions, SubscriberOptions, load_driver
from dfpubsub.backends.etcd import txn
from dfpubsub.backends.foreign import SKIPPED
from dfpubsub.errors import ForeignRecord
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues, shard_for
from dfpubsub.queues.api import marker
from dfpubsub.store import open_store
from dfpubsub.store.outbox import split_versioned
from dfpubsub.store.sqlite import _SCHEMA as SQLITE_SCHEMA
from tests.conftest import wait_for
from tests.functional.df_db_helpers import base_env, df_db
from tests.functional.notify_helpers import delivered_keys, delivery, make_topic, wait_drained
from tests.functional.sink_helpers import RecordingSink

_n = itertools.count()
GOOD = {f"g{i}": {"i": i, "name": f"port {i}"} for i in range(5)}
VALID = msgpack.packb({"ok": 1})
#: Garbage in the value alone, which a listing of versions (without values) does not read.
VALUE_ONLY = {"not-msgpack", "truncated", "value-text", "no-value"}


def _skipped(kind: str | None = None) -> int:
    return SKIPPED.get(kind) if kind else SKIPPED.get()


# -- garbage writers, one per backend: each returns how many foreign objects it left -----------------------

def _redis_garbage(store) -> int:
    r = redis_py.Redis.from_url(store.url)
    ns, index = f"{store.prefix}:nb:".encode(), f"{store.prefix}:nb:t:port"
    rows = {
        b"version-text": {"topic": "port", "version": "abc", "value": VALID},
        b"not-msgpack": {"topic": "port", "version": "7", "value": b"\xc1"},
        b"truncated": {"topic": "port", "version": "7", "value": b"\x92\x01"},
        b"topic-not-utf8": {"topic": b"\xff\xfe", "version": "7", "value": VALID},
        b"key-not-utf8-\xff": {"topic": "port", "version": "7", "value": VALID},
        b"out-of-range": {"topic": "port", "version": "9" * 30, "value": VALID},
        b"negative": {"topic": "port", "version": "-3", "value": VALID},
        b"no-value": {"topic": "port", "version": "7"},
    }
    for key, fields in rows.items():
        r.hset(ns + b"o:port:" + key, mapping=fields)
        r.sadd(index, key)
    r.set(ns + b"o:port:wrong-type", "a string, not a hash")
    r.sadd(index, b"wrong-type")
    r.sadd(f"{store.prefix}:nb:t:network", "x")
    r.delete(f"{store.prefix}:nb:t:network")
    r.set(f"{store.prefix}:nb:t:network", "an index that is not a set")  # the whole table's index
    return len(rows) + 2


def _etcd_garbage(store) -> int:
    root, topics = store._root + b"port/", store._topic_root + b"port/"
    puts = [(root + b"not-msgpack", b"\xc1"), (root + b"truncated", b"\x92\x01"),
            (root + b"key-not-utf8-\xff", VALID), (root + b"g0", VALID),  # a valid rewrite stays valid
            (topics + b"g1", b"\xff\xfe")]  # g1's topic key is not UTF-8: g1 goes under its table's topic
    for key, value in puts:
        store._commit(txn([], [rpc.PutRequest(key=key, value=value)]))
    return 4


def _sqlite_garbage(store) -> int:
    conn = sqlite3.connect(store._db.path)
    # Another tool's rows bypass our triggers (their columns would not even fit a feed entry):
    # drop them for these inserts, and let the store's schema put them back.
    conn.executescript("DROP TRIGGER nb_write_on_insert; DROP TRIGGER nb_write_on_update;")
    rows = [("port", "not-msgpack", "port", 7, b"\xc1"), ("port", "version-text", "port", "abc", VALID),
            ("port", "topic-blob", b"port", 7, VALID), ("port", "value-text", "port", 7, "text")]
    conn.executemany("INSERT INTO nb_objects (tbl, key, topic, version, value) VALUES (?, ?, ?, ?, ?)", rows)
    conn.execute("INSERT INTO nb_objects VALUES ('port', 'topic-not-utf8', CAST(X'FFFE' AS TEXT), 7, ?)", (VALID,))
    # The version triggers followed the foreign rows: put the store's counter back where it was.
    conn.execute("UPDATE nb_meta SET value = (SELECT max(version) FROM nb_objects WHERE typeof(version) = "
                 "'integer' AND key LIKE 'g%') WHERE name = 'revision'")
    conn.commit()
    conn.executescript(SQLITE_SCHEMA)
    conn.close()
    return 5


GARBAGE = {"redis": _redis_garbage, "etcd": _etcd_garbage, "sqlite": _sqlite_garbage}


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def fouled(request, tmp_path):
    """(backend, store, url, prefix, foreign count): valid objects and garbage beside them."""
    prefix = f"fr{next(_n)}-{tmp_path.name[-16:]}"
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/nb.sqlite"
        store = open_store(url, ["port", "network"])
    else:
        url = request.getfixturevalue(f"shared_{request.param}").url
        store = open_store(url, ["port", "network"], prefix=prefix)
    for key, value in GOOD.items():
        store.create("port", key, value)
    bad = GARBAGE[request.param](store)
    yield request.param, store, url, prefix, bad
    store.close()


def test_every_store_read_serves_the_valid_objects_and_counts_the_rest(fouled):
    backend, store, _, _, bad = fouled
    before = _skipped("store_object") + _skipped("store_topic") + _skipped("store_index")
    assert {o.key for o in store.list()} == set(GOOD)
    after_list = _skipped("store_object") + _skipped("store_topic") + _skipped("store_index")
    assert after_list - before == bad
    assert {o.key for o in store.list_topics(["port"])} == set(GOOD)
    # A version listing leaves values on the server: only a foreign value goes unseen there.
    assert set(GOOD) <= {v.key for v in store.list_versions(["port"])} <= set(GOOD) | VALUE_ONLY
    refs = [("port", k) for k in [*GOOD, "not-msgpack", "truncated"]]
    assert {o.key for o in store.get_many(refs)} == set(GOOD)
    assert store.get("port", "not-msgpack") is None and store.get("port", "g2").value == GOOD["g2"]
    assert store.get("port", "g1").value == GOOD["g1"] and store.get("port", "g1").topic == "port"
    assert store.list("network") == []


def test_a_controller_syncs_every_valid_object_despite_foreign_ones(fouled):
    backend, store, _, _, _ = fouled
    driver = load_driver(f"memory://foreign-{next(_n)}")
    ctrl = Controller(store, driver.subscriber(Stats("s", "s")), ["port"],
                      options=SubscriberOptions(message_delay_window=0.2))
    ctrl.start()
    try:
        assert ctrl.subscriber.wait_synced(10)
        assert {o.key for o in ctrl.cache.items()} == set(GOOD)
        stats = Stats("p", "p")
        api = NbApi(store, Publisher(driver.publisher(stats), "writer", PublisherOptions(), stats))
        made = api.create("port", "new", {"n": 1})
        wait_for(lambda: ctrl.cache.get("port", "new") == made, what="the new object in the cache")
        api.publisher.close()
    finally:
        ctrl.stop()


def test_df_db_shows_what_it_skipped_and_doctor_lists_the_keys(fouled):
    backend, store, url, prefix, bad = fouled
    env = base_env(DFPUBSUB_STORE__URL=url, DFPUBSUB_STORE__PREFIX=prefix)
    table = df_db(env, "tables")
    assert table.returncode == 0 and "Traceback" not in table.stderr
    assert f"skipped {bad} record(s)" in table.stderr and "df-db doctor" in table.stderr
    assert table.stderr.count("\n") == 1
    assert [line.split()[-1] for line in table.stdout.splitlines() if line.split()[0] == "port"] == [
        str(len(set(GOOD)))]
    # Every valid object is listed (on etcd g1 too, whose topic key is foreign), the rest counted.
    listed = json.loads(df_db(env, "-o", "json", "ls", "port").stdout)
    assert {d["key"] for d in listed["items"]} == set(GOOD)
    assert len(listed["skipped"]) == bad - (backend == "redis")  # (not the network table's foul index)
    dumped = json.loads(df_db(env, "-o", "json", "dump").stdout)
    assert {d["key"] for d in dumped["items"]} == set(GOOD) and len(dumped["skipped"]) == bad
    doctor = df_db(env, "-o", "json", "doctor")
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr
    found = json.loads(doctor.stdout)
    assert len(found) == bad and all(r["key"] and r["reason"] for r in found)
    if backend == "redis":
        assert {r["key"] for r in found} >= {f"{prefix}:nb:o:port:wrong-type", f"{prefix}:nb:t:network",
                                              f"{prefix}:nb:o:port:key-not-utf8-\\xff"}


# -- writes next to foreign queue records: all or nothing, and the caller told why -----------------------

@pytest.fixture
def outbox(shared_redis):
    """(redis client, store, queues, registry, api, topic) sharing one Redis database."""
    prefix = f"frq{next(_n)}"
    store = open_store(shared_redis.url, ["port"], prefix=prefix)
    queues = open_queues(shared_redis.url, prefix=prefix)
    registry = NotificationRegistry(queues)
    topic = registry.create_topic(Topic("orders", "http://127.0.0.1:9/hook", persistent=True, shards=4))
    registry.put_configuration(NotificationConfig("all", "port", "orders"))
    api = NbApi(store, None, Notifier(registry, queues))
    yield redis_py.Redis.from_url(shared_redis.url), store, queues, registry, api, topic, prefix
    store.close()
    queues.close()


def _key_on(topic, shard: str) -> str:
    return next(f"k{i}" for i in itertools.count() if shard_for("orders", topic.shards, "port", f"k{i}") == shard)


@pytest.mark.parametrize("foul", ["entries_wrong_type", "seq_not_a_number",
                                  "meta_wrong_type", "reservations_wrong_type", "bytes_out_of_range"])
def test_a_write_a_foreign_queue_record_would_break_is_refused_before_it_changes_anything(outbox, foul):
    r, store, queues, registry, api, topic, prefix = outbox
    shard = registry.shard_names(topic)[1]
    bad_key, ok_key = _key_on(topic, shard), _key_on(topic, registry.shard_names(topic)[2])
    api.create("port", bad_key, {"v": 1})
    ns = f"{prefix}:q:"
    culprit = {
        "entries_wrong_type": lambda: (r.delete(ns + "e:" + shard), r.set(ns + "e:" + shard, "x"))[1],
        "seq_not_a_number": lambda: r.hset(ns + "m:" + shard, "seq", "abc"),
        "meta_wrong_type": lambda: (r.delete(ns + "m:" + shard), r.sadd(ns + "m:" + shard, "x"))[1],
        # (only read when the metadata counts reserved bytes: else the write never touches them)
        "reservations_wrong_type": lambda: (r.set(ns + "r:" + shard, "x"), r.hset(ns + "m:" + shard, "reserved_bytes", 10)),
        "bytes_out_of_range": lambda: r.hset(ns + "m:" + shard, "bytes", "9" * 40),
    }
    culprit[foul]()
    entries_before = r.xlen(ns + "e:" + shard) if r.type(ns + "e:" + shard) == b"stream" else None
    version_before = store.get("port", bad_key).version
    with pytest.raises(ForeignRecord) as refused:
        api.update("port", bad_key, {"v": 2})
    assert prefix in refused.value.key and "df-db doctor" in str(refused.value)
    assert store.get("port", bad_key).version == version_before  # not written
    if entries_before is not None:
        assert r.xlen(ns + "e:" + shard) == entries_before  # nothing queued either
    with pytest.raises(ForeignRecord):
        api.create("port", bad_key + "-new", 1) if shard_for("orders", 4, "port", bad_key + "-new") == shard \
            else api.update("port", bad_key, {"v": 3})
    # Writes to the other shards go on, with their notifications.
    made = api.create("port", ok_key, {"v": 1})
    assert store.get("port", ok_key) == made
    assert api.notifier.stats.get("notifications_enqueued") >= 2


def test_foreign_reservations_stop_a_notified_write_only_where_it_would_touch_them(outbox):
    """The outbox touches a shard's reservations only to sweep them, so it proves their type only
    when the metadata counts reserved bytes; a reservation, which adds to them, always proves it."""
    r, store, queues, registry, api, topic, prefix = outbox
    shard = registry.shard_names(topic)[1]
    key = _key_on(topic, shard)
    api.create("port", key, {"v": 1})
    r.set(f"{prefix}:q:r:{shard}", "x")  # nothing reserved: the write never reads it
    made = api.update("port", key, {"v": 2})
    listed, _ = queues.list(shard, 10)
    assert [split_versioned(e.data)[0] for e in listed][-1] == made.version
    with pytest.raises(ForeignRecord) as refused:
        queues.reserve(shard, 100)
    assert refused.value.key == f"{prefix}:q:r:{shard}"
    assert store.get("port", key) == made


def test_a_foreign_entry_past_the_queue_sequence_stops_no_write_and_notifications_go_after_it(outbox):
    """Another writer's stream entry at an id past the shard's sequence, kept or removed since:
    the next append would collide with it, and a reader's position may be past it already. The
    write goes on, and its notification takes the next id after the foreign one."""
    r, store, queues, registry, api, topic, prefix = outbox
    shard = registry.shard_names(topic)[1]
    key, entries = _key_on(topic, shard), f"{prefix}:q:e:{shard}"
    api.create("port", key, {"v": 1})
    r.xadd(entries, {"x": "y"}, id="999999-0")
    api.update("port", key, {"v": 2})
    assert [i for i, _ in r.xrange(entries)][-2:] == [b"999999-0", b"1000000-0"]
    r.xadd(entries, {"x": "y"}, id="2000000-0")
    r.xdel(entries, "2000000-0")  # gone, but no id at or below it can be added any more
    made = api.update("port", key, {"v": 3})
    assert [i for i, _ in r.xrange(entries)][-1] == b"2000001-0"
    assert store.get("port", key) == made
    listed, _ = queues.list(shard, 10)
    assert [e.marker for e in listed][-1] == marker(2000001)
    assert split_versioned(listed[-1].data)[0] == made.version
    assert api.notifier.stats.get("notifications_enqueued") == 3


def test_a_two_phase_write_next_to_a_foreign_shard_is_refused_before_the_store_write(shared_redis, tmp_path):
    """The store on SQLite, the queues on Redis: no one script can do both, so the notification is
    reserved before the store write and committed after it. The reservation proves the shard ours."""
    prefix = f"frt{next(_n)}"
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port"])
    queues = open_queues(shared_redis.url, prefix=prefix)
    registry = NotificationRegistry(queues)
    topic = registry.create_topic(Topic("orders", "http://127.0.0.1:9/hook", persistent=True, shards=4))
    registry.put_configuration(NotificationConfig("all", "port", "orders"))
    api = NbApi(store, None, Notifier(registry, queues))
    r = redis_py.Redis.from_url(shared_redis.url)
    bad, good = registry.shard_names(topic)[1], registry.shard_names(topic)[2]
    r.set(f"{prefix}:q:e:{bad}", "not a stream")
    with pytest.raises(ForeignRecord) as refused:
        api.create("port", _key_on(topic, bad), 1)
    assert refused.value.key == f"{prefix}:q:e:{bad}"
    assert store.get("port", _key_on(topic, bad)) is None
    # A shard that turns foreign while this writer holds credits on it (reservations taken ahead):
    # the write holding one stands and its notification is counted lost; the next one is refused.
    made = api.create("port", _key_on(topic, good), 1)
    assert store.get("port", _key_on(topic, good)) == made
    r.hset(f"{prefix}:q:m:{good}", "seq", "abc")
    lost = api.notifier.stats.get("notifications_lost", reason="foreign_record")
    api.update("port", _key_on(topic, good), 2)
    assert api.notifier.stats.get("notifications_lost", reason="foreign_record") == lost + 1
    with pytest.raises(ForeignRecord):
        api.update("port", _key_on(topic, good), 3)
    assert store.get("port", _key_on(topic, good)).version == made.version + 1
    store.close()
    queues.close()


# -- notification records, queue metadata, dead letters --------------------------------------------------

@pytest.mark.parametrize("backend", ["sqlite", "etcd", "redis"])
def test_foreign_notification_records_do_not_stop_writes_or_delivery(backend, tmp_path, request):
    if backend == "sqlite":
        url, options = f"sqlite:///{tmp_path}/nb.sqlite", {}
    else:
        url, options = request.getfixturevalue(f"shared_{backend}").url, {"prefix": f"frn{next(_n)}"}
    queues = open_queues(url, **options)
    registry = NotificationRegistry(queues, cache_ttl=0.0)
    with WebhookReceiver() as webhook:
        topic = make_topic(registry, "orders", webhook.url, shards=2)
        registry.put_configuration(NotificationConfig("all", "port", "orders"))
        queues.put_record("topic", "broken", b"\xff not JSON")
        queues.put_record("topic", "list", b"[1, 2]")
        queues.put_record("notification_config", "port/broken", b'{"id": 1}')
        queues.dead_letter(registry.shard_names(topic)[0], "00000000000000000001", b"data", "max_retries")
        if backend == "redis":
            r = redis_py.Redis.from_url(url)
            r.hset(f"{options['prefix']}:q:rec:topic", b"\xff\xfe", b"{}")
            r.hset(f"{options['prefix']}:q:d:{registry.shard_names(topic)[0]}", "00000000000000000002", b"\xc1")
        before = _skipped()
        assert [t.name for t in registry.list_topics()] == ["orders"]
        assert [c.id for c in registry.get_configurations()] == ["all"]
        assert len(queues.list_dead_letters()) == 1
        assert _skipped() - before >= 3
        store = open_store(url, ["port"], **options)
        api = NbApi(store, None, Notifier(registry, queues))
        for i in range(10):
            api.create("port", f"p{i}", {"i": i})
        worker = delivery(queues)
        try:
            wait_drained(registry, "orders")
            assert sorted(k for k, _ in delivered_keys(webhook)) == sorted(f"p{i}" for i in range(10))
        finally:
            worker.stop()
        store.close()
    queues.close()


@pytest.mark.parametrize("backend", ["sqlite", "etcd", "redis"])
def test_foreign_queue_metadata_is_named_and_the_other_queues_listed(backend, request, tmp_path):
    url = f"sqlite:///{tmp_path}/nb.sqlite" if backend == "sqlite" else request.getfixturevalue(
        f"shared_{backend}").url
    prefix = f"frm{next(_n)}"
    queues = open_queues(url, **({} if backend == "sqlite" else {"prefix": prefix}))
    for name in ("a", "b", "c"):
        queues.create_queue(name)
    if backend == "sqlite":
        raw = sqlite3.connect(f"{tmp_path}/nb.sqlite", isolation_level=None)
        raw.execute("UPDATE q_queues SET max_bytes = 'lots' WHERE name = 'b'")
        raw.execute("UPDATE q_queues SET entries = x'c1', created_at = 'x' WHERE name = 'c'")
        raw.execute("INSERT INTO q_queues (name, max_bytes, max_entries, stale_after, created_at) "
                    "VALUES (x'ff', 1, 1, 1, 1)")
    elif backend == "redis":
        r = redis_py.Redis.from_url(url)
        r.hset(f"{prefix}:q:m:b", "max_bytes", "lots")
        r.delete(f"{prefix}:q:m:c")
        r.set(f"{prefix}:q:m:c", "x")
        r.sadd(f"{prefix}:q:queues", b"\xff")
    else:
        conn = queues._conn
        conn.commit(txn([], [rpc.PutRequest(key=queues._states + b"b", value=b"\xc1"),
                               rpc.PutRequest(key=queues._states + b"c", value=msgpack.packb([1, 2])),
                               rpc.PutRequest(key=queues._states + b"\xff", value=b"")]))
        queues._forget("b")
        queues._forget("c")
    for name in ("b", "c"):
        with pytest.raises(ForeignRecord):
            queues.stats(name)
    assert queues.list_queues() == ["a", "b", "c"]
    assert queues.stats("a").entries == 0
    # A lease another writer left holds nothing: it is not shown, and the next owner takes it over.
    for until in ("never", "inf", "nan"):
        if backend == "sqlite":
            raw.execute("UPDATE q_queues SET owner = 'ghost', owner_until = ? WHERE name = 'a'", (until,))
        elif backend == "redis":
            r.hset(f"{prefix}:q:m:a", mapping={"owner": "ghost", "owner_until": until})
        else:
            conn.commit(txn([], [rpc.PutRequest(key=queues._locks + b"a", value=msgpack.packb(["ghost", until]))]))
        assert queues.owner("a") is None and queues.stats("a").owner is None
        assert queues.lock("a", "w1", 10.0) and queues.owner("a")[0] == "w1"
        assert queues.unlock("a", "w1")
    env = base_env(DFPUBSUB_STORE__URL=url, DFPUBSUB_STORE__PREFIX=prefix)
    listed = json.loads(df_db(env, "-o", "json", "queues", "list").stdout)
    assert [q["queue"] for q in listed["items"]] == ["a"] and len(listed["skipped"]) == 3
    queues.close()


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_queue_entry_of_the_wrong_shape_is_set_aside_and_delivery_goes_on(backend, request, tmp_path):
    prefix = f"fre{next(_n)}"
    if backend == "sqlite":
        url, options = f"sqlite:///{tmp_path}/nb.sqlite", {}
    else:
        url, options = request.getfixturevalue("shared_redis").url, {"prefix": prefix}
    queues = open_queues(url, **options)
    registry = NotificationRegistry(queues, cache_ttl=0.0)
    with WebhookReceiver() as webhook:
        make_topic(registry, "orders", webhook.url, shards=1)
        registry.put_configuration(NotificationConfig("all", "port", "orders"))
        store = open_store(url, ["port"], **options)
        api = NbApi(store, None, Notifier(registry, queues))
        api.create("port", "before", 1)
        # Another writer appends an entry of its own shape, and keeps the queue's sequence with it.
        if backend == "sqlite":
            raw = sqlite3.connect(f"{tmp_path}/nb.sqlite", isolation_level=None)
            raw.execute("INSERT INTO q_entries VALUES ('orders', 2, '', 4, 'then', 'text')")
            # and a dead letter and a notification record of its own
            raw.execute(f"INSERT INTO q_dead_letters VALUES ('orders', '{'9' * 20}', 'why', 'never', 'text')")
            raw.execute("INSERT INTO q_records VALUES ('topic', x'ff', 'text')")
        else:
            r = redis_py.Redis.from_url(url)
            r.xadd(f"{prefix}:q:e:orders", {"x": "y"}, id="2-0")
            r.hset(f"{prefix}:q:m:orders", "seq", 2)
            r.hset(f"{prefix}:q:d:orders", "9" * 20, b"\xc1")  # and a dead letter of its own
        api.create("port", "after", 2)
        before = _skipped("queue_entry")
        worker = delivery(queues)
        try:
            wait_drained(registry, "orders")
            assert sorted(k for k, _ in delivered_keys(webhook)) == ["after", "before"]
            assert [d.marker for d in queues.list_dead_letters("orders")] == ["00000000000000000002"]
            assert queues.redrive("orders", "9" * 20) is None  # the foreign letter: skipped, not moved
            assert _skipped("queue_entry") > before
        finally:
            worker.stop()
        store.close()
    queues.close()


# -- drivers and publishers ------------------------------------------------------------------------------

def test_a_foreign_join_counter_leaves_the_redis_publisher_running(shared_redis):
    from dfpubsub.drivers.redis_streams import RedisStreamsDriver

    prefix = f"frj{next(_n)}"
    r = redis_py.Redis.from_url(shared_redis.url)
    r.set(f"{prefix}:ps:$joins", "not a number")
    driver = RedisStreamsDriver(shared_redis.url, {"prefix": prefix})
    before = _skipped("driver_control_key")
    stats = Stats("p", "p")
    pub = Publisher(driver.publisher(stats), "pub", PublisherOptions(max_idle_time=0.2), stats)
    sink = RecordingSink(driver.subscriber(Stats("s", "s")), ["t"])
    sink.sub.start()
    try:
        wait_for(lambda: _skipped("driver_control_key") > before + 1, what="the counter polled twice")
        for i in range(20):
            pub.publish("t", "tbl", f"k{i}", "create", i + 1, {"i": i})
        pub.flush()
        wait_for(lambda: len(sink.keys("t")) == 20, what="every event")
        assert pub._thread.is_alive() and stats.get("background_errors") == 0
    finally:
        pub.close()
        sink.sub.close()


class _Flaky:
    """A real memory transport whose join poll raises an unexpected error ``failures`` times."""

    def __init__(self, inner, failures):
        self.inner, self.failures = inner, failures

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def new_subscribers(self):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a transport bug")
        return self.inner.new_subscribers()


def test_the_publisher_thread_survives_an_unexpected_error_and_recovers():
    driver = load_driver(f"memory://flaky-{next(_n)}")
    stats = Stats("p", "p")
    pub = Publisher(_Flaky(driver.publisher(stats), 3), "pub", PublisherOptions(batch_linger=0.05), stats)
    sink = RecordingSink(driver.subscriber(Stats("s", "s")), ["t"])
    sink.sub.start()
    try:
        wait_for(lambda: stats.get("background_errors") == 3, what="three failures")
        for i in range(5):
            pub.publish("t", "tbl", f"k{i}", "create", i + 1, i)  # flushed by the restarted thread's linger
        wait_for(lambda: len(sink.keys("t")) == 5, what="the batch the background thread flushes")
        assert pub._thread.is_alive()
    finally:
        pub.close()
        sink.sub.close()


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_foreign_discovery_rows_are_skipped(backend, request):
    from dfpubsub.discovery import PublisherRecord, open_discovery

    server = request.getfixturevalue(f"shared_{backend}")
    prefix = f"frd{next(_n)}"
    disc = open_discovery(server.url, prefix=prefix, ttl=30, renew_interval=5)
    reg = disc.register(PublisherRecord("p1", "pub", ["tcp://127.0.0.1:1"], "h", 1, 1.0, ["t"]))
    before = _skipped("discovery_row")
    if backend == "redis":
        r = redis_py.Redis.from_url(server.url)
        r.sadd(f"{prefix}:publishers", "bad1", "bad2")
        r.set(f"{prefix}:publishers:bad1", "not JSON")
        r.hset(f"{prefix}:publishers:bad2", "a", "hash")
        expected = 2
    else:
        disc._conn.call(lambda s: s.kv.Put(rpc.PutRequest(key=disc.root + b"bad1", value=b"\xc1")))
        expected = 1
    assert [p.publisher_id for p in disc.list()] == ["p1"]
    assert _skipped("discovery_row") - before >= expected
    reg.close()
    disc.close()


def test_a_text_stale_after_stops_no_notified_write_only_reservations(outbox):
    """The outbox makes no reservation, so a shard's stale_after (what a reservation lasts) is
    neither read nor proved on its path; a reservation still refuses what it cannot read."""
    r, store, queues, registry, api, topic, prefix = outbox
    shard = registry.shard_names(topic)[1]
    key = _key_on(topic, shard)
    r.hset(f"{prefix}:q:m:{shard}", "stale_after", "soon")
    made = api.create("port", key, {"v": 1})
    listed, _ = queues.list(shard, 10)
    assert [split_versioned(e.data)[0] for e in listed] == [made.version]
    with pytest.raises(ForeignRecord) as refused:
        queues.reserve(shard, 100)
    assert refused.value.key == f"{prefix}:q:m:{shard}"
