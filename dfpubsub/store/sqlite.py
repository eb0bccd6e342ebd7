"""Embedded SQLite store, the default: one file, WAL, safe for several processes.

Writers take SQLite's write lock up front (``BEGIN IMMEDIATE``) and bump one
revision counter in the same transaction, so versions are unique and
increasing across every process sharing the file. Readers never block writers
(WAL). A forked child reopens its own connection.

The change feed (:mod:`dfpubsub.store.feed`) is the append-only table
``nb_feed`` keyed by revision. The trigger that stores each create's and
update's revision appends its entry too, so those writes stay one statement; a
delete appends in its own transaction. Every revision has its entry, so
history is gone below the oldest entry kept. The writer of every 256th
revision drops the entries beyond the retained count. A reader waits on this process's writers (a condition
they notify after each commit) and polls ``PRAGMA data_version`` every
millisecond for other processes' commits.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar, cast

import msgpack

from ..backends import foreign
from ..backends.sqlite import SqliteDb, fetch_rows, file_location
from ..errors import AlreadyExists, HistoryGone, NotFound, StoreUnavailable, VersionConflict
from ..events import VersionedObject
from .api import DEFAULT_MAX_VALUE_BYTES, PackedTable, Pages, Store
from .feed import FeedEntry, FeedRetention, parse_entry
from .outbox import Outbox, SqliteOutbox

__all__ = ["SqliteStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nb_objects (
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    topic TEXT NOT NULL,
    version INTEGER NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (tbl, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nb_objects_topic ON nb_objects (topic);
CREATE TABLE IF NOT EXISTS nb_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO nb_meta VALUES ('revision', 0);
CREATE TABLE IF NOT EXISTS nb_feed (
    rev INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    action TEXT NOT NULL,
    at INTEGER NOT NULL DEFAULT (unixepoch())
);
-- One trigger per write statement stores the revision and appends the feed's entry: two
-- triggers each cost a trigger program per write. Files made before the feed had one that
-- stored the revision only.
BEGIN;
DROP TRIGGER IF EXISTS nb_revision_on_insert;
DROP TRIGGER IF EXISTS nb_revision_on_update;
CREATE TRIGGER IF NOT EXISTS nb_write_on_insert AFTER INSERT ON nb_objects
BEGIN
  UPDATE nb_meta SET value = NEW.version WHERE name = 'revision';
  INSERT INTO nb_feed (rev, topic, tbl, key, action) VALUES (NEW.version, NEW.topic, NEW.tbl, NEW.key, 'create');
END;
CREATE TRIGGER IF NOT EXISTS nb_write_on_update AFTER UPDATE OF version ON nb_objects
BEGIN
  UPDATE nb_meta SET value = NEW.version WHERE name = 'revision';
  INSERT INTO nb_feed (rev, topic, tbl, key, action) VALUES (NEW.version, NEW.topic, NEW.tbl, NEW.key, 'update');
END;
COMMIT;
"""
_FEED_DELETE = "INSERT INTO nb_feed (rev, topic, tbl, key, action) VALUES (?, ?, ?, ?, 'delete')"
_FEED_READ = "SELECT rev, topic, tbl, key, action FROM nb_feed WHERE rev > ? ORDER BY rev LIMIT ?"
# Every revision has its entry, so history is gone below the oldest one kept, or up to the
# revision when none is (all dropped, or a file written before the feed existed).
_FEED_HORIZON = ("SELECT coalesce((SELECT min(rev) FROM nb_feed) - 1, "
                 "(SELECT value FROM nb_meta WHERE name = 'revision'))")
_FEED_TRIM = "DELETE FROM nb_feed WHERE rev <= ?"
#: A writer drops the entries beyond the retained count when its version is a multiple of this.
_TRIM_EVERY = 256
#: Seconds between two looks at other processes' commits while a feed reader waits.
_FEED_POLL = 0.001


