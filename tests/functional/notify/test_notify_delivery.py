"""Delivery of persistent notifications to real endpoints: what Ceph's acceptance suite checks."""

import os
import shutil
import subprocess
import sys
from collections import defaultdict

from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub.notify import NotificationRegistry
from dfpubsub.queues import open_queues
from dfpubsub.testing.servers import free_port
from tests.conftest import wait_for
from tests.functional.notify_helpers import (
    delivered_keys,
    delivery,
    enqueue,
    enqueue_raw,
    make_topic,
    owns_all,
    pending,
    wait_drained,
)


def test_endpoint_down_pending_grows_then_drains_when_it_is_back(queues):
    registry = NotificationRegistry(queues)
    webhook = WebhookReceiver()  # not listening yet: connection refused
    topic = make_topic(registry, "down", webhook.url)
    worker = delivery(queues)
    try:
        wait_for(lambda: owns_all(queues, registry, "down", "w1"), what="the worker to own every shard")
        for i in range(60):
            enqueue(queues, topic, "port", f"p{i}", "create", i + 1)
        assert pending(registry, "down") == 60
        for i in range(60, 100):
            enqueue(queues, topic, "port", f"p{i}", "create", i + 1)
        wait_for(lambda: worker.worker.topic_stats("down").get("retries") >= 3, what="retries")
        assert pending(registry, "down") == 100
        webhook.start()
        wait_drained(registry, "down")
        assert sorted(delivered_keys(webhook)) == sorted((f"p{i}", i + 1) for i in range(100))
        # Counted once the removal has returned, a moment after the queue shows it drained.
        wait_for(lambda: worker.worker.topic_stats("down").get("delivered") >= 100, what="the deliveries counted")
        assert worker.worker.topic_stats("down").get("delivered") == 100
    finally:
        worker.stop()
        webhook.stop()


def test_time_to_live_and_max_retries_move_entries_to_the_dead_letters(queues):
    registry = NotificationRegistry(queues)
    refused = f"http://127.0.0.1:{free_port()}/hook"
    ttl = make_topic(registry, "ttl", refused, time_to_live=0.3, shards=2)
    retries = make_topic(registry, "retries", refused, max_retries=2, shards=2)
    for i in range(5):
        enqueue(queues, ttl, "port", f"t{i}", "create", i + 1)
        enqueue(queues, retries, "port", f"r{i}", "create", i + 1)
    worker = delivery(queues)
    try:
        for name in ("ttl", "retries"):
            wait_drained(registry, name)
        dead = queues.list_dead_letters()
        reasons = defaultdict(set)
        for d in dead:
            reasons[d.queue.split(".")[0]].add(d.reason.split(" ")[0])
        assert len(dead) == 10 and reasons == {"ttl": {"time_to_live"}, "retries": {"max_retries"}}
        assert worker.worker.topic_stats("retries").get("retries") >= 2
        # Counted once the set-aside has returned, a moment after the queue shows it drained.
        wait_for(lambda: worker.worker.topic_stats("ttl").get("dead_letters", "time_to_live") >= 5,
                 what="the dead letters counted")
        assert worker.worker.topic_stats("ttl").get("dead_letters", "time_to_live") == 5
    finally:
        worker.stop()


def test_a_dead_endpoint_does_not_delay_a_live_one_on_the_same_source(queues):
    registry = NotificationRegistry(queues)
    with WebhookReceiver() as live:
        dead = make_topic(registry, "dead", f"http://127.0.0.1:{free_port()}/hook", shards=3)
        alive = make_topic(registry, "alive", live.url, shards=3)
        for i in range(200):
            enqueue(queues, dead, "port", f"p{i}", "update", i + 1)
            enqueue(queues, alive, "port", f"p{i}", "update", i + 1)
        worker = delivery(queues)
        try:
            wait_drained(registry, "alive")
            assert len(live.records) == 200
            assert pending(registry, "dead") == 200
        finally:
            worker.stop()


def test_per_key_order_holds_at_the_endpoint(queues):
    registry = NotificationRegistry(queues)
    with WebhookReceiver() as webhook:
        topic = make_topic(registry, "order", webhook.url, shards=4)
        worker = delivery(queues, batch_size=7)
        try:
            version = 0
            for _ in range(30):
                for k in range(8):
                    version += 1
                    enqueue(queues, topic, "port", f"k{k}", "update", version)
            wait_drained(registry, "order")
            seen = defaultdict(list)
            for key, v in delivered_keys(webhook):
                seen[key].append(v)
            assert sum(len(v) for v in seen.values()) == 240
            assert all(v == sorted(v) for v in seen.values())
        finally:
            worker.stop()


def _df_notify(url, worker_id, prefix):
    exe = shutil.which("df-notify", path=os.path.dirname(sys.executable))
    return subprocess.Popen([exe, "--notify.url", url, "--store.prefix", prefix, "--notify.worker-id", worker_id,
                             "--notify.renew-interval", "0.3", "--notify.lease", "1.5",
                             "--notify.poll-interval", "0.02", "--log.level", "warning"])


