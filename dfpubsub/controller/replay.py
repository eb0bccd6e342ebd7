"""A repair by replay: read the store's change feed from where the cache is complete, fetch only
what it missed.

A controller's cache is *complete up to* a revision ``after``: every write
the store committed up to it is in the cache (it was listed at that
revision, or replayed up to it). Anything lost since (an envelope, a dead
writer's last writes, a partition) is in the feed after ``after``. A replay
reads those entries (a few dozen bytes each, no values), keeps the last one
per object, and compares it with the cache:

- the last write of an object is an update or create at ``r``: the cache
  must hold it at exactly ``r``; below, the cache missed it; above, the
  version was never the store's (no entry explains it) and is forged;
- the last write is a delete at ``r``: the cache must not hold the object.

Only the objects that fail the test are read (``get_many``, a page at a
time), and a delete is applied from its entry alone. An object events
changed since the last repair without any entry explaining it
(:meth:`VersionedCache.take_touched`) is read too: whatever an event claimed,
the store's answer replaces it. So a replay costs what was missed plus the
entries since the last repair, not the table, and the cache equals the store
afterwards for every object written or touched since.

The position only moves over entries read, up to the head read before them.
A replay never skips history, and never stops short of the newest write it
knows of (:meth:`Store.feed_last`, read after the head: on etcd, whose head
also counts other clients' writes, a key every write of the store puts), so it
is *complete*: it read every write committed before it began. (On etcd it
reads them by range, at once, from the history of that key, whose value names
each write, :meth:`Store.read_writes`: a watch from a past revision waits for
etcd's catch-up round of 100 ms. On an etcd
store that no writer of this version wrote to, it reads up to the newest write
of an object that exists, :meth:`Store.feed_floor`, then until nothing more
arrives for a moment: probably complete, not provably.) What it cannot do it
refuses, and the caller relists: :class:`~dfpubsub.errors.HistoryGone` (the
feed was trimmed or compacted below ``after``), :class:`TooFarBehind` (more
entries than ``max_entries``, where a relist reads less, OVSDB's rule; known
before reading where every revision is an entry, :attr:`Store.feed_dense`) and
:class:`AheadOfStore` (``after`` is above the store's head: only a bookmark
could have put it there, or the store went back to an older state).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

from ..errors import StoreUnavailable
from ..events import Action, VersionedObject
from ..store import FeedEntry, Store
from .cache import Change, VersionedCache

__all__ = ["AheadOfStore", "Replayed", "TooFarBehind", "replay", "replay_limit"]

_DELETE = Action.DELETE
#: Objects per get_many: one request each, small enough for every backend's limits.
_PAGE = 500
#: Seconds a replay waits for the feed to reach the head it read (etcd's watch delivers the past
#: in catch-up rounds of 100 ms, slower on a loaded server); SQLite and Redis answer at once.
_CATCH_UP = 10.0
#: Seconds without a new entry after which a reader past the floor has read what there is (etcd).
_QUIET = 0.2


class TooFarBehind(Exception):
    """The feed since the position holds more entries than a replay may read: relist instead."""


class AheadOfStore(Exception):
    """The position is above the store's head: no write of this store put it there."""


class Replayed(NamedTuple):
    """What a replay did: the changes the cache had missed, the feed entries and objects it read,
    the revision the cache is now complete up to, and whether it provably read every write
    committed before it began (see the module's doc)."""

    changes: list[Change]
    entries: int
    objects: int
    position: int
    complete: bool


def replay_limit(store: Store, cache: VersionedCache, ratio: float) -> int:
    """The most feed entries a replay may read before a relist reads less (OVSDB's rule):
    ``ratio`` of the cached objects (at least 1000), divided by what an entry costs against an
    object's version in a listing, by the backend's measure (:attr:`Store.feed_entry_cost`)."""
    return int(ratio * max(len(cache), 1000) / store.feed_entry_cost)


