"""The store's change feed: what every committed write appends, in commit order.

Each create, update and delete appends one :class:`FeedEntry` ``(revision,
topic, table, key, action)`` in the same transaction (SQLite, an append-only
table filled by the write statements' triggers), the same script (Redis, a
stream whose ids are the revisions) or is the store's own history (etcd,
read by a watch from a revision). ``revision`` is the version the write gave
the object, so a reader's position is one integer and a restart resumes from
it.

History is bounded (:class:`FeedRetention`): reading at or below what was
dropped raises :class:`~dfpubsub.errors.HistoryGone`, and the reader must
resync from a listing. Entries that do not decode (written by something else
beside the store) are skipped and counted, never raised.

:class:`FeedReader` follows the feed: :meth:`FeedReader.read` returns the next
entries, waiting up to ``timeout`` for some without busy polling (etcd's
watch, Redis's blocking ``XREAD``, SQLite a wake-up from this process's
writers plus a bounded poll of ``PRAGMA data_version`` for other processes').
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ..events import ACTIONS, Action

if TYPE_CHECKING:
    from .api import Store

__all__ = ["FeedEntry", "FeedRetention", "FeedReader", "parse_entry", "DEFAULT_BATCH"]

#: Entries per read unless told otherwise.
DEFAULT_BATCH = 1000


class FeedEntry(NamedTuple):
    """One committed write. ``topic`` is the object's topic when the write knew it; etcd's update
    without a topic change cannot tell it, and gives the table's name (a reader that fetches the
    object takes the topic from it)."""

    revision: int
    topic: str
    table: str
    key: str
    action: Action


@dataclass(frozen=True, slots=True)
class FeedRetention:
    """How much history a store keeps: the newest ``max_entries``, none older than ``max_age`` seconds.

    The count is enforced by the writes themselves (Redis trims in the write
    script, SQLite every 256 revisions); the age by :meth:`Store.compact_feed`,
    which the feed publisher calls periodically. etcd keeps its own history:
    its ``--auto-compaction-retention`` is the bound there.
    """

    max_entries: int = 100_000
    max_age: float = 3600.0


def parse_entry(revision: object, topic: object, table: object, key: object, action: object,
                tables: frozenset[str]) -> FeedEntry | None:
    """A feed entry from raw fields, or None if any is foreign: not text, an unknown action,
    a table outside the schema, an empty key or a revision that is not a positive integer."""
    if isinstance(topic, bytes) and isinstance(table, bytes) and isinstance(key, bytes) and isinstance(action, bytes):
        try:
            topic, table, key, action = topic.decode(), table.decode(), key.decode(), action.decode()
        except UnicodeDecodeError:
            return None
    if not (isinstance(topic, str) and isinstance(table, str) and isinstance(key, str) and isinstance(action, str)):
        return None
    act = ACTIONS.get(action)
    if act is None or table not in tables or not key or not topic:
        return None
    if isinstance(revision, bytes):
        revision = revision.decode("ascii", "replace")
    try:
        rev = int(revision)  # type: ignore[call-overload]  # anything a foreign writer left: int() tells
    except (TypeError, ValueError):
        return None
    return FeedEntry(rev, topic, table, key, act) if rev > 0 else None


class FeedReader:
    """Follows ``store``'s feed from just after revision ``after``.

    ``position`` is the revision of the last entry returned (or skipped as
    foreign); save it to resume. Not thread-safe: one reader per thread.
    """

    def __init__(self, store: Store, after: int):
        self.store = store
        self.position = after

    def read(self, limit: int = DEFAULT_BATCH, timeout: float = 0.0) -> list[FeedEntry]:
        """The next entries (at most ``limit``), waiting up to ``timeout`` seconds for some.

        Raises :class:`~dfpubsub.errors.HistoryGone` when entries after
        ``position`` were dropped, and StoreUnavailable when the store is.
        """
        entries, last = self.store._read_feed(self.position, limit, timeout)
        self.position = max(self.position, last)
        return entries

    def close(self) -> None:
        """Release what the backend holds for this reader (nothing on most)."""
