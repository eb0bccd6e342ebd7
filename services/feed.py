"""df-feed: publishes every committed write of the northbound store, from its change feed.

A daemon of its own rather than a mode of df-publisher-service: that service
relays forked workers' envelopes byte for byte and needs no store, while this
one reads the store and is a publisher itself (its own id and sequences). Run
it anywhere; several at once (each with its own ``[feed] cursor``) are several
publishers of the same changes, and subscribers drop the repeats by version
(docs/feed.md). It binds ``pubsub.driver`` (``pubsub.multiproc`` is refused:
one process needs no publisher service) and registers in the discovery table,
so controllers with ``--controller.discover true`` connect to it.

SIGTERM: finish the batch in hand, save the position, unregister, say bye, exit 0.
"""

from __future__ import annotations

import logging
import socket
import sys

from dfpubsub.config import parse_settings
from dfpubsub.console import close_all, console_main, stop_on_signals
from dfpubsub.discovery import PublisherAnnouncer, discovery_from_settings
from dfpubsub.errors import ConfigError, DfPubSubError
from dfpubsub.factory import create_publisher
from dfpubsub.feed_publisher import FeedPublisher, FileCursor
from dfpubsub.leader import lead
from dfpubsub.logs import setup_logging
from dfpubsub.metrics import start_metrics_server
from dfpubsub.publisher import Publisher
from dfpubsub.store import open_store_from_settings

log = logging.getLogger("df-feed")


@console_main("df-feed")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-feed``."""
    settings = parse_settings("df-feed", __doc__.split("\n")[0], argv,
                              ("feed", "store", "pubsub", "discovery", "leader", "etcd", "redis",
                               "log", "metrics"))
    setup_logging(settings.log.level, settings.log.format)
    fs = settings.feed
    name = settings.pubsub.publisher_name or f"{socket.gethostname()}/feed"
    store = publisher = feed = announcer = discovery = leadership = None
    try:
        if settings.pubsub.multiproc:
            raise ConfigError("df-feed is one process: set pubsub.multiproc = false and give it a driver to bind")
        store = open_store_from_settings(settings)
        publisher = create_publisher(settings, name)
        assert isinstance(publisher, Publisher)
        feed = FeedPublisher(store, publisher, FileCursor(fs.cursor, fs.fsync) if fs.cursor else None,
                             topics=settings.pubsub.topics, batch=fs.batch, compact_interval=fs.compact_interval)
        if fs.announce:
            discovery = discovery_from_settings(settings)
            announcer = PublisherAnnouncer(discovery, publisher, advertise_host=fs.advertise_host or None)
        leadership = lead(settings, "df-feed")
    except DfPubSubError as exc:
        log.error("cannot start", extra={"error": str(exc)})
        close_all(announcer, discovery, feed, publisher, store)
        return 1
    start_metrics_server(settings.metrics.port, settings.metrics.addr)
    stop = stop_on_signals()
    if not leadership.wait():  # [leader]: a standby stopped before it led
        close_all(announcer, discovery, feed, publisher, store)
        return 0
    log.info("feed publisher starting", extra={"publisher": name, "id": publisher.id, "position": feed.position,
                                               "uri": publisher.transport.uri})
    feed.run(stop)
    log.info("feed publisher stopping", extra={"publisher": name, "position": feed.position,
                                               "published": publisher.stats.get("feed_published")})
    close_all(leadership, announcer, discovery, feed, publisher, store)
    return leadership.exit_status()


if __name__ == "__main__":
    sys.exit(main())
