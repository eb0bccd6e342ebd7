"""Slots in SQLite (``sqlite:///path``, the store's own file): a row per held slot with its ticket
and expiry, taken in one ``BEGIN IMMEDIATE`` transaction.

The expiry is wall-clock time compared by every process that opens the file,
which share one host's clock (:mod:`dfpubsub.leader.sqlite` says why). A row
that is not a slot (wrong types, an expiry further than :data:`.api.MAX_LEASE`
ahead) is skipped, counted and deleted by the next acquisition.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ..backends.foreign import skip
from ..backends.sqlite import SqliteDb, sqlite_path
from .api import MAX_LEASE, SKIP_KIND, SlotHolder, is_ticket

__all__ = ["SqliteSlots"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS relist_slots (
    name TEXT NOT NULL,
    slot INTEGER NOT NULL,
    ticket TEXT NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (name, slot)
);
"""


class SqliteSlots:
    """The semaphore ``name`` in the SQLite database of ``url``."""

    backend = "sqlite"

    def __init__(self, url: str, name: str, timeout: float):
        self.name = name
        self._db = SqliteDb(sqlite_path(url), _SCHEMA, "relist slot table", timeout=timeout)

    def _held(self, conn: sqlite3.Connection, now: float, clean: bool) -> dict[int, tuple[str, float]]:
        """slot -> (ticket, expires) of the live slots; garbage rows skipped (and, ``clean``, deleted)."""
        held: dict[int, tuple[str, float]] = {}
        rows: list[Any] = conn.execute("SELECT rowid, slot, ticket, expires FROM relist_slots WHERE name = ?",
                                       (self.name,)).fetchall()
        for rowid, slot, ticket, expires in rows:
            if type(slot) is not int or not is_ticket(ticket) or not isinstance(expires, (int, float)) \
                    or expires > now + MAX_LEASE:
                skip(SKIP_KIND, f"relist_slots/{self.name}/{slot!r}", "malformed",
                     f"not a slot (ticket {ticket!r:.60}, expires {expires!r})")
                if clean:
                    conn.execute("DELETE FROM relist_slots WHERE rowid = ?", (rowid,))
            elif expires > now:
                held[slot] = (ticket, float(expires))
        return held

    def acquire(self, ticket: str, slots: int, duration: float) -> int | None:
        def take(conn: sqlite3.Connection) -> int | None:
            now = time.time()
            held = self._held(conn, now, clean=True)
            free = next((i for i in range(slots) if i not in held), None)
            if free is not None:
                conn.execute("INSERT OR REPLACE INTO relist_slots (name, slot, ticket, expires) VALUES (?, ?, ?, ?)",
                             (self.name, free, ticket, now + duration))
            return free

        return self._db.transaction(take, "take a relist slot")

    def renew(self, ticket: str, slot: int, duration: float) -> bool:
        def extend(conn: sqlite3.Connection) -> bool:
            now = time.time()
            return conn.execute("UPDATE relist_slots SET expires = ? WHERE name = ? AND slot = ? AND ticket = ? "
                                "AND expires > ?", (now + duration, self.name, slot, ticket, now)).rowcount == 1

        return self._db.transaction(extend, "renew a relist slot")

    def release(self, ticket: str, slot: int) -> None:
        self._db.transaction(lambda conn: conn.execute(
            "DELETE FROM relist_slots WHERE name = ? AND slot = ? AND ticket = ?", (self.name, slot, ticket)),
            "release a relist slot")

    def holders(self, slots: int) -> list[SlotHolder]:
        def read(conn: sqlite3.Connection) -> list[SlotHolder]:
            now = time.time()
            return [SlotHolder(slot, t, expires - now) for slot, (t, expires) in sorted(self._held(conn, now, False).items())
                    if slot < slots]

        return self._db.run(read, "read the relist slots")

    def close(self) -> None:
        self._db.close()
