"""The isolation half of the notify benchmark: a healthy topic's delivery latency beside hung endpoints.

One :class:`DeliveryWorker` (df-notify's defaults: 64 sends in flight, 8 per
topic) serves a healthy 11-shard topic whose local webhook answers at once,
and ``hung`` 11-shard topics whose webhooks accept connections on loopback and
never answer (HTTP timeout 10 s, the default), every shard of them holding
entries. A writer commits ``rate`` notifications per second to the healthy
topic for ``seconds`` (long enough for the hung sends to time out and be
retried within it); a notification's latency is from its commit to its
arrival at the webhook. The figure is the p99 of those latencies, with hung
endpoints and without (``hung=0``): docs/df-notify.md asks for at most twice.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from dfpubsub.tools.webhook import HungWebhook, WebhookReceiver

from dfpubsub.notify import NotificationRegistry, Topic, event_name
from dfpubsub.notify.delivery import DeliveryOptions, DeliveryThread, DeliveryWorker
from dfpubsub.notify.notification import encode, make_notification
from dfpubsub.queues import QueueStore, open_queues, shard_for

__all__ = ["isolation_p99"]

SHARDS = 11


def _commit(queues: QueueStore, topic: str, key: str, version: int) -> None:
    data = encode(make_notification(topic, event_name("update"), "update", "port", key, version, {"v": version}))
    shard = shard_for(topic, SHARDS, "port", key)
    queues.commit(shard, queues.reserve(shard, len(data)), data)


def isolation_p99(hung: int = 6, rate: int = 200, seconds: float = 14.0) -> float:
    """The p99 (seconds) of the healthy topic's delivery latency with ``hung`` hung endpoints beside it."""
    hung_hooks = [HungWebhook() for _ in range(hung)]
    try:
        with tempfile.TemporaryDirectory(prefix="dfpubsub-isolation-") as tmp, WebhookReceiver() as hook:
            queues = open_queues(f"sqlite:///{os.path.join(tmp, 'q.sqlite')}")
            registry = NotificationRegistry(queues)
            for n, h in enumerate(hung_hooks):
                registry.create_topic(Topic(f"hung{n}", h.url, persistent=True, shards=SHARDS, retry_sleep=0.1))
                for i in range(SHARDS * 8):  # entries on every shard
                    _commit(queues, f"hung{n}", f"k{i}", i + 1)
            registry.create_topic(Topic("healthy", hook.url, persistent=True, shards=SHARDS))
            worker = DeliveryWorker(queues, registry, DeliveryOptions("bench", 1.0, 10.0, 0.05))
            sent: dict[str, float] = {}
            with DeliveryThread(worker):
                _commit(queues, "healthy", "warm-up", 1)  # connections and sessions opened, untimed
                deadline = time.monotonic() + 10
                while not hook.records and time.monotonic() < deadline:
                    time.sleep(0.01)
                if hung:  # the hung endpoints hold what they can before the healthy topic's load starts
                    deadline = time.monotonic() + 10
                    while sum(len(h.accepted) for h in hung_hooks) < 6 * hung and time.monotonic() < deadline:
                        time.sleep(0.02)
                total = int(rate * seconds)
                start = time.monotonic()
                for i in range(total):
                    key = f"h{i}"
                    sent[key] = time.time()
                    _commit(queues, "healthy", key, i + 2)
                    pause = start + (i + 1) / rate - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                deadline = time.monotonic() + 60
                while len(hook.records) <= total and time.monotonic() < deadline:
                    time.sleep(0.05)
            queues.close()
            arrived = {r["s3"]["object"]["key"]: at for at, r in hook.arrivals}
    finally:
        for h in hung_hooks:
            h.close()
    latencies = [arrived.get(key, float("inf")) - at for key, at in sent.items()]
    return statistics.quantiles(latencies, n=100, method="inclusive")[98]


if __name__ == "__main__":
    base, isolated = isolation_p99(0), isolation_p99()
    print(f"healthy topic p99 {base:.3f} s alone, {isolated:.3f} s beside 6 hung endpoints")
