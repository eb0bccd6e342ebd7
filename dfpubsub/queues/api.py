"""The persistent queue contract: bounded two-phase-commit queues, leases and dead letters.

A writer ``reserve()``\\s room for an entry before it changes anything, then
``commit()``\\s the entry (or ``abort()``\\s) once its own write is done, so an
entry exists exactly when the write happened and a full queue refuses the
write up front (Ceph's persistent bucket notifications). The owner of a
queue (a lease taken with ``lock()``) ``list()``\\s entries in commit order
and removes exactly those it delivered (``remove_markers()``, or ``remove()``
of a prefix); what cannot be delivered goes to the dead letters with
``set_aside()``, which records and removes each entry in one atomic step.

**Accounting** (docs/queues.md): a queue counts its committed entries and
bytes and its live reservations and their reserved bytes, and refuses a
reservation when ``bytes + reserved_bytes + size > max_bytes`` or
``entries + reservations >= max_entries``. Every counter changes in the same
atomic step as what it counts, with the sizes actually stored, so nothing
leaks (Ceph adds an overhead on reserve that it never subtracts).
Reservations older than the queue's ``stale_after`` seconds are expired:
they stop counting and can no longer be committed, so the capacity of a
writer that crashed between reserve and commit comes back.

**Markers** are opaque strings that sort, as strings, in commit order within
a queue (20-digit zero-padded numbers; never reused while the queue exists).

Times (reservation expiry, leases, ``enqueued_at``) come from the caller's
clock (``clock``, ``time.time`` by default): processes sharing a Redis or
etcd backend from several hosts need synchronised clocks (NTP), with an
error well under ``stale_after`` and the lease duration.

Backends implement the abstract ``_``-prefixed hooks (docs/queues.md, "Writing
a backend"); this class validates arguments, so every backend fails the same
way on bad input, and derives the rest: a single reserve or commit is a batch
of one, ``remove_markers()`` and ``set_aside()`` share one hook, and a lease is
read from ``stats()``, unless a backend overrides those with cheaper ways.
"""

from __future__ import annotations

import abc
import builtins
import re
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..errors import InvalidValue
from ..store.api import Store
from ..store.outbox import Outbox, same_place

__all__ = [
    "QueueStore",
    "Aside",
    "QueueEntry",
    "QueueInfo",
    "QueueStats",
    "DeadLetter",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_STALE_AFTER",
    "marker",
    "marker_seq",
]

#: Ceph's default queue size.
DEFAULT_MAX_BYTES = 128 << 20
DEFAULT_MAX_ENTRIES = 100_000
#: Seconds after which a reservation that was neither committed nor aborted expires.
DEFAULT_STALE_AFTER = 30.0

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
_MARKER_DIGITS = 20
#: Sequence numbers stay below 2**63 (SQLite's integers); larger markers mean "the end".
_MAX_SEQ = (1 << 63) - 1
_MAX_RECORD_NAME_BYTES = 1024


class QueueEntry(NamedTuple):
    """A committed entry: its ``marker``, the bytes given to commit, and when it was committed."""

    marker: str
    data: bytes
    enqueued_at: float


class QueueInfo(NamedTuple):
    """A queue's configuration."""

    name: str
    max_bytes: int
    max_entries: int
    stale_after: float
    created_at: float


class QueueStats(NamedTuple):
    """What a queue holds now; ``owner``/``owner_until`` are None unless a lease is held."""

    entries: int
    bytes: int
    reservations: int
    reserved_bytes: int
    max_bytes: int
    max_entries: int
    owner: str | None
    owner_until: float | None


class DeadLetter(NamedTuple):
    """An entry that could not be delivered, set aside with the reason."""

    queue: str
    marker: str
    data: bytes
    reason: str
    at: float


class Aside(NamedTuple):
    """What :meth:`QueueStore.set_aside` records with each entry it removes."""

    reason: str
    at: float