class _Waker:
    """Wakes this process's feed readers of one file when a writer of it commits."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.commits = 0
        self.waiters = 0

    def notify(self) -> None:
        self.commits += 1
        if self.waiters:  # no lock taken on the write path while nobody waits
            with self.cond:
                self.cond.notify_all()


_WAKERS: dict[str, _Waker] = {}
_WAKERS_LOCK = threading.Lock()


def _waker(location: str) -> _Waker:
    with _WAKERS_LOCK:
        return _WAKERS.setdefault(location, _Waker())


_NEXT_VERSION = "UPDATE nb_meta SET value = value + 1 WHERE name = 'revision' RETURNING value"
# Creates and updates are one statement each: the version is the revision + 1, and
# a trigger stores it back as the revision, atomically (a write statement holds the
# write lock from its first step). One statement instead of BEGIN, bump, write and
# COMMIT halves the calls into SQLite on the path every NbApi write takes.
_REVISION = "(SELECT value + 1 FROM nb_meta WHERE name = 'revision')"
_INSERT = f"INSERT INTO nb_objects VALUES (?, ?, ?, {_REVISION}, ?) ON CONFLICT (tbl, key) DO NOTHING RETURNING version"
# Conditions are appended, not written as "(? IS NULL OR version = ?)": an OR there
# keeps SQLite from using the primary key, and every write would scan the table.
# Nor is the topic set when it does not change: that would rewrite its index entry too.
_UPDATE = f"UPDATE nb_objects SET version = {_REVISION}, value = ? WHERE tbl = ? AND key = ?"
_UPDATE_TOPIC = f"UPDATE nb_objects SET topic = ?, version = {_REVISION}, value = ? WHERE tbl = ? AND key = ?"
_DELETE = "DELETE FROM nb_objects WHERE tbl = ? AND key = ?"
#: Keys per statement of get_many (SQLite allows 32766 variables).
_MANY = 500


def _name(table: Any, key: Any) -> str:
    return f"nb_objects[tbl={foreign.key_text(table)}, key={foreign.key_text(key)}]"


# Objects are read a table at a time: the table is a parameter, not a column of every row, and
# the topic comes back only where it is not the table's own name (NULL otherwise). Two strings
# fewer to build per row, and a table's objects share one of each: a resync of a million
# objects reads a fifth faster and keeps ~100 MB less (docs/performance.md).
_SELECT = "SELECT nullif(topic, ?1), key, version, value FROM nb_objects WHERE tbl = ?1"
_SELECT_VERSIONS = "SELECT nullif(topic, ?1), key, version FROM nb_objects WHERE tbl = ?1"


def _marks(n: int) -> str:
    """Placeholders ?2 .. ?n+1, after the table's ?1."""
    return ",".join(f"?{i}" for i in range(2, n + 2))


def _objects(rows: list[tuple[Any, ...]], table: str, blobs: list[bytes] | None = None,
             values: bool = True, decode: bool = True) -> list[VersionedObject]:
    """The objects of ``table`` from its (topic or NULL, key, version, value) rows, foreign rows skipped;
    with ``blobs``, their values' bytes appended to it in step (``values=False``: values checked, not kept;
    ``decode=False``: values not even decoded, their bytes for the caller to prove)."""
    # A resync's hot loop, a million rows and more: the type checks and decode_value are
    # inlined (a Python call per row cost a fifth of the loop), and tuple.__new__ skips the
    # named tuple's Python-level __new__.
    unpackb, new = msgpack.unpackb, tuple.__new__
    out: list[VersionedObject] = []
    add = out.append
    for topic, key, version, blob in rows:
        try:  # free unless it raises
            if topic is None:
                topic = table
            if (topic.__class__ is not str or key.__class__ is not str or version.__class__ is not int
                    or blob.__class__ is not bytes):
                raise TypeError("a column has the wrong type")
            value = unpackb(blob, raw=False, strict_map_key=False) if decode else None
            add(new(VersionedObject, (topic, table, key, version, value if values else None)))
            if blobs is not None:
                blobs.append(blob)
        except foreign.DECODE_ERRORS as exc:
            foreign.skip_error("store_object", _name(table, key), exc)
    return out


