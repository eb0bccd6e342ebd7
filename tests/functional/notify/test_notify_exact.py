"""A delivery worker removes exactly what it delivered or set aside, never an entry it still holds,
and its retry counts survive a takeover (SQLite, Redis, etcd)."""

import time

import pytest
from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub.notify import NotificationRegistry
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
    reopen,
    wait_drained,
)


def test_an_undecodable_entry_takes_only_itself_to_the_dead_letters(queues):
    registry = NotificationRegistry(queues)
    webhook = WebhookReceiver()  # down: the valid entries wait in the queue
    topic = make_topic(registry, "bad", webhook.url, shards=1)
    for i in range(5):
        enqueue(queues, topic, "port", f"a{i}", "create", i + 1)
    bad = enqueue_raw(queues, "bad", b"\x93not a notification")
    for i in range(5):
        enqueue(queues, topic, "port", f"b{i}", "create", i + 1)
    worker = delivery(queues)
    try:
        wait_for(lambda: queues.list_dead_letters("bad"), what="the undecodable entry to be set aside")
        wait_for(lambda: worker.worker.topic_stats("bad").get("retries") >= 2, what="retries of the valid ones")
        # The ten valid entries are still queued, not only in the worker's memory.
        assert pending(registry, "bad") == 10
        assert bad not in {e.marker for e in queues.list("bad")[0]}
    finally:
        worker.stop()  # the worker goes away with whatever it held in memory
    [dead] = queues.list_dead_letters("bad")
    assert dead.marker == bad and dead.reason.startswith("undecodable")
    webhook.start()
    worker = delivery(queues, worker_id="w2")
    try:
        wait_drained(registry, "bad")
        assert set(delivered_keys(webhook)) == {(f"{p}{i}", i + 1) for p in "ab" for i in range(5)}
    finally:
        worker.stop()
        webhook.stop()


def test_expiry_sets_aside_only_the_expired_entries_whatever_their_place(queues):
    registry = NotificationRegistry(queues)
    webhook = WebhookReceiver()
    topic = make_topic(registry, "ttl", webhook.url, shards=1, time_to_live=5.0)
    behind = reopen(queues, clock=lambda: time.time() - 10)  # a writer whose clock is 10 s late
    try:
        enqueue(queues, topic, "port", "young", "create", 1)  # first in the queue, not expired
        enqueue(behind, topic, "port", "old", "create", 2)  # after it, and expired at once
        enqueue(queues, topic, "port", "young2", "create", 3)
    finally:
        behind.close()
    worker = delivery(queues)
    try:
        wait_for(lambda: queues.list_dead_letters("ttl"), what="the expired entry to be set aside")
        wait_for(lambda: worker.worker.topic_stats("ttl").get("retries") >= 2, what="retries of the others")
        assert pending(registry, "ttl") == 2
        [dead] = queues.list_dead_letters("ttl")
        assert dead.reason.startswith("time_to_live")
        webhook.start()
        wait_drained(registry, "ttl")
        assert sorted(delivered_keys(webhook)) == [("young", 1), ("young2", 3)]
    finally:
        worker.stop()
        webhook.stop()


def test_retry_counts_survive_a_takeover(queues):
    registry = NotificationRegistry(queues)
    refused = f"http://127.0.0.1:{free_port()}/hook"
    make_topic(registry, "budget", refused, shards=1, max_retries=6, retry_sleep=0.2)
    topic = registry.get_topic("budget")
    for i in range(3):
        enqueue(queues, topic, "port", f"p{i}", "create", i + 1)
    first = delivery(queues, worker_id="w1")
    try:
        wait_for(lambda: first.worker.topic_stats("budget").get("retries") >= 4, what="four retries")
    finally:
        first.stop()
    assert pending(registry, "budget") == 3
    second = delivery(queues, worker_id="w2")
    try:
        wait_for(lambda: owns_all(queues, registry, "budget", "w2"), what="w2 to take the shard")
        wait_drained(registry, "budget")
        # The budget of 1 + 6 attempts was partly spent by w1: w2 does not start it again.
        assert second.worker.topic_stats("budget").get("retries") <= 3
        assert {d.reason.split(" ")[0] for d in queues.list_dead_letters("budget")} == {"max_retries"}
        assert len(queues.list_dead_letters("budget")) == 3
    finally:
        second.stop()


@pytest.mark.parametrize("record", [
    b'{"queue": 1.0, "first": "00000000000000000001", "last": "00000000000000000009", "attempts": 100}',
    b"\xff not json",
    b'{"queue": "x", "first": 1, "attempts": true}',
])
def test_a_retry_record_of_another_queue_or_a_foreign_one_does_not_apply(queues, record):
    """A topic deleted and made again numbers its entries from 1: the old count is not theirs."""
    from dfpubsub.notify.shard import ATTEMPTS_KIND

    registry = NotificationRegistry(queues)
    topic = make_topic(registry, "again", f"http://127.0.0.1:{free_port()}/hook", shards=1, max_retries=2)
    queues.put_record(ATTEMPTS_KIND, "again", record)
    enqueue(queues, topic, "port", "p", "create", 1)
    worker = delivery(queues)
    try:
        wait_drained(registry, "again")
        assert worker.worker.topic_stats("again").get("retries") == 2
        wait_for(lambda: queues.get_record(ATTEMPTS_KIND, "again") is None, what="the handled count to go")
    finally:
        worker.stop()
