"""The writer side of persistent notifications: NbApi with a Notifier, and the pub/sub bridge,
on real SQLite, Redis and etcd backends. The queues live in the store's own backend (SQLite and
Redis then notify in the write itself, etcd reserves and commits around it), or, for the
``-split`` variants, elsewhere (another file, another Redis database: reserve and commit)."""

import itertools
import json
import subprocess
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass

import pytest

from dfpubsub.config import load_settings
from dfpubsub.errors import AlreadyExists, NotFound, QueueFull, VersionConflict
from dfpubsub.events import Action
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import AsyncNbApi, NbApi
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.bridge import NotificationBridge
from dfpubsub.notify.notification import decode
from dfpubsub.notify.producer import Notifier
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.queues import open_queues, shard_for
from dfpubsub.store import open_store
from dfpubsub.subscriber import Subscriber, SubscriberOptions
from tests.conftest import wait_for

TABLES = ["port", "router"]
ENDPOINT = "http://127.0.0.1:9/hook"
_n = itertools.count()


@dataclass
class Env:
    kind: str
    url: str
    options: dict
    store: object
    queues: object
    registry: NotificationRegistry

    def notifier(self, **kw):
        return Notifier(self.registry, self.queues, **kw)

    def api(self, **kw):
        return NbApi(self.store, None, self.notifier(**kw))

    def topic(self, name="orders", source="port", **attrs):
        topic = self.registry.create_topic(Topic(name, ENDPOINT, persistent=True, **attrs))
        self.registry.put_configuration(NotificationConfig(f"{name}-all", source, name))
        return topic

    def entries(self, topic):
        """Every notification of ``topic``, by shard, in queue order."""
        out = {}
        for shard in self.registry.shard_names(topic):
            items, more = self.queues.list(shard, 10_000)
            assert not more
            out[shard] = [decode(e.data) for e in items]
        return out

    def reservations(self, topic):
        return self.registry.topic_stats(topic.name).reservations


@pytest.fixture(params=["sqlite", "redis", "etcd", "sqlite-split", "redis-split"])
def env(request, tmp_path):
    kind = request.param
    if kind.startswith("sqlite"):
        url, options = f"sqlite:///{tmp_path}/nb.sqlite", {}
        queues_url = f"sqlite:///{tmp_path}/queues.sqlite" if kind.endswith("-split") else url
    else:
        server = request.getfixturevalue("shared_etcd" if kind == "etcd" else "shared_redis")
        scheme = "etcd" if kind == "etcd" else "redis"
        url = queues_url = f"{scheme}://127.0.0.1:{server.port}" + ("" if kind == "etcd" else "/0")
        if kind.endswith("-split"):
            queues_url = url[:-1] + "1"
        options = {"prefix": f"np{next(_n)}-{tmp_path.name[-24:]}"}
    store = open_store(url, TABLES, **options)
    queues = open_queues(queues_url, **options)
    assert queues.shares_store(store) == (kind in ("sqlite", "redis"))
    yield Env(kind, queues_url, options, store, queues, NotificationRegistry(queues))
    queues.close()
    store.close()


def test_creates_and_deletes_land_in_the_shard_of_their_key_in_version_order(env):
    topic = env.topic()
    api = env.api()
    made = [api.create("port", f"p{i}", {"i": i}) for i in range(100)]
    gone = [api.delete("port", f"p{i}") for i in range(100)]
    by_shard = env.entries(topic)
    assert sum(len(v) for v in by_shard.values()) == 200
    assert sum(1 for v in by_shard.values() if v) > 5, "keys spread over the shards"
    seen = {}
    for shard, notes in by_shard.items():
        last = defaultdict(int)
        for n in notes:
            assert shard == shard_for(topic.name, topic.shards, "port", n.key)
            assert n.version > last[n.key], "per-key order within the shard"
            last[n.key] = n.version
            seen[(n.key, n.action)] = n
    for obj in made:
        n = seen[(obj.key, "create")]
        assert (n.version, n.event_name, n.bucket, n.topic, n.config_id) == (
            obj.version, "s3:ObjectCreated:Put", "port", "orders", "orders-all")
        assert n.id == f"orders:port:{obj.key}:{obj.version}" and n.size > 0 and len(n.etag) == 32
    for obj in gone:
        n = seen[(obj.key, "delete")]
        assert (n.version, n.event_name, n.size, n.etag) == (obj.version, "s3:ObjectRemoved:Delete", 0, "")
    assert api.notifier.stats.get("notifications_enqueued") == 200
    api.notifier.close()
    assert env.reservations(topic) == 0, "closing gives the credits back"


