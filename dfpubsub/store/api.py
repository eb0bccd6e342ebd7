"""The northbound store contract: versioned objects in declared tables.

Every write gets a new **version** from one store-wide counter (etcd's
revision, a counter row in SQLite, a counter key in Redis), so versions
increase strictly per object *and* across deletes and re-creates: a late
event about a deleted object can never look newer than its deletion.
Writes may compare-and-set on the version they expect.

Values are msgpack-encoded by this base class, which also validates names and
sizes, so every backend fails the same way on bad input and nothing is
half-written. Backends implement the ``_``-prefixed hooks.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from typing import Any, NamedTuple

import msgpack

from ..errors import InvalidValue, UnknownTable, ValueTooLarge
from ..events import VersionedObject
from .feed import DEFAULT_BATCH, FeedEntry, FeedReader, FeedRetention
from .outbox import Outbox

__all__ = ["Store", "AsyncStore", "ObjectVersion", "PackedTable", "Pages", "DEFAULT_MAX_VALUE_BYTES", "check_name"]

DEFAULT_MAX_VALUE_BYTES = 1 << 20
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_MAX_KEY_BYTES = 1024


def check_name(kind: str, name: object) -> None:
    """InvalidValue unless ``name`` is a valid name of a table or topic (``kind``)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidValue(f"{kind} name {name!r} must match {_NAME.pattern}")


class ObjectVersion(NamedTuple):
    """An object's identity and version, without its value (see :meth:`Store.list_versions`)."""

    topic: str
    table: str
    key: str
    version: int


class PackedTable(NamedTuple):
    """Objects of one table, by column (in step): their topics, keys, versions, and their values'
    bytes as the store holds them (see :meth:`Store.list_packed_tables_at`)."""

    table: str
    topics: Sequence[str]
    keys: Sequence[str]
    versions: Sequence[int]
    blobs: Sequence[bytes]


#: Pages of a listing: each the objects and, in step, their values' bytes (:meth:`Store.list_pages_at`).
Pages = Iterator[tuple[list[VersionedObject], list[bytes]]]


def decode_value(blob: bytes) -> Any:
    """Inverse of the encoding the base class applies to values."""
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


