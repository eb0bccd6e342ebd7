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
import socket
import sys
import threading
from functools import partial

from dfpubsub.backends.sqlite import require_sqlite_file
from dfpubsub.config import parse_settings
from dfpubsub.console import close_all, console_main
from dfpubsub.daemon import Daemon, check_settings
from dfpubsub.factory import create_subscriber
from dfpubsub.logs import setup_logging
from dfpubsub.notify.bridge import NotificationBridge
from dfpubsub.notify.delivery import DeliveryOptions, DeliveryWorker
from dfpubsub.notify.producer import Notifier
from dfpubsub.notify.wiring import queues_from_settings, registry_from_settings
from dfpubsub.store import MISSING_HINT, open_store_from_settings

log = logging.getLogger("df-notify")


async def _run(worker: DeliveryWorker, daemon: Daemon) -> None:
    stop = asyncio.Event()
    beat = daemon.health.heartbeat("loop", 30.0)

    async def watch() -> None:
        # The signal sets a thread's event; this brings it into the loop, and shows the loop turns.
        while not daemon.stop.is_set():
            beat()
            await asyncio.sleep(0.2)
        stop.set()

    watcher = asyncio.create_task(watch())
    try:
        await worker.run(stop)
    finally:
        watcher.cancel()


def _walked(worker: DeliveryWorker, synced: threading.Event) -> str | None:
    """The readiness of df-notify: its last walk of the queues (claiming and renewing the shards'
    leases) went well."""
    if worker.walk_error is not None:
        return f"walking the queues failed: {worker.walk_error}"
    if worker.walked is None:
        return "the queues were not walked yet"
    synced.set()
    return None


@console_main("df-notify")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-notify``."""
    settings = check_settings(parse_settings("df-notify", __doc__.split("\n")[0], argv,
                                             ("notify", "store", "pubsub", "etcd", "redis", "log", "metrics")))
    setup_logging(settings.log.level, settings.log.format)
    n = settings.notify
    worker_id = n.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    daemon = Daemon("df-notify", worker_id, settings)
    if not settings.store.create:
        require_sqlite_file(n.url or settings.store.url, MISSING_HINT)
        if n.url in ("", settings.store.url) and not settings.store.url.startswith("sqlite"):
            # The queues share the store's server and prefix, which its writers (and df-db init) made:
            # a prefix nobody made is a typo, whose empty queues would look like nothing to deliver.
            store = daemon.open("store", lambda: open_store_from_settings(settings))
            if store is None:
                return 0
            store.close()
    queues = daemon.open("queues", lambda: queues_from_settings(settings))
    if queues is None:
        return 0
    subscriber = notifier = None
    try:
        registry = registry_from_settings(settings, queues)
        worker = DeliveryWorker(queues, registry, DeliveryOptions(
            worker_id, renew_interval=n.renew_interval, lease=n.lease, poll_interval=n.poll_interval,
            batch_size=n.batch_size, max_inflight=n.max_inflight, endpoint_inflight=n.endpoint_inflight))
        if n.bridge:
            notifier = Notifier(registry, queues, publisher=worker_id)
            subscriber = create_subscriber(settings, NotificationBridge(notifier),
                                           topics=settings.pubsub.topics or settings.store.tables,
                                           name=f"{worker_id}-bridge")
            subscriber.start()
        daemon.health.readiness("queues", partial(_walked, worker, daemon.health.synced))
        log.info("df-notify starting", extra={"worker": worker_id, "queues": queues.backend,
                                              "renew_interval": n.renew_interval, "lease": n.lease})
        asyncio.run(_run(worker, daemon))
        log.info("df-notify stopping", extra={"worker": worker_id})
    finally:
        close_all(subscriber, notifier, queues, daemon)
    return 0


if __name__ == "__main__":
    sys.exit(main())