#: decode_value as one C call, for the C loops of _packed_table (a def costs a Python frame per value).
_decode = partial(msgpack.unpackb, raw=False, strict_map_key=False)
_NULL = type(None)
_TOPIC_TYPES = {str, _NULL}


def _packed_table(rows: list[tuple[Any, ...]], table: str) -> PackedTable:
    """The (topic or NULL, key, version, value) rows of ``table`` by column, every value decoded
    once and dropped, foreign rows skipped.

    A resync's first sync, a million rows and more: the checks run as C loops over whole
    columns (types, then a decode of every value), with no object per row to build. A table
    where any of them fails goes through :func:`_objects`, which finds and skips the foreign rows.
    """
    topics, keys, versions, blobs = zip(*rows)
    named = {*map(type, topics)}
    if ({*map(type, keys)} == {str} and {*map(type, versions)} == {int} and {*map(type, blobs)} == {bytes}
            and named <= _TOPIC_TYPES):
        try:
            deque(map(_decode, blobs), maxlen=0)
        except foreign.DECODE_ERRORS:
            pass
        else:
            if _NULL in named:  # the table's own name
                topics = (table,) * len(keys) if named == {_NULL} else tuple(table if t is None else t for t in topics)
            return PackedTable(table, topics, keys, versions, blobs)
    kept: list[bytes] = []
    objects = _objects(rows, table, kept, False)
    return PackedTable(table, [o[0] for o in objects], [o[2] for o in objects], [o[3] for o in objects], kept)


