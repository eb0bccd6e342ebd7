"""df-archiver: a subscriber that writes every event, with its envelope's metadata, to the event log.

The log is Parquet segments partitioned by topic and date (docs/pipeline.md),
rolled by size and age and published by atomic rename; every event is first
appended to a journal, so a crash loses nothing: the next start publishes the
journal. With ``[archive] backfill`` it checks what it received against the
store's change feed and archives the writes it did not receive, from where
the log's last reach marker says it is complete (a restart, a new leader):
docs/pipeline.md, "No hole". Without it, what the transport lost stays
visible as a sequence gap in the log (``df-pipeline audit`` reports it) and in
the ``gaps`` counter. SIGTERM publishes what is buffered and exits;
``--metrics.port`` serves Prometheus counters and the /livez and /readyz probes.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable

from dfpubsub.archive import SegmentWriter
from dfpubsub.config import Settings, parse_settings
from dfpubsub.console import close_all, console_main
from dfpubsub.daemon import Daemon, check_settings
from dfpubsub.discovery import DiscoveryConnector, discovery_from_settings
from dfpubsub.errors import DfPubSubError
from dfpubsub.events import Event
from dfpubsub.factory import create_subscriber
from dfpubsub.leader import Leadership
from dfpubsub.logs import setup_logging
from dfpubsub.metrics import Stats
from dfpubsub.pipeline.backfill import FeedBackfill
from dfpubsub.store import Store, open_store_from_settings

log = logging.getLogger("df-archiver")

__all__ = ["Archiver", "main"]


class Archiver:
    """Subscribes to ``topics`` as ``settings`` say and archives every event under ``archive.path``."""

    def __init__(self, settings: Settings, topics: list[str], name: str, stop: threading.Event | None = None,
                 leadership: Leadership | None = None, store: Store | None = None):
        a = settings.archive
        self.name = name
        self.stats = Stats("archiver", name)
        self.writer = SegmentWriter(a.path, a.segment_max_bytes, a.segment_max_age, a.fsync, self.stats)
        #: With a store: the log checked against its change feed (a marker every segment's age, 10 s at most).
        self.backfill = None if store is None else FeedBackfill(
            store, topics, self.writer, self.stats, a.backfill_after, min(10.0, a.segment_max_age))
        self.subscriber = create_subscriber(settings, self._on_event, None, topics, name)
        self._tick = min(1.0, a.segment_max_age / 4)
        self._stop = stop if stop is not None else threading.Event()
        #: Why the last segment could not be published (None: the last roll went well).
        self.trouble: str | None = None
        self._leadership = leadership or Leadership(None)

    def _on_event(self, event: Event) -> None:
        # [leader]: past its renew deadline the lease may be another's, which archives from here on.
        if not self._leadership.may_act():
            self.stats.inc("drops", reason="not_leader")
            return
        segment = self.writer.append_event(event, time.time())
        if self.backfill is not None:
            self.backfill.received(event, segment)

    def start(self) -> Archiver:
        """Publish what a crashed predecessor left, find where the log reaches, then subscribe."""
        recovered = self.writer.recover()
        if recovered:
            log.info("recovered events from journals", extra={"events": recovered})
        if self.backfill is not None:
            self.backfill.start()
        self.subscriber.start()
        return self

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self._stop.set()

    def run(self, beat: Callable[[], None] = lambda: None) -> bool:
        """Roll segments by age until :meth:`stop`; then stop receiving and publish the rest.
        ``beat`` is called at every turn (a liveness probe's heartbeat).

        Returns whether everything received was published (else it waits in a journal).
        """
        while not self._stop.wait(self._tick):
            beat()
            try:
                if self.backfill is not None and self._leadership.may_act():  # past its deadline: another's turn
                    self.backfill.step()
                self.writer.maybe_roll()
                self.trouble = None
            except DfPubSubError as exc:  # a full disk: its rows stay in their journal until the next start
                self.trouble = f"cannot publish a segment: {exc}"
                log.error("cannot publish a segment", extra={"error": str(exc)})
        self.subscriber.close()
        try:
            if self.backfill is not None:
                self.backfill.close()
            self.writer.close()
        except DfPubSubError as exc:
            log.error("cannot publish the last segment; its journal waits for the next start",
                      extra={"error": str(exc)})
            return False
        received = {f"subscriber_{k}": v for k, v in self.subscriber.stats.snapshot().items()}
        log.info("archiver stopped", extra={"archiver": self.name, **self.stats.snapshot(), **received})
        return True


@console_main("df-archiver")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-archiver``."""
    settings = check_settings(parse_settings("df-archiver", __doc__.split("\n")[0], argv,
                                             ("pubsub", "archive", "store", "discovery", "leader", "etcd", "redis",
                                              "log", "metrics")))
    setup_logging(settings.log.level, settings.log.format)
    name = settings.archive.name or socket.gethostname()
    topics = settings.pubsub.topics or settings.store.tables
    daemon = Daemon("df-archiver", name, settings)
    store = None
    if settings.archive.backfill:
        store = daemon.open("store", lambda: open_store_from_settings(settings))
        if store is None:  # stopped while the store did not answer
            daemon.close()
            return 0
    leadership = daemon.lead()  # journals are recovered by the leader only
    if leadership is None:  # a standby stopped before it led
        close_all(store, daemon)
        return 0
    archiver = Archiver(settings, topics, name, daemon.stop, leadership, store)
    connector = discovery = None
    try:
        if settings.archive.discover:
            discovery = discovery_from_settings(settings)
            connector = DiscoveryConnector(discovery, archiver.subscriber)
        if daemon.open("store", archiver.start) is None:
            close_all(connector, discovery, archiver.subscriber, leadership, store, daemon)
            return 0
    except DfPubSubError:
        close_all(connector, discovery, archiver.subscriber, leadership, store, daemon)
        raise
    health = daemon.health
    health.synced.set()  # journals published, subscribed: nothing more to sync
    health.readiness("archive", lambda: archiver.trouble)
    health.threads("threads", lambda: archiver.subscriber.threads)
    beat = health.heartbeat("main", 30.0)
    log.info("archiver started", extra={"archiver": name, "topics": sorted(topics), "path": settings.archive.path,
                                        "subscriber": archiver.subscriber.transport.__class__.__name__})
    clean = archiver.run(beat)
    if connector is not None:
        connector.close(disconnect=False)
    close_all(discovery, leadership, store, daemon)
    return leadership.exit_status(0 if clean else 1)


if __name__ == "__main__":
    sys.exit(main())
