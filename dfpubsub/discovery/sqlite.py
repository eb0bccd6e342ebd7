"""Discovery in the embedded SQLite file (``sqlite:///path``), the default.

One table, ``discovery_publishers``, keyed by (prefix, publisher_id), with the
record as JSON and ``expires_at`` in Unix seconds. A renewal moves
``expires_at`` to now + TTL (and re-inserts a row that vanished). SQLite has
no expiry of its own, so readers ignore rows past ``expires_at`` and delete
them as they meet them: any lister is the garbage collector. Watchers poll.

Like the store: WAL, so readers never block writers, and a busy timeout for
the write lock; several processes can share the file (it may be the store's
own file). Expiry compares Unix times written by different processes, so
their clocks must agree: they share one host, or NTP. A forked child opens
its own connection.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ..backends import foreign
from ..backends.sqlite import SqliteDb
from .api import Discovery, PublisherRecord

__all__ = ["SqliteDiscovery"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS discovery_publishers (
    prefix TEXT NOT NULL,
    publisher_id TEXT NOT NULL,
    record TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (prefix, publisher_id)
) WITHOUT ROWID;
"""
_UPSERT = "INSERT OR REPLACE INTO discovery_publishers VALUES (?, ?, ?, ?)"
_RENEW = "UPDATE discovery_publishers SET expires_at = ? WHERE prefix = ? AND publisher_id = ?"
_REWRITE = "UPDATE discovery_publishers SET expires_at = ?, record = ? WHERE prefix = ? AND publisher_id = ?"
_DELETE = "DELETE FROM discovery_publishers WHERE prefix = ? AND publisher_id = ?"
_SELECT = "SELECT publisher_id, record, expires_at FROM discovery_publishers WHERE prefix = ?"
# The expiry is re-checked: the row may have been renewed since it was read.
_COLLECT = "DELETE FROM discovery_publishers WHERE prefix = ? AND publisher_id = ? AND expires_at <= ?"


class SqliteDiscovery(Discovery):
    """``sqlite:///path/to/file`` (``sqlite:///:memory:``: this process only)."""

    backend = "sqlite"

    def __init__(self, path: str, ttl: float, renew_interval: float, prefix: str = "dfpubsub",
                 timeout: float | None = None):
        super().__init__(f"sqlite:///{path}", ttl, renew_interval, prefix, timeout)
        self.path = path
        # The busy timeout bounds the wait for the write lock: a renewal must not hang past its tick.
        self._db = SqliteDb(path, _SCHEMA, "discovery", timeout=self.timeout)

    def _run(self, what: str, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        return self._db.run(lambda conn: conn.execute(sql, args), what)

    def _create(self, record: PublisherRecord) -> None:
        self._run("register", _UPSERT,
                  (self.prefix, record.publisher_id, record.to_json().decode(), time.time() + self.ttl))

    def _renew(self, handle: Any, record: PublisherRecord, rewrite: bool) -> None:
        expires = time.time() + self.ttl
        if rewrite:
            cur = self._run("renew", _REWRITE, (expires, record.to_json().decode(), self.prefix, record.publisher_id))
        else:
            cur = self._run("renew", _RENEW, (expires, self.prefix, record.publisher_id))
        if cur.rowcount == 0:
            self._trouble.warning(f"vanished-{record.publisher_id}", "discovery row vanished; re-creating it",
                                  backend=self.backend, publisher_id=record.publisher_id)
            self._create(record)

    def _remove(self, handle: Any, record: PublisherRecord) -> None:
        self._run("unregister", _DELETE, (self.prefix, record.publisher_id))

    def _snapshot(self) -> dict[str, PublisherRecord]:
        rows = self._run("list", _SELECT, (self.prefix,)).fetchall()
        now = time.time()
        out: dict[str, PublisherRecord] = {}
        expired: list[str] = []
        for publisher_id, blob, expires_at in rows:
            if not isinstance(expires_at, (int, float)) or not isinstance(publisher_id, str):
                foreign.skip("discovery_row", f"sqlite discovery row {publisher_id!r}", "wrong_type",
                             "expires_at is not a number or publisher_id not text")
                continue
            if expires_at <= now:
                expired.append(publisher_id)
                continue
            record = self._parse_row(publisher_id, blob, expires_at - now)
            if record is not None:
                out[publisher_id] = record
        for publisher_id in expired:
            self._run("collect expired", _COLLECT, (self.prefix, publisher_id, now))
        return out

    def _close(self) -> None:
        self._db.close()
