"""The feed publisher: follows the store's change feed and publishes every committed write.

This closes the write/publish hole by construction (docs/feed.md): whoever
wrote (NbApi in any publish mode, a controller registering its chassis, df-db,
a raw store call) and whatever happened after the commit (a crash, a lost
answer), the write is in the feed, and this publishes it. For each batch of
entries it reads the objects' *current* values and versions (``get_many``):
an object changed again since its entry goes out with its newer version,
which every cache takes; one deleted since is left to its delete's entry,
which carries the deletion's version.

The position moves, and is saved (:class:`FileCursor`), only once a batch
was handed to the transport, so a restart resumes there: delivery is at least
once, and subscribers drop the repeats by version. A batch whose publishing
failed (the store died before its values were read) stays pending and is
published first at the next step: the reader has already moved past it, and
dropping it would pass over a committed write with nothing to show for it (no
gap: its entries never took a sequence number). Without a saved position, or when
the feed's history below it is gone, nothing can tell what was missed: the
publisher declares its topics lost (:meth:`Publisher.declare_lost`), every
subscriber resyncs them, and it goes on from the store's head.

Since it publishes every entry in revision order, it can say how far it got:
at most every ``bookmark_interval`` while entries come, and as soon as the
feed goes quiet, a hello with a bookmark (:meth:`Publisher.bookmark`) tells
subscribers that every entry up to its position went out on their topics'
streams at the sequences the hello lists. Controllers that hear its streams
unbroken move their positions on it and read nothing from the store for it
(dfpubsub.controller.bookmarks). An entry it cannot publish (a value too
large for a frame) would make that claim false: its topic is declared lost
instead, so subscribers see a gap and repair it from the store.

With a publisher of wire schema 2 (docs/protocol.md §4.6) the values are not
decoded at all: each object's bytes are read as the store holds them
(:meth:`Store.get_many_packed`), their structure checked in one pass (what
every subscriber checks again at receipt), and sent as they are.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .codec import PACKED_SCHEMA, check_packed
from .errors import DecodeError, HistoryGone, InvalidEvent, StoreError
from .events import Action, VersionedObject
from .logs import RateLimitedLog
from .metrics import ROLE_COUNTERS, Stats
from .retry import Backoff
from .store import FeedEntry, Store

if TYPE_CHECKING:
    from .publisher import Publisher

__all__ = ["FeedPublisher", "FileCursor"]

log = logging.getLogger(__name__)


class FileCursor:
    """A feed position kept in a file, replaced atomically (and fsynced if ``fsync``)."""

    def __init__(self, path: str, fsync: bool = False):
        self.path = path
        self.fsync = fsync

    def load(self) -> int | None:
        """The saved position; None if there is none or it is not a number (then: start afresh)."""
        try:
            with open(self.path, encoding="ascii") as fh:
                value = int(fh.read().strip())
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return value if value >= 0 else None

    def save(self, position: int) -> None:
        """Replace the saved position; OSError if the file cannot be written."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{position}\n")
            if self.fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, self.path)