def marker(seq: int) -> str:
    """The marker of the ``seq``-th entry committed to a queue (from 1)."""
    return f"{seq:0{_MARKER_DIGITS}d}"


def marker_seq(value: str | None) -> int:
    """Inverse of :func:`marker`; None is 0 (before the first entry). InvalidValue otherwise."""
    if value is None:
        return 0
    if not isinstance(value, str) or len(value) != _MARKER_DIGITS or not value.isdigit():
        raise InvalidValue(f"not a queue marker: {value!r}")
    return min(int(value), _MAX_SEQ)


def check_name(name: str, what: str = "queue name") -> str:
    """``name`` if it is a valid queue (or record kind) name, else InvalidValue."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidValue(f"{what} {name!r} must match {_NAME.pattern}")
    return name


def _positive(value: object, what: str, kind: type = int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= 0:
        raise InvalidValue(f"{what} must be a positive {kind.__name__}, not {value!r}")


def _record_name(name: str) -> str:
    if not isinstance(name, str) or not name or "\x00" in name or len(name.encode()) > _MAX_RECORD_NAME_BYTES:
        raise InvalidValue(f"record name must be a non-empty str of at most {_MAX_RECORD_NAME_BYTES} bytes without NUL")
    return name


def _size(size: object) -> int:
    if size.__class__ is not int or size < 0:
        raise InvalidValue(f"reservation size must be an int >= 0, not {size!r}")
    return size


def _data(data: object) -> bytes:
    if data.__class__ is bytes:
        return data
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidValue(f"entry data must be bytes, not {type(data).__name__}")
    return bytes(data)


class QueueStore(abc.ABC):
    """Synchronous, thread-safe queues; several processes may share one backend."""

    #: Short name of the backend ("sqlite", "redis", "etcd").
    backend: str = ""
    #: Most reservations or entries one reserve_many() / commit_many() may carry.
    max_batch: int = 1000
    #: Where the queues live, as stores name it (:attr:`dfpubsub.store.Store.location`); "" if nowhere
    #: a store can share.
    location: str = ""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock

    # -- the transactional outbox ---------------------------------------------------------

    def shares_store(self, store: Store) -> bool:
        """Whether ``store`` can append to these queues in its own writes (:meth:`outbox`)."""
        return same_place(self.backend, self.location, store.backend, store.location)

    def outbox(self, entries: builtins.list[tuple[str, bytes]], with_value: bool = False) -> Outbox:
        """An outbox appending ``(queue, body)`` entries atomically with one write of a store
        that :meth:`shares_store`: each entry checked against its queue's bounds (QueueFull
        fails the write), no reservation needed (:mod:`dfpubsub.store.outbox`). With
        ``with_value`` each body is completed by the value the write stores, as a msgpack bin.

        InvalidValue on a backend that has no outbox.
        """
        raise InvalidValue(f"the {self.backend} queues cannot append in a store's writes")

    # -- the registry of queues ---------------------------------------------------------

    def create_queue(
        self,
        name: str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> bool:
        """Create and register a queue; True if it was new.

        Idempotent: for an existing queue the limits are updated and its
        entries, reservations and lease are kept.
        """
        check_name(name)
        _positive(max_bytes, "max_bytes")
        _positive(max_entries, "max_entries")
        _positive(stale_after, "stale_after", float)
        return self._create_queue(name, max_bytes, max_entries, float(stale_after), self.clock())

    def delete_queue(self, name: str) -> bool:
        """Delete a queue with its entries, reservations, lease and dead letters; False if there was none."""
        return self._delete_queue(name)

    def list_queues(self) -> builtins.list[str]:
        """Names of every queue, sorted."""
        return self._list_queues()

    def queue_info(self, name: str) -> QueueInfo:
        """The queue's configuration; QueueNotFound."""
        return self._queue_info(name)

    # -- writers -------------------------------------------------------------------------

    def reserve(self, name: str, size: int) -> str:
        """Reserve room for an entry of about ``size`` bytes; the reservation's id.

        Raises :class:`~dfpubsub.errors.QueueFull` (nothing reserved) or
        :class:`~dfpubsub.errors.QueueNotFound`.
        """
        return self._reserve(name, _size(size), self.clock())

    def reserve_many(self, name: str, sizes: Sequence[int]) -> builtins.list[str]:
        """Reserve room for ``len(sizes)`` entries in one round trip: all of them, or
        none and QueueFull. Lets a writer keep a few reservations ready ahead of its writes."""
        self._batch(sizes)
        return self._reserve_many(name, [_size(s) for s in sizes], self.clock()) if sizes else []

    def commit(self, name: str, res_id: str, data: bytes) -> str:
        """Turn a reservation into an entry holding ``data``; the entry's marker.

        An entry larger than its reservation takes the extra room if there is
        some, else raises QueueFull and leaves the reservation as it was.
        :class:`~dfpubsub.errors.ReservationNotFound` for a reservation that
        is unknown, already used, or expired.
        """
        return self._commit(name, res_id, _data(data), self.clock())

    def commit_many(self, name: str, items: Sequence[tuple[str, bytes]]) -> builtins.list[str]:
        """Commit several ``(reservation id, data)`` in one round trip, in that order; their markers.

        All or nothing: on QueueFull or ReservationNotFound nothing is
        committed (expired reservations are dropped all the same); commit the
        items one by one to find which failed and keep the others.
        """
        self._batch(items)
        checked = [(r, _data(d)) for r, d in items]
        if len({r for r, _ in checked}) != len(checked):
            raise InvalidValue("commit_many() got the same reservation twice")
        return self._commit_many(name, checked, self.clock()) if checked else []

    def abort(self, name: str, res_id: str) -> bool:
        """Give a reservation's room back; False if it was unknown or had expired."""
        return self._abort(name, res_id, self.clock())

    def _batch(self, items: Sequence[object]) -> None:
        if len(items) > self.max_batch:
            raise InvalidValue(f"at most {self.max_batch} items per batch on {self.backend}, not {len(items)}")

    # -- the owner -----------------------------------------------------------------------

    def list(self, name: str, max: int = 1000, from_marker: str | None = None) -> tuple[builtins.list[QueueEntry], bool]:
        """Up to ``max`` entries committed after ``from_marker``, in commit order, and
        whether more follow."""
        _positive(max, "max")
        return self._list(name, max, marker_seq(from_marker))

    def remove(self, name: str, up_to_marker: str) -> int:
        """Remove the entries up to and including ``up_to_marker``; how many were removed.

        Only for a prefix the caller handled whole: an entry listed but not yet
        delivered that sorts before ``up_to_marker`` goes too (use :meth:`remove_markers`).
        """
        return self._remove(name, marker_seq(up_to_marker))

    def remove_markers(self, name: str, markers: Sequence[str]) -> int:
        """Remove exactly the entries at ``markers``, in one atomic step; how many were
        removed (markers of entries already gone are skipped)."""
        self._batch(markers)
        seqs = sorted({marker_seq(m) for m in markers})
        return self._remove_exact(name, [(s, None) for s in seqs], None) if seqs else 0

    def stats(self, name: str) -> QueueStats:
        """Counters of the queue (expired reservations no longer count) and its lease."""
        return self._stats(name, self.clock())

    # -- ownership leases ------------------------------------------------------------------

    def lock(self, name: str, owner: str, duration: float) -> bool:
        """Take the queue's lease for ``duration`` seconds if it is free or expired, or renew
        it if ``owner`` holds it; False if another owner holds it."""
        if not isinstance(owner, str) or not owner:
            raise InvalidValue(f"lease owner must be a non-empty str, not {owner!r}")
        _positive(duration, "lease duration", float)
        now = self.clock()
        return self._lock(name, owner, now, now + duration)

    def unlock(self, name: str, owner: str) -> bool:
        """Release the lease if ``owner`` holds it; False otherwise."""
        return self._unlock(name, owner)

    def owner(self, name: str) -> tuple[str, float] | None:
        """(owner, until) of the unexpired lease, or None."""
        return self._owner(name, self.clock())

    # -- dead letters ----------------------------------------------------------------------

    def dead_letter(self, name: str, marker: str, data: bytes, reason: str) -> bool:
        """Record a dead letter with ``reason``; False if (queue, marker) already was.

        Records only: the entry stays queued (a delivery worker uses
        :meth:`set_aside`, which also removes it atomically). Dead letters are
        not counted in the queue's capacity; they stay until purged or the
        queue is deleted.
        """
        marker_seq(marker)
        if not isinstance(data, bytes) or not isinstance(reason, str):
            raise InvalidValue("dead letter data must be bytes and reason a str")
        return self._dead_letter(name, marker, data, reason, self.clock())

    def set_aside(self, name: str, entries: Sequence[QueueEntry], reason: str) -> int:
        """Move ``entries`` (as listed) to the dead letters with ``reason``: recording each one
        and removing it from the queue is one atomic step (all of them here), so a crash leaves
        an entry either queued or set aside, never both lost nor only half moved. An entry no
        longer queued is skipped (another owner handled it); one already recorded keeps its
        first record and is removed. How many entries were removed.
        """
        self._batch(entries)
        if not isinstance(reason, str):
            raise InvalidValue("dead letter reason must be a str")
        items = {}
        for e in entries:
            if not isinstance(e.data, bytes):
                raise InvalidValue("dead letter data must be bytes")
            items[marker_seq(e.marker)] = e.data
        return self._remove_exact(name, sorted(items.items()), Aside(reason, self.clock())) if items else 0

    def list_dead_letters(self, name: str | None = None, max: int = 1000) -> builtins.list[DeadLetter]:
        """Dead letters of one queue (all if None), by queue then marker, at most ``max``."""
        _positive(max, "max")
        return self._list_dead_letters(name, max)

    def purge_dead_letters(self, name: str | None = None) -> int:
        """Delete the dead letters of one queue (all if None); how many."""
        return self._purge_dead_letters(name)

    def redrive(self, name: str, marker: str) -> str | None:
        """Put dead letter ``marker`` of queue ``name`` back at the end of its queue: the letter
        leaves the dead letters and its data becomes a new entry in one atomic step, so a crash
        or a concurrent redrive never loses nor duplicates it. The new entry's marker; None if
        there is no such letter (redriven or purged meanwhile). QueueFull if the queue has no
        room for it (the letter stays)."""
        marker_seq(marker)
        return self._redrive(name, marker, self.clock())

    # -- small records (topics, notification configurations) -------------------------------

    def put_record(self, kind: str, name: str, data: bytes) -> None:
        """Store ``data`` as record ``name`` of ``kind``, replacing any."""
        check_name(kind, "record kind")
        _record_name(name)
        if not isinstance(data, bytes):
            raise InvalidValue("record data must be bytes")
        self._put_record(kind, name, data)

    def get_record(self, kind: str, name: str) -> bytes | None:
        """A record's data, or None."""
        check_name(kind, "record kind")
        return self._get_record(kind, _record_name(name))

    def list_records(self, kind: str) -> dict[str, bytes]:
        """Every record of ``kind``, by name."""
        return self._list_records(check_name(kind, "record kind"))

    def record_key(self, kind: str, name: str) -> str:
        """Where record ``name`` of ``kind`` lives in the backend, as an operator would look it up."""
        return f"q_records[kind={kind}, name={name}]"

    def delete_record(self, kind: str, name: str) -> bool:
        """Delete a record; False if there was none."""
        check_name(kind, "record kind")
        return self._delete_record(kind, _record_name(name))

    # -- lifecycle -----------------------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> QueueStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- backend hooks (times are the caller's clock) -----------------------------------------
    # Arguments come checked. Each hook is atomic where its public method promises so; one on a
    # queue that does not exist raises QueueNotFound, but _delete_queue and _unlock answer False,
    # _list_dead_letters and _purge_dead_letters nothing. The abstract ones are the contract; the
    # others are derived from them, and a backend overrides one only where its own costs less.

    @abc.abstractmethod
    def _create_queue(self, name: str, max_bytes: int, max_entries: int, stale_after: float, now: float) -> bool: ...

    @abc.abstractmethod
    def _delete_queue(self, name: str) -> bool: ...

    @abc.abstractmethod
    def _list_queues(self) -> builtins.list[str]: ...

    @abc.abstractmethod
    def _queue_info(self, name: str) -> QueueInfo: ...

    @abc.abstractmethod
    def _reserve_many(self, name: str, sizes: builtins.list[int], now: float) -> builtins.list[str]:
        """Reservations of ``sizes`` (at least one), all or none (QueueFull)."""

    def _reserve(self, name: str, size: int, now: float) -> str:
        """One reservation: a batch of one."""
        return self._reserve_many(name, [size], now)[0]

    @abc.abstractmethod
    def _commit_many(self, name: str, items: builtins.list[tuple[str, bytes]], now: float) -> builtins.list[str]:
        """The entries of ``items`` (at least one, distinct reservations), in order, all or none."""

    def _commit(self, name: str, res_id: str, data: bytes, now: float) -> str:
        """One commit: a batch of one."""
        return self._commit_many(name, [(res_id, data)], now)[0]

    @abc.abstractmethod
    def _abort(self, name: str, res_id: str, now: float) -> bool: ...

    @abc.abstractmethod
    def _list(self, name: str, max: int, after: int) -> tuple[builtins.list[QueueEntry], bool]: ...

    @abc.abstractmethod
    def _remove(self, name: str, up_to: int) -> int: ...

    @abc.abstractmethod
    def _remove_exact(self, name: str, items: builtins.list[tuple[int, bytes | None]], aside: Aside | None) -> int:
        """Remove the entries at the sequence numbers of ``items`` (sorted, distinct, at most
        :attr:`max_batch`) that are still queued, in one atomic step (or one per page where a step
        holds fewer); how many. With ``aside`` (:meth:`set_aside`), each one removed is recorded
        in its step as a dead letter of the item's data (None only without ``aside``) and
        ``aside``'s reason and time; one already recorded may keep its first record."""

    @abc.abstractmethod
    def _stats(self, name: str, now: float) -> QueueStats: ...

    @abc.abstractmethod
    def _lock(self, name: str, owner: str, now: float, until: float) -> bool: ...

    @abc.abstractmethod
    def _unlock(self, name: str, owner: str) -> bool: ...

    def _owner(self, name: str, now: float) -> tuple[str, float] | None:
        """The lease as :meth:`_stats` shows it."""
        stats = self._stats(name, now)
        return None if stats.owner is None or stats.owner_until is None else (stats.owner, stats.owner_until)

    @abc.abstractmethod
    def _dead_letter(self, name: str, marker: str, data: bytes, reason: str, now: float) -> bool: ...

    @abc.abstractmethod
    def _list_dead_letters(self, name: str | None, max: int) -> builtins.list[DeadLetter]: ...

    @abc.abstractmethod
    def _purge_dead_letters(self, name: str | None) -> int: ...

    @abc.abstractmethod
    def _redrive(self, name: str, marker: str, now: float) -> str | None: ...

    @abc.abstractmethod
    def _put_record(self, kind: str, name: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _get_record(self, kind: str, name: str) -> bytes | None: ...

    @abc.abstractmethod
    def _list_records(self, kind: str) -> dict[str, bytes]: ...

    @abc.abstractmethod
    def _delete_record(self, kind: str, name: str) -> bool: ...
