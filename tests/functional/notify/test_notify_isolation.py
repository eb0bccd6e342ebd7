"""A hung endpoint holds only its own topic's slots, and HTTP timeouts are set per topic."""

import time

import pytest
from dfpubsub.tools.webhook import HungWebhook, WebhookReceiver

from dfpubsub.notify import NotificationRegistry
from dfpubsub.queues import open_queues
from tests.conftest import wait_for
from tests.functional.notify_helpers import (
    delivered_keys,
    delivery,
    enqueue,
    make_topic,
    wait_drained,
)

pytestmark = pytest.mark.alone  # bounds on elapsed time


def test_hung_endpoints_do_not_delay_a_healthy_topic(tmp_path):
    queues = open_queues(f"sqlite:///{tmp_path}/queues.sqlite")
    registry = NotificationRegistry(queues)
    hung = [HungWebhook() for _ in range(3)]
    try:
        with WebhookReceiver() as webhook:
            for n, h in enumerate(hung):
                topic = make_topic(registry, f"hung{n}", h.url, shards=4, endpoint_options={"timeout": "60"})
                for i in range(40):
                    enqueue(queues, topic, "port", f"p{i}", "create", i + 1)
            healthy = make_topic(registry, "healthy", webhook.url, shards=2)
            # Worker-wide 8 sends in flight, 2 per topic: the three hung topics hold 6 at most.
            worker = delivery(queues, max_inflight=8, endpoint_inflight=2)
            try:
                wait_for(lambda: sum(len(h.accepted) for h in hung) >= 6, what="the hung endpoints to hold sends")
                start = time.monotonic()
                for i in range(50):
                    enqueue(queues, healthy, "port", f"h{i}", "create", i + 1)
                wait_drained(registry, "healthy", timeout=10)
                assert time.monotonic() - start < 5, "the healthy topic waited for the hung ones"
                assert len(delivered_keys(webhook)) == 50
                # Each hung topic used its own two slots, no more.
                assert all(len(h.accepted) <= 2 for h in hung)
            finally:
                worker.stop()
    finally:
        for h in hung:
            h.close()
        queues.close()


def test_a_topic_sets_its_own_read_timeout_and_in_flight_slots(tmp_path):
    queues = open_queues(f"sqlite:///{tmp_path}/queues.sqlite")
    registry = NotificationRegistry(queues)
    with HungWebhook() as hung:
        topic = make_topic(registry, "slow", hung.url, shards=3, max_retries=1,
                           endpoint_options={"read_timeout": "0.3", "connect_timeout": "1", "max_inflight": "1"})
        for i in range(6):
            enqueue(queues, topic, "port", f"p{i}", "create", i + 1)
        worker = delivery(queues)
        try:
            start = time.monotonic()
            wait_drained(registry, "slow", timeout=15)
            elapsed = time.monotonic() - start
            # Two attempts per shard of 0.3 s each, well under the default 10 s timeout; one send at a
            # time (max_inflight 1), so the three shards' six attempts took turns.
            assert 6 * 0.3 <= elapsed < 8
            dead = queues.list_dead_letters()
            assert len(dead) == 6 and all(d.reason.startswith("max_retries") for d in dead)
            assert any("Timeout" in d.reason or "timed out" in d.reason for d in dead)
            assert len(hung.accepted) == 6
        finally:
            worker.stop()
    queues.close()
