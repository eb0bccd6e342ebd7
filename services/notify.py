"""df-notify: delivers persistent notifications from their queues to the topics' endpoints.

Run as many as you like, on any hosts: they share the shards through leases
in the queue backend (``[notify]``: renewed every ``renew_interval``, taken
over ``lease`` seconds after an owner stopped renewing), and only a shard's
owner delivers and removes its entries, at least once, in per-key order.
See docs/df-notify.md. With ``notify.bridge = true`` it also subscribes to
``pubsub.topics`` (default: the store's tables) on the configured driver and
enqueues the changes of writers that do not use NbApi (docs/notifications.md).
SIGTERM stops the shards, releases their leases at once (another worker takes
them on its next walk) and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys

from dfpubsub.config import parse_settings
from dfpubsub.console import console_main
from dfpubsub.errors import DfPubSubError
from dfpubsub.factory import create_subscriber
from dfpubsub.logs import setup_logging
from dfpubsub.metrics import start_metrics_server
from dfpubsub.notify.bridge import NotificationBridge
from dfpubsub.notify.delivery import DeliveryOptions, DeliveryWorker
from dfpubsub.notify.producer import Notifier
from dfpubsub.notify.wiring import queues_from_settings, registry_from_settings

log = logging.getLogger("df-notify")


async def _run(worker: DeliveryWorker) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await worker.run(stop)


@console_main("df-notify")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-notify``."""
    settings = parse_settings("df-notify", __doc__.split("\n")[0], argv, ("notify", "store", "pubsub", "etcd", "redis", "log", "metrics"))
    setup_logging(settings.log.level, settings.log.format)
    n = settings.notify
    worker_id = n.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    try:
        queues = queues_from_settings(settings)
        registry = registry_from_settings(settings, queues)
        worker = DeliveryWorker(queues, registry, DeliveryOptions(
            worker_id, renew_interval=n.renew_interval, lease=n.lease, poll_interval=n.poll_interval,
            batch_size=n.batch_size, max_inflight=n.max_inflight, endpoint_inflight=n.endpoint_inflight))
    except DfPubSubError as exc:
        log.error("cannot start", extra={"error": str(exc)})
        return 1
    subscriber = notifier = None
    if n.bridge:
        try:
            notifier = Notifier(registry, queues, publisher=worker_id)
            subscriber = create_subscriber(settings, NotificationBridge(notifier),
                                           topics=settings.pubsub.topics or settings.store.tables,
                                           name=f"{worker_id}-bridge")
        except DfPubSubError as exc:
            log.error("cannot start the pub/sub bridge", extra={"error": str(exc)})
            queues.close()
            return 1
        subscriber.start()
    start_metrics_server(settings.metrics.port, settings.metrics.addr)
    log.info("df-notify starting", extra={"worker": worker_id, "queues": queues.backend,
                                          "renew_interval": n.renew_interval, "lease": n.lease})
    asyncio.run(_run(worker))
    log.info("df-notify stopping", extra={"worker": worker_id})
    if subscriber is not None and notifier is not None:
        subscriber.close()
        notifier.close()
    queues.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