class FeedPublisher:
    """Publishes ``store``'s feed through ``publisher``; ``cursor`` None keeps no position.

    ``topics`` are declared lost (resynced by subscribers) when what came
    before the position is unknown, along with every table's name and every
    topic this publisher has seen in the feed.
    """

    def __init__(self, store: Store, publisher: Publisher, cursor: FileCursor | None = None, *,
                 topics: Iterable[str] = (), batch: int = 1000, compact_interval: float = 60.0,
                 stats: Stats | None = None, bookmark_interval: float = 1.0):
        self.store = store
        self.publisher = publisher
        self.cursor = cursor
        self.batch = batch
        self.compact_interval = compact_interval
        self.bookmark_interval = bookmark_interval
        self.stats = stats or publisher.stats
        self.stats.seed(*ROLE_COUNTERS["feed"])
        self._topics = set(topics) | set(store.tables)
        self._trouble = RateLimitedLog(log)
        saved = cursor.load() if cursor is not None else None
        self.reader = store.follow_feed(saved if saved is not None else store.feed_head())
        self._saved = saved
        self._published = self.reader.position
        self._pending: list[FeedEntry] = []  # read, not yet published (see step)
        self._bookmarked = -1  # the position the last bookmark named
        self._bookmark_sent = float("-inf")
        if saved is None:
            self._lost("no saved position")

    @property
    def position(self) -> int:
        """Revision up to which every entry was published (foreign ones skipped)."""
        return self._published

    def step(self, timeout: float = 0.2) -> int:
        """Read one batch (waiting up to ``timeout`` for it), publish it, save the position;
        how many entries it held. StoreUnavailable if the store is: a batch read but not
        published is published first by the next step."""
        if not self._pending:
            try:
                self._pending = self.reader.read(self.batch, timeout)
            except HistoryGone as exc:
                self.stats.inc("feed_history_gone")
                self.reader.close()
                self.reader = self.store.follow_feed(self.store.feed_head())
                self._published = self.reader.position
                self._lost(str(exc))
                self._save()
                return 0
        entries = self._pending
        if entries:
            self._publish(entries)
        self._pending = []
        self._published = self.reader.position  # past the batch, and past foreign entries skipped
        self.stats.inc("feed_entries", len(entries))
        if self.position != self._saved:
            self._save()
        self._bookmark(quiet=not entries)
        return len(entries)

    def _bookmark(self, quiet: bool) -> None:
        """Say how far every entry went out: at most every ``bookmark_interval`` while entries
        come, at once when the feed went quiet (the last word of a burst)."""
        if self.bookmark_interval <= 0 or self._published == self._bookmarked:
            return
        now = time.monotonic()
        if quiet or now - self._bookmark_sent >= self.bookmark_interval:
            self.publisher.bookmark(self._published)
            self._bookmarked, self._bookmark_sent = self._published, now
            self.stats.inc("feed_bookmarks")

    def run(self, stop: threading.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Publish until ``stop`` is set; a store that fails is retried with backoff; the feed is
        compacted every ``compact_interval`` seconds. ``beat`` is called at every turn (a
        liveness probe's heartbeat)."""
        backoff, next_compact = Backoff(0.1, 5.0), 0.0
        while not stop.is_set():
            beat()
            try:
                self.step()
                backoff.reset()
                if self.compact_interval and time.monotonic() >= next_compact:
                    next_compact = time.monotonic() + self.compact_interval
                    if removed := self.store.compact_feed():
                        self.stats.inc("feed_compacted", removed)
            except StoreError as exc:  # unavailable, or a watch the server canceled: read again from the position
                self.stats.inc("feed_store_errors")
                self._trouble.warning("store", "cannot read the feed; retrying", error=str(exc), position=self.position)
                stop.wait(backoff.failed())

    def close(self) -> None:
        """Stop following (the publisher and the store are the caller's to close)."""
        self.reader.close()

    def _publish(self, entries: list[FeedEntry]) -> None:
        # One message per object per batch: the newest entry of each, in feed order.
        last = {(e.table, e.key): e for e in entries}
        wanted = [(e.table, e.key) for e in last.values() if e.action is not Action.DELETE]
        packed: dict[tuple[str, str], bytes] = {}
        if not wanted:
            current = {}
        elif self.publisher.options.schema == PACKED_SCHEMA:
            objects, blobs = self._current_packed(wanted)
            current = {(o.table, o.key): o for o in objects}
            packed = {(o.table, o.key): b for o, b in zip(objects, blobs)}
        else:
            current = {(o.table, o.key): o for o in self._current(wanted)}
        publish, topics, published = self.publisher.publish, self._topics, 0
        with self.publisher.burst():  # flushed at its end
            for (table, key), entry in sorted(last.items(), key=lambda item: item[1].revision):
                topics.add(entry.topic)
                try:
                    if entry.action is Action.DELETE:
                        publish(entry.topic, table, key, Action.DELETE, entry.revision)
                    else:
                        obj = current.get((table, key))
                        if obj is None:  # deleted since: its delete's entry follows
                            self.stats.inc("feed_gone_since")
                            continue
                        topics.add(obj.topic)
                        publish(obj.topic, table, key, entry.action, obj.version, obj.value, None,
                                packed.get((table, key)))
                    published += 1
                except InvalidEvent as exc:  # too large for a frame, say: a gap makes subscribers repair it
                    self.stats.inc("feed_unpublishable")
                    self._trouble.warning("event", "change not publishable; its topic is declared lost", table=table,
                                          key=key, error=str(exc))
                    self.publisher.declare_lost((entry.topic,), "feed_unpublishable")
        self.stats.inc("feed_published", published)

    def _current(self, refs: list[tuple[str, str]]) -> list[VersionedObject]:
        """The objects of ``refs`` that exist; one whose value does not decode (written beside the
        store by something else) is skipped and counted."""
        try:
            return self.store.get_many(refs)
        except (ValueError, TypeError):
            out = []
            for table, key in refs:
                try:
                    obj = self.store.get(table, key)
                except (ValueError, TypeError):
                    self.stats.inc("feed_undecodable")
                    continue
                if obj is not None:
                    out.append(obj)
            return out

    def _current_packed(self, refs: list[tuple[str, str]]) -> tuple[list[VersionedObject], list[bytes]]:
        """:meth:`_current` without decoding: the objects (carrying None) and their values' bytes; one
        whose bytes are not one msgpack object is skipped and counted (a value that is not a map stays:
        publishing it fails, and its topic is declared lost)."""
        objects, blobs = self.store.get_many_packed(refs)
        try:
            check_packed(blobs)
            return objects, blobs
        except DecodeError:  # find which: rare (something wrote beside the store)
            pass
        kept: tuple[list[VersionedObject], list[bytes]] = ([], [])
        for obj, blob in zip(objects, blobs):
            try:
                check_packed([blob])
            except DecodeError as exc:
                if exc.reason != "malformed":
                    self.stats.inc("feed_undecodable")
                    continue
            kept[0].append(obj)
            kept[1].append(blob)
        return kept

    def _lost(self, why: str) -> None:
        self.stats.inc("feed_declared_lost")
        log.warning("feed history unknown; subscribers will resync", extra={"why": why, "position": self.position,
                                                                          "topics": sorted(self._topics)})
        self.publisher.declare_lost(self._topics, "feed_lost")

    def _save(self) -> None:
        if self.cursor is not None:
            try:
                self.cursor.save(self.position)
                self._saved = self.position
            except OSError as exc:
                self._trouble.warning("cursor", "cannot save the feed position", path=self.cursor.path,
                                      error=str(exc))
