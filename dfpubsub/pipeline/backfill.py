"""The archive with no hole: df-archiver checks what it received against the store's change feed.

Events reach the archiver through the transport, which can miss some: those
published while no archiver ran (a leader killed, the standby not yet
subscribed), those the transport lost. Every committed write is in the
store's change feed, in revision order. :class:`FeedBackfill` follows the feed
from the log's **reach** (the revision up to which every committed write of
the archived topics is in the log) and, entry by entry, in order:

- a write the archiver received (the same table, key and version) moves the
  reach past it;
- a write not received after ``grace`` seconds (time for its event to come:
  delivery, a publisher's reconnection) is read from the store and appended
  as a row of its own (``publisher_id`` :data:`FEED_PUBLISHER`, ``seq`` its
  revision; its value if the store still holds that version, else null);
- an entry of another topic moves the reach on.

Every ``mark_every`` seconds the reach, if it moved, is written to the log as a
:data:`REACH` marker in each topic's partition (after the rows it covers:
journaled together, published together). The next archiver of the log (a
restart, a new leader) reads the newest marker and the writes archived above
it (:mod:`dfpubsub.archive.marks`) and resumes the feed there: what the old
one had not archived is read from the feed, what it had is not read twice.
Where the feed's history no longer reaches the reach (:class:`HistoryGone`:
retention, compaction, a long outage), a :data:`HISTORY_GONE` marker says
which revisions could not be checked, and the reach moves past them;
``df-pipeline audit`` reports gaps there as "history gone", not as
unexplained.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

import msgpack

from ..archive.marks import Reach, archived_above, newest_reach, reach_note
from ..archive.schema import HISTORY_GONE, REACH, feed_row, marker_row
from ..archive.writer import SegmentWriter
from ..errors import HistoryGone, StoreError, StoreUnavailable
from ..events import Action, Event
from ..logs import RateLimitedLog
from ..metrics import Stats
from ..store import FeedEntry, FeedReader, Store

__all__ = ["FeedBackfill"]

log = logging.getLogger("dfpubsub.archive.backfill")

#: Feed entries read per step, and objects per get_many.
_BATCH = 1000


class FeedBackfill:
    """Keeps the log under ``writer`` complete for ``topics`` against ``store``'s change feed.

    Call :meth:`start` once (after the writer recovered its journals), :meth:`received`
    after each event is appended, and :meth:`step` periodically from one thread.
    Counters (role ``archiver``): ``backfilled`` (rows read from the feed),
    ``history_gone`` (markers written), ``feed_errors``.
    """

    def __init__(self, store: Store, topics: Iterable[str], writer: SegmentWriter, stats: Stats,
                 grace: float = 10.0, mark_every: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.topics = sorted(set(topics))
        self.writer = writer
        self.stats = stats
        self.grace = grace
        self.mark_every = mark_every
        self._clock = clock
        # etcd's feed names the table as the topic of an update that left the topic alone: where a
        # topic is not a table's name, such an entry may be ours, and only the object can say.
        self._topics_not_tables = any(t not in store.tables for t in self.topics)
        #: Every committed write of the topics up to here is in the log.
        self.reach = 0
        self._lock = threading.Lock()  # guards _seen: the subscriber's thread adds, step() takes
        self._seen: dict[tuple[str, str, int], str] = {}  # writes received above the reach -> their segment
        self._pending: deque[tuple[FeedEntry, float]] = deque()  # read, not yet matched, with when read
        self._reader: FeedReader | None = None
        self._marked = -1  # the reach of the last marker
        self._marked_at = float("-inf")
        self._trouble = RateLimitedLog(log, 10.0)

    def start(self) -> Reach | None:
        """Resume from the log's newest reach marker (the writes above it already archived are
        not read again), or, for a log that has none, from the feed's head: a new log has no
        history to complete. Returns the marker found."""
        found = newest_reach(self.writer.root, self.topics)
        if found is None:
            self.reach = self.store.feed_head()
        else:
            self.reach = found.revision
            with self._lock:
                for write in archived_above(self.writer.root, self.topics, found):
                    self._seen[write] = found.scan_from
        self._reader = self.store.follow_feed(self.reach)
        log.info("following the change feed", extra={"reach": self.reach, "marker": found is not None,
                                                     "archived_above": len(self._seen)})
        self._mark(time.time())
        return found

    def received(self, event: Event, segment: str) -> None:
        """``event`` was appended to ``segment`` (call after the append: the reach never passes a
        write that is not yet in the log)."""
        if event.version > self.reach:
            with self._lock:
                self._seen.setdefault((event.table, event.key, event.version), segment)

    def step(self) -> None:
        """Read the feed on, match what it says with what was received, read from the store the
        writes that waited ``grace`` in vain, and mark the reach every ``mark_every`` seconds."""
        assert self._reader is not None, "start() first"
        try:
            entries = self._reader.read(_BATCH, 0.0)
        except HistoryGone as exc:
            self._gone(exc)
            return
        except StoreError as exc:  # unavailable, or refusing: the reach waits, and so do the writes
            self.stats.inc("feed_errors")
            self._trouble.warning("feed", "cannot read the change feed; the reach waits",
                                  error=str(exc), reach=self.reach)
            return
        now = self._clock()
        self._pending.extend((entry, now) for entry in entries)
        try:
            self._settle(now)
        except StoreUnavailable as exc:
            self.stats.inc("feed_errors")
            self._trouble.warning("fetch", "cannot read missed writes from the store; the reach waits",
                                  error=str(exc), reach=self.reach)
        if self.reach != self._marked and now - self._marked_at >= self.mark_every:
            self._mark(time.time())

    def close(self) -> None:
        """Mark the reach one last time (before the writer's last roll) and stop following the feed."""
        if self._reader is not None:
            if self.reach != self._marked:
                self._mark(time.time())
            self._reader.close()
            self._reader = None

    # -- inside ----------------------------------------------------------------------------------

    def _settle(self, now: float) -> None:
        """Move the reach over the pending entries, in order, as far as they are archived."""
        missing: list[FeedEntry] = []
        with self._lock:
            while self._pending:
                entry, read_at = self._pending[0]
                write = (entry.table, entry.key, entry.revision)
                if self._seen.pop(write, None) is None and self._ours(entry):
                    if now - read_at < self.grace:
                        break
                    missing.append(entry)
                self._pending.popleft()
        if missing:
            self._backfill(missing)  # appended before the reach moves past them
        with self._lock:
            if self._pending:  # up to the first entry still waiting for its event
                self.reach = max(self.reach, self._pending[0][0].revision - 1)
            elif self._reader is not None:  # everything read is settled: up to where the reader is
                self.reach = max(self.reach, self._reader.position)
            for write in [w for w in self._seen if w[2] <= self.reach]:
                del self._seen[write]  # received, but no entry of ours: another store's, or forged

    def _ours(self, entry: FeedEntry) -> bool:
        return entry.topic in self.topics or (self._topics_not_tables and entry.action is Action.UPDATE
                                              and entry.topic == entry.table)

    def _backfill(self, missing: list[FeedEntry]) -> None:
        for start in range(0, len(missing), _BATCH):
            page = missing[start:start + _BATCH]
            current = {(o.table, o.key): o for o in self.store.get_many({(e.table, e.key) for e in page})}
            received_at = time.time()
            for entry in page:
                obj = current.get((entry.table, entry.key))
                topic = obj.topic if obj is not None else entry.topic
                if topic not in self.topics:
                    continue
                value = None
                if entry.action is not Action.DELETE and obj is not None and obj.version == entry.revision:
                    value = msgpack.packb(obj.value)
                self.writer.append(feed_row(topic, entry.table, entry.key, entry.action.value, entry.revision,
                                            value, received_at))
                self.stats.inc("backfilled")
        log.info("archived writes read from the change feed", extra={"writes": len(missing),
                                                                     "up_to": missing[-1].revision})

    def _gone(self, exc: HistoryGone) -> None:
        horizon = exc.horizon or self.store.feed_head()
        after = self.reach
        received_at = time.time()
        note = msgpack.packb({"after": after})
        for topic in self.topics:
            self.writer.append(marker_row(topic, HISTORY_GONE, horizon, after, note, received_at))
        self.stats.inc("history_gone")
        log.warning("the change feed's history is gone: writes the archiver did not receive in between "
                    "cannot be archived", extra={"after": after, "horizon": horizon})
        with self._lock:
            self._pending.clear()
            self.reach = max(self.reach, horizon)
            for write in [w for w in self._seen if w[2] <= self.reach]:
                del self._seen[write]
        if self._reader is not None:
            self._reader.close()
        self._reader = self.store.follow_feed(self.reach)

    def _mark(self, received_at: float) -> None:
        with self._lock:
            reach = self.reach
            scan_from = min(self._seen.values(), default="")
        note = reach_note(scan_from)
        for topic in self.topics:
            self.writer.append(marker_row(topic, REACH, reach, 0, note, received_at))
        self._marked, self._marked_at = reach, self._clock()
