"""The transactional outbox: with the queues in the store's own SQLite file or Redis database,
a write and its notifications are one atomic step (dfpubsub/store/outbox.py)."""

import itertools
import json
import signal
import subprocess
import sys

import msgpack
import pytest

from dfpubsub.errors import InvalidValue, QueueFull
from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.notification import decode, value_digest
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues, shard_for
from dfpubsub.store import open_store
from dfpubsub.store.outbox import split_versioned
from tests.conftest import wait_for

TABLES = ["port"]
_n = itertools.count()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture(params=["sqlite", "redis"])
def where(request, tmp_path):
    """(url, options) of a store and queues that share a backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/nb.sqlite", {}
    server = request.getfixturevalue("shared_redis")
    return f"redis://127.0.0.1:{server.port}/0", {"prefix": f"ob{next(_n)}-{tmp_path.name[-20:]}"}


def _setup(url, options, clock=None, **topic):
    store = open_store(url, TABLES, **options)
    queues = open_queues(url, **options, **({"clock": clock} if clock else {}))
    assert queues.shares_store(store)
    registry = NotificationRegistry(queues)
    made = registry.create_topic(Topic("orders", "http://127.0.0.1:9/hook", persistent=True, **topic))
    registry.put_configuration(NotificationConfig("all", "port", "orders"))
    return store, queues, registry, made


def _notes(queues, registry, topic):
    """Every (shard, entry data) of ``topic``, in queue order."""
    out = []
    for shard in registry.shard_names(topic):
        items, more = queues.list(shard, 100_000)
        assert not more
        out += [(shard, e.data) for e in items]
    return out


def test_the_write_carries_its_notifications_with_no_reservation(where):
    store, queues, registry, topic = _setup(*where)
    api = NbApi(store, None, Notifier(registry, queues))
    made = [api.create("port", f"k{i}", {"i": i}) for i in range(30)]
    made.append(api.delete("port", "k0"))
    assert api.notifier.credits_held() == 0 and registry.topic_stats(topic.name).reservations == 0
    notes = _notes(queues, registry, topic)
    assert len(notes) == 31 and api.notifier.stats.get("notifications_enqueued") == 31
    by_version = {}
    for shard, data in notes:
        version, body = split_versioned(data)  # the store wrote the version in front of the body
        n = decode(data)
        assert n.version == version and n.id == f"orders:port:{n.key}:{version}"
        assert shard == shard_for("orders", topic.shards, "port", n.key)
        # Schema 2 with no version of its own, carrying the value's encoding: size and etag are
        # derived from it when the entry is read, equal to what the writer would have computed.
        row = msgpack.unpackb(body)
        assert row[0] == 2 and row[6] is None
        if n.action == "create":
            assert row[-1] == msgpack.packb({"i": int(n.key[1:])})
            assert (n.size, n.etag) == value_digest({"i": int(n.key[1:])})
        else:
            assert row[-1] == [0, ""] and (n.size, n.etag) == (0, "")
        by_version[version] = n
    assert [(by_version[o.version].key, by_version[o.version].action) for o in made] == (
        [(f"k{i}", "create") for i in range(30)] + [("k0", "delete")])


def test_a_full_queue_sweeps_expired_reservations_before_it_refuses(where):
    clock = Clock()
    store, queues, registry, topic = _setup(*where, clock, shards=1, max_entries=2, stale_after=10.0)
    held = [queues.reserve("orders", 100) for _ in range(2)]  # a two-phase writer that died
    api = NbApi(store, None, Notifier(registry, queues))
    with pytest.raises(QueueFull) as full:
        api.create("port", "a", 1)
    assert full.value.queue == "orders" and store.get("port", "a") is None
    assert api.notifier.stats.get("notifications_refused", "orders") == 1
    clock.now += 11  # the dead writer's reservations are stale now; the write itself sweeps them
    obj = api.create("port", "a", 1)
    assert [decode(d).version for _, d in _notes(queues, registry, topic)] == [obj.version]
    assert queues.stats("orders").reservations == 0 and len(held) == 2


_WRITER = """
import json, sys
from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationRegistry
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues
from dfpubsub.store import open_store
url, options, keys, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
queues = open_queues(url, **options)
api = NbApi(open_store(url, ["port"], **options), None, Notifier(NotificationRegistry(queues), queues))
print("ready", flush=True)
i = 0
while count == 0 or i < count:
    api.update("port", f"k{i % keys}", {"i": i})
    i += 1
