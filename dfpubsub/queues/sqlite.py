"""Embedded SQLite queues, the default: one file, WAL, safe for several processes.

Each queue is a row of ``q_queues`` holding its limits, its counters and its
lease; reservations and entries are rows of their own tables. Triggers keep
the counters: inserting or deleting a reservation or an entry updates its
queue's row in the same statement, so the counters are always the sums of
the rows that exist, whatever the mix of calls, crashes and processes.

``reserve()`` and ``commit()`` are one statement each (one implicit
transaction, no read before the write): an ``INSERT ... SELECT`` whose
``WHERE`` is the capacity check. Only when it inserts nothing does a second
transaction sweep expired reservations, retry, and find out why (QueueFull,
QueueNotFound, ReservationNotFound). The entry's reservation id is kept in
its row because the insert trigger deletes the reservation with it.
``reserve_many()`` and ``commit_many()`` are one transaction each: a sweep,
then the same statements through ``executemany``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from ..backends import foreign
from ..backends.sqlite import Row, SqliteDb, file_location
from ..errors import QueueFull, QueueNotFound, ReservationNotFound
from ..store.outbox import Outbox, SqliteOutbox, value_tail, versioned
from .api import Aside, DeadLetter, QueueEntry, QueueInfo, QueueStats, QueueStore, check_name, marker
from .readback import foreign_entry, queue_meta

__all__ = ["SqliteQueues"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS q_queues (
    name TEXT PRIMARY KEY,
    max_bytes INTEGER NOT NULL,
    max_entries INTEGER NOT NULL,
    stale_after REAL NOT NULL,
    created_at REAL NOT NULL,
    seq INTEGER NOT NULL DEFAULT 0,
    entries INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    reservations INTEGER NOT NULL DEFAULT 0,
    reserved_bytes INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    owner_until REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS q_reservations (
    queue TEXT NOT NULL,
    id TEXT NOT NULL,
    size INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (queue, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS q_entries (
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    res TEXT NOT NULL,
    size INTEGER NOT NULL,
    enqueued_at REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (queue, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS q_dead_letters (
    queue TEXT NOT NULL,
    marker TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (queue, marker)
);
CREATE TABLE IF NOT EXISTS q_records (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (kind, name)
);
CREATE TRIGGER IF NOT EXISTS q_reservation_added AFTER INSERT ON q_reservations BEGIN
    UPDATE q_queues SET reservations = reservations + 1, reserved_bytes = reserved_bytes + NEW.size
    WHERE name = NEW.queue;
END;
CREATE TRIGGER IF NOT EXISTS q_reservation_gone AFTER DELETE ON q_reservations BEGIN
    UPDATE q_queues SET reservations = reservations - 1, reserved_bytes = reserved_bytes - OLD.size
    WHERE name = OLD.queue;
END;
CREATE TRIGGER IF NOT EXISTS q_entry_added AFTER INSERT ON q_entries BEGIN
    DELETE FROM q_reservations WHERE queue = NEW.queue AND id = NEW.res;
    UPDATE q_queues SET seq = NEW.seq, entries = entries + 1, bytes = bytes + NEW.size WHERE name = NEW.queue;
END;
CREATE TRIGGER IF NOT EXISTS q_entry_gone AFTER DELETE ON q_entries BEGIN
    UPDATE q_queues SET entries = entries - 1, bytes = bytes - OLD.size WHERE name = OLD.queue;
END;
"""

