"""Leases in SQLite (``sqlite:///path``): a row per election with the holder, the expiry and the
fencing token, each change one ``BEGIN IMMEDIATE`` transaction.

The expiry is wall-clock time (``time.time()``), compared by every process
that opens the file: they share one host's clock, as a SQLite file is never
shared over a network file system (its locks do not hold there). A release
sets the expiry to 0 but keeps the row, so the next holder's token is still
one more than the last.
"""

from __future__ import annotations

import sqlite3
import time

from ..backends.foreign import skip
from ..backends.sqlite import SqliteDb, sqlite_path
from ..errors import ForeignRecord
from .api import Holder

__all__ = ["SqliteLease"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leader_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires REAL NOT NULL
);
"""


class SqliteLease:
    """The lease ``name`` in the SQLite database of ``url``."""

    backend = "sqlite"

    def __init__(self, url: str, name: str, timeout: float):
        self.name = name
        self._db = SqliteDb(sqlite_path(url), _SCHEMA, "leader lease table", timeout=timeout)

    def _row(self, conn: sqlite3.Connection) -> tuple[str, int, float] | None:
        row = conn.execute("SELECT holder, token, expires FROM leader_leases WHERE name = ?", (self.name,)).fetchone()
        if row is None:
            return None
        holder, token, expires = row
        if not (isinstance(holder, str) and type(token) is int and isinstance(expires, (int, float))):
            detail = f"not a lease (holder {holder!r}, token {token!r}, expires {expires!r})"
            skip("leader lease", f"leader_leases/{self.name}", "malformed", detail)
            # A token that cannot be read cannot be outbid safely: an operator must look at the row.
            raise ForeignRecord(f"leader_leases row {self.name!r}", detail)
        return holder, token, float(expires)

    def acquire(self, identity: str, duration: float) -> int | None:
        def take(conn: sqlite3.Connection) -> int | None:
            now = time.time()
            row = self._row(conn)
            if row is not None and row[2] > now:
                return None
            token = (row[1] if row is not None else 0) + 1
            conn.execute("INSERT OR REPLACE INTO leader_leases (name, holder, token, expires) VALUES (?, ?, ?, ?)",
                         (self.name, identity, token, now + duration))
            return token

        return self._db.transaction(take, "acquire the leader lease")

    def renew(self, identity: str, token: int, duration: float) -> bool:
        def extend(conn: sqlite3.Connection) -> bool:
            now = time.time()
            cur = conn.execute("UPDATE leader_leases SET expires = ? WHERE name = ? AND holder = ? AND token = ? "
                               "AND expires > ?", (now + duration, self.name, identity, token, now))
            return cur.rowcount == 1

        return self._db.transaction(extend, "renew the leader lease")

    def release(self, identity: str, token: int) -> None:
        self._db.transaction(lambda conn: conn.execute(
            "UPDATE leader_leases SET expires = 0 WHERE name = ? AND holder = ? AND token = ?",
            (self.name, identity, token)), "release the leader lease")

    def holder(self) -> Holder | None:
        def read(conn: sqlite3.Connection) -> Holder | None:
            row = self._row(conn)
            if row is None or row[2] <= 0:
                return None
            return Holder(row[0], row[1], row[2] - time.time())

        return self._db.run(read, "read the leader lease")

    def close(self) -> None:
        self._db.close()
