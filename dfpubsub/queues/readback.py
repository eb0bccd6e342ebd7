"""Decoding what the queue backends read back, skipping foreign records (dfpubsub.backends.foreign).

Queue names, record names and dead letters come back as bytes from etcd and
Redis; another writer may have left anything there. These helpers decode the
ones that are ours and skip (count, name) the rest, so one foreign key never
fails ``df-db queues list``, the registry or a dead-letter listing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import msgpack

from ..backends import foreign
from ..errors import ForeignRecord
from .api import DeadLetter, QueueEntry, check_name

__all__ = ["queue_names", "named_records", "dead_letter", "queue_meta", "foreign_entry"]

T = TypeVar("T")


def queue_meta(key: object, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` decoding the metadata of one queue at backend ``key``; when it does not
    decode, the record is counted and :class:`~dfpubsub.errors.ForeignRecord` raised: a listing
    skips that queue, a writer or the queue's owner is told which key to repair."""
    try:
        return fn(*args)
    except foreign.DECODE_ERRORS as exc:
        foreign.skip_error("queue_meta", key, exc)
        raise ForeignRecord(foreign.key_text(key), f"queue metadata does not decode ({type(exc).__name__})") from exc


def queue_names(rows: Iterable[tuple[bytes, object]]) -> list[str]:
    """The sorted queue names of (name bytes, backend key) rows; foreign ones skipped."""
    out = []
    for raw, key in rows:
        name = foreign.decode("queue_name", key, _name, raw)
        if name is not None:
            out.append(name)
    return sorted(out)


def named_records(kind: str, rows: Iterable[tuple[bytes, bytes, object]]) -> dict[str, bytes]:
    """Records by name, of (name bytes, data, backend key) rows; names that are not UTF-8 skipped."""
    out = {}
    for raw, data, key in rows:
        name = foreign.decode(f"notify_{kind}", key, bytes.decode, raw)
        if name is not None:
            out[name] = data
    return dict(sorted(out.items()))


def dead_letter(queue: str | bytes, mk: str | bytes, packed: bytes) -> DeadLetter:
    """A dead letter from its queue, marker and msgpack ``[data, reason, at]``; a decoding error
    (for foreign.decode) if it is not one."""
    data, reason, at = msgpack.unpackb(packed, raw=False)
    if not isinstance(data, bytes) or not isinstance(reason, str) or not isinstance(at, (int, float)):
        raise TypeError("a dead letter is [bytes, str, number]")
    return DeadLetter(_name(queue) if isinstance(queue, bytes) else queue,
                      mk.decode() if isinstance(mk, bytes) else mk, data, reason, float(at))


def foreign_entry(mk: str, key: object, exc: BaseException) -> QueueEntry:
    """A queue entry of the wrong shape (counted): handed on with no data, so that its owner
    treats it as any undecodable entry (sets it aside) and the queue moves on past it."""
    foreign.skip_error("queue_entry", key, exc)
    return QueueEntry(mk, b"", 0.0)


def _name(raw: bytes) -> str:
    return check_name(raw.decode())