# SQLite keeps whatever another writer puts in a column, and a number compares below any text:
# limits left as text would let every write in. A queue whose limits are not numbers takes none.
_BOUNDED = "typeof(max_bytes) = 'integer' AND typeof(max_entries) = 'integer' AND typeof(stale_after) IN ('integer', 'real')"
# Inserts the reservation only if it fits; the trigger counts it.
_RESERVE = f"""
INSERT INTO q_reservations (queue, id, size, expires_at)
SELECT name, :id, :size, :now + stale_after FROM q_queues
WHERE name = :name AND bytes + reserved_bytes + :size <= max_bytes AND entries + reservations < max_entries
  AND {_BOUNDED}
"""
# Inserts the entry only if the reservation is live and the entry fits (a larger entry
# needs the difference free); the trigger deletes the reservation and counts the entry.
_COMMIT = """
INSERT INTO q_entries (queue, seq, res, size, enqueued_at, data)
SELECT q.name, q.seq + 1, r.id, :size, :now, :data FROM q_queues AS q
JOIN q_reservations AS r ON r.queue = q.name AND r.id = :id
WHERE q.name = :name AND r.expires_at >= :now
  AND (:size <= r.size OR (typeof(q.max_bytes) = 'integer' AND q.bytes + q.reserved_bytes - r.size + :size <= q.max_bytes))
RETURNING seq
"""
_COMMIT_MANY = _COMMIT.replace("RETURNING seq", "")
# An outbox's entry: no reservation, the bounds checked by the insert itself.
_APPEND = f"""
INSERT INTO q_entries (queue, seq, res, size, enqueued_at, data)
SELECT name, seq + 1, '', :size, :now, :data FROM q_queues
WHERE name = :name AND bytes + reserved_bytes + :size <= max_bytes AND entries + reservations < max_entries
  AND {_BOUNDED}
"""
_SWEEP = "DELETE FROM q_reservations WHERE queue = ? AND expires_at < ?"
_QUEUE = "SELECT max_bytes, max_entries, stale_after, created_at FROM q_queues WHERE name = ?"
_STATS = """
SELECT entries, bytes, reservations, reserved_bytes, max_bytes, max_entries, owner, owner_until
FROM q_queues WHERE name = ?
"""
# SQLite keeps whatever another writer put in a column (a TEXT expiry compares above every
# number): a lease whose owner is not text or whose expiry is not a time is free to take.
_LEASE_FREE = ("(owner IS NULL OR typeof(owner) != 'text' OR typeof(owner_until) NOT IN ('integer', 'real') "
               "OR owner_until < :now OR owner_until > 1e12)")


class _Reservation(TypedDict):
    """The named parameters of _RESERVE."""

    id: str
    size: int
    now: float
    name: str


class _Commit(TypedDict):
    """The named parameters of _COMMIT: the entry ``data`` of reservation ``id``."""

    size: int
    now: float
    data: bytes
    id: str
    name: str