def test_a_failed_store_write_leaves_no_entry_and_no_reservation(env):
    topic = env.topic(shards=3)
    api = env.api()
    obj = api.create("port", "k", {"v": 1})
    with pytest.raises(AlreadyExists):
        api.create("port", "k", {"v": 2})
    with pytest.raises(VersionConflict):
        api.update("port", "k", {"v": 3}, expected_version=obj.version + 100)
    with pytest.raises(NotFound):
        api.delete("port", "missing")
    with pytest.raises(NotFound):
        api.update("port", "missing", {})
    notes = [n for shard in env.entries(topic).values() for n in shard]
    assert [(n.key, n.version) for n in notes] == [("k", obj.version)]
    assert env.reservations(topic) == api.notifier.credits_held(), "only the process's unused credits"
    api.notifier.close()
    assert env.reservations(topic) == 0


def test_writes_no_topic_wants_reserve_nothing(env):
    topic = env.topic(source="router")
    env.registry.put_configuration(NotificationConfig("deletes", "port", topic.name, actions=("delete",)))
    env.registry.create_topic(Topic("plain", ENDPOINT))  # not persistent: the delivery side's business
    env.registry.put_configuration(NotificationConfig("plain", "port", "plain"))
    api = env.api()
    api.create("port", "a", 1)
    api.update("port", "a", 2)
    assert not [n for shard in env.entries(topic).values() for n in shard]
    api.delete("port", "a")
    assert [n.action for shard in env.entries(topic).values() for n in shard] == ["delete"]


def test_queue_full_fails_the_write_before_the_store_and_keeps_what_was_committed(env):
    topic = env.topic(shards=1, max_entries=5)
    api = env.api()
    for i in range(5):
        api.create("port", f"k{i}", i)
    with pytest.raises(QueueFull) as full:
        api.create("port", "k5", 5)
    assert full.value.queue == "orders"
    with pytest.raises(QueueFull):
        api.delete("port", "k0")
    assert env.store.get("port", "k5") is None and env.store.get("port", "k0") is not None
    assert [n.key for n in env.entries(topic)["orders"]] == [f"k{i}" for i in range(5)]
    assert env.reservations(topic) == 0
    assert api.notifier.stats.get("notifications_refused", "orders") == 2
    items, _ = env.queues.list("orders", 2)
    env.queues.remove("orders", items[-1].marker)  # delivered: room again
    api.create("port", "k5", 5)
    assert [n.key for n in env.entries(topic)["orders"]] == ["k2", "k3", "k4", "k5"]


def test_queue_full_on_a_second_topic_gives_back_the_first_topics_reservation(env):
    roomy = env.topic("roomy", shards=1)
    tight = env.topic("tight", shards=1, max_entries=1)
    api = env.api(credit=1)
    api.create("port", "a", 1)
    with pytest.raises(QueueFull):
        api.create("port", "b", 2)
    assert env.store.get("port", "b") is None
    assert [n.key for n in env.entries(roomy)["roomy"]] == ["a"]
    assert env.reservations(roomy) == 0 and env.reservations(tight) == 0


_CRASHER = """
import json, os, sys
from dfpubsub.notify import NotificationRegistry
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues
url, options = sys.argv[1], json.loads(sys.argv[2])
queues = open_queues(url, **options)
pending = Notifier(NotificationRegistry(queues), queues).prepare("port", "crash", "create", {"x": 1})
print(",".join(pending.queues), flush=True)
os._exit(0)  # dies between reserve and commit
"""