class SqliteStore(Store):
    """``sqlite:///path/to/nb.sqlite`` (``sqlite:///:memory:`` for a private, in-memory one)."""

    backend = "sqlite"
    feed_entry_cost = 1.2  # 34 bytes an entry, 28 an object's version

    def __init__(
        self,
        path: str,
        tables: Iterable[str],
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
        feed_retention: FeedRetention | None = None,
    ):
        super().__init__(tables, max_value_bytes, feed_retention)
        self.path = path
        self.location = file_location(path)
        self._db = SqliteDb(path, _SCHEMA, "store", timeout=busy_timeout, synchronous=synchronous)
        # :memory: is private to this object: its own waker.
        self._waker = _waker(self.location) if self.location else _Waker()
        self._watch: sqlite3.Connection | None = None  # data_version of other processes' commits
        self._watch_lock = threading.Lock()
        self._watch_pid = -1

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._db.transaction(fn)

    def _read(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self._db.fetchall(sql, args, "read")

    def _get(self, table: str, key: str) -> VersionedObject | None:
        objs = _objects(self._read(_SELECT + " AND key = ?2", (table, key)), table)
        return objs[0] if objs else None

    def _list(self, table: str | None, topics: set[str] | None) -> list[VersionedObject]:
        if topics is not None and not topics:
            return []
        tables = sorted(self.tables) if table is None else [table]
        tail = "" if topics is None else f" AND topic IN ({_marks(len(topics))})"
        return self._objects_of(self._at_revision(_SELECT + tail, tables, tuple(topics or ()))[0])

    def _at_revision(self, sql: str, tables: Iterable[str], args: tuple[Any, ...]) -> tuple[dict[str, list[tuple[Any, ...]]], int]:
        """Rows of ``sql`` for each of ``tables`` (``?1``, then ``args``) and the revision, in one
        read transaction."""

        def read(conn: sqlite3.Connection) -> tuple[dict[str, list[tuple[Any, ...]]], int]:
            conn.execute("BEGIN")
            try:
                revision = conn.execute("SELECT value FROM nb_meta WHERE name = 'revision'").fetchone()[0]
                return {t: fetch_rows(conn, sql, (t, *args)) for t in tables}, int(revision)
            finally:
                conn.execute("COMMIT")

        return self._db.run(read, "list")

    @staticmethod
    def _objects_of(rows: dict[str, list[tuple[Any, ...]]], blobs: list[bytes] | None = None,
                    values: bool = True) -> list[VersionedObject]:
        """The objects of each table's rows, in one list (and their values' bytes in ``blobs``)."""
        out: list[VersionedObject] = []
        for table, table_rows in rows.items():
            out.extend(_objects(table_rows, table, blobs, values))
        return out

    def _topics_clause(self, topics: set[str]) -> str:
        """The condition on the topic of a resync's listing of ``topics`` (``?2`` on).

        Topics that include every table's own name likely cover most of the
        store, and a scan of the table reads it a third faster than the index on
        topic (a lookup per row): ``+topic`` keeps SQLite off the index.
        """
        column = "+topic" if topics >= self.tables else "topic"
        return f" AND {column} IN ({_marks(len(topics))})"

    def _list_at(self, topics: set[str]) -> tuple[list[VersionedObject], int]:
        objects, _, revision = self._listing(topics, None, True)
        return objects, revision

    def _list_packed_at(self, topics: set[str], values: bool) -> tuple[list[VersionedObject], list[bytes], int]:
        return self._listing(topics, [], values)

    def _list_packed_tables_at(self, topics: set[str]) -> tuple[list[PackedTable], int]:
        rows, revision = self._at_revision(_SELECT + self._topics_clause(topics), sorted(self.tables),
                                           tuple(topics))
        return [_packed_table(table_rows, table) for table, table_rows in rows.items() if table_rows], revision

    def _listing(self, topics: set[str], blobs: list[bytes] | None,
                 values: bool) -> tuple[list[VersionedObject], list[bytes], int]:
        rows, revision = self._at_revision(_SELECT + self._topics_clause(topics), sorted(self.tables),
                                           tuple(topics))
        return self._objects_of(rows, blobs, values), blobs or [], revision

    def _list_pages_at(self, topics: set[str], page_size: int, values: bool) -> tuple[int, Pages]:
        revision = self._read("SELECT value FROM nb_meta WHERE name = 'revision'", ())[0][0]
        return int(revision), self._pages(topics, page_size, values)

    def _pages(self, topics: set[str], page_size: int, values: bool) -> Pages:
        """Each table's objects of ``topics`` in key order, a page per read (after the last key of
        the page before, on the primary key: ``+topic`` keeps SQLite off the topic index)."""
        n = len(topics)
        sql = (f"{_SELECT} AND +topic IN ({_marks(n)}) AND key > ?{n + 2} ORDER BY key LIMIT ?{n + 3}")
        wanted = tuple(topics)
        for table in sorted(self.tables):
            after: Any = ""
            while True:
                rows = self._read(sql, (table, *wanted, after, page_size))
                if not rows:
                    break
                blobs: list[bytes] = []
                yield _objects(rows, table, blobs, values), blobs
                if len(rows) < page_size:
                    break
                after = rows[-1][1]

    def _list_versions_at(self, topics: set[str]) -> tuple[list[tuple[str, str, str, int]], int]:
        rows, revision = self._at_revision(_SELECT_VERSIONS + self._topics_clause(topics), sorted(self.tables),
                                           tuple(topics))
        out: list[tuple[str, str, str, int]] = []
        add = out.append
        for table, table_rows in rows.items():
            for topic, key, version in table_rows:
                if topic is None:
                    topic = table
                if topic.__class__ is not str or key.__class__ is not str or version.__class__ is not int:
                    foreign.skip_error("store_object", _name(table, key), TypeError("a column has the wrong type"))
                else:
                    add((topic, table, key, version))
        return out, revision

    def _get_many(self, refs: list[tuple[str, str]]) -> list[VersionedObject]:
        return self._many(refs, None)

    def _get_many_packed(self, refs: list[tuple[str, str]]) -> tuple[list[VersionedObject], list[bytes]]:
        blobs: list[bytes] = []
        return self._many(refs, blobs), blobs

    def _many(self, refs: list[tuple[str, str]], blobs: list[bytes] | None) -> list[VersionedObject]:
        """The objects of ``refs``; with ``blobs``, undecoded, their values' bytes appended to it."""
        by_table: dict[str, list[str]] = {}
        for table, key in refs:
            by_table.setdefault(table, []).append(key)
        out: list[VersionedObject] = []
        for table, keys in by_table.items():
            for start in range(0, len(keys), _MANY):
                chunk = keys[start:start + _MANY]
                out.extend(_objects(self._read(f"{_SELECT} AND key IN ({_marks(len(chunk))})", (table, *chunk)),
                                    table, blobs, blobs is None, blobs is None))
        return out

    @staticmethod
    def _refusal(conn: sqlite3.Connection, table: str, key: str, expected: int | None) -> Exception:
        """Why a conditional write matched no row (only read on the failure path)."""
        row = conn.execute("SELECT version FROM nb_objects WHERE tbl = ? AND key = ?", (table, key)).fetchone()
        if row is None:
            return NotFound(f"{table}/{key} does not exist")
        return VersionConflict(table, key, expected if expected is not None else -1, row[0])

    # Each write is the revision bump plus one statement whose RETURNING says whether it
    # applied; a refused write raises and _write rolls the bump back.

    def _statement(self, sql: str, args: tuple[Any, ...], outbox: Outbox | None,
                   blob: bytes) -> tuple[Any, ...] | None:
        """Run one write statement; its RETURNING row (the version first) or None.

        Alone it is autocommitted; with an outbox, the outbox appends in the
        same transaction once the statement wrote (the version is then known),
        completing its entries with the written value ``blob`` if it asks so.
        """
        if outbox is None:
            # fetchall, not fetchone: the statement must run to its end to commit.
            rows = self._db.fetchall(sql, args, "write")
            row = rows[0] if rows else None
        else:
            def run(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
                rows = conn.execute(sql, args).fetchall()
                if rows:
                    cast(SqliteOutbox, outbox).apply(conn, rows[0][0], blob)
                return rows[0] if rows else None

            row = self._write(run)
        if row is not None:
            self._committed(row[0])
        return row

    def _committed(self, version: int) -> None:
        """After a write: wake this process's feed readers; now and then, trim the feed."""
        self._waker.notify()
        if version % _TRIM_EVERY == 0:
            self._db.fetchall(_FEED_TRIM, (version - self.feed_retention.max_entries,), "trim the feed")

    def _create(self, table: str, key: str, topic: str, blob: bytes, value: Any,
                outbox: Outbox | None) -> VersionedObject:
        row = self._statement(_INSERT, (table, key, topic, blob), outbox, blob)
        if row is None:
            raise AlreadyExists(f"{table}/{key} already exists")
        return VersionedObject(topic, table, key, row[0], value)

    def _update(
        self, table: str, key: str, topic: str | None, blob: bytes, value: Any, expected: int | None,
        outbox: Outbox | None,
    ) -> VersionedObject:
        sql, args = (_UPDATE, (blob, table, key)) if topic is None else (_UPDATE_TOPIC, (topic, blob, table, key))
        if expected is not None:
            sql, args = sql + " AND version = ?", (*args, expected)
        row = self._statement(sql + " RETURNING version, topic", args, outbox, blob)
        if row is None:
            raise self._db.run(lambda conn: self._refusal(conn, table, key, expected), "read")
        return VersionedObject(row[1], table, key, row[0], value)

    def _delete(self, table: str, key: str, expected: int | None, outbox: Outbox | None) -> VersionedObject:
        def run(conn: sqlite3.Connection) -> VersionedObject:
            (version,) = conn.execute(_NEXT_VERSION).fetchone()
            row = conn.execute(
                _DELETE + (" RETURNING topic" if expected is None else " AND version = ? RETURNING topic"),
                (table, key) if expected is None else (table, key, expected),
            ).fetchone()
            if row is None:
                raise self._refusal(conn, table, key, expected)
            conn.execute(_FEED_DELETE, (version, row[0], table, key))
            if outbox is not None:
                cast(SqliteOutbox, outbox).apply(conn, version, None)
            return VersionedObject(row[0], table, key, version, None)

        obj = self._write(run)
        self._committed(obj.version)
        return obj

    def _drop_all(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM nb_objects").rowcount

        return self._write(run)

    def _identity(self, new: bytes, renew: bool) -> bytes:
        read = "SELECT value FROM nb_meta WHERE name = 'identity'"
        rows = [] if renew else self._read(read, ())
        if rows:  # read first: a reader with a read-only file has it too
            return bytes(rows[0][0])

        def run(conn: sqlite3.Connection) -> bytes:
            # A BLOB in nb_meta's INTEGER column stays a BLOB (SQLite's affinity leaves it).
            conn.execute(f"INSERT OR {'REPLACE' if renew else 'IGNORE'} INTO nb_meta VALUES ('identity', ?)", (new,))
            return bytes(conn.execute(read).fetchone()[0])

        return self._write(run)

    # -- change feed -------------------------------------------------------------------

    def _feed_head(self) -> int:
        return int(self._read("SELECT value FROM nb_meta WHERE name = 'revision'", ())[0][0])

    def _read_feed(self, after: int, limit: int, wait: float) -> tuple[list[FeedEntry], int]:
        deadline = time.monotonic() + wait
        while True:
            seen = self._waker.commits
            version = self._data_version() if wait > 0 else 0
            entries, last = self._feed_page(after, limit)
            if last > after or wait <= 0:
                return entries, last
            self._wait_commit(seen, version, deadline)
            if time.monotonic() >= deadline:
                return self._feed_page(after, limit)

    def _feed_page(self, after: int, limit: int) -> tuple[list[FeedEntry], int]:
        def run(conn: sqlite3.Connection) -> tuple[list[tuple[Any, ...]], int]:
            conn.execute("BEGIN")  # one snapshot for the entries and the horizon
            try:
                return conn.execute(_FEED_READ, (after, limit)).fetchall(), conn.execute(_FEED_HORIZON).fetchone()[0]
            finally:
                conn.execute("COMMIT")

        rows, horizon = self._db.run(run, "read the feed")
        if horizon > after:
            raise HistoryGone(after, horizon)
        entries = []
        for rev, topic, tbl, key, action in rows:
            entry = parse_entry(rev, topic, tbl, key, action, self.tables)
            if entry is None:
                self.feed_skipped += 1
            else:
                entries.append(entry)
        return entries, (rows[-1][0] if rows else after)

    def _data_version(self) -> int:
        """Changes whenever another connection to the file commits (0 for :memory:)."""
        if not self.location:
            return 0
        with self._watch_lock:
            try:
                if self._watch is None or self._watch_pid != os.getpid():  # a forked child opens its own
                    self._watch = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                    self._watch_pid = os.getpid()
                return int(self._watch.execute("PRAGMA data_version").fetchone()[0])
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite store {self.path}: watch the feed failed: {exc}") from exc

    def _wait_commit(self, seen: int, version: int, deadline: float) -> None:
        """Return once this process committed since ``seen``, another since ``version``, or at ``deadline``."""
        waker = self._waker
        with waker.cond:
            waker.waiters += 1
            try:
                while waker.commits == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    waker.cond.wait(min(left, _FEED_POLL))
                    if self.location and self._data_version() != version:
                        return
            finally:
                waker.waiters -= 1

    def _compact_feed(self, retention: FeedRetention) -> int:
        def run(conn: sqlite3.Connection) -> int:
            (newest,) = conn.execute("SELECT coalesce(max(rev), 0) FROM nb_feed").fetchone()
            (aged,) = conn.execute("SELECT coalesce(max(rev), 0) FROM nb_feed WHERE at < ?",
                                   (int(time.time() - retention.max_age),)).fetchone()
            return conn.execute(_FEED_TRIM, (max(aged, newest - retention.max_entries),)).rowcount

        return self._write(run)

    def close(self) -> None:
        with self._watch_lock:
            if self._watch is not None and self._watch_pid == os.getpid():
                self._watch.close()
                self._watch = None
        self._db.close()