def replay(store: Store, cache: VersionedCache, topics: set[str], after: int, *, max_entries: int,
           touched: Iterable[tuple[str, str]] = ()) -> Replayed:
    """Bring ``cache`` up to the store's head for ``topics`` from the feed after ``after``.

    Raises :class:`~dfpubsub.errors.HistoryGone`, :class:`TooFarBehind` or
    :class:`AheadOfStore` (having changed nothing), and StoreUnavailable when the store is, or
    when its feed does not reach the head within ``_CATCH_UP`` seconds (the caller tries again
    later: a replay never stops short).
    """
    head, span = store.feed_since(after)  # HistoryRewound: ``after`` lies where a failover took the store back
    if after > head:
        raise AheadOfStore(f"position {after} is above the store's head {head}")
    if store.feed_dense and span > max_entries:  # the count is known without reading
        raise TooFarBehind(f"{span} feed entries since revision {after}, more than {max_entries}")
    last, position, entries, complete = _read(store, after, head, max_entries)
    wanted: list[tuple[str, str]] = []
    deleted: list[tuple[tuple[str, str], int]] = []
    version, live, unsure = cache.version, cache.live_version, not store.feed_topics
    for ident, entry in last.items():
        held = live(*ident)  # its version only: no value to decode
        # Only entries of these topics or of an object the cache holds concern it (one that left
        # the topics is then deleted). Where an entry may name the table for the topic (etcd's
        # update that kept it, Store.feed_topics), an update of an object the cache does not hold
        # is read too: only the object tells whether it is of these topics.
        if held is None and entry.topic not in topics and not (
                unsure and entry.topic == entry.table and entry.action is not _DELETE):
            continue
        if entry.action is _DELETE:
            if held is not None:
                deleted.append((ident, entry.revision))
        elif held is None or held != entry.revision:
            wanted.append(ident)
    # Changed by an event, yet no write since the position explains it: whatever the event
    # claimed, the store answers for it.
    wanted.extend(i for i in touched if i not in last)
    fetched = _fetch(store, wanted)
    found = {(o.table, o.key) for o in fetched}
    position = max(position, after)
    # Asked for and gone: deleted after the last entry read (its delete's own entry comes later),
    # or never the store's. The deletion's version is unknown; the tombstone keeps at most the
    # position, so that a forged version cannot block the object's genuine writes.
    gone = [(i, min(version(*i), position)) for i in wanted if i not in found and live(*i) is not None]
    changes = cache.correct(topics, fetched, deleted + gone)
    return Replayed(changes, entries, len(wanted), position, complete)


def _read(store: Store, after: int, head: int,
          max_entries: int) -> tuple[dict[tuple[str, str], FeedEntry], int, int, bool]:
    """The last entry of each object written after ``after`` up to ``head``, the revision the
    reader reached, how many entries it read, and whether that is every write committed before
    the head was read.

    Up to the store's newest write (:meth:`Store.feed_last`, read after the head: the head
    itself where every revision is an entry). Where that is unknown (an etcd store no writer of
    this version wrote to), a reader that went quiet short of the head must reach the floor
    (:meth:`Store.feed_floor`, the newest write of an object that exists, asked only then: etcd
    sorts every key for it), then stops once nothing more arrived for ``_QUIET`` seconds; a
    delete after the floor still in transit then is left to the next repair (the position does
    not pass it), and the replay is not complete."""
    logged = store.read_writes(after)  # etcd: at once, where a watch waits for its catch-up round
    if logged is not None:
        entries, position = logged
        if len(entries) > max_entries:
            raise TooFarBehind(f"{len(entries)} feed entries since revision {after}, more than {max_entries}")
        return {(e.table, e.key): e for e in entries}, position, len(entries), True
    goal = head if store.feed_dense else store.feed_last()
    reader = store.follow_feed(after)
    last: dict[tuple[str, str], FeedEntry] = {}
    count = 0
    now = time.monotonic()
    deadline, quiet_since, floor = now + _CATCH_UP, now, None
    try:
        while reader.position < (head if goal is None else goal):
            batch = reader.read(1000, 0.05)
            now = time.monotonic()
            if batch:
                deadline, quiet_since = now + _CATCH_UP, now
            elif goal is None and now - quiet_since >= _QUIET and reader.position >= (
                    floor := store.feed_floor() if floor is None else floor):
                break
            elif now > deadline:  # stopping short would call the repair done with writes unread
                raise StoreUnavailable(f"the feed stopped at revision {reader.position} of {head} for {_CATCH_UP:g} s")
            count += len(batch)
            if count > max_entries:
                raise TooFarBehind(f"more than {max_entries} feed entries since revision {after}")
            for entry in batch:
                last[(entry.table, entry.key)] = entry
        return last, reader.position, count, reader.position >= (head if goal is None else goal)
    finally:
        reader.close()


def _fetch(store: Store, refs: list[tuple[str, str]]) -> list[VersionedObject]:
    out: list[VersionedObject] = []
    for i in range(0, len(refs), _PAGE):
        out.extend(store.get_many(refs[i:i + _PAGE]))
    return out
