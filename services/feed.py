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

import gc
import logging
import socket
import sys
import threading
from functools import partial

from dfpubsub.config import parse_settings
from dfpubsub.console import close_all, console_main
from dfpubsub.daemon import Daemon, check_settings
from dfpubsub.discovery import PublisherAnnouncer, discovery_from_settings
from dfpubsub.errors import ConfigError
from dfpubsub.factory import create_publisher
from dfpubsub.feed_publisher import FeedPublisher, FileCursor
from dfpubsub.logs import setup_logging
from dfpubsub.publisher import Publisher
from dfpubsub.store import Store, open_store_from_settings

log = logging.getLogger("df-feed")


@console_main("df-feed")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-feed``."""
    settings = check_settings(parse_settings("df-feed", __doc__.split("\n")[0], argv,
                                             ("feed", "store", "pubsub", "discovery", "leader", "etcd", "redis",
                                              "log", "metrics")))
    setup_logging(settings.log.level, settings.log.format)
    fs = settings.feed
    if settings.pubsub.multiproc:
        raise ConfigError("df-feed is one process: set pubsub.multiproc = false and give it a driver to bind")
    name = settings.pubsub.publisher_name or f"{socket.gethostname()}/feed"
    daemon = Daemon("df-feed", name, settings)
    store = daemon.open("store", lambda: open_store_from_settings(settings))
    publisher = feed = announcer = discovery = leadership = None
    try:
        if store is None:
            return 0
        publisher = create_publisher(settings, name)
        assert isinstance(publisher, Publisher)
        pub = publisher
        feed = daemon.open("store", lambda: FeedPublisher(
            store, pub, FileCursor(fs.cursor, fs.fsync) if fs.cursor else None,
            topics=settings.pubsub.topics, batch=fs.batch, compact_interval=fs.compact_interval,
            bookmark_interval=fs.bookmark_interval))
        if feed is None:
            return 0
        if fs.announce:
            discovery = found = discovery_from_settings(settings)
            announcer = daemon.open("discovery", lambda: PublisherAnnouncer(
                found, pub, advertise_host=fs.advertise_host or None, role="feed"))
            if announcer is None:
                return 0
        leadership = daemon.lead()
        if leadership is None:  # a standby stopped before it led
            return 0
        health = daemon.health
        health.polled("feed", partial(_lag, store, feed, fs.ready_lag, health.synced), interval=1.0, timeout=10.0)
        beat = health.heartbeat("main", 30.0)
        # What exists at start-up lives as long as the daemon: keep it out of every collection (as
        # df-controller does). Each batch allocates thousands of objects, and the full collections
        # they trigger walked all of it: most of df-feed's CPU per entry (tools/bench/feed.py).
        gc.freeze()
        log.info("feed publisher starting", extra={"publisher": name, "id": publisher.id, "position": feed.position,
                                                   "uri": publisher.transport.uri})
        feed.run(daemon.stop, beat)
        log.info("feed publisher stopping", extra={"publisher": name, "position": feed.position,
                                                   "published": publisher.stats.get("feed_published")})
    finally:
        close_all(leadership, announcer, discovery, feed, publisher, store, daemon)
    return leadership.exit_status() if leadership is not None else 0


def _lag(store: Store, feed: FeedPublisher, bound: int, synced: threading.Event) -> str | None:
    """The readiness of df-feed: the store answers and the reader is within ``bound`` revisions of
    the feed's head (the first time: synced)."""
    behind = store.feed_head() - feed.position
    if behind > bound:
        return f"{behind} revisions behind the feed's head (limit {bound})"
    synced.set()
    return None


if __name__ == "__main__":
    sys.exit(main())