def test_a_writer_crashing_between_reserve_and_commit_gives_the_room_back_after_stale_after(env):
    topic = env.topic(shards=1, max_entries=1, stale_after=1.0)
    out = subprocess.run([sys.executable, "-c", _CRASHER, env.url, json.dumps(env.options)],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "orders"
    assert env.reservations(topic) == 1
    api = env.api()
    with pytest.raises(QueueFull):
        api.create("port", "after", 1)
    wait_for(lambda: env.reservations(topic) == 0, timeout=10, what="the crashed writer's reservation to expire")
    obj = api.create("port", "after", 1)
    assert [(n.key, n.version) for n in env.entries(topic)["orders"]] == [("after", obj.version)]


def test_notifications_larger_than_a_credit_get_a_reservation_of_their_own(env):
    topic = env.topic(shards=2, opaque_data="o" * 5000)
    api = env.api()
    key = "k" * 900
    obj = api.create("port", key, {"big": "v" * 2000})
    small = api.create("port", "small", 1)
    notes = {n.key: n for shard in env.entries(topic).values() for n in shard}
    assert notes[key].version == obj.version and notes[key].opaque_data == "o" * 5000
    assert notes["small"].version == small.version
    stats = env.registry.topic_stats(topic.name)
    assert stats.bytes > 2 * 5000
    api.notifier.close()
    assert env.registry.topic_stats(topic.name).reservations == 0


def test_concurrent_writers_of_one_key_keep_version_order_in_its_shard(env):
    topic = env.topic()
    api = env.api()
    api.create("port", "hot", 0)
    errors = []

    def writer(w):
        try:
            for i in range(25 if env.kind == "etcd" else 50):
                api.update("port", "hot", {"w": w, "i": i})
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    shard = shard_for(topic.name, topic.shards, "port", "hot")
    versions = [n.version for n in env.entries(topic)[shard]]
    assert len(versions) == 1 + 4 * (25 if env.kind == "etcd" else 50)
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert versions[-1] == env.store.get("port", "hot").version


def test_changing_the_default_shard_count_affects_new_topics_only(env):
    old = env.topic("old")
    env.registry.default_shards = 3
    new = env.topic("new")
    assert (old.shards, new.shards) == (11, 3)
    assert env.registry.get_topic("old").shards == 11
    api = env.api()
    for i in range(40):
        api.create("port", f"k{i}", i)
    for topic in (old, new):
        by_shard = env.entries(topic)
        assert len(by_shard) == topic.shards
        assert sorted(n.key for v in by_shard.values() for n in v) == sorted(f"k{i}" for i in range(40))
        for shard, notes in by_shard.items():
            assert all(shard == shard_for(topic.name, topic.shards, "port", n.key) for n in notes)


def test_async_nbapi_notifies_through_its_nbapi(env):
    import asyncio

    topic = env.topic(shards=1)
    api = AsyncNbApi(env.api())

    async def run():
        obj = await api.create("port", "a", 1)
        with pytest.raises(AlreadyExists):
            await api.create("port", "a", 1)
        return obj

    obj = asyncio.run(run())
    assert [(n.key, n.version) for n in env.entries(topic)["orders"]] == [("a", obj.version)]


def test_from_settings_builds_the_notifier_when_notify_is_enabled(tmp_path):
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    base = {"store": {"url": db, "tables": TABLES}}
    assert NbApi.from_settings(load_settings(None, base), publish=False).notifier is None
    api = NbApi.from_settings(load_settings(None, {**base, "notify": {"enabled": True}}), publish=False)
    try:
        registry = api.notifier.registry
        topic = registry.create_topic(Topic("orders", ENDPOINT, persistent=True))
        registry.put_configuration(NotificationConfig("all", "port", "orders"))
        obj = api.create("port", "a", 1)
        shard = shard_for("orders", 11, "port", "a")
        assert topic.shards == 11
        assert [decode(e.data).version for e in api.notifier.queues.list(shard)[0]] == [obj.version]
    finally:
        api.close()


# -- the bridge ----------------------------------------------------------------------------------------


def _bridge_node(env, bus, **notifier_kw):
    bridge = NotificationBridge(env.notifier(**notifier_kw), Stats("notify-bridge", f"b{next(_n)}"))
    sub = Subscriber(bus.subscriber(Stats("subscriber", "s")), ["port"], bridge,
                     options=SubscriberOptions(initial_sync=False))
    sub.start()
    pub = Publisher(bus.publisher(Stats("publisher", "p")), "writer", PublisherOptions(batch_linger=0))
    return bridge, sub, pub


def test_the_bridge_enqueues_events_published_by_writers_outside_nbapi(env):
    topic = env.topic()
    bus = load_driver(f"memory://bridge-{next(_n)}")
    bridge, sub, pub = _bridge_node(env, bus)
    try:
        for i in range(30):
            pub.publish("port", "port", f"k{i}", Action.CREATE, 100 + i, {"i": i})
        for i in range(10):
            pub.publish("port", "port", f"k{i}", Action.DELETE, 200 + i)
        wait_for(lambda: bridge.stats.get("events_in") == 40, what="the events to reach the bridge")
        notes = [n for shard in env.entries(topic).values() for n in shard]
        assert sorted((n.key, n.version, n.action) for n in notes) == sorted(
            [(f"k{i}", 100 + i, "create") for i in range(30)] + [(f"k{i}", 200 + i, "delete") for i in range(10)])
        assert all(n.publisher == pub.id for n in notes)
        for shard, shard_notes in env.entries(topic).items():
            assert all(shard == shard_for(topic.name, topic.shards, "port", n.key) for n in shard_notes)
    finally:
        pub.close()
        sub.close()


def test_a_full_queue_makes_the_bridge_count_drops_and_carry_on(env):
    env.topic(shards=1, max_entries=3)
    bus = load_driver(f"memory://bridge-{next(_n)}")
    bridge, sub, pub = _bridge_node(env, bus)
    try:
        for i in range(5):
            pub.publish("port", "port", f"k{i}", Action.CREATE, i + 1, i)
        # events_in counts an event as it arrives; its enqueue or drop is counted after.
        enqueued = bridge.notifier.stats
        wait_for(lambda: enqueued.get("notifications_enqueued") + bridge.stats.get("drops", "queue_full") == 5)
        assert bridge.stats.get("drops", "queue_full") == 2
        items, _ = env.queues.list("orders")
        assert [decode(e.data).key for e in items] == ["k0", "k1", "k2"]
        env.queues.remove("orders", items[-1].marker)
        pub.publish("port", "port", "k9", Action.UPDATE, 9, 9)
        wait_for(lambda: enqueued.get("notifications_enqueued") == 4)
        assert [decode(e.data).key for e in env.queues.list("orders")[0]] == ["k9"]
        assert sub.stats.get("handler_errors") == 0
    finally:
        pub.close()
        sub.close()


# -- the window between the store write and the commit ------------------------------------------------


def test_a_commit_after_its_reservation_expired_reserves_again(env):
    topic = env.topic(shards=1, stale_after=0.5)
    notifier = env.notifier()
    pending = notifier.prepare("port", "slow", "create", {"v": 1})
    wait_for(lambda: env.reservations(topic) == 0, what="the reservation to expire")  # a very slow store write
    obj = env.store.create("port", "slow", {"v": 1})
    assert notifier.commit(pending, obj) == 1
    assert [(n.key, n.version) for n in env.entries(topic)["orders"]] == [("slow", obj.version)]
    assert notifier.stats.get("notifications_lost") == 0


def test_a_notification_that_cannot_be_committed_after_the_write_is_counted_lost(env):
    topic = env.topic(shards=1, max_entries=1, stale_after=0.5)
    notifier = env.notifier()
    pending = notifier.prepare("port", "slow", "create", 1)
    wait_for(lambda: env.reservations(topic) == 0, what="the reservation to expire")
    env.api().create("port", "fast", 2)  # takes the only room meanwhile
    obj = env.store.create("port", "slow", 1)
    assert notifier.commit(pending, obj) == 0
    assert notifier.stats.get("notifications_lost", "expired") == 1
    assert [n.key for n in env.entries(topic)["orders"]] == ["fast"]
    assert env.reservations(topic) == 0


def test_a_topic_dropped_by_another_process_stops_reserving_without_failing_writes(env):
    topic = env.topic(shards=2)
    api = env.api()
    api.create("port", "a", 1)  # the notifier's snapshot now holds the topic
    other = NotificationRegistry(env.queues)
    other.set_topic(Topic(topic.name, ENDPOINT, persistent=False))
    obj = api.create("port", "b", 2)
    assert env.store.get("port", "b") == obj
    assert env.queues.list_queues() == []
