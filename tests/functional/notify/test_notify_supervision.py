"""Shard tasks are supervised: a queue backend that fails after a send, or dies and comes back
in the middle of a batch, stalls no shard; every committed notification is delivered."""

import pytest
from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub.notify import NotificationRegistry
from dfpubsub.queues import open_queues
from dfpubsub.testing import crash
from tests.conftest import wait_for
from tests.functional.notify_helpers import delivered_keys, delivery, enqueue, make_topic, wait_drained


@pytest.fixture(params=["redis", "etcd"])
def backend(request):
    """A queue backend server of this test's own, free to kill and restart."""
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def webhook():
    with WebhookReceiver() as hook:
        yield hook


def _fill(url, hook, shards, count):
    queues = open_queues(url, prefix="sup")
    registry = NotificationRegistry(queues)
    topic = make_topic(registry, "sup", hook.url, shards=shards)
    for i in range(count):
        enqueue(queues, topic, "port", f"p{i}", "create", i + 1)
    return queues, registry


def test_the_backend_failing_after_a_send_stalls_no_shard(backend, webhook):
    queues, registry = _fill(backend.url, webhook, 1, 30)
    # The endpoint acknowledged the first batch; the queue backend dies before its removal.
    crash.arm("notify.after_send", backend.kill)
    worker = delivery(queues, batch_size=10)
    try:
        wait_for(lambda: worker.worker.topic_stats("sup").get("shard_failures") >= 1, timeout=20,
                 what="the failed removal to be seen")
        backend.start()
        wait_drained(registry, "sup", timeout=30)
        assert set(delivered_keys(webhook)) == {(f"p{i}", i + 1) for i in range(30)}
    finally:
        crash.disarm("notify.after_send")
        worker.stop()
        queues.close()


def test_the_backend_killed_and_restarted_mid_batch_everything_is_delivered(backend, webhook):
    queues, registry = _fill(backend.url, webhook, 11, 3000)
    worker = delivery(queues, batch_size=20)
    try:
        wait_for(lambda: len(webhook.records) >= 300, timeout=30, what="delivery to be under way")
        backend.kill()
        wait_for(lambda: worker.worker.topic_stats("sup").get("shard_failures") >= 3, timeout=20,
                 what="the shards to see the backend gone")
        backend.start()
        wait_drained(registry, "sup", timeout=60)
        assert set(delivered_keys(webhook)) == {(f"p{i}", i + 1) for i in range(3000)}
        assert worker.worker.owned() and len(worker.worker.owned()) <= 11
    finally:
        worker.stop()
        queues.close()


def test_a_shard_that_keeps_failing_is_released_for_another_worker(tmp_path, webhook):
    queues = open_queues(f"sqlite:///{tmp_path}/queues.sqlite")
    registry = NotificationRegistry(queues)
    topic = make_topic(registry, "stuck", webhook.url, shards=1)
    first = delivery(queues, worker_id="w1")
    second = None
    try:
        wait_for(lambda: (queues.owner("stuck") or ("",))[0] == "w1", what="w1 to own the shard")
        second = delivery(queues, worker_id="w2")

        def bug():
            raise RuntimeError("a bug after every send")

        crash.arm("notify.after_send", bug, times=10_000)
        for i in range(20):
            enqueue(queues, topic, "port", f"p{i}", "create", i + 1)
        # w1 fails round after round for longer than a lease (1 s), then lets the shard go.
        wait_for(lambda: (queues.owner("stuck") or ("",))[0] == "w2", timeout=20, what="w2 to take the shard over")
        assert first.worker.topic_stats("stuck").get("shard_failures") >= 2
        assert "stuck" not in first.worker.owned()
        crash.disarm("notify.after_send")
        wait_drained(registry, "stuck")
        assert set(delivered_keys(webhook)) == {(f"p{i}", i + 1) for i in range(20)}
    finally:
        crash.disarm("notify.after_send")
        first.stop()
        if second is not None:
            second.stop()
        queues.close()
