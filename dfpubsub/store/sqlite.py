"""Embedded SQLite store, the default: one file, WAL, safe for several processes.

Writers take SQLite's write lock up front (``BEGIN IMMEDIATE``) and bump one
revision counter in the same transaction, so versions are unique and
increasing across every process sharing the file. Readers never block writers
(WAL). A forked child reopens its own connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from .. import foreign
from ..errors import AlreadyExists, NotFound, VersionConflict
from ..events import VersionedObject
from ..sqlite_client import SqliteDb, file_location
from .api import DEFAULT_MAX_VALUE_BYTES, ObjectVersion, Store, decode_value
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
CREATE TRIGGER IF NOT EXISTS nb_revision_on_insert AFTER INSERT ON nb_objects
BEGIN UPDATE nb_meta SET value = NEW.version WHERE name = 'revision'; END;
CREATE TRIGGER IF NOT EXISTS nb_revision_on_update AFTER UPDATE OF version ON nb_objects
BEGIN UPDATE nb_meta SET value = NEW.version WHERE name = 'revision'; END;
"""
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


def _foreign(topic: Any, key: Any, version: Any, blob: Any) -> bool:
    """Whether a row's columns have types this store never writes (another writer's row)."""
    return (topic.__class__ is not str or key.__class__ is not str or version.__class__ is not int
            or blob.__class__ is not bytes)


def _name(table: Any, key: Any) -> str:
    return f"nb_objects[tbl={foreign.key_text(table)}, key={foreign.key_text(key)}]"


def _objects(rows: list[tuple], tables: frozenset[str]) -> list[VersionedObject]:
    """The objects of (topic, table, key, version, value) rows of ``tables``, foreign rows skipped."""
    unpack, out = decode_value, []
    for topic, tbl, key, version, blob in rows:
        if tbl not in tables:
            continue
        try:  # free unless it raises
            if _foreign(topic, key, version, blob):
                raise TypeError("a column has the wrong type")
            out.append(VersionedObject(topic, tbl, key, version, unpack(blob)))
        except foreign.DECODE_ERRORS as exc:
            foreign.skip_error("store_object", _name(tbl, key), exc)
    return out


class SqliteStore(Store):
    """``sqlite:///path/to/nb.sqlite`` (``sqlite:///:memory:`` for a private, in-memory one)."""

    backend = "sqlite"

    def __init__(
        self,
        path: str,
        tables: Iterable[str],
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
    ):
        super().__init__(tables, max_value_bytes)
        self.path = path
        self.location = file_location(path)
        self._db = SqliteDb(path, _SCHEMA, "store", timeout=busy_timeout, synchronous=synchronous)

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._db.transaction(fn)

    def _read(self, sql: str, args: tuple) -> list[tuple]:
        return self._db.fetchall(sql, args, "read")

    def _get(self, table: str, key: str) -> VersionedObject | None:
        rows = self._read("SELECT topic, version, value FROM nb_objects WHERE tbl = ? AND key = ?", (table, key))
        if not rows:
            return None
        objs = _objects([(rows[0][0], table, key, *rows[0][1:])], self.tables)
        return objs[0] if objs else None

    def _list(self, table: str | None, topics: set[str] | None) -> list[VersionedObject]:
        sql = "SELECT topic, tbl, key, version, value FROM nb_objects"
        where: list[str] = []
        args: list[Any] = []
        if table is not None:
            where.append("tbl = ?")
            args.append(table)
        if topics is not None:
            if not topics:
                return []
            where.append(f"topic IN ({','.join('?' * len(topics))})")
            args.extend(topics)
        if where:
            sql += " WHERE " + " AND ".join(where)
        return _objects(self._read(sql, tuple(args)), self.tables)

    def _list_versions(self, topics: set[str]) -> list[ObjectVersion]:
        if not topics:
            return []
        sql = f"SELECT topic, tbl, key, version FROM nb_objects WHERE topic IN ({','.join('?' * len(topics))})"
        out = []
        for topic, tbl, key, version in self._read(sql, tuple(topics)):
            if tbl in self.tables:
                if _foreign(topic, key, version, b""):
                    foreign.skip_error("store_object", _name(tbl, key), TypeError("a column has the wrong type"))
                else:
                    out.append(ObjectVersion(topic, tbl, key, version))
        return out

    def _get_many(self, refs: list[tuple[str, str]]) -> list[VersionedObject]:
        by_table: dict[str, list[str]] = {}
        for table, key in refs:
            by_table.setdefault(table, []).append(key)
        out: list[VersionedObject] = []
        for table, keys in by_table.items():
            for start in range(0, len(keys), _MANY):
                chunk = keys[start:start + _MANY]
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT topic, ?, key, version, value FROM nb_objects WHERE tbl = ? AND key IN ({marks})"
                out.extend(_objects(self._read(sql, (table, table, *chunk)), self.tables))
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

    def _statement(self, sql: str, args: tuple, outbox: Outbox | None) -> tuple | None:
        """Run one write statement; its RETURNING row (the version first) or None.

        Alone it is autocommitted; with an outbox, the outbox appends in the
        same transaction once the statement wrote (the version is then known).
        """
        if outbox is None:
            # fetchall, not fetchone: the statement must run to its end to commit.
            rows = self._db.fetchall(sql, args, "write")
            return rows[0] if rows else None

        def run(conn: sqlite3.Connection) -> tuple | None:
            rows = conn.execute(sql, args).fetchall()
            if rows:
                cast(SqliteOutbox, outbox).apply(conn, rows[0][0])
            return rows[0] if rows else None

        return self._write(run)

    def _create(self, table: str, key: str, topic: str, blob: bytes, value: Any,
                outbox: Outbox | None) -> VersionedObject:
        row = self._statement(_INSERT, (table, key, topic, blob), outbox)
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
        row = self._statement(sql + " RETURNING version, topic", args, outbox)
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
            if outbox is not None:
                cast(SqliteOutbox, outbox).apply(conn, version)
            return VersionedObject(row[0], table, key, version, None)

        return self._write(run)

    def _drop_all(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM nb_objects").rowcount

        return self._write(run)

    def close(self) -> None:
        self._db.close()
