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

from .events import Action, Event, VersionedObject

__all__ = ["VersionedCache", "Change"]


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

    def apply(self, event: Event) -> bool:
        """Apply ``event`` if it is newer than the cached state; return whether it was."""
        ident = (event.table, event.key)
        with self._lock:
            if event.version <= self._version_locked(ident):
                return False
            if event.action is Action.DELETE:
                self._objects.pop(ident, None)
                self._tombstones[ident] = (event.version, self._clock())
                self._maybe_purge_locked()
            else:
                self._tombstones.pop(ident, None)
                self._objects[ident] = VersionedObject(event.topic, event.table, event.key, event.version, event.value)
            return True

    def get(self, table: str, key: str) -> VersionedObject | None:
        """The live object, or None if absent or deleted."""
        with self._lock:
            return self._objects.get((table, key))

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

    def reconcile(self, topics: Iterable[str], truth: Iterable[VersionedObject]) -> list[Change]:
        """Make the objects of ``topics`` equal to ``truth`` (a full listing of them).

        Returns the changes the cache had missed, as an informer's relist does:
        creates and updates for objects that are newer in the truth, deletes for
        objects the truth no longer has. Objects newer in the cache than in the
        listing are kept. The caller must not apply events while the listing is
        read and reconciled (the subscriber's dispatch thread does both), so
        that an object missing from the listing was really deleted.
        """
        topics = set(topics)
        changes: list[Change] = []
        seen: set[tuple[str, str]] = set()
        now = self._clock()
        objects, tombstones = self._objects, self._tombstones
        append = changes.append
        with self._lock:
            for obj in truth:  # the hot loop of a resync: 100k objects and more
                topic, table, key, version, value = obj
                ident = (table, key)
                seen.add(ident)
                previous = objects.get(ident)
                if previous is not None:
                    if version <= previous.version:
                        continue
                    append(Change(Action.UPDATE, topic, table, key, version, value, previous))
                else:
                    if tombstones:
                        tomb = tombstones.get(ident)
                        if tomb is not None:
                            if version <= tomb[0]:
                                continue
                            del tombstones[ident]
                    append(Change(Action.CREATE, topic, table, key, version, value, None))
                objects[ident] = obj
            for ident, obj in list(self._objects.items()):
                if obj.topic in topics and ident not in seen:
                    del self._objects[ident]
                    # The deletion's own version is unknown; the object's marks a floor.
                    self._tombstones[ident] = (obj.version, now)
                    changes.append(Change(Action.DELETE, obj.topic, obj.table, obj.key, obj.version, None, obj))
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
