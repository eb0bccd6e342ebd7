"""df-controller: a sample controller daemon that keeps a cache of the store and logs every change.

It is the informer pattern end to end: subscribe to the configured topics on
the configured driver, full-sync from the configured store, apply events, and
resync whatever a gap, a dead publisher or an overflow says was missed. With
``--controller.discover true`` it also connects to the publishers listed in the
discovery table as they come and go. Each
create, update and delete is logged as one JSON line. SIGTERM stops it
cleanly; ``--metrics.port`` serves Prometheus counters.
"""

from __future__ import annotations

import gc
import logging
import socket
import sys

from dfpubsub.console import console_main
from dfpubsub.config import parse_settings
from dfpubsub.controller import Controller
from dfpubsub.discovery import DiscoveryConnector, discovery_from_settings
from dfpubsub.errors import DfPubSubError
from dfpubsub.events import VersionedObject
from dfpubsub.factory import create_driver, subscriber_options
from dfpubsub.logs import setup_logging
from dfpubsub.metrics import Stats, start_metrics_server
from dfpubsub.nbapi import open_store_from_settings
from dfpubsub.pipeline.bootstrap import SnapshotBootstrap

log = logging.getLogger("df-controller")


class LoggingHandler:
    """Logs every change of one table."""

    def __init__(self, table: str):
        self.table = table

    def on_create(self, obj: VersionedObject) -> None:
        log.info("create", extra={"table": obj.table, "key": obj.key, "version": obj.version, "topic": obj.topic})

    def on_update(self, obj: VersionedObject, previous: VersionedObject) -> None:
        log.info("update", extra={"table": obj.table, "key": obj.key, "version": obj.version,
                                  "previous_version": previous.version})

    def on_delete(self, previous: VersionedObject) -> None:
        log.info("delete", extra={"table": previous.table, "key": previous.key, "version": previous.version})


@console_main("df-controller")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-controller``."""
    settings = parse_settings("df-controller", __doc__.split("\n")[0], argv)
    setup_logging(settings.log.level, settings.log.format)
    name = settings.controller.name or socket.gethostname()
    topics = settings.pubsub.topics or settings.store.tables
    try:
        store = open_store_from_settings(settings)
        driver = create_driver(settings)
        transport = driver.subscriber(Stats("subscriber-transport", name))
    except DfPubSubError as exc:
        log.error("cannot start", extra={"error": str(exc)})
        return 1
    controller = Controller(
        store, transport, topics, {t: LoggingHandler(t) for t in settings.store.tables},
        subscriber_options(settings.pubsub), name, settings.controller.reconcile_interval,
        settings.cache.tombstone_horizon,
        bootstrap=SnapshotBootstrap(settings.controller.bootstrap) if settings.controller.bootstrap else None,
    )
    discovery = connector = None
    if settings.controller.discover:
        try:
            discovery = discovery_from_settings(settings)
            connector = DiscoveryConnector(discovery, controller.subscriber, static=[driver.url] if driver.url else [])
        except DfPubSubError as exc:
            log.error("cannot watch the discovery table", extra={"error": str(exc)})
            store.close()
            return 1
    start_metrics_server(settings.metrics.port, settings.metrics.addr)
    # What exists at start-up lives as long as the daemon: keep it out of every collection.
    gc.freeze()
    log.info("controller starting", extra={"controller": name, "topics": sorted(topics), "store": store.backend,
                                           "discover": settings.controller.discover})
    controller.run_forever()
    if connector is not None and discovery is not None:
        connector.close(disconnect=False)
        discovery.close()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