def _count(value: object) -> int:
    """A counter or bound of a queue's row; a decoding error (foreign) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{value!r} is not a count")
    return value


def _time(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e12:
        raise TypeError(f"{value!r} is not a time")
    return float(value)


def _info(name: str, max_bytes: object, max_entries: object, stale_after: object, created_at: object) -> QueueInfo:
    return QueueInfo(name, _count(max_bytes), _count(max_entries), _time(stale_after), _time(created_at))


def _check_bounds(conn: sqlite3.Connection, name: str) -> None:
    """After a write its bounds refused: ForeignRecord (counted) if they are another writer's, not
    numbers (else the refusal was for want of room); nothing if the queue does not exist."""
    row = conn.execute(_QUEUE, (name,)).fetchone()
    if row is not None:
        queue_meta(f"q_queues row {name!r}", _info, name, *row)


def _stats_of(row: Row, now: float) -> QueueStats:
    entries, size, n, reserved, max_bytes, max_entries, owner, until = row
    held: tuple[str | None, float | None] = (None, None)
    lease = None if owner is None else foreign.decode("queue_lease", "q_queues.owner", _lease, owner, until)
    if lease is not None and lease[1] >= now:
        held = lease
    return QueueStats(_count(entries), _count(size), _count(n), _count(reserved), _count(max_bytes),
                      _count(max_entries), *held)


def _lease(owner: object, until: object) -> tuple[str, float]:
    if not isinstance(owner, str):
        raise TypeError(f"lease owner {owner!r} is not text")
    return owner, _time(until)


def _entry(seq: object, data: object, at: object) -> QueueEntry:
    if not isinstance(data, bytes):
        raise TypeError(f"entry data is {type(data).__name__}, not bytes")
    return QueueEntry(marker(_count(seq)), data, _time(at))


def _dead_letter(queue: object, mk: object, data: object, reason: object, at: object) -> DeadLetter:
    if not isinstance(mk, str) or not isinstance(data, bytes) or not isinstance(reason, str):
        raise TypeError("a dead letter is (text marker, bytes, text reason)")
    return DeadLetter(check_name(queue), mk, data, reason, _time(at))  # type: ignore[arg-type]


def _record(name: object, data: object) -> tuple[str, bytes]:
    if not isinstance(name, str) or not isinstance(data, bytes):
        raise TypeError("a record is (text name, bytes)")
    return name, data


class _Refused(Exception):
    """A commit of a batch matched nothing: roll the batch back."""


class _Outbox(SqliteOutbox):
    """Appends in the store's transaction: the bounds checked by the insert; on a refusal,
    expired reservations are swept and the insert tried again before QueueFull."""

    def __init__(self, location: str, entries: list[tuple[str, bytes]], with_value: bool, now: float):
        super().__init__(location, entries, with_value)
        self.now = now

    def apply(self, conn: sqlite3.Connection, version: int, blob: bytes | None) -> None:
        tail = value_tail(blob) if self.with_value and blob is not None else b""
        for name, body in self.entries:
            data = versioned(version, body + tail)
            args = {"name": name, "size": len(data), "now": self.now, "data": data}
            if conn.execute(_APPEND, args).rowcount:
                continue
            conn.execute(_SWEEP, (name, self.now))
            if conn.execute(_APPEND, args).rowcount:
                continue
            if conn.execute("SELECT 1 FROM q_queues WHERE name = ?", (name,)).fetchone() is None:
                self.skipped += 1
                continue
            _check_bounds(conn, name)
            raise QueueFull(name, f"no room for an entry of {len(data)} bytes")


class SqliteQueues(QueueStore):
    """``sqlite:///path/to/queues.sqlite``; it may be the northbound store's file (other tables)."""

    backend = "sqlite"

    def __init__(
        self,
        path: str,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ):
        super().__init__(clock)
        self.path = path
        self.location = file_location(path)
        self._db = SqliteDb(path, _SCHEMA, "queues", timeout=busy_timeout, synchronous=synchronous)

    # -- plumbing --------------------------------------------------------------------------

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` in one autocommitted call, or a transaction ``fn`` opens itself."""
        return self._db.run(fn)

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` in a write transaction; rolled back if it raises."""
        return self._db.transaction(fn)

    @staticmethod
    def _missing(conn: sqlite3.Connection, name: str) -> QueueNotFound | None:
        if conn.execute("SELECT 1 FROM q_queues WHERE name = ?", (name,)).fetchone() is None:
            return QueueNotFound(f"no queue {name!r}")
        return None

    @classmethod
    def _require(cls, conn: sqlite3.Connection, name: str) -> None:
        """Raise QueueNotFound unless ``name`` exists (asked only when a statement matched nothing)."""
        missing = cls._missing(conn, name)
        if missing:
            raise missing

    # -- registry ------------------------------------------------------------------------------

    def _create_queue(self, name: str, max_bytes: int, max_entries: int, stale_after: float, now: float) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            args = (name, max_bytes, max_entries, stale_after, now)
            cur = conn.execute("INSERT OR IGNORE INTO q_queues (name, max_bytes, max_entries, stale_after, created_at)"
                               " VALUES (?, ?, ?, ?, ?)", args)
            if cur.rowcount:
                return True
            conn.execute("UPDATE q_queues SET max_bytes = ?, max_entries = ?, stale_after = ? WHERE name = ?",
                         (max_bytes, max_entries, stale_after, name))
            return False

        return self._tx(run)

    def _delete_queue(self, name: str) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            # The queue's row goes first, so the triggers of the deletes below have nothing to update.
            existed = conn.execute("DELETE FROM q_queues WHERE name = ?", (name,)).rowcount
            for table in ("q_entries", "q_reservations", "q_dead_letters"):
                conn.execute(f"DELETE FROM {table} WHERE queue = ?", (name,))
            return bool(existed)

        return self._tx(run)

    def _list_queues(self) -> list[str]:
        rows = self._run(lambda c: c.execute("SELECT name FROM q_queues ORDER BY name").fetchall())
        names = (foreign.decode("queue_name", f"q_queues row {foreign.key_text(n)!r}", check_name, n)
                 for n, in rows)
        return [n for n in names if n is not None]

    def _queue_info(self, name: str) -> QueueInfo:
        row = self._run(lambda c: c.execute(_QUEUE, (name,)).fetchone())
        if row is None:
            raise QueueNotFound(f"no queue {name!r}")
        return queue_meta(f"q_queues row {name!r}", _info, name, *row)

    # -- writers ---------------------------------------------------------------------------------

    def outbox(self, entries: list[tuple[str, bytes]], with_value: bool = False) -> Outbox:
        """See :meth:`QueueStore.outbox`."""
        return _Outbox(self.location, entries, with_value, self.clock())

    def _reserve(self, name: str, size: int, now: float) -> str:
        args: _Reservation = {"id": os.urandom(8).hex(), "size": size, "now": now, "name": name}
        if self._run(lambda c: c.execute(_RESERVE, args).rowcount):
            return args["id"]
        return self._reserve_rows(name, [args], now)[0]

    def _reserve_many(self, name: str, sizes: list[int], now: float) -> list[str]:
        return self._reserve_rows(name, [{"id": os.urandom(8).hex(), "size": s, "now": now, "name": name}
                                         for s in sizes], now)

    def _reserve_rows(self, name: str, rows: list[_Reservation], now: float) -> list[str]:
        """All ``rows`` or none, in one transaction after a sweep of the expired reservations."""

        def run(conn: sqlite3.Connection) -> None:
            conn.execute(_SWEEP, (name, now))
            if conn.executemany(_RESERVE, rows).rowcount == len(rows):
                return
            row = conn.execute(_STATS, (name,)).fetchone()
            if row is None:
                raise QueueNotFound(f"no queue {name!r}")
            queue_meta(f"q_queues row {name!r}", _stats_of, row, now)  # a foreign bound refuses: say so
            _check_bounds(conn, name)
            raise QueueFull(name, "{} entries of {} bytes and {} reservations of {} bytes: no room for {} more "
                                  "of {} bytes within {} bytes and {} entries".format(
                                      *row[:4], len(rows), sum(r["size"] for r in rows), *row[4:6]))

        self._tx(run)
        return [r["id"] for r in rows]

    def _commit(self, name: str, res_id: str, data: bytes, now: float) -> str:
        args: _Commit = {"size": len(data), "now": now, "data": data, "id": res_id, "name": name}
        # fetchall: the statement must run to its end to commit.
        rows = self._run(lambda c: c.execute(_COMMIT, args).fetchall())
        if rows:
            return marker(rows[0][0])
        return self._commit_rows(name, [args])[0]

    def _commit_many(self, name: str, items: list[tuple[str, bytes]], now: float) -> list[str]:
        rows: list[_Commit] = [{"size": len(d), "now": now, "data": d, "id": r, "name": name} for r, d in items]

        def run(conn: sqlite3.Connection) -> list[str]:
            conn.execute(_SWEEP, (name, now))  # expired reservations neither count nor commit
            if conn.executemany(_COMMIT_MANY, rows).rowcount != len(rows):
                raise _Refused
            # The transaction holds the write lock: the batch took the last len(rows) numbers.
            (seq,) = conn.execute("SELECT seq FROM q_queues WHERE name = ?", (name,)).fetchone()
            return [marker(n) for n in range(seq - len(rows) + 1, seq + 1)]

        try:
            return self._tx(run)
        except _Refused:
            return self._commit_rows(name, rows)

    def _commit_rows(self, name: str, rows: list[_Commit]) -> list[str]:
        """The slow path: commit ``rows`` after a sweep, all or none; else raise why the first
        refused one was. A savepoint undoes the commits of a refused batch and keeps the sweep."""

        def run(conn: sqlite3.Connection) -> list[str] | Exception:
            conn.execute(_SWEEP, (name, rows[0]["now"]))
            conn.execute("SAVEPOINT batch")
            markers = []
            for args in rows:
                got = conn.execute(_COMMIT, args).fetchall()
                if not got:
                    conn.execute("ROLLBACK TO batch")
                    return self._refusal(conn, name, args)
                markers.append(marker(got[0][0]))
            return markers

        got = self._tx(run)
        if isinstance(got, Exception):
            raise got
        return got

    def _refusal(self, conn: sqlite3.Connection, name: str, args: _Commit) -> Exception:
        """Why a commit was refused, after the sweep (so an expired reservation is an unknown one)."""
        res = conn.execute("SELECT size FROM q_reservations WHERE queue = ? AND id = ?",
                           (name, args["id"])).fetchone()
        if res is None:
            return self._missing(conn, name) or ReservationNotFound(
                f"queue {name}: reservation {args['id']!r} is unknown (committed, aborted, expired or never made)")
        _check_bounds(conn, name)
        return QueueFull(name, f"an entry of {args['size']} bytes does not fit in its reservation of {res[0]} "
                               "bytes nor in the free room")

    def _abort(self, name: str, res_id: str, now: float) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            row: list[tuple[float]] = conn.execute(
                "DELETE FROM q_reservations WHERE queue = ? AND id = ? RETURNING expires_at", (name, res_id)).fetchall()
            if not row:
                self._require(conn, name)
                return False
            return row[0][0] >= now

        return self._run(run)

    # -- the owner ---------------------------------------------------------------------------------

    def _list(self, name: str, max: int, after: int) -> tuple[list[QueueEntry], bool]:
        def run(conn: sqlite3.Connection) -> list[Any]:
            rows = conn.execute("SELECT seq, data, enqueued_at FROM q_entries WHERE queue = ? AND seq > ? "
                                "ORDER BY seq LIMIT ?", (name, after, max + 1)).fetchall()
            if not rows:
                self._require(conn, name)
            return rows

        rows = self._run(run)
        out = []
        for seq, data, at in rows[:max]:
            try:
                out.append(_entry(seq, data, at))
            except foreign.DECODE_ERRORS as exc:
                out.append(foreign_entry(marker(seq), f"q_entries row ({name!r}, {seq})", exc))
        return out, len(rows) > max

    def _remove(self, name: str, up_to: int) -> int:
        def run(conn: sqlite3.Connection) -> int:
            n = conn.execute("DELETE FROM q_entries WHERE queue = ? AND seq <= ?", (name, up_to)).rowcount
            if not n:
                self._require(conn, name)
            return n

        return self._run(run)

    def _remove_exact(self, name: str, items: list[tuple[int, bytes | None]], aside: Aside | None) -> int:
        delete = "DELETE FROM q_entries WHERE queue = ? AND seq = ?"

        def run(conn: sqlite3.Connection) -> int:
            if aside is None:
                n = conn.executemany(delete, [(name, s) for s, _ in items]).rowcount
            else:
                n = 0
                for seq, data in items:
                    if conn.execute(delete, (name, seq)).rowcount:
                        n += 1
                        conn.execute("INSERT INTO q_dead_letters VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                     (name, marker(seq), aside.reason, aside.at, data))
            if not n:
                self._require(conn, name)
            return n

        return self._tx(run)

    def _stats(self, name: str, now: float) -> QueueStats:
        def run(conn: sqlite3.Connection) -> Row:
            conn.execute(_SWEEP, (name, now))
            row: Row | None = conn.execute(_STATS, (name,)).fetchone()
            if row is None:
                raise QueueNotFound(f"no queue {name!r}")
            return row

        return queue_meta(f"q_queues row {name!r}", _stats_of, self._tx(run), now)

    # -- leases ---------------------------------------------------------------------------------------

    def _lock(self, name: str, owner: str, now: float, until: float) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            taken = conn.execute(
                f"UPDATE q_queues SET owner = :owner, owner_until = :until WHERE name = :name "
                f"AND (owner = :owner OR {_LEASE_FREE})",
                {"owner": owner, "until": until, "name": name, "now": now}).rowcount
            if not taken:
                self._require(conn, name)
            return bool(taken)

        return self._run(run)

    def _unlock(self, name: str, owner: str) -> bool:
        return bool(self._run(lambda c: c.execute(
            "UPDATE q_queues SET owner = NULL, owner_until = NULL WHERE name = ? AND owner = ?", (name, owner)
        ).rowcount))

    def _owner(self, name: str, now: float) -> tuple[str, float] | None:
        row = self._run(lambda c: c.execute("SELECT owner, owner_until FROM q_queues WHERE name = ?",
                                            (name,)).fetchone())
        if row is None:
            raise QueueNotFound(f"no queue {name!r}")
        lease = None if row[0] is None else foreign.decode("queue_lease", f"q_queues row {name!r}", _lease, *row)
        return None if lease is None or lease[1] < now else lease

    # -- dead letters -------------------------------------------------------------------------------

    def _dead_letter(self, name: str, marker: str, data: bytes, reason: str, now: float) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            added = conn.execute(
                "INSERT INTO q_dead_letters SELECT name, ?, ?, ?, ? FROM q_queues WHERE name = ? "
                "ON CONFLICT DO NOTHING", (marker, reason, now, data, name)).rowcount
            if not added:
                self._require(conn, name)
            return bool(added)

        return self._run(run)

    def _list_dead_letters(self, name: str | None, max: int) -> list[DeadLetter]:
        sql = "SELECT queue, marker, data, reason, at FROM q_dead_letters"
        args: tuple[str | int, ...] = (max,)
        if name is not None:
            sql, args = sql + " WHERE queue = ?", (name, max)
        rows = self._run(lambda c: c.execute(sql + " ORDER BY queue, marker LIMIT ?", args).fetchall())
        letters = (foreign.decode("queue_dead_letter", f"q_dead_letters row ({foreign.key_text(row[0])!r}, "
                                  f"{foreign.key_text(row[1])!r})", _dead_letter, *row) for row in rows)
        return [letter for letter in letters if letter is not None]

    def _purge_dead_letters(self, name: str | None) -> int:
        if name is None:
            return self._run(lambda c: c.execute("DELETE FROM q_dead_letters").rowcount)
        return self._run(lambda c: c.execute("DELETE FROM q_dead_letters WHERE queue = ?", (name,)).rowcount)

    def _redrive(self, name: str, mk: str, now: float) -> str | None:
        def run(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT data FROM q_dead_letters WHERE queue = ? AND marker = ?",
                               (name, mk)).fetchone()
            if row is None:
                self._require(conn, name)
                return None
            if not isinstance(row[0], bytes):
                foreign.skip("queue_dead_letter", f"q_dead_letters row ({name!r}, {mk!r})", "wrong_type")
                return None
            args = {"size": len(row[0]), "now": now, "data": row[0], "name": name}
            conn.execute(_SWEEP, (name, now))
            got = conn.execute(_APPEND + " RETURNING seq", args).fetchall()
            if not got:
                _check_bounds(conn, name)
                raise QueueFull(name, f"no room to redrive a dead letter of {len(row[0])} bytes")
            conn.execute("DELETE FROM q_dead_letters WHERE queue = ? AND marker = ?", (name, mk))
            return marker(got[0][0])

        return self._tx(run)

    # -- records -------------------------------------------------------------------------------------

    def _put_record(self, kind: str, name: str, data: bytes) -> None:
        self._run(lambda c: c.execute("INSERT OR REPLACE INTO q_records VALUES (?, ?, ?)", (kind, name, data)))

    def _get_record(self, kind: str, name: str) -> bytes | None:
        row = self._run(lambda c: c.execute("SELECT data FROM q_records WHERE kind = ? AND name = ?",
                                            (kind, name)).fetchone())
        record = None if row is None else foreign.decode(f"notify_{kind}", self.record_key(kind, name), _record,
                                                         name, row[0])
        return None if record is None else record[1]

    def _list_records(self, kind: str) -> dict[str, bytes]:
        rows = self._run(lambda c: c.execute("SELECT name, data FROM q_records WHERE kind = ? ORDER BY name",
                                             (kind,)).fetchall())
        records = (foreign.decode(f"notify_{kind}", self.record_key(kind, foreign.key_text(n)), _record, n, d)
                   for n, d in rows)
        return dict(r for r in records if r is not None)

    def _delete_record(self, kind: str, name: str) -> bool:
        return bool(self._run(lambda c: c.execute("DELETE FROM q_records WHERE kind = ? AND name = ?",
                                                  (kind, name)).rowcount))

    def close(self) -> None:
        self._db.close()
