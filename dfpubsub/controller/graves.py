"""A cache's tombstones: the version each deleted object was deleted at, for a while.

A mass delete leaves a tombstone per object, millions of them, and each must
be forgotten ``horizon`` seconds after it was made. Kept as one dict per
table of key -> version (no (table, key) tuple nor timestamp per tombstone),
grouped in **generations**: a generation takes the tombstones of up to a
quarter of the horizon and is dropped whole once its newest is older than the
horizon. A tombstone so lives between ``horizon`` and 1.25 × ``horizon``, and
purging costs nothing per tombstone (the scan of every tombstone it replaced
held the cache's lock for a second per million). Not thread-safe: the cache
holds its lock around every call.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Graves"]


class _Generation:
    __slots__ = ("since", "last", "tables")

    def __init__(self, now: float):
        self.since = now
        self.last = now
        self.tables: dict[str, dict[str, int]] = {}


class Graves:
    """Tombstones by table and key, purged ``horizon`` seconds after they were made."""

    def __init__(self, horizon: float):
        self.horizon = horizon
        self._width = horizon / 4
        #: The generations, oldest first: empty when there is no tombstone (what the cache tests,
        #: without a call, before looking one up).
        self.gens: deque[_Generation] = deque()

    def __len__(self) -> int:
        return sum(len(keys) for gen in self.gens for keys in gen.tables.values())

    def get(self, table: str, key: str) -> int | None:
        """The version ``key`` of ``table`` was deleted at, or None."""
        for gen in reversed(self.gens):  # newest first: at most one generation holds a key
            keys = gen.tables.get(table)
            if keys is not None:
                version = keys.get(key)
                if version is not None:
                    return version
        return None

    def add(self, table: str, key: str, version: int, now: float) -> None:
        """Note that ``key`` of ``table`` was deleted at ``version``, at time ``now``."""
        self.purge(now)
        gens = self.gens
        if len(gens) > 1 or (gens and gens[-1].since + self._width <= now):
            self.discard(table, key)  # the key is in one generation at most
        if not gens or gens[-1].since + self._width <= now:
            gens.append(_Generation(now))
        newest = gens[-1]
        newest.last = now
        keys = newest.tables.get(table)
        if keys is None:
            keys = newest.tables[table] = {}
        keys[key] = version

    def discard(self, table: str, key: str) -> None:
        """Forget ``key``'s tombstone (the object was created again)."""
        for gen in self.gens:
            keys = gen.tables.get(table)
            if keys is not None and keys.pop(key, None) is not None and not keys:
                del gen.tables[table]

    def purge(self, now: float) -> None:
        """Drop the generations whose newest tombstone is older than the horizon."""
        gens, limit = self.gens, now - self.horizon
        while gens and (gens[0].last < limit or not gens[0].tables):
            gens.popleft()

    def per_table(self) -> dict[str, int]:
        """Tombstones held per table."""
        out: dict[str, int] = {}
        for gen in self.gens:
            for table, keys in gen.tables.items():
                out[table] = out.get(table, 0) + len(keys)
        return out
