"""Topics, writes and a running delivery worker for the notification tests (their `queues` fixture is in
notify/conftest.py); shared with the foreign-records and chaos tests."""

from dfpubsub.notify import NotificationRegistry, Topic, event_name
from dfpubsub.notify.delivery import DeliveryOptions, DeliveryThread, DeliveryWorker
from dfpubsub.notify.notification import encode, make_notification
from dfpubsub.queues import open_queues, shard_for
from tests.conftest import wait_for

#: Fast timers: leases of a second, renewed five times a second.
FAST = {"renew_interval": 0.2, "lease": 1.0, "poll_interval": 0.02}


def make_topic(registry, name, url, **attrs):
    """A persistent topic on ``url``, retried fast."""
    return registry.create_topic(Topic(name, url, persistent=True, **{"retry_sleep": 0.05, **attrs}))


def enqueue(queues, topic, table, key, action, version, value=None):
    """What a writer does for one change: reserve on the key's shard, then commit."""
    data = encode(make_notification(topic.name, event_name(action), action, table, key, version, value))
    shard = shard_for(topic.name, topic.shards, table, key)
    queues.commit(shard, queues.reserve(shard, len(data)), data)
    return shard


def delivery(queues, worker_id="w1", **opts):
    """A started delivery worker on its own thread (stop it with ``.stop()``)."""
    worker = DeliveryWorker(queues, NotificationRegistry(queues), DeliveryOptions(worker_id, **{**FAST, **opts}))
    return DeliveryThread(worker).start()


def pending(registry, topic):
    return registry.topic_stats(topic).entries


def owns_all(queues, registry, topic, owner):
    shards = registry.shard_names(registry.get_topic(topic))
    return all((queues.owner(s) or ("",))[0] == owner for s in shards)


def delivered_keys(webhook):
    """(key, version) of every S3 record the webhook acknowledged."""
    return [(r["s3"]["object"]["key"], int(r["s3"]["object"]["sequencer"], 16)) for r in webhook.records]


def wait_drained(registry, topic, timeout=20.0):
    wait_for(lambda: pending(registry, topic) == 0, timeout=timeout, what=f"topic {topic} to drain")


def reopen(queues, **options):
    """Another client of the same queues (another writer, e.g. with a clock of its own)."""
    if queues.backend == "sqlite":
        return open_queues(f"sqlite:///{queues.path}", **options)
    return open_queues(queues.url, prefix=queues.prefix, **options)


def enqueue_raw(queues, shard, data):
    """What a broken or foreign writer may leave: bytes that are no notification."""
    return queues.commit(shard, queues.reserve(shard, len(data)), data)