"""


def _writer(url, options, keys, count=0):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, url, json.dumps(options), str(keys), str(count)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_writer_killed_mid_stream_leaves_no_write_without_its_notification(where):
    url, options = where
    store, queues, registry, topic = _setup(url, options)
    for k in range(20):
        store.create("port", f"k{k}", 0)
    first = max(o.version for o in store.list("port"))
    proc = _writer(url, options, 20)
    try:
        wait_for(lambda: registry.topic_stats(topic.name).entries >= 500, timeout=60, what="500 notified writes")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    versions = sorted(decode(d).version for _, d in _notes(queues, registry, topic))
    last = {o.key: o.version for o in store.list("port")}
    # The only writer: it took every version after `first`; each write that happened is notified
    # once, and nothing is notified that did not happen.
    assert versions == list(range(first + 1, max(last.values()) + 1))
    assert set(last.values()) - {0} <= set(versions) | set(range(first + 1))


def test_processes_writing_one_key_enqueue_it_in_version_order(where):
    url, options = where
    store, queues, registry, topic = _setup(url, options)
    store.create("port", "k0", 0)
    writers = [_writer(url, options, 1, 100) for _ in range(3)]
    for proc in writers:
        assert proc.wait(timeout=120) == 0
    shard = shard_for("orders", topic.shards, "port", "k0")
    versions = [decode(d).version for s, d in _notes(queues, registry, topic) if s == shard]
    assert len(versions) == 300 and versions == sorted(versions)
    assert versions[-1] == store.get("port", "k0").version


def test_a_store_refuses_an_outbox_of_queues_it_does_not_hold(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    queues = open_queues(f"sqlite:///{tmp_path}/elsewhere.sqlite")
    queues.create_queue("q")
    assert not queues.shares_store(store)
    with pytest.raises(InvalidValue, match="cannot commit"):
        store.create("port", "a", 1, outbox=queues.outbox([("q", b"\x80")]))
    assert store.get("port", "a") is None and queues.stats("q").entries == 0
    memory = open_store("sqlite:///:memory:", TABLES)
    assert not open_queues("sqlite:///:memory:").shares_store(memory), "two :memory: databases are two"


def test_a_topic_gone_since_the_snapshot_is_skipped_and_the_write_stands(where):
    store, queues, registry, topic = _setup(*where, shards=2)
    api = NbApi(store, None, Notifier(registry, queues))
    api.create("port", "a", 1)  # the notifier's snapshot now holds the topic
    NotificationRegistry(queues).delete_topic("orders")  # another process
    obj = api.create("port", "b", 2)
    assert store.get("port", "b") == obj
    assert api.notifier.stats.get("notifications_enqueued") == 1
    assert api.notifier.registry.matching_topics("port", "c", "create") == [], "the snapshot was dropped"



def test_two_configurations_of_one_topic_put_two_entries_in_one_queue_or_none(where):
    store, queues, registry, topic = _setup(*where, shards=1, max_entries=3)
    registry.put_configuration(NotificationConfig("again", "port", "orders"))
    api = NbApi(store, None, Notifier(registry, queues))
    obj = api.create("port", "a", 1)
    notes = [decode(d) for _, d in _notes(queues, registry, topic)]
    assert sorted((n.config_id, n.version) for n in notes) == [("again", obj.version), ("all", obj.version)]
    assert [e.marker for e in queues.list("orders")[0]] == sorted(e.marker for e in queues.list("orders")[0])
    with pytest.raises(QueueFull):  # room for one more entry, not for both
        api.create("port", "b", 2)
    assert store.get("port", "b") is None and queues.stats("orders").entries == 2


@pytest.mark.parametrize("pad", [10, 300, 70_000])
def test_the_store_completes_each_entry_with_the_value_it_writes(where, pad):
    """The notifier hands the store its entries short of the value's encoding, and the store
    appends the blob it writes (msgpack bin 8, 16 or 32 by its length), in the same step."""
    store, queues, registry, topic = _setup(*where, shards=3)
    api = NbApi(store, None, Notifier(registry, queues))
    values = [{"pad": "x" * pad, "i": i} for i in range(3)]
    made = [api.create("port", "a", values[0]), api.update("port", "a", values[1]), api.update("port", "a", values[2])]
    notes = [decode(d) for _, d in _notes(queues, registry, topic)]
    assert [(n.version, n.action) for n in notes] == [(made[0].version, "create"), (made[1].version, "update"),
                                                      (made[2].version, "update")]
    for (_, data), value in zip(_notes(queues, registry, topic), values):
        assert msgpack.unpackb(split_versioned(data)[1])[-1] == msgpack.packb(value)
        assert (decode(data).size, decode(data).etag) == value_digest(value)
    stats = registry.topic_stats(topic.name)
    assert stats.bytes == sum(len(d) for _, d in _notes(queues, registry, topic))


def test_the_room_an_entry_needs_counts_the_value_it_carries(where):
    store, queues, registry, topic = _setup(*where, shards=1, max_bytes=4000)
    api = NbApi(store, None, Notifier(registry, queues))
    api.create("port", "a", {"pad": "x" * 1000})
    with pytest.raises(QueueFull):  # the body alone would fit: the value it carries does not
        api.update("port", "a", {"pad": "x" * 3000})
    assert store.get("port", "a").value == {"pad": "x" * 1000} and queues.stats("orders").entries == 1
    assert queues.stats("orders").bytes == len(_notes(queues, registry, topic)[0][1])


def test_an_outbox_carrying_the_written_value_cannot_go_with_a_deletion(where):
    store, queues, registry, topic = _setup(*where, shards=1)
    store.create("port", "a", 1)
    with pytest.raises(InvalidValue, match="deletion"):
        store.delete("port", "a", outbox=queues.outbox([("orders", b"\x9d")], with_value=True))
    assert store.get("port", "a").value == 1 and queues.stats("orders").entries == 0


def test_configurations_added_and_removed_reach_the_next_write(where):
    """The notifier works out each (table, action)'s topics once per registry snapshot: a
    change made through the registry reaches the very next write."""
    store, queues, registry, topic = _setup(*where, shards=2)
    audit = registry.create_topic(Topic("audit", "http://127.0.0.1:9/hook", persistent=True, shards=3))
    api = NbApi(store, None, Notifier(registry, queues))
    api.create("port", "k1", 1)
    registry.put_configuration(NotificationConfig("a-keys", "port", "audit", prefix="a"))
    api.create("port", "a1", 1)
    api.create("port", "k2", 1)
    registry.delete_configuration("port", "all")
    api.update("port", "a1", 2)
    api.update("port", "k1", 2)
    assert sorted((decode(d).key, decode(d).action) for _, d in _notes(queues, registry, topic)) == [
        ("a1", "create"), ("k1", "create"), ("k2", "create")]
    assert [(decode(d).key, decode(d).action, shard) for shard, d in _notes(queues, registry, audit)] == [
        ("a1", "create", shard_for("audit", 3, "port", "a1")), ("a1", "update", shard_for("audit", 3, "port", "a1"))]