def test_kill_9_of_the_owner_during_delivery_another_takes_over_and_nothing_is_lost(tmp_path, shared_redis):
    prefix = f"takeover-{tmp_path.name[-12:]}"
    url = f"redis://127.0.0.1:{shared_redis.port}/0"
    queues = open_queues(url, prefix=prefix)
    registry = NotificationRegistry(queues)
    a = b = None
    with WebhookReceiver() as webhook:
        topic = make_topic(registry, "takeover", webhook.url, shards=4)
        try:
            a = _df_notify(url, "a", prefix)
            wait_for(lambda: owns_all(queues, registry, "takeover", "a"), what="a to own every shard")
            b = _df_notify(url, "b", prefix)
            for i in range(3000):
                enqueue(queues, topic, "port", f"p{i % 50}", "update", i + 1)
            wait_for(lambda: webhook.records, what="a to deliver")
            a.kill()
            a.wait(10)
            left = pending(registry, "takeover")
            wait_for(lambda: owns_all(queues, registry, "takeover", "b"), what="b to take the shards over")
            wait_drained(registry, "takeover", timeout=30)
            got = set(delivered_keys(webhook))
            assert got == {(f"p{i % 50}", i + 1) for i in range(3000)}, "nothing lost (duplicates allowed)"
            assert left > 0 or len(webhook.records) >= 3000
        finally:
            for p in (a, b):
                if p is not None:
                    p.kill()
                    p.wait(10)
            queues.close()


def test_100_creates_and_100_deletes_through_nbapi_are_all_delivered(queues, tmp_path):
    from dfpubsub.nbapi import NbApi
    from dfpubsub.notify import NotificationConfig
    from dfpubsub.notify.producer import Notifier
    from dfpubsub.store import open_store

    registry = NotificationRegistry(queues)
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port"])
    with WebhookReceiver() as webhook:
        make_topic(registry, "objects", webhook.url)
        registry.put_configuration(NotificationConfig("all", "port", "objects"))
        api = NbApi(store, None, Notifier(registry, queues))
        worker = delivery(queues)
        try:
            created = [api.create("port", f"obj{i}", {"i": i}) for i in range(100)]
            deleted = [api.delete("port", f"obj{i}") for i in range(100)]
            wait_drained(registry, "objects")
            names = {(r["s3"]["object"]["key"], r["eventName"]) for r in webhook.records}
            assert {(o.key, "ObjectCreated:Put") for o in created} <= names
            assert {(o.key, "ObjectRemoved:Delete") for o in deleted} <= names
            assert set(delivered_keys(webhook)) == {(o.key, o.version) for o in created + deleted}
        finally:
            worker.stop()
            store.close()


def test_a_new_default_shard_count_applies_to_new_topics_and_everything_is_delivered(queues):
    registry = NotificationRegistry(queues)
    with WebhookReceiver() as webhook:
        old = make_topic(registry, "old", webhook.url)
        registry = NotificationRegistry(queues, default_shards=3)
        new = make_topic(registry, "new", webhook.url)
        assert (registry.get_topic("old").shards, new.shards) == (11, 3)
        for i in range(50):
            enqueue(queues, old, "port", f"o{i}", "create", i + 1)
            enqueue(queues, new, "port", f"n{i}", "create", i + 1)
        worker = delivery(queues)
        try:
            for name in ("old", "new"):
                wait_drained(registry, name)
            assert len({k for k, _ in delivered_keys(webhook)}) == 100
            assert len(registry.shard_names(old)) == 11
        finally:
            worker.stop()


def test_entries_of_the_previous_release_and_of_this_one_deliver_the_same_record(queues, tmp_path):
    """Across an upgrade a shard holds schema 1 maps (size and etag computed by the writer) next to
    schema 2 entries (the value's encoding, size and etag derived at delivery): both are delivered,
    with the same size and etag for the same value."""
    import msgpack

    from dfpubsub.nbapi import NbApi
    from dfpubsub.notify import NotificationConfig
    from dfpubsub.notify.notification import value_digest
    from dfpubsub.notify.producer import Notifier
    from dfpubsub.queues import shard_for
    from dfpubsub.store import open_store

    value = {"name": "p", "fixed_ips": ["10.0.0.1"], "mtu": 1500, "nested": {"b": 1, "a": [1.5, None]}}
    size, etag = value_digest(value)
    registry = NotificationRegistry(queues)
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port"])
    with WebhookReceiver() as webhook:
        topic = make_topic(registry, "upgrade", webhook.url, shards=2)
        registry.put_configuration(NotificationConfig("all", "port", "upgrade"))
        old = {"v": 1, "id": "upgrade:port:old:7", "topic": "upgrade", "event_name": "s3:ObjectCreated:Put",
               "action": "create", "bucket": "port", "key": "old", "version": 7, "size": size, "etag": etag,
               "event_time": 1.5e9, "value": None, "opaque_data": "", "publisher": "before", "config_id": "all"}
        enqueue_raw(queues, shard_for("upgrade", topic.shards, "port", "old"), msgpack.packb(old))
        api = NbApi(store, None, Notifier(registry, queues))
        worker = delivery(queues)
        try:
            made = api.create("port", "new", value)
            wait_drained(registry, "upgrade")
            objects = {r["s3"]["object"]["key"]: r["s3"]["object"] for r in webhook.records}
            assert objects["old"]["versionId"] == "7" and objects["new"]["versionId"] == str(made.version)
            assert (objects["old"]["size"], objects["old"]["eTag"]) == (size, etag)
            assert (objects["new"]["size"], objects["new"]["eTag"]) == (size, etag)
        finally:
            worker.stop()
            store.close()