class Store(abc.ABC):
    """Synchronous, thread-safe store of versioned objects.

    ``tables`` is the schema: writing or reading any other table raises
    :class:`UnknownTable`. An object's ``topic`` (what subscribers take)
    defaults to its table's name.
    """

    #: Short name of the backend ("sqlite", "etcd", "redis").
    backend: str = ""
    #: Where the data lives (a file, a server and database), as queue backends name it to find
    #: out whether they share it (:mod:`dfpubsub.store.outbox`); "" where nothing can share it.
    location: str = ""
    #: Every revision is one feed entry, so ``feed_head() - position`` counts the entries a reader
    #: has ahead of it (False where the revision counts other writes too: etcd's whole keyspace).
    feed_dense: bool = True
    #: Every feed entry names its object's topic (etcd's entry of an update that kept the topic
    #: names the table instead: a reader must look at the object to know).
    feed_topics: bool = True
    #: What reading one feed entry costs, against reading one object's identity and version in a
    #: listing (measured in bytes the server sends, tools/bench/repair.py): a repair by replay pays
    #: the one, a relist the other, so this weighs which reads less.
    feed_entry_cost: float = 1.0

    def __init__(self, tables: Iterable[str], max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
                 feed_retention: FeedRetention | None = None):
        tables = frozenset(tables)
        for t in tables:
            check_name("table", t)
        self.tables = tables
        self.max_value_bytes = max_value_bytes
        self.feed_retention = feed_retention or FeedRetention()
        #: Feed entries read back that were not this store's (garbage beside valid data): skipped.
        self.feed_skipped = 0

    # -- public API ------------------------------------------------------------

    def initialized(self) -> bool:
        """Whether the store was made (``df-db init``, a writer's open, ``[store] create``) or
        has been written to. Daemons open only such a store: on etcd and Redis a mistyped
        address, database or prefix finds nothing, which looks exactly like an empty store."""
        return True  # SQLite: the file is the mark, looked for before opening (require_sqlite_file)

    def initialize(self) -> None:
        """Make the store, if it was not (idempotent: nothing is written when it was)."""

    def identity(self, renew: bool = False) -> bytes:
        """The store's identity: random bytes made once (``df-db init``, or the first call) and kept
        with the data, so that what was built from one store (a controller's snapshot,
        :mod:`dfpubsub.controller.snapshot`) is never taken for another's. ``renew`` replaces it
        (``df-db init --new-identity``, after a restore from backup). Secret as the data is: a
        snapshot is sealed with it. NotImplementedError where the backend keeps none."""
        return self._identity(secrets.token_bytes(16), renew)

    def get(self, table: str, key: str) -> VersionedObject | None:
        """The object, or None."""
        self._check(table, key)
        return self._get(table, key)

    def list(self, table: str | None = None, topic: str | None = None) -> builtins.list[VersionedObject]:
        """Objects of ``table`` (all tables if None), optionally only of ``topic``."""
        if table is not None:
            self._check(table)
        return self._list(table, None if topic is None else {topic})

    def list_topics(self, topics: Iterable[str]) -> builtins.list[VersionedObject]:
        """Objects of every table whose topic is in ``topics`` (what a resync reads)."""
        return self._list(None, set(topics))

    def list_versions(self, topics: Iterable[str]) -> builtins.list[ObjectVersion]:
        """Identity and version of every object of ``topics``, without values.

        What a catch-up from a snapshot reads (docs/pipeline.md): much less
        than :meth:`list_topics`, and it still shows every object deleted
        since the snapshot (it is not listed) and every one changed (its
        version differs); :meth:`get_many` then reads just those.
        """
        return self._list_versions(set(topics))

    def list_at(self, topics: Iterable[str]) -> tuple[builtins.list[VersionedObject], int]:
        """:meth:`list_topics`, and the store revision the listing reflects.

        Every write up to that revision is in the listing (a listing read over
        several requests may also show later ones). A resync needs it to tell
        a cached version that is newer than the listing from a forged one.
        """
        topics = set(topics)
        return self._list_at(topics) if topics else ([], 0)

    def list_packed_at(self, topics: Iterable[str], values: bool = True
                       ) -> tuple[builtins.list[VersionedObject], builtins.list[bytes], int]:
        """:meth:`list_at`, and in step with the objects each value's bytes as the store holds them
        (what :func:`decode_value` decoded): a cache that keeps values packed keeps these, instead
        of packing every value again (dfpubsub.controller.cache). ``values=False``: every value
        is still decoded (a foreign one is skipped, as always) but not kept, and the objects carry
        None: a listing of a million objects then never holds a million decoded values at once."""
        topics = set(topics)
        return self._list_packed_at(topics, values) if topics else ([], [], 0)

    def list_packed_tables_at(self, topics: Iterable[str]) -> tuple[builtins.list[PackedTable], int]:
        """:meth:`list_packed_at` without values, by table and column: what a cache filled from scratch
        keeps, with no object per row to build (dfpubsub.controller.cache). Every value is still
        decoded (a foreign one is skipped, as always) and dropped. A table may come in several parts."""
        topics = set(topics)
        return self._list_packed_tables_at(topics) if topics else ([], 0)

    def list_pages_at(self, topics: Iterable[str], page_size: int, values: bool = True) -> tuple[int, Pages]:
        """:meth:`list_packed_at` in pages of about ``page_size`` objects (with their values' bytes),
        each read from the store when the one before was taken: neither the store nor the reader
        holds the whole listing of a large table at once (Kubernetes' streamed list, KEP-3157).
        Returns the store revision the listing reflects, read before the first page (every write
        up to it is in some page; a later page may also show later writes), and the pages. Each
        object is in one page at most. ``values`` as for :meth:`list_packed_at`."""
        if page_size < 1:
            raise ValueError("a page holds at least one object")
        topics = set(topics)
        return self._list_pages_at(topics, page_size, values) if topics else (0, iter(()))

    def list_versions_at(self, topics: Iterable[str]) -> tuple[builtins.list[tuple[str, str, str, int]], int]:
        """:meth:`list_versions` as plain (topic, table, key, version) tuples, and the store
        revision the listing reflects (as for :meth:`list_at`)."""
        topics = set(topics)
        return self._list_versions_at(topics) if topics else ([], 0)

    def get_many(self, refs: Iterable[tuple[str, str]]) -> builtins.list[VersionedObject]:
        """The objects of ``refs`` ((table, key) pairs) that exist, in no particular order."""
        refs = list(refs)
        for table, key in refs:
            self._check(table, key)
        return self._get_many(refs) if refs else []

    def get_many_packed(self, refs: Iterable[tuple[str, str]]
                        ) -> tuple[builtins.list[VersionedObject], builtins.list[bytes]]:
        """:meth:`get_many` without decoding: the objects carry None, and in step with them are their
        values' bytes as the store holds them, **not proved**: what a feed publisher of wire schema 2
        sends as they are (dfpubsub.feed_publisher), after checking their structure itself. A row
        whose other columns are foreign is still skipped."""
        refs = list(refs)
        for table, key in refs:
            self._check(table, key)
        return self._get_many_packed(refs) if refs else ([], [])

    def create(self, table: str, key: str, value: Any, topic: str | None = None, *,
               outbox: Outbox | None = None) -> VersionedObject:
        """Create an object; :class:`~dfpubsub.errors.AlreadyExists` if it exists.

        With ``outbox``, its queue entries are appended in the same atomic
        step (:mod:`dfpubsub.store.outbox`); QueueFull then fails the write.
        """
        self._check(table, key, outbox)
        return self._create(table, key, self._topic(table, topic), self._encode(table, key, value), value, outbox)

    def update(
        self, table: str, key: str, value: Any, expected_version: int | None = None, topic: str | None = None, *,
        outbox: Outbox | None = None,
    ) -> VersionedObject:
        """Replace an object's value (and topic, if given).

        :class:`~dfpubsub.errors.NotFound` if it does not exist;
        :class:`~dfpubsub.errors.VersionConflict` if ``expected_version`` is
        given and differs. ``outbox`` as for :meth:`create`.
        """
        self._check(table, key, outbox)
        if topic is not None:
            self._topic(table, topic)
        return self._update(table, key, topic, self._encode(table, key, value), value, expected_version, outbox)

    def delete(self, table: str, key: str, expected_version: int | None = None, *,
               outbox: Outbox | None = None) -> VersionedObject:
        """Delete an object; returns it with the deletion's version and no value. ``outbox``
        as for :meth:`create`."""
        self._check(table, key, outbox, has_value=False)
        return self._delete(table, key, expected_version, outbox)

    # -- change feed (dfpubsub/store/feed.py) ---------------------------------------

    def feed_head(self) -> int:
        """The store's revision now: a reader starting here sees only later writes."""
        return self._feed_head()

    def feed_floor(self) -> int:
        """A revision the feed surely has an entry at or above: the newest write of an object that
        still exists. Where every revision is an entry (:attr:`feed_dense`) this is :meth:`feed_head`;
        where the head counts other keys' writes too (etcd), a reader that must reach the head
        knows from this how far it surely must read."""
        return self.feed_head()

    def feed_last(self) -> int | None:
        """The revision of the store's newest write, deletes included: a reader that has reached it
        has read every write committed before this call. Where every revision is an entry
        (:attr:`feed_dense`) this is :meth:`feed_head`; etcd keeps it in a key every write puts
        (None on a store no writer of this version has written to yet)."""
        return self.feed_head()

    def read_writes(self, after: int) -> tuple[builtins.list[FeedEntry], int] | None:
        """Every write of the store after revision ``after``, oldest first, and the revision of its
        newest write (every write up to it is among them), read at once where the backend keeps them
        so that a range reads them faster than following the feed does (etcd serves a watch from a
        past revision in catch-up rounds of 100 ms: it reads the history of its ``feedlast`` key
        instead, dfpubsub/store/etcd_log.py). None where it cannot, or a feed reader reads less:
        the caller follows the feed (SQLite and Redis answer a feed read at once). HistoryGone as
        :meth:`read_feed`."""
        return None

    def feed_since(self, after: int) -> tuple[int, int]:
        """The store's revision now and how many revisions the feed holds after ``after`` up to it
        (where every revision is an entry, :attr:`feed_dense`, the entries a replay would read; 0
        if ``after`` is above the head).

        :class:`~dfpubsub.errors.HistoryRewound` if ``after`` lies among revisions the server
        that holds the store now never had: a Redis replica promoted by a failover, or a server
        restarted without its last writes, moves its revisions past those of the old master
        (store.md#failover), and a reader between the two had read writes that are lost.
        """
        head = self.feed_head()
        return head, max(0, head - after)

    def read_feed(self, after: int, limit: int = DEFAULT_BATCH) -> builtins.list[FeedEntry]:
        """Up to ``limit`` feed entries with revisions above ``after``, oldest first, without waiting.

        :class:`~dfpubsub.errors.HistoryGone` if some of them were dropped.
        """
        return self._read_feed(after, limit, 0.0)[0]

    def follow_feed(self, after: int) -> FeedReader:
        """A reader of the entries after ``after`` that can wait for new ones."""
        return FeedReader(self, after)

    def compact_feed(self) -> int:
        """Drop the entries beyond ``feed_retention``; how many went (etcd: 0, its server compacts)."""
        return self._compact_feed(self.feed_retention)

    def drop_all(self) -> int:
        """Delete every object of every table without publishing; returns how many."""
        return self._drop_all()

    def count(self, table: str | None = None) -> int:
        """Number of objects (in ``table``)."""
        return len(self.list(table))

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- validation --------------------------------------------------------------

    def _check(self, table: str, key: str | None = None, outbox: Outbox | None = None,
               has_value: bool = True) -> None:
        if outbox is not None:
            outbox.check_store(self.backend, self.location, has_value)
        if table not in self.tables:
            raise UnknownTable(f"unknown table {table!r}; tables: {', '.join(sorted(self.tables)) or 'none'}")
        if key is not None:
            if not isinstance(key, str) or not key or "\x00" in key or len(key.encode()) > _MAX_KEY_BYTES:
                raise InvalidValue(f"key must be a non-empty str of at most {_MAX_KEY_BYTES} bytes without NUL")

    def _topic(self, table: str, topic: str | None) -> str:
        if topic is None:
            return table
        if not isinstance(topic, str) or not topic or topic.startswith("$") or "\x00" in topic:
            raise InvalidValue(f"invalid topic {topic!r}")
        return topic

    def _encode(self, table: str, key: str, value: Any) -> bytes:
        try:
            blob: bytes = msgpack.packb(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidValue(f"{table}/{key}: value is not serialisable: {exc}") from exc
        if len(blob) > self.max_value_bytes:
            raise ValueTooLarge(f"{table}/{key}: value is {len(blob)} bytes; the limit is {self.max_value_bytes}")
        return blob

    # -- backend hooks -------------------------------------------------------------

    @abc.abstractmethod
    def _get(self, table: str, key: str) -> VersionedObject | None: ...

    @abc.abstractmethod
    def _list(self, table: str | None, topics: set[str] | None) -> builtins.list[VersionedObject]: ...

    def _list_versions(self, topics: set[str]) -> builtins.list[ObjectVersion]:
        return [ObjectVersion(*row) for row in self._list_versions_at(topics)[0]] if topics else []

    @abc.abstractmethod
    def _list_at(self, topics: set[str]) -> tuple[builtins.list[VersionedObject], int]: ...

    def _list_packed_at(self, topics: set[str], values: bool
                        ) -> tuple[builtins.list[VersionedObject], builtins.list[bytes], int]:
        """Backends that read the values' bytes hand them over; this packs the listing again."""
        objects, revision = self._list_at(topics)
        pack = msgpack.Packer().pack
        blobs = [pack(o.value) for o in objects]
        return objects if values else [o._replace(value=None) for o in objects], blobs, revision

    def _list_packed_tables_at(self, topics: set[str]) -> tuple[builtins.list[PackedTable], int]:
        """The packed listing, cut into columns at each change of table."""
        objects, blobs, revision = self._list_packed_at(topics, False)
        if not objects:
            return [], revision
        topic_col, table_col, key_col, version_col, _ = zip(*objects)
        out, at = [], 0
        for table, run in groupby(table_col):
            end = at + len(list(run))
            out.append(PackedTable(table, topic_col[at:end], key_col[at:end], version_col[at:end], blobs[at:end]))
            at = end
        return out, revision

    @abc.abstractmethod
    def _list_pages_at(self, topics: set[str], page_size: int, values: bool) -> tuple[int, Pages]: ...

    @abc.abstractmethod
    def _list_versions_at(self, topics: set[str]) -> tuple[builtins.list[tuple[str, str, str, int]], int]:
        """Leaves the values on the server."""

    def _get_many(self, refs: builtins.list[tuple[str, str]]) -> builtins.list[VersionedObject]:
        """Backends override this to read many objects per round trip."""
        return [o for o in (self._get(t, k) for t, k in refs) if o is not None]

    def _get_many_packed(self, refs: builtins.list[tuple[str, str]]
                         ) -> tuple[builtins.list[VersionedObject], builtins.list[bytes]]:
        """Backends that read the values' bytes hand them over; this packs them again."""
        objects = self._get_many(refs)
        pack = msgpack.Packer().pack
        return [o._replace(value=None) for o in objects], [pack(o.value) for o in objects]

    @abc.abstractmethod
    def _create(self, table: str, key: str, topic: str, blob: bytes, value: Any,
                outbox: Outbox | None) -> VersionedObject: ...

    @abc.abstractmethod
    def _update(
        self, table: str, key: str, topic: str | None, blob: bytes, value: Any, expected: int | None,
        outbox: Outbox | None,
    ) -> VersionedObject: ...

    @abc.abstractmethod
    def _delete(self, table: str, key: str, expected: int | None, outbox: Outbox | None) -> VersionedObject: ...

    @abc.abstractmethod
    def _drop_all(self) -> int: ...

    def _identity(self, new: bytes, renew: bool) -> bytes:
        """The identity kept, after keeping ``new`` where there is none (or ``renew``)."""
        raise NotImplementedError(f"a {self.backend or type(self).__name__} store keeps no identity")

    @abc.abstractmethod
    def _feed_head(self) -> int: ...

    @abc.abstractmethod
    def _read_feed(self, after: int, limit: int, wait: float) -> tuple[builtins.list[FeedEntry], int]:
        """Entries after ``after`` (waiting up to ``wait`` s for one) and the last revision they
        cover, foreign entries skipped included (``after`` if none)."""

    @abc.abstractmethod
    def _compact_feed(self, retention: FeedRetention) -> int: ...


class AsyncStore:
    """The same contract for asyncio code: each call runs in a worker thread.

    Store calls are short and the backends' clients are synchronous (or, for
    etcd, bound to their own loop), so a thread per call keeps one
    implementation per backend instead of two.
    """

    def __init__(self, store: Store):
        self.store = store

    async def get(self, table: str, key: str) -> VersionedObject | None:
        """See :meth:`Store.get`."""
        return await asyncio.to_thread(self.store.get, table, key)

    async def list(self, table: str | None = None, topic: str | None = None) -> builtins.list[VersionedObject]:
        """See :meth:`Store.list`."""
        return await asyncio.to_thread(self.store.list, table, topic)

    async def list_topics(self, topics: Iterable[str]) -> builtins.list[VersionedObject]:
        """See :meth:`Store.list_topics`."""
        return await asyncio.to_thread(self.store.list_topics, list(topics))

    async def list_versions(self, topics: Iterable[str]) -> builtins.list[ObjectVersion]:
        """See :meth:`Store.list_versions`."""
        return await asyncio.to_thread(self.store.list_versions, list(topics))

    async def list_at(self, topics: Iterable[str]) -> tuple[builtins.list[VersionedObject], int]:
        """See :meth:`Store.list_at`."""
        return await asyncio.to_thread(self.store.list_at, list(topics))

    async def list_versions_at(self, topics: Iterable[str]) -> tuple[builtins.list[tuple[str, str, str, int]], int]:
        """See :meth:`Store.list_versions_at`."""
        return await asyncio.to_thread(self.store.list_versions_at, list(topics))

    async def get_many(self, refs: Iterable[tuple[str, str]]) -> builtins.list[VersionedObject]:
        """See :meth:`Store.get_many`."""
        return await asyncio.to_thread(self.store.get_many, list(refs))

    async def create(self, table: str, key: str, value: Any, topic: str | None = None) -> VersionedObject:
        """See :meth:`Store.create`."""
        return await asyncio.to_thread(self.store.create, table, key, value, topic)

    async def update(
        self, table: str, key: str, value: Any, expected_version: int | None = None, topic: str | None = None
    ) -> VersionedObject:
        """See :meth:`Store.update`."""
        return await asyncio.to_thread(self.store.update, table, key, value, expected_version, topic)

    async def delete(self, table: str, key: str, expected_version: int | None = None) -> VersionedObject:
        """See :meth:`Store.delete`."""
        return await asyncio.to_thread(self.store.delete, table, key, expected_version)
