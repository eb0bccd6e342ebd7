"""df-controller: a sample controller daemon that keeps a cache of the store and logs every change.

It is the informer pattern end to end: subscribe to the configured topics on
the configured driver, full-sync from the configured store, apply events, and
resync whatever a gap, a dead publisher or an overflow says was missed; every
changed key goes through the work queue to ``[controller] workers`` reconciler
threads. With ``--controller.discover true`` it also connects to the publishers
listed in the discovery table as they come and go. Each reconcile (the key's
newest state, or its deletion) is logged as one JSON line. SIGTERM stops it
cleanly; ``--metrics.port`` serves Prometheus counters.
"""

from __future__ import annotations

import gc
import logging
import socket
import sys

from dfpubsub.config import parse_settings
from dfpubsub.console import close_all, console_main
from dfpubsub.controller import Controller, ControllerOptions, FeedIds, ObjectKey, RelistAdmission, StatusWriter
from dfpubsub.daemon import Daemon, check_settings
from dfpubsub.discovery import DiscoveryConnector, discovery_from_settings
from dfpubsub.errors import DfPubSubError
from dfpubsub.events import VersionedObject
from dfpubsub.factory import create_driver, subscriber_options
from dfpubsub.leader import Leadership
from dfpubsub.logs import setup_logging
from dfpubsub.metrics import Stats
from dfpubsub.pipeline.bootstrap import SnapshotBootstrap
from dfpubsub.store import Store, open_store_from_settings

log = logging.getLogger("df-controller")


class LoggingReconciler:
    """Logs the state each key is reconciled to (what a real controller would program), and for a
    deleted key the final state it had (what a real controller would clean up)."""

    def __init__(self) -> None:
        self.controller: Controller | None = None
        self.leadership = Leadership(None)

    def reconcile(self, key: ObjectKey, obj: VersionedObject | None) -> None:
        self.leadership.check()  # [leader]: NotLeader past the renew deadline; the key is retried
        if obj is not None:
            log.info("reconcile", extra={"table": obj.table, "key": obj.key, "version": obj.version,
                                         "topic": obj.topic})
            return
        last = self.controller.lister(key.table).last_known(key.key) if self.controller is not None else None
        log.info("delete", extra={"table": key.table, "key": key.key, "version": last.version if last else None})


@console_main("df-controller")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-controller``."""
    settings = check_settings(parse_settings(
        "df-controller", __doc__.split("\n")[0], argv,
        ("pubsub", "cache", "store", "controller", "relist", "discovery", "leader", "etcd", "redis", "log",
         "metrics")))
    setup_logging(settings.log.level, settings.log.format)
    name = settings.controller.name or socket.gethostname()
    topics = settings.pubsub.topics or settings.store.tables
    daemon = Daemon("df-controller", name, settings)
    store = daemon.open("store", lambda: open_store_from_settings(settings))
    if store is None:
        return 0
    try:
        driver = create_driver(settings)
        transport = driver.subscriber(Stats("subscriber-transport", name))
        admission = RelistAdmission.from_settings(settings, name)  # a fleet's relists: bounded, jittered, paged
    except DfPubSubError:
        store.close()
        raise
    reconciler = LoggingReconciler()
    # df-feed's bookmarks move the positions without reading the store; discovery says who is df-feed.
    feeds = FeedIds() if settings.controller.discover and settings.controller.bookmarks else None
    controller = Controller(
        store, transport, topics, None, subscriber_options(settings.pubsub), name,
        settings.controller.reconcile_interval, settings.cache.tombstone_horizon,
        bootstrap=SnapshotBootstrap(settings.controller.bootstrap) if settings.controller.bootstrap else None,
        reconcilers={t: reconciler for t in settings.store.tables},
        runtime=ControllerOptions.from_settings(settings.controller),
        feeds=feeds,
        state_dir=settings.controller.state_dir or None,
        admission=admission,
    )
    reconciler.controller = controller
    discovery = connector = None
    if settings.controller.discover:
        try:
            discovery = discovery_from_settings(settings)
            connector = DiscoveryConnector(discovery, controller.subscriber, static=[driver.url] if driver.url else [],
                                           feeds=feeds)
        except DfPubSubError:
            store.close()
            raise
    health = daemon.health
    health.synced = controller.synced
    health.threads("threads", lambda: controller.threads)
    health.polled("store", lambda: _ping(store), interval=2.0, timeout=10.0)
    if settings.controller.snapshot_required and controller.snapshots is not None:
        health.readiness("snapshot", controller.snapshots.problem)
    leadership = daemon.lead()
    if leadership is None:  # a standby stopped before it led
        if connector is not None:
            connector.close(disconnect=False)
        close_all(admission, discovery, store, daemon)
        return 0
    reconciler.leadership = leadership
    beat = health.heartbeat("main", 30.0)
    # What exists at start-up lives as long as the daemon: keep it out of every collection.
    gc.freeze()
    log.info("controller starting", extra={"controller": name, "topics": sorted(topics), "store": store.backend,
                                           "discover": settings.controller.discover})
    status = StatusWriter(controller, settings.controller.status_file, settings.controller.status_interval) \
        if settings.controller.status_file else None
    controller.start()
    while not daemon.stop.wait(1.0):
        beat()
    log.info("controller stopping", extra={"controller": name})
    controller.stop(timeout=3.0)
    if connector is not None:
        connector.close(disconnect=False)  # the subscriber is closed: nothing to disconnect
    close_all(status, admission, discovery, leadership, store, daemon)
    return leadership.exit_status()


def _ping(store: Store) -> None:
    """A store that answers passes (a failure raises, and fails the check with its message)."""
    store.feed_head()


if __name__ == "__main__":
    sys.exit(main())
