"""df-archiver: a subscriber that writes every event, with its envelope's metadata, to the event log.

The log is Parquet segments partitioned by topic and date (docs/pipeline.md),
rolled by size and age and published by atomic rename; every event is first
appended to a journal, so a crash loses nothing: the next start publishes the
journal. The archiver does not resync from the store: what the transport lost
stays visible as a sequence gap in the log (``df-pipeline audit`` reports it)
and in the ``gaps`` counter. SIGTERM publishes what is buffered and exits;
``--metrics.port`` serves Prometheus counters.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time

from dfpubsub.archive import SegmentWriter
from dfpubsub.config import Settings, add_config_arguments, settings_from_args
from dfpubsub.console import ArgumentParser, console_main
from dfpubsub.discovery import DiscoveryConnector, discovery_from_settings
from dfpubsub.errors import DfPubSubError
from dfpubsub.events import Event
from dfpubsub.factory import create_subscriber
from dfpubsub.leader import Leadership, lead
from dfpubsub.logs import setup_logging
from dfpubsub.metrics import Stats, start_metrics_server

log = logging.getLogger("df-archiver")

__all__ = ["Archiver", "main"]


class Archiver:
    """Subscribes to ``topics`` as ``settings`` say and archives every event under ``archive.path``."""

    def __init__(self, settings: Settings, topics: list[str], name: str, leadership: Leadership | None = None):
        a = settings.archive
        self.name = name
        self.stats = Stats("archiver", name)
        self.writer = SegmentWriter(a.path, a.segment_max_bytes, a.segment_max_age, a.fsync, self.stats)
        self.subscriber = create_subscriber(settings, self._on_event, None, topics, name)
        self._tick = min(1.0, a.segment_max_age / 4)
        self._stop = threading.Event()
        self._leadership = leadership or Leadership(None)

    def _on_event(self, event: Event) -> None:
        # [leader]: past its renew deadline the lease may be another's, which archives from here on.
        if not self._leadership.may_act():
            self.stats.inc("drops", reason="not_leader")
            return
        self.writer.append_event(event, time.time())

    def start(self) -> Archiver:
        """Publish what a crashed predecessor left, then subscribe."""
        recovered = self.writer.recover()
        if recovered:
            log.info("recovered events from journals", extra={"events": recovered})
        self.subscriber.start()
        return self

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self._stop.set()

    def run(self) -> bool:
        """Roll segments by age until :meth:`stop`; then stop receiving and publish the rest.

        Returns whether everything received was published (else it waits in a journal).
        """
        while not self._stop.wait(self._tick):
            try:
                self.writer.maybe_roll()
            except DfPubSubError as exc:  # a full disk: its rows stay in their journal until the next start
                log.error("cannot publish a segment", extra={"error": str(exc)})
        self.subscriber.close()
        try:
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
    parser = ArgumentParser(prog="df-archiver", description=__doc__.split("\n")[0])
    add_config_arguments(parser, ("pubsub", "archive", "store", "discovery", "leader", "log", "metrics"))
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except DfPubSubError as exc:
        print(f"df-archiver: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log.level, settings.log.format)
    name = settings.archive.name or socket.gethostname()
    topics = settings.pubsub.topics or settings.store.tables
    leadership = lead(settings, "df-archiver")
    start_metrics_server(settings.metrics.port, settings.metrics.addr)
    if not leadership.wait():  # [leader]: a standby stopped before it led
        return 0
    try:
        archiver = Archiver(settings, topics, name, leadership)
        connector = discovery = None
        if settings.archive.discover:
            discovery = discovery_from_settings(settings)
            connector = DiscoveryConnector(discovery, archiver.subscriber)
        archiver.start()
    except DfPubSubError as exc:
        log.error("cannot start", extra={"error": str(exc)})
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: archiver.stop())
    log.info("archiver started", extra={"archiver": name, "topics": sorted(topics), "path": settings.archive.path,
                                        "subscriber": archiver.subscriber.transport.__class__.__name__})
    clean = archiver.run()
    if connector is not None and discovery is not None:
        connector.close(disconnect=False)
        discovery.close()
    leadership.close()
    return leadership.exit_status(0 if clean else 1)


if __name__ == "__main__":
    sys.exit(main())
