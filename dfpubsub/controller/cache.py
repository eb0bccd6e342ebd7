"""The subscriber's local cache of versioned objects, with tombstones.

An update is applied only if its version is newer than what the cache holds;
a delete leaves a tombstone carrying its version, so a late create or update
of an older version cannot bring the object back. Tombstones are purged after
``tombstone_horizon`` seconds, which must exceed the longest delay a message
can have (the delay window plus transport buffering).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from ..events import Action, Event, VersionedObject

__all__ = ["VersionedCache", "Change"]

# Per event: an enum member's lookup and the named tuple's Python-level __new__ cost more than
# the rest of an apply's test and store together.
_DELETE = Action.DELETE
_new = tuple.__new__


class Change(NamedTuple):
    """What reconciling the cache with the source of truth changed.

    ``previous`` is the object the cache held before (None on create).
    """

    action: Action
    topic: str
    table: str
    key: str
    version: int
    value: Any = None
    previous: VersionedObject | None = None


class VersionedCache:
    """Objects by (table, key), applying only newer versions. Thread-safe."""

    def __init__(self, tombstone_horizon: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.tombstone_horizon = tombstone_horizon
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], VersionedObject] = {}
        # (table, key) -> (version, time of deletion)
        self._tombstones: dict[tuple[str, str], tuple[int, float]] = {}
        self._next_purge = 0.0
        #: What events changed since :meth:`begin_relist` (None: no relist under way).
        self._recent: set[tuple[str, str]] | None = None
        #: What events changed since :meth:`take_touched` (None: nobody asks), for a replay to
        #: check against the store's feed.
        self._touched: set[tuple[str, str]] | None = None

    def apply(self, event: Event) -> bool:
        """Apply ``event`` if it is newer than the cached state; return whether it was."""
        ident = (event.table, event.key)
        with self._lock:
            held = self._objects.get(ident)  # _version_locked, inlined on the dispatch thread's hot path
            if held is not None:
                if event.version <= held[3]:
                    return False
            elif self._tombstones:
                tomb = self._tombstones.get(ident)
                if tomb is not None and event.version <= tomb[0]:
                    return False
            if event.action is _DELETE:
                self._objects.pop(ident, None)
                self._tombstones[ident] = (event.version, self._clock())
                self._maybe_purge_locked()
            else:
                if self._tombstones:
                    self._tombstones.pop(ident, None)
                self._objects[ident] = _new(VersionedObject,
                                            (event.topic, event.table, event.key, event.version, event.value))
            if self._recent is not None:
                self._recent.add(ident)
            if self._touched is not None:
                self._touched.add(ident)
            return True

    def get(self, table: str, key: str) -> VersionedObject | None:
        """The live object, or None if absent or deleted."""
        # No lock: one dict lookup is atomic, and reconcilers on worker threads call this for
        # every key while the dispatch thread applies events under the lock; contending for it
        # cost a GIL hand-off per key (a third of a queued reconcile, tools/bench/controller.py).
        return self._objects.get((table, key))

    def lookup(self) -> Callable[[tuple[str, str]], VersionedObject | None]:
        """A lock-free reader of live objects by ``(table, key)``, valid for the cache's life: for a
        reader that looks up every key it is handed, such as a controller's workers (no method
        call nor key tuple to build per key, as :meth:`get` needs)."""
        return self._objects.get

    def version(self, table: str, key: str) -> int:
        """Version of the object or its tombstone; 0 when unknown."""
        with self._lock:
            return self._version_locked((table, key))

    def items(self, table: str | None = None, topic: str | None = None) -> list[VersionedObject]:
        """Live objects, optionally of one table and/or one topic."""
        with self._lock:
            return [
                o for o in self._objects.values()
                if (table is None or o.table == table) and (topic is None or o.topic == topic)
            ]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def __iter__(self) -> Iterator[VersionedObject]:
        return iter(self.items())

    def begin_relist(self) -> None:
        """Note from now on which objects events change, until the next :meth:`reconcile`: the
        only cached versions a listing read after this call may fail to show."""
        with self._lock:
            self._recent = set()

    def diff(self, versions: Iterable[tuple[str, str, str, int]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Split a listing of (topic, table, key, version) into the (table, key) of the objects the
        cache holds otherwise (to be read) and of those it holds exactly so."""
        stale: list[tuple[str, str]] = []
        same: list[tuple[str, str]] = []
        with self._lock:
            objects = self._objects
            for topic, table, key, version in versions:
                ident = (table, key)
                obj = objects.get(ident)
                if obj is None or obj[3] != version or obj[0] != topic:
                    stale.append(ident)
                else:
                    same.append(ident)
        return stale, same

    def reconcile(self, topics: Iterable[str], truth: Iterable[VersionedObject], revision: int | None = None,
                  same: Iterable[tuple[str, str]] = ()) -> list[Change]:
        """Make the objects of ``topics`` equal to ``truth`` (a full listing of them).

        Returns the changes the cache had missed, as an informer's relist does:
        creates and updates for objects that differ in the truth, deletes for
        objects the truth no longer has. ``same`` are more objects of the
        listing, which the cache holds exactly as listed (see :meth:`diff`).

        Truth wins: ``revision`` is the store revision the listing reflects
        (:meth:`Store.list_at`). A cached version the listing does not show is
        kept only if it is provably newer than the listing: above ``revision``
        and applied since :meth:`begin_relist`. Anything else (a forged version,
        however high) is replaced by the store's. Without ``revision`` (a
        listing from elsewhere, such as a snapshot), cached versions higher
        than the listing's are kept. The caller must not apply events between
        reading the listing and reconciling it unless it called
        :meth:`begin_relist` before the listing was read.
        """
        topics = set(topics)
        changes: list[Change] = []
        now = self._clock()
        with self._lock:
            objects, tombstones = self._objects, self._tombstones
            recent, self._recent = self._recent or set(), None

            def kept(version: int, ident: tuple[str, str]) -> bool:
                """Whether a cached version the listing does not show stays."""
                return revision is None or (version > revision and ident in recent)

            if revision is not None and not objects and not tombstones:  # a first sync: every object is new
                truth = truth if isinstance(truth, list) else list(truth)
                create = Action.CREATE
                # Built apart, then copied in (a fast copy of a whole table, ~40 ms a million objects):
                # the dict itself stays, as lookup() hands it to readers that keep it.
                objects.update({(obj[1], obj[2]): obj for obj in truth})
                # tuple.__new__ skips the named tuple's Python-level __new__ (see SqliteStore._objects).
                return [_new(Change, (create, *obj, None)) for obj in truth]
            same = same if isinstance(same, (list, tuple, set)) else list(same)
            listed: list[tuple[str, str]] = []  # the idents of truth
            present = len(same)  # listed objects the cache holds after the loop
            append, note = changes.append, listed.append
            for obj in truth:  # the hot loop of a resync: 100k objects and more
                topic, table, key, version, value = obj
                ident = (table, key)
                note(ident)
                previous = objects.get(ident)
                if previous is not None:
                    present += 1
                    if version == previous.version or (version < previous.version and kept(previous.version, ident)):
                        continue
                    append(Change(Action.UPDATE, topic, table, key, version, value, previous))
                else:
                    if tombstones:
                        tomb = tombstones.get(ident)
                        if tomb is not None:
                            if version <= tomb[0] and kept(tomb[0], ident):
                                continue
                            del tombstones[ident]
                    present += 1
                    append(Change(Action.CREATE, topic, table, key, version, value, None))
                objects[ident] = obj
            if revision is not None and present == len(objects):
                # A store's listing names each object once: every cached object is listed, none
                # is to be deleted, and the pass over all of them can be left out.
                return changes
            seen = set(same)
            seen.update(listed)
            for ident, obj in list(objects.items()):
                if obj.topic in topics and ident not in seen:
                    if revision is not None and kept(obj.version, ident):
                        continue  # created after the listing was read
                    del objects[ident]
                    # The deletion's own version is unknown; the object's marks a floor, and the
                    # listing's revision bounds it (a forged version must not block later writes).
                    floor = obj.version if revision is None else min(obj.version, revision)
                    tombstones[ident] = (floor, now)
                    changes.append(Change(Action.DELETE, obj.topic, obj.table, obj.key, obj.version, None, obj))
        return changes

    def take_touched(self) -> set[tuple[str, str]]:
        """The (table, key) of every object events changed since the last call, and start anew.

        A replay (:mod:`dfpubsub.controller.replay`) checks each against the store's feed: a
        version no write of the store explains came from a forged or foreign event.
        """
        with self._lock:
            touched, self._touched = self._touched or set(), set()
            return touched

    def correct(self, topics: set[str], objects: Iterable[VersionedObject],
                deleted: Iterable[tuple[tuple[str, str], int]]) -> list[Change]:
        """Make these objects what the store says, whatever the cache held (truth wins).

        ``objects`` were read from the store (their versions are the store's own); one whose
        topic is not in ``topics`` has left them and is deleted here. ``deleted`` are (table, key)
        the store deleted at a version. Returns what changed, as :meth:`reconcile` does.
        """
        changes: list[Change] = []
        now = self._clock()
        with self._lock:
            held, tombstones = self._objects, self._tombstones
            for obj in objects:
                ident = (obj[1], obj[2])
                previous = held.get(ident)
                if obj[0] not in topics:
                    if previous is not None:
                        del held[ident]
                        tombstones[ident] = (obj[3], now)
                        changes.append(Change(Action.DELETE, *previous[:4], None, previous))
                    continue
                if previous is not None and previous[3] == obj[3] and previous[0] == obj[0]:
                    continue
                tombstones.pop(ident, None)
                held[ident] = obj
                changes.append(Change(Action.CREATE if previous is None else Action.UPDATE, *obj, previous))
            for ident, version in deleted:
                previous = held.pop(ident, None)
                tombstones[ident] = (version, now)
                if previous is not None:
                    changes.append(Change(Action.DELETE, *previous[:4], None, previous))
        return changes

    def _version_locked(self, ident: tuple[str, str]) -> int:
        obj = self._objects.get(ident)
        if obj is not None:
            return obj.version
        tomb = self._tombstones.get(ident)
        return tomb[0] if tomb is not None else 0

    def _maybe_purge_locked(self) -> None:
        now = self._clock()
        if now < self._next_purge:
            return
        self._next_purge = now + self.tombstone_horizon / 4
        limit = now - self.tombstone_horizon
        for ident in [i for i, (_, t) in self._tombstones.items() if t < limit]:
            del self._tombstones[ident]

    def tombstones(self) -> int:
        """Number of tombstones held (for metrics and tests)."""
        with self._lock:
            return len(self._tombstones)
