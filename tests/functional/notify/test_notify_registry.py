"""Notification topics and configurations, stored in the queue backends."""

import pytest

from dfpubsub.errors import AlreadyExists, InvalidValue, QueueNotFound, TopicNotFound
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic, event_name
from dfpubsub.queues import shard_for

HOOK = "http://127.0.0.1:8080/hook"


@pytest.fixture
def registry(queues):
    return NotificationRegistry(queues, default_shards=3, cache_ttl=60)


def test_topic_crud(registry, queues):
    t = registry.create_topic(Topic("orders", HOOK, persistent=True, max_bytes=1000, max_entries=50,
                                    time_to_live=60, max_retries=5, retry_sleep=0.5, format="cloudevents",
                                    opaque_data="tenant=a"))
    assert t.shards == 3 and registry.get_topic("orders") == t
    assert queues.list_queues() == ["orders", "orders.1", "orders.2"]
    assert queues.queue_info("orders.2")[1:3] == (1000, 50)
    assert registry.create_topic(Topic("orders", HOOK, persistent=True, max_bytes=1000, max_entries=50,
                                       time_to_live=60, max_retries=5, retry_sleep=0.5, format="cloudevents",
                                       opaque_data="tenant=a")) == t  # the same again: fine
    with pytest.raises(AlreadyExists):
        registry.create_topic(Topic("orders", "http://elsewhere/"))
    registry.create_topic(Topic("audit", "amqp://guest:guest@127.0.0.1:5672/x"))  # not persistent: no queues
    assert [x.name for x in registry.list_topics()] == ["audit", "orders"]
    assert queues.list_queues() == ["orders", "orders.1", "orders.2"]
    changed = registry.set_topic(Topic("orders", HOOK, persistent=True, max_bytes=2000, max_entries=50))
    assert changed.shards == 3 and changed.format == "s3" and registry.get_topic("orders") == changed
    assert queues.queue_info("orders.1").max_bytes == 2000  # new limits reach the shards
    with pytest.raises(InvalidValue, match="shards"):
        registry.set_topic(Topic("orders", HOOK, persistent=True, shards=5))
    with pytest.raises(TopicNotFound):
        registry.set_topic(Topic("nope", HOOK))
    assert registry.delete_topic("orders") is True and registry.delete_topic("orders") is False
    assert queues.list_queues() == [] and [x.name for x in registry.list_topics()] == ["audit"]
    with pytest.raises(TopicNotFound):
        registry.get_topic("orders")


def test_toggle_persistent_creates_and_deletes_shards(registry, queues):
    registry.create_topic(Topic("t", HOOK))
    assert queues.list_queues() == []
    registry.set_topic(Topic("t", HOOK, persistent=True))
    assert queues.list_queues() == ["t", "t.1", "t.2"]
    queues.commit("t.1", queues.reserve("t.1", 1), b"pending")
    registry.set_topic(Topic("t", HOOK, persistent=False))
    assert queues.list_queues() == []  # pending entries go with the shards, as in Ceph
    registry.set_topic(Topic("t", HOOK, persistent=True))
    assert queues.stats("t.1").entries == 0


def test_default_shard_count_applies_to_new_topics_only(queues):
    old = NotificationRegistry(queues, default_shards=11)
    assert old.create_topic(Topic("before", HOOK, persistent=True)).shards == 11
    new = NotificationRegistry(queues, default_shards=2)
    assert new.create_topic(Topic("after", HOOK, persistent=True)).shards == 2
    assert new.get_topic("before").shards == 11
    assert new.set_topic(Topic("before", HOOK, persistent=True, opaque_data="x")).shards == 11
    assert new.create_topic(Topic("explicit", HOOK, persistent=True, shards=1)).shards == 1
    assert len(queues.list_queues()) == 11 + 2 + 1
    # Every key's shard exists for each topic.
    for topic in new.list_topics():
        for i in range(100):
            queues.queue_info(shard_for(topic.name, topic.shards, "port", f"p{i}"))


def test_stats_aggregate_over_shards(registry, queues):
    registry.create_topic(Topic("t", HOOK, persistent=True))
    for i, shard in enumerate(registry.shard_names(registry.get_topic("t"))):
        for _ in range(i + 1):
            queues.commit(shard, queues.reserve(shard, 10), b"x" * 10)
    queues.reserve("t.2", 7)
    queues.lock("t.1", "worker-a", 60)
    s = registry.topic_stats("t")
    assert (s.entries, s.bytes, s.reservations, s.reserved_bytes) == (6, 60, 1, 7)
    assert [x.entries for x in s.shards.values()] == [1, 2, 3]
    assert s.owners == {"t": None, "t.1": "worker-a", "t.2": None}
    registry.create_topic(Topic("plain", HOOK))
    assert registry.topic_stats("plain").entries == 0 and registry.topic_stats("plain").shards == {}
    with pytest.raises(TopicNotFound):
        registry.topic_stats("nope")


