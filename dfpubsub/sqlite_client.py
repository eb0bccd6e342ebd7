"""Opening the embedded SQLite database that the store, the queues and discovery share."""

from __future__ import annotations

import os
import sqlite3

from .errors import StoreUnavailable

__all__ = ["connect_sqlite"]


def connect_sqlite(path: str, schema: str, what: str, *, timeout: float = 5.0,
                   synchronous: str = "NORMAL") -> sqlite3.Connection:
    """A connection in autocommit mode and WAL, usable from any thread, with ``schema`` applied.

    ``timeout`` bounds the wait for another process's write lock. One
    connection per process: callers reopen after a fork. Raises
    :class:`StoreUnavailable` naming ``what`` when the file cannot be opened.
    """
    try:
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.executescript(schema)
    except (sqlite3.Error, OSError) as exc:
        raise StoreUnavailable(f"cannot open SQLite {what} {path}: {exc}") from exc
    return conn
