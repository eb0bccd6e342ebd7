"""The transactional outbox: queue entries a store write commits atomically with itself.

When the persistent notification queues live in the store's own backend (the
same SQLite file, the same Redis database), a write does not need Ceph's two
round trips around it (reserve before, commit after, a crash in between loses
the notification). The notifier hands the store an :class:`Outbox` with the
write: the store checks the queues' room, writes the object, takes its new
version and appends the entries, all in the write's own transaction (SQLite)
or script (Redis). The write and its notifications happen together or not at
all: a full queue fails the write with :class:`~dfpubsub.errors.QueueFull`
and leaves the store as it was.

The store assigns the version inside that transaction, so an entry's data is
the version, as a msgpack string of its decimal digits, followed by the body
the notifier encoded without it (:func:`versioned`); readers split them with
:func:`split_versioned`. Digits, not a msgpack integer, because a Redis script
holds numbers as doubles and versions as strings.

An outbox built ``with_value`` carries bodies that end short of their last
msgpack element, the value's encoding: the store appends the value it writes
as a msgpack bin (:func:`value_tail`), so a notification that carries the
value does not pack it a second time, nor send it twice to a Redis server.

A queue backend builds the outbox (``QueueStore.outbox``) in the form its
store backend runs; the store only calls it.
"""

from __future__ import annotations

import abc
import sqlite3
from typing import Any

from ..errors import InvalidValue

__all__ = ["Outbox", "SqliteOutbox", "RedisOutbox", "same_place", "versioned", "split_versioned", "value_tail",
           "MAX_PREFIX_BYTES", "MAX_TAIL_HEADER_BYTES"]

#: The most a version prefix takes: a fixstr header and 20 digits (2**64 - 1).
MAX_PREFIX_BYTES = 21
_FIXSTR = 0xA0
#: The most a msgpack bin header takes (bin 32).
MAX_TAIL_HEADER_BYTES = 5


def versioned(version: int, body: bytes) -> bytes:
    """An outbox entry's data: ``version`` as a msgpack fixstr of its digits, then ``body``."""
    digits = str(version).encode()
    return bytes((_FIXSTR | len(digits),)) + digits + body


def value_tail(blob: bytes) -> bytes:
    """What a ``with_value`` outbox appends to each body: the stored value ``blob`` as a msgpack bin."""
    n = len(blob)
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big") + blob
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big") + blob
    return b"\xc6" + n.to_bytes(4, "big") + blob


def split_versioned(data: bytes) -> tuple[int | None, bytes]:
    """(version, body) of an outbox entry; (None, data) for data without a version prefix.

    Raises :class:`InvalidValue` when a prefix is there but not a version.
    """
    if not data or data[0] & 0xE0 != _FIXSTR:
        return None, data
    end = 1 + (data[0] & 0x1F)
    digits = data[1:end]
    if len(data) < end or not digits.isdigit():
        raise InvalidValue("an outbox entry's version prefix is not decimal digits")
    return int(digits), data[end:]


def same_place(backend: str, location: str, other_backend: str, other_location: str) -> bool:
    """Whether two handles (a store, queues) hold their data in one place that one write can
    change atomically: the same backend at the same, shareable (non-empty) location."""
    return bool(location) and backend == other_backend and location == other_location


class Outbox(abc.ABC):  # noqa: B024 - a base of the backends' outboxes, never built itself
    """Entries to append, each ``(queue, body)``, atomically with one store write.

    ``backend`` and ``location`` say which store can run it (a store refuses
    another's outbox). With ``with_value`` every body is completed by the
    value the write stores (:func:`value_tail`): only a create or an update
    can run such an outbox. After the write, ``skipped`` counts the entries
    whose queue no longer existed (the topic was deleted meanwhile): they want
    nothing, and are not an error.
    """

    backend: str = ""

    def __init__(self, location: str, entries: list[tuple[str, bytes]], with_value: bool = False):
        self.location = location
        self.entries = entries
        self.with_value = with_value
        self.skipped = 0

    def check_store(self, backend: str, location: str, has_value: bool = True) -> None:
        """Raise InvalidValue unless the store at ``location`` of ``backend`` can run this outbox
        with a write that stores a value (``has_value``) or not."""
        if not same_place(self.backend, self.location, backend, location):
            raise InvalidValue(f"an outbox for the {self.backend} queues at {self.location} cannot commit "
                               f"with the {backend} store at {location}")
        if self.with_value and not has_value:
            raise InvalidValue("an outbox whose entries end with the written value cannot go with a deletion")


class SqliteOutbox(Outbox):
    """An outbox the SQLite store runs inside its write transaction."""

    backend = "sqlite"

    @abc.abstractmethod
    def apply(self, conn: sqlite3.Connection, version: int, blob: bytes | None) -> None:
        """Append the entries with ``version`` (and, ``with_value``, the written value ``blob``) on
        ``conn``, inside the write's open transaction; raise QueueFull (the store rolls the write
        back) if one does not fit."""


class RedisOutbox(Outbox):
    """An outbox the Redis store runs inside its write script.

    Two pieces of Lua run at the top level of the store's script, over its
    ``KEYS`` and ``ARGV`` after the store's own (from offsets ``KB`` and
    ``AB``, which the store defines) and ``OB_VALUE``, the blob the write
    stores (nil for a deletion). :attr:`CHECK` runs before the write changes
    anything and returns the store's refusal, if any: ``{4, i}`` when entry
    ``i`` does not fit, ``{5, k, why}`` when ``KEYS[k]`` is a foreign record
    the append could not write past. :attr:`APPEND` runs after the write
    succeeded, with ``OB_VERSION`` its version (a string), appends every entry
    and adds the entries it skipped to ``OB_SKIPPED``.
    """

    backend = "redis"
    CHECK: str = ""
    APPEND: str = ""

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """The keys the entries touch, after the store's own."""

    @abc.abstractmethod
    def args(self) -> list[Any]:
        """The arguments of the entries, after the store's own."""