def test_configurations_and_matching(registry):
    registry.create_topic(Topic("created", HOOK, persistent=True))
    registry.create_topic(Topic("removed", HOOK, persistent=True))
    registry.create_topic(Topic("all", HOOK))
    registry.put_configuration(NotificationConfig("c1", "port", "created", actions=("s3:ObjectCreated:*",),
                                                  prefix="web-", suffix=".eu"))
    registry.put_configuration(NotificationConfig("c2", "port", "removed", actions=("delete",)))
    registry.put_configuration(NotificationConfig("c3", "port", "all"))
    registry.put_configuration(NotificationConfig("c4", "network", "created", actions=("create",)))
    with pytest.raises(TopicNotFound):
        registry.put_configuration(NotificationConfig("c5", "port", "nope"))

    def matched(table, key, action):
        found = sorted((m.config.id, m.topic.name) for m in registry.matching_topics(table, key, action))
        for _ in range(2):  # a notifier's question, decided once per (table, action) and snapshot
            persistent = sorted((m.config.id, m.topic.name) for m in registry.persistent_topics(table, key, action))
            assert persistent == [(c, t) for c, t in found if t != "all"]
        return found

    assert matched("port", "web-1.eu", "create") == [("c1", "created"), ("c3", "all")]
    assert matched("port", "web-1.eu", "update") == [("c1", "created"), ("c3", "all")]
    assert matched("port", "web-1.us", "update") == [("c3", "all")]
    assert matched("port", "web-1.eu", "delete") == [("c2", "removed"), ("c3", "all")]
    assert matched("network", "n", "create") == [("c4", "created")]
    assert matched("network", "n", "update") == []  # "create" is the store's action only
    assert matched("subnet", "s", "create") == []
    assert [c.id for c in registry.get_configurations("port")] == ["c1", "c2", "c3"]
    assert len(registry.get_configurations()) == 4
    registry.put_configuration(NotificationConfig("c3", "port", "all", actions=("s3:ObjectRemoved:*",)))
    assert matched("port", "x", "create") == []
    assert registry.delete_configuration("port", "c2") == 1
    assert registry.delete_configuration("port") == 2 and registry.get_configurations("port") == []
    registry.delete_topic("created")  # takes its configurations along
    assert registry.get_configurations() == []


def test_another_process_changes_are_seen_after_the_cache_ttl(queues):
    now = [0.0]
    writer = NotificationRegistry(queues, cache_ttl=1.0, clock=lambda: now[0])
    admin = NotificationRegistry(queues)
    admin.create_topic(Topic("t", HOOK, persistent=True, shards=1))
    assert writer.matching_topics("port", "k", "create") == []
    admin.put_configuration(NotificationConfig("c", "port", "t"))
    assert writer.matching_topics("port", "k", "create") == []  # cached
    now[0] = 1.5
    assert [m.config.id for m in writer.matching_topics("port", "k", "create")] == ["c"]


def test_topic_and_configuration_validation():
    with pytest.raises(InvalidValue):
        Topic("t.1", HOOK)  # a shard's name
    for bad in ({"endpoint": "not a url"}, {"shards": 0}, {"format": "xml"}, {"max_retries": -1},
                {"time_to_live": -1}, {"persistent": "yes"}, {"max_bytes": 0}):
        with pytest.raises(InvalidValue):
            Topic(**{"name": "t", "endpoint": HOOK, **bad})
    with pytest.raises(InvalidValue):
        NotificationConfig("c", "port", "t", actions=("s3:Nope",))
    with pytest.raises(InvalidValue):
        NotificationConfig("c", "a/b", "t")
    with pytest.raises(InvalidValue):
        Topic.from_json(b'{"name": "t", "endpoint": "http://x/", "colour": "red"}')
    t = Topic("t", HOOK, persistent=True, shards=4, opaque_data="o")
    assert Topic.from_json(t.to_json()) == t
    c = NotificationConfig("c", "port", "t", actions=["create", "s3:ObjectRemoved:*"], prefix="a", suffix="z")
    assert NotificationConfig.from_json(c.to_json()) == c and c.actions == ("create", "s3:ObjectRemoved:*")
    assert [event_name(a) for a in ("create", "update", "delete")] == [
        "s3:ObjectCreated:Put", "s3:ObjectCreated:Put", "s3:ObjectRemoved:Delete"]
    with pytest.raises(InvalidValue):
        event_name("rename")


def test_a_deleted_topics_queues_are_gone(registry, queues):
    registry.create_topic(Topic("t", HOOK, persistent=True))
    registry.delete_topic("t")
    with pytest.raises(QueueNotFound):
        queues.reserve("t.1", 1)
