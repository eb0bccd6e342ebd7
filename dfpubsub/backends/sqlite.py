"""The embedded SQLite database that the store, the queues and discovery share: one connection
per process, used under one lock."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import StoreMissing, StoreUnavailable
from .urls import sqlite_path

__all__ = ["Row", "SqliteDb", "connect_sqlite", "fetch_rows", "file_location", "require_sqlite_file",
           "sqlite_lacks_table", "sqlite_path"]

T = TypeVar("T")

#: A row as sqlite3 returns it. SQLite's values are typed by what was stored, not by the column
#: (another writer may have stored anything): its reader checks each value it uses.
Row = tuple[Any, ...]


def require_sqlite_file(url: str, hint: str = "nothing to read") -> None:
    """For commands that only read, and daemons: :class:`StoreMissing`, naming the file and
    ``hint``, if ``url`` is a SQLite database that does not exist (opening it would create an
    empty one)."""
    if url.startswith("sqlite:"):
        path = sqlite_path(url)
        if path != ":memory:" and not os.path.exists(path):
            raise StoreMissing(f"no database at {os.path.abspath(path)} ({url}); {hint}")


def sqlite_lacks_table(url: str, table: str) -> bool:
    """Whether ``url`` is a SQLite database (existing) without ``table``: then it holds none of
    that table's records, and a reader must not open it the usual way (which creates the table).
    Looked at through a read-only connection; False for any other URL, and for a missing file
    (whose opener says so)."""
    if not url.startswith("sqlite:"):
        return False
    path = sqlite_path(url)
    if path == ":memory:" or not os.path.exists(path):
        return False
    try:
        conn = sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True, timeout=5.0)
        try:
            row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot read SQLite {path}: {exc}") from exc
    return row is None


def file_location(path: str) -> str:
    """The file ``path`` names, absolute and without links: what two handles on one file share.
    "" for ``:memory:``, which every connection has to itself."""
    return "" if path == ":memory:" else os.path.realpath(path)


def connect_sqlite(path: str, schema: str, what: str, *, timeout: float = 5.0,
                   synchronous: str = "NORMAL") -> sqlite3.Connection:
    """A connection in autocommit mode and WAL, usable from any thread, with ``schema`` applied.

    ``timeout`` bounds the wait for another process's write lock. Raises
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


def _text(raw: bytes) -> str | bytes:
    """TEXT as str, or as bytes when it is not UTF-8."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def fetch_rows(conn: sqlite3.Connection, sql: str, args: tuple[object, ...]) -> list[Row]:
    """The rows of ``sql``; text another writer stored that is not UTF-8 comes as bytes, for the
    caller to skip (foreign records, dfpubsub/backends/foreign.py), instead of failing the whole read."""
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError as exc:
        if "decode" not in str(exc):
            raise
    conn.text_factory = _text  # only then: a text factory in Python costs every row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.text_factory = str


class SqliteDb:
    """This process's connection to ``path`` (``what`` names it in errors), opened now.

    A connection must not cross a fork: a child opens its own at its first
    call. Calls are serialised by one lock; sqlite3 errors become
    :class:`StoreUnavailable`.
    """

    def __init__(self, path: str, schema: str, what: str, *, timeout: float = 5.0, synchronous: str = "NORMAL"):
        self.path = path
        self.what = what
        self._schema = schema
        self._timeout = timeout
        self._synchronous = synchronous
        self._lock = threading.Lock()
        self._pid = -1
        self._conn: sqlite3.Connection | None = None
        with self._lock:
            self._connection()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self._conn = connect_sqlite(self.path, self._schema, self.what, timeout=self._timeout,
                                        synchronous=self._synchronous)
            self._pid = os.getpid()
        return self._conn

    def run(self, fn: Callable[[sqlite3.Connection], T], doing: str = "call") -> T:
        """``fn(conn)`` under the lock (autocommitted statements, or a transaction it opens)."""
        with self._lock:
            try:
                return fn(self._connection())
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.what} {self.path}: {doing} failed: {exc}") from exc

    def fetchall(self, sql: str, args: tuple[object, ...], doing: str = "call") -> list[Row]:
        """One autocommitted statement run to its end (a write commits); its rows.

        :meth:`run` with no closure to build: this is every store read and write.
        """
        with self._lock:
            try:
                return fetch_rows(self._connection(), sql, args)
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.what} {self.path}: {doing} failed: {exc}") from exc

    def transaction(self, fn: Callable[[sqlite3.Connection], T], doing: str = "write") -> T:
        """``fn(conn)`` in one write transaction, rolled back if it raises."""

        def tx(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return self.run(tx, doing)

    def close(self) -> None:
        """Close this process's connection (a parent's, inherited over a fork, is left alone)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
