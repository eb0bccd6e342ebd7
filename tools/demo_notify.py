"""The notification part of df-demo: a persistent topic delivers to a webhook that is down for a while.

A topic ``port-events`` (11 shards on embedded SQLite) takes every change of
``port``; the API worker's NbApi reserves and commits a notification with each
write. The webhook is down at first: df-notify's worker retries, the entries
wait in the queues. The webhook comes up: everything is delivered, in order per
key, as S3 event records, and the queues drain to 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.delivery import DeliveryOptions, DeliveryThread, DeliveryWorker
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues

__all__ = ["run_notifications"]


def run_notifications(api: NbApi, workdir: Path, say: Callable[[str, str], None],
                      wait: Callable[..., bool]) -> bool:
    """Write ports with notifications on; True if the webhook got every change once the queues drained."""
    # The demo narrates the outage itself; the worker's own warnings would repeat it.
    logging.getLogger("dfpubsub.notify").setLevel(logging.ERROR)
    queues = open_queues(f"sqlite:///{workdir}/queues.sqlite")
    registry = NotificationRegistry(queues)
    webhook = WebhookReceiver()
    registry.create_topic(Topic("port-events", webhook.url, persistent=True, retry_sleep=0.3))
    registry.put_configuration(NotificationConfig("all-ports", "port", "port-events"))
    api.notifier = Notifier(registry, queues, publisher="api-worker")
    worker = DeliveryWorker(queues, registry, DeliveryOptions("df-notify-1", renew_interval=0.3, lease=1.5,
                                                              poll_interval=0.05))
    say("notify", f"topic 'port-events' (11 shards) -> {webhook.url}, which is DOWN for now")
    with DeliveryThread(worker):
        written = []
        for i in range(12):
            key = f"port-n{i % 5}"
            obj = (api.update("port", key, {"n": i}) if api.get("port", key) is not None
                   else api.create("port", key, {"n": i}))
            written.append((obj.key, obj.version))
        obj = api.delete("port", "port-n0")
        written.append((obj.key, obj.version))
        stats = worker.topic_stats("port-events")
        wait(lambda: stats.get("retries") >= 2)
        pending = registry.topic_stats("port-events").entries
        say("notify", f"{len(written)} writes; the webhook refuses: {stats.get('retries')} retries so far, "
                      f"{pending} notifications wait in the queues")
        time.sleep(1.0)  # let the outage last a little, for the story
        webhook.start()
        say("webhook", "up again")
        drained = wait(lambda: registry.topic_stats("port-events").entries == 0, 20)
        records = webhook.records
    webhook.stop()
    api.notifier = None
    got = [(r["s3"]["object"]["key"], int(r["s3"]["object"]["sequencer"], 16)) for r in records]
    in_order = all(
        [v for k, v in got if k == key] == sorted(v for k, v in got if k == key) for key, _ in written
    )
    first = records[0] if records else {}
    say("webhook", f"received {len(records)} S3 records, e.g. {first.get('eventName')} "
                   f"{first.get('s3', {}).get('object', {}).get('key')}; per-key order kept: {in_order}")
    ok = drained and set(written) <= set(got) and in_order
    say("notify", f"queues drained: {drained}; every change delivered: {set(written) <= set(got)}")
    queues.close()
    return ok
