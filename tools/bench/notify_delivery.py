"""The delivery half of the notify benchmark: notifications/s one df-notify worker delivers.

A persistent 11-shard topic on embedded SQLite is filled with ``count``
notifications as a notifier writes them, each carrying its value's encoding
(the worker derives size and etag from it), not timed; then one
:class:`DeliveryWorker` delivers them to a local HTTP webhook running in
another process (S3 records, the endpoint's default batches), acknowledged
and removed; the figure is count / time to empty. ``batch=1`` measures one
notification per request instead.
:func:`kafka_delivery_rate` does the same into librdkafka's mock Kafka cluster
(three brokers in this process, one message per notification, idempotent,
``acks=all``): it measures the endpoint and the worker, not a real cluster's disks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import msgpack

from dfpubsub.notify import NotificationRegistry, Topic, event_name
from dfpubsub.notify.delivery import DeliveryOptions, DeliveryThread, DeliveryWorker
from dfpubsub.notify.notification import encode, make_notification
from dfpubsub.queues import open_queues, shard_for
from dfpubsub.testing.servers import free_port

__all__ = ["delivery_rate", "kafka_delivery_rate"]

VALUE = {"name": "port-000001", "mac": "fa:16:3e:12:34:56", "fixed_ips": ["10.0.0.17"], "status": "ACTIVE"}


def _deliver(url: str, count: int, endpoint_options: dict[str, str]) -> float:
    """Queue ``count`` notifications for ``url`` (not timed); the rate one worker empties the queue at."""
    with tempfile.TemporaryDirectory(prefix="dfpubsub-notify-bench-") as tmp:
        queues = open_queues(f"sqlite:///{os.path.join(tmp, 'q.sqlite')}")
        registry = NotificationRegistry(queues)
        topic = registry.create_topic(Topic("bench", url, persistent=True, max_entries=count, max_bytes=1 << 30,
                                            endpoint_options=endpoint_options))
        for i in range(count):
            key = f"port-{i % 4096:06d}"
            data = encode(make_notification("bench", event_name("update"), "update", "port", key, i + 1, VALUE),
                          msgpack.packb(VALUE))
            shard = shard_for("bench", topic.shards or 11, "port", key)
            queues.commit(shard, queues.reserve(shard, len(data)), data)
        worker = DeliveryWorker(queues, registry, DeliveryOptions("bench", 1.0, 10.0, 0.01, 100, 64))
        start = time.perf_counter()
        with DeliveryThread(worker):
            while registry.topic_stats("bench").entries:
                time.sleep(0.02)
            elapsed = time.perf_counter() - start
        queues.close()
    return count / elapsed


def delivery_rate(count: int = 50_000, max_batch: int = 100) -> float:
    """Notifications per second one worker delivers to a local webhook."""
    port = free_port()
    hook = subprocess.Popen([sys.executable, "-m", "dfpubsub.tools.webhook", "--port", str(port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert hook.stdout is not None and hook.stdout.readline().strip() == "ready"
        return _deliver(f"http://127.0.0.1:{port}/hook", count, {"max_batch": str(max_batch)})
    finally:
        hook.terminate()
        hook.wait(10)


def kafka_delivery_rate(count: int = 50_000) -> float:
    """Notifications per second one worker delivers into librdkafka's mock cluster (3 brokers)."""
    from dfpubsub.testing.kafka_mock import MockKafkaCluster

    with MockKafkaCluster(3) as cluster:
        cluster.create_topic("bench", 4)
        return _deliver(f"kafka://{cluster.bootstrap_servers}", count, {})


if __name__ == "__main__":
    print(f"{delivery_rate():,.0f} notifications/s (batches of 100)")
    print(f"{delivery_rate(5_000, 1):,.0f} notifications/s (one per request)")
    print(f"{kafka_delivery_rate():,.0f} notifications/s into the mock Kafka cluster")
