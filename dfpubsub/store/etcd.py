"""etcd store (``etcd://host:port[,host:port...]``) over gRPC, with aetcd's messages and stubs.

Calls use gRPC's synchronous API on the caller's own thread. aetcd's client is
asyncio-only, and running it on a private loop in a daemon thread (as this
module once did) cost each call two thread wake-ups, about 0.2 ms: a quarter of
an etcd write on loopback. A synchronous channel is thread-safe and needs no
loop, so only aetcd's generated stubs and protobuf messages are used. The
channel is a :class:`~dfpubsub.backends.etcd.EtcdConnection` (shared with the
etcd queues): created on first use; closed just before ``os.fork()``, once
the calls in flight have ended (gRPC does not survive a fork with a call
inside it), and reopened on the next call, in the parent and in the child. A
channel that failed is closed, so the next call reconnects (to the next
endpoint): a restarted etcd is picked up by the same store object.

Layout:

- ``/{prefix}/nb/{table}/{key}`` holds the value, msgpack-encoded by the base
  class. An object's version is this key's ``mod_revision``, i.e. etcd's
  store-wide revision of its last write; a deletion's version is the revision
  of the delete (the header revision of the write's transaction).
- ``/{prefix}/nbtopic/{table}/{key}`` holds the topic (UTF-8), and exists only
  for objects whose topic is not their table's name.
- ``/{prefix}/store`` marks the store as made (:meth:`Store.initialized`): ``df-db
  init`` and a writer's open put it once; a store holding objects counts as made
  without it. It lies outside ``nb`` and its history, which the change feed reads.
- ``/{prefix}/feedlast`` is put by every write's transaction, so that its
  ``mod_revision`` is the revision of the store's newest write, deletes included
  (:meth:`Store.feed_last`): etcd's own revision counts every key of the
  cluster, and no range read shows a delete. A repair reads the feed up to it
  and knows it has read every write committed before it began. Its value names
  the write (action, table, key, topic), so that its history is a log of the
  store's writes that a range at past revisions reads without a watch's
  catch-up round (:mod:`.etcd_log`, :meth:`Store.read_writes`).

Why the topic is a sibling key: every write must return the object's topic
(it is what gets published), yet update and delete are not told it. Inside
the value it would have to be read before the value could be rewritten: two
round trips. As a sibling key it is read *in* the write's transaction, so
every write is one ``Txn``: compare that the object exists (or not, for a
create) and, if asked, its ``mod_revision``; on success write the value and
read, write or delete the topic key; on failure read the object's revision,
which tells NotFound from VersionConflict. Why only for other topics: most
objects take their table's name as topic; for them the topic range is empty,
so a listing, which reads the object range and the topic range at one
revision, costs one range read as before, and the object range holds objects
only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..backends import foreign
from ..backends.etcd import EtcdConnection, status_code, txn
from ..errors import AlreadyExists, NotFound, StoreUnavailable, VersionConflict, WriteOutcomeUnknown
from ..events import VersionedObject
from .api import DEFAULT_MAX_VALUE_BYTES, Pages, Store, decode_value
from .etcd_feed import EtcdFeedReader
from .etcd_log import NO_OBJECT, log_put, read_log
from .feed import FeedEntry, FeedRetention
from .outbox import Outbox

__all__ = ["EtcdStore"]

_PAGE_KEYS = 5000
#: Objects per Txn of get_many: two reads each, within etcd's default --max-txn-ops of 128.
_TXN_OBJECTS = 64



def _exists(key: bytes, expected: int | None = None) -> list[rpc.Compare]:
    """The key exists (create_revision > 0) and, if given, was last written at ``expected``."""
    compare = [rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.GREATER, create_revision=0)]
    if expected is not None:
        compare.append(rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=expected))
    return compare


def _topic_of(kvs: Any, table: str) -> str:
    """The topic in a read (or deleted) topic key: the table's name if there is none, or if
    the key is foreign (not UTF-8; skipped, counted, named). The object itself is valid: it is
    listed, read and published under its table's own topic, by every reader and writer alike."""
    if not kvs:
        return table
    topic = foreign.decode("store_topic", kvs[0].key, bytes.decode, kvs[0].value)
    return table if topic is None else topic


def _object(topic_kvs: Any, table: str, key: str, kv: Any, decode: bool = True) -> VersionedObject | None:
    """The object of a value key ``kv`` and its topic key's read, or None (skipped) if its value is
    foreign (``decode=False``: the value not decoded, so not looked at, and None)."""
    try:
        value = decode_value(kv.value) if decode else None
    except foreign.DECODE_ERRORS as exc:
        foreign.skip_error("store_object", kv.key, exc)
        return None
    return VersionedObject(_topic_of(topic_kvs, table), table, key, kv.mod_revision, value)


def _set_topic(table: str, topic_path: bytes, topic: str) -> Any:
    """The request that stores ``topic``: no topic key for the table's own name."""
    if topic == table:
        return rpc.DeleteRangeRequest(key=topic_path)
    return rpc.PutRequest(key=topic_path, value=topic.encode())


class EtcdStore(Store):
    """Objects in etcd 3.4+; versions are etcd revisions."""

    backend = "etcd"
    feed_dense = False  # the revision counts every write of the cluster, queues' and discovery's too
    feed_topics = False  # an update that keeps its topic does not write the topic key
    feed_entry_cost = 12.0  # a watch event carries the value and the previous one: 476 bytes, 39 a version

    def __init__(
        self,
        url: str,
        tables: Iterable[str],
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        prefix: str = "dfpubsub",
        timeout: float = 5.0,
        feed_retention: FeedRetention | None = None,
    ):
        super().__init__(tables, max_value_bytes, feed_retention)
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        self._conn = EtcdConnection(url, timeout)
        self._root = f"/{prefix}/nb/".encode()
        self._topic_root = f"/{prefix}/nbtopic/".encode()
        self._mark = f"/{prefix}/store".encode()
        self._last = f"/{prefix}/feedlast".encode()
        self._put_last = rpc.PutRequest(key=self._last)  # a write the log cannot name (drop_all): watch instead

    # -- plumbing ------------------------------------------------------------------------

    def _where(self) -> str:
        return self._conn.where()

    def close(self) -> None:
        self._conn.close()

    def initialized(self) -> bool:
        response = self._commit(txn([], [
            rpc.RangeRequest(key=self._mark, count_only=True),
            rpc.RangeRequest(key=self._root, range_end=prefix_range_end(self._root), limit=1, keys_only=True)]))
        return any(r.response_range.count for r in response.responses)

    def initialize(self) -> None:
        absent = rpc.Compare(key=self._mark, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)
        # Put once: every put is a revision of the whole cluster, which readers of the feed skip.
        self._commit(txn([absent], [rpc.PutRequest(key=self._mark, value=b"dfpubsub store"),
                                    rpc.PutRequest(key=self._last, value=NO_OBJECT)]))

    def _identity(self, new: bytes, renew: bool) -> bytes:
        key = self._mark + b"/identity"
        if not renew:  # read first: a read-only user has it too
            kvs = self._commit(txn([], [rpc.RangeRequest(key=key)])).responses[0].response_range.kvs
            if kvs:
                return bytes(kvs[0].value)
        absent = [] if renew else [rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                                               create_revision=0)]
        response = self._commit(txn(absent, [rpc.PutRequest(key=key, value=new)], [rpc.RangeRequest(key=key)]))
        if response.succeeded:
            return new
        return bytes(response.responses[0].response_range.kvs[0].value)

    # -- etcd operations ----------------------------------------------------------------

    def _paths(self, table: str, key: str) -> tuple[bytes, bytes]:
        """The object's value key and topic key."""
        name = f"{table}/{key}".encode()
        return self._root + name, self._topic_root + name

    def _commit(self, request: rpc.TxnRequest) -> Any:
        return self._conn.commit(request)

    def _write(self, request: rpc.TxnRequest) -> Any:
        """Commit a write; a lost answer is WriteOutcomeUnknown (etcd may have applied it)."""
        try:
            return self._commit(request)
        except StoreUnavailable as exc:
            raise WriteOutcomeUnknown(f"{exc}; the write may have been applied") from exc

    def _get(self, table: str, key: str) -> VersionedObject | None:
        path, topic_path = self._paths(table, key)
        response = self._commit(txn([], [rpc.RangeRequest(key=path), rpc.RangeRequest(key=topic_path)]))
        kvs = response.responses[0].response_range.kvs
        if not kvs:
            return None
        return _object(response.responses[1].response_range.kvs, table, key, kvs[0])

    def _range(self, kv: Any, key: bytes, end: bytes, limit: int, revision: int,
               keys_only: bool = False) -> tuple[Any, int]:
        """One Range of up to ``limit`` keys from ``key`` to ``end`` at ``revision`` (0: now), and the
        limit it took: a page above the message limit is asked again in smaller pages."""
        while True:
            request = rpc.RangeRequest(key=key, range_end=end, limit=limit, revision=revision, keys_only=keys_only)
            try:
                return kv.Range(request, timeout=self.timeout), limit
            except grpc.RpcError as exc:
                if status_code(exc) != grpc.StatusCode.RESOURCE_EXHAUSTED or limit == 1:
                    raise
                limit //= 2

    def _scan(self, kv: Any, start: bytes, revision: int, keys_only: bool = False) -> tuple[list[Any], int]:
        """Pages of the keys under ``start`` at ``revision`` (0: now), and the revision read."""
        pages: list[Any] = []
        key, end, limit = start, prefix_range_end(start), _PAGE_KEYS
        while True:
            page, limit = self._range(kv, key, end, limit, revision, keys_only)
            revision = revision or page.header.revision  # every page from the same snapshot
            pages.append(page.kvs)
            if not page.more or not page.kvs:
                return pages, revision
            key = page.kvs[-1].key + b"\x00"

    def _list_pages_at(self, topics: set[str], page_size: int, values: bool) -> tuple[int, Pages]:
        first, revision = self._page(self._root, page_size, 0)
        return revision, self._pages(first, revision, topics, page_size, values)

    def _page(self, key: bytes, limit: int, revision: int) -> tuple[Any, int]:
        """Up to ``limit`` objects from ``key`` on at ``revision`` (0: now), and the revision they
        were read at: should ``revision`` be compacted away, the store's revision now (every write
        up to the first page's revision is still in some page)."""

        def read(kv: Any) -> tuple[Any, int]:
            try:
                return self._range(kv, key, prefix_range_end(self._root), limit, revision)[0], revision
            except grpc.RpcError as exc:
                if not revision or status_code(exc) != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                return self._range(kv, key, prefix_range_end(self._root), limit, 0)[0], 0

        page, pinned = self._conn.call(read)
        return page, pinned or int(page.header.revision)  # unpinned: read at the store's revision now

    def _topics_of(self, first: bytes, last: bytes, revision: int) -> dict[bytes, str | None]:
        """The topic keys of the object names from ``first`` to ``last`` at ``revision``."""
        end = self._topic_root + last + b"\x00"
        page = self._conn.call(lambda kv: self._range(kv, self._topic_root + first, end, _PAGE_KEYS, revision)[0])
        return self._named([page.kvs])

    def _pages(self, page: Any, revision: int, topics: set[str], page_size: int, values: bool) -> Pages:
        """The pages from ``page`` on, each of the objects under the root after the last key of the
        one before, at ``revision`` (:meth:`_page`), with the topic keys of the same names (one more
        Range, empty where every object has its table's name as topic)."""
        skip = len(self._root)
        while True:
            kvs = page.kvs
            if not kvs:
                return
            named = self._topics_of(kvs[0].key[skip:], kvs[-1].key[skip:], revision)
            blobs: list[bytes] = []
            yield self._objects(self._selected([kvs], named, topics), blobs, values), blobs
            if not page.more:
                return
            page, revision = self._page(kvs[-1].key + b"\x00", page_size, revision)

    def _read_all(self, under: bytes, keys_only: bool) -> tuple[list[Any], dict[bytes, str | None], int]:
        """Pages of the objects under ``under``, the topics of those that have their own, and the
        revision both were read at."""

        def run(kv: Any) -> tuple[list[Any], list[Any], int]:
            attempts = 0
            while True:
                try:  # the objects, then their topics at the same revision
                    pages, revision = self._scan(kv, self._root + under, 0, keys_only)
                    return pages, self._scan(kv, self._topic_root + under, revision)[0], revision
                except grpc.RpcError as exc:  # the snapshot was compacted away: start over
                    attempts += 1
                    if status_code(exc) != grpc.StatusCode.OUT_OF_RANGE or attempts == 3:
                        raise

        pages, topic_pages, revision = self._conn.call(run)
        return pages, self._named(topic_pages), revision

    def _named(self, topic_pages: list[Any]) -> dict[bytes, str | None]:
        """Object name -> topic, from pages of topic keys."""
        skip = len(self._topic_root)
        named: dict[bytes, str | None] = {}
        for kvs in topic_pages:
            for kv in kvs:
                # None: a topic key that is not UTF-8; its object goes under its table's topic.
                named[kv.key[skip:]] = foreign.decode("store_topic", kv.key, bytes.decode, kv.value)
        return named

    def _listed(self, under: bytes, topics: set[str] | None,
                keys_only: bool) -> tuple[list[tuple[str, str, str, Any]], int]:
        """(topic, table, key, kv) of the objects under ``under`` of ``topics`` (all if None), and
        the revision they were read at."""
        pages, named, revision = self._read_all(under, keys_only)
        return self._selected(pages, named, topics), revision

    def _selected(self, pages: list[Any], named: dict[bytes, str | None],
                  topics: set[str] | None) -> list[tuple[str, str, str, Any]]:
        """(topic, table, key, kv) of the objects of ``pages`` of ``topics`` (all if None)."""
        out = []
        skip, tables = len(self._root), self.tables
        for kvs in pages:
            for kv in kvs:
                name = kv.key[skip:]
                try:
                    tbl, _, key = name.decode().partition("/")
                except UnicodeDecodeError as exc:
                    foreign.skip_error("store_object", kv.key, exc)
                    continue
                if tbl not in tables:
                    continue
                topic = (named.get(name) or tbl) if named else tbl
                if topics is None or topic in topics:
                    out.append((topic, tbl, key, kv))
        return out

    def _list(self, table: str | None, topics: set[str] | None) -> list[VersionedObject]:
        if topics is not None and not topics:
            return []
        under = f"{table}/".encode() if table is not None else b""
        return self._objects(self._listed(under, topics, False)[0])

    @staticmethod
    def _objects(listed: list[tuple[str, str, str, Any]], blobs: list[bytes] | None = None,
                 values: bool = True) -> list[VersionedObject]:
        """The objects listed, foreign ones skipped; with ``blobs``, their values' bytes appended in step
        (``values=False``: values checked, not kept)."""
        new, unpack = tuple.__new__, decode_value  # tuple.__new__: see dfpubsub.store.sqlite._objects
        out: list[VersionedObject] = []
        add = out.append
        for topic, tbl, key, kv in listed:
            try:  # free unless it raises
                value = unpack(kv.value)
                add(new(VersionedObject, (topic, tbl, key, kv.mod_revision, value if values else None)))
            except foreign.DECODE_ERRORS as exc:
                foreign.skip_error("store_object", kv.key, exc)
            else:
                if blobs is not None:
                    blobs.append(kv.value)
        return out

    def _list_at(self, topics: set[str]) -> tuple[list[VersionedObject], int]:
        listed, revision = self._listed(b"", topics, False)
        return self._objects(listed), revision

    def _list_packed_at(self, topics: set[str], values: bool) -> tuple[list[VersionedObject], list[bytes], int]:
        listed, revision = self._listed(b"", topics, False)
        blobs: list[bytes] = []
        return self._objects(listed, blobs, values), blobs, revision

    def _list_versions_at(self, topics: set[str]) -> tuple[list[tuple[str, str, str, int]], int]:
        listed, revision = self._listed(b"", topics, True)
        return [(topic, tbl, key, kv.mod_revision) for topic, tbl, key, kv in listed], revision

    def _get_many(self, refs: list[tuple[str, str]]) -> list[VersionedObject]:
        return self._many(refs, None)

    def _get_many_packed(self, refs: list[tuple[str, str]]) -> tuple[list[VersionedObject], list[bytes]]:
        blobs: list[bytes] = []
        return self._many(refs, blobs), blobs

    def _many(self, refs: list[tuple[str, str]], blobs: list[bytes] | None) -> list[VersionedObject]:
        """The objects of ``refs``; with ``blobs``, undecoded, their values' bytes appended to it."""
        out: list[VersionedObject] = []
        decode = blobs is None
        for start in range(0, len(refs), _TXN_OBJECTS):
            chunk = refs[start:start + _TXN_OBJECTS]
            reads = [rpc.RangeRequest(key=path) for table, key in chunk for path in self._paths(table, key)]
            responses = self._commit(txn([], reads)).responses
            for i, (table, key) in enumerate(chunk):
                kvs = responses[2 * i].response_range.kvs
                obj = _object(responses[2 * i + 1].response_range.kvs, table, key, kvs[0], decode) if kvs else None
                if obj is not None:
                    out.append(obj)
                    if blobs is not None:
                        blobs.append(kvs[0].value)
        return out

    # No outbox reaches these: no queue backend shares an etcd store's location (it has none).
    def _create(self, table: str, key: str, topic: str, blob: bytes, value: Any,
                outbox: Outbox | None) -> VersionedObject:
        path, topic_path = self._paths(table, key)
        absent = rpc.Compare(key=path, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)
        response = self._write(txn([absent], [rpc.PutRequest(key=path, value=blob),
                                                _set_topic(table, topic_path, topic),
                                                log_put(self._last, b"c", table, key, topic)]))
        if not response.succeeded:
            raise AlreadyExists(f"{table}/{key} already exists")
        return VersionedObject(topic, table, key, response.header.revision, value)

    def _update(
        self, table: str, key: str, topic: str | None, blob: bytes, value: Any, expected: int | None,
        outbox: Outbox | None,
    ) -> VersionedObject:
        path, topic_path = self._paths(table, key)
        # Without a new topic, the current one is read in the same transaction.
        topic_op = rpc.RangeRequest(key=topic_path) if topic is None else _set_topic(table, topic_path, topic)
        response = self._write(txn(_exists(path, expected),
                                   [rpc.PutRequest(key=path, value=blob), topic_op,
                                    log_put(self._last, b"u", table, key, topic or "")],
                                   [rpc.RangeRequest(key=path, keys_only=True)]))
        if not response.succeeded:
            self._refused(table, key, expected, response)
        if topic is None:
            topic = _topic_of(response.responses[1].response_range.kvs, table)
        return VersionedObject(topic, table, key, response.header.revision, value)

    def _delete(self, table: str, key: str, expected: int | None, outbox: Outbox | None) -> VersionedObject:
        path, topic_path = self._paths(table, key)
        response = self._write(txn(
            _exists(path, expected),
            [rpc.DeleteRangeRequest(key=path), rpc.DeleteRangeRequest(key=topic_path, prev_kv=True),
             log_put(self._last, b"d", table, key)],
            [rpc.RangeRequest(key=path, keys_only=True)]))
        if not response.succeeded:
            self._refused(table, key, expected, response)
        topic = _topic_of(response.responses[1].response_delete_range.prev_kvs, table)
        return VersionedObject(topic, table, key, response.header.revision, None)

    @staticmethod
    def _refused(table: str, key: str, expected: int | None, response: Any) -> NoReturn:
        """Raise why a write compared false, from its failure branch's read of the object."""
        kvs = response.responses[0].response_range.kvs
        if not kvs or expected is None:
            raise NotFound(f"{table}/{key} does not exist")
        raise VersionConflict(table, key, expected, kvs[0].mod_revision)

    def _drop_all(self) -> int:
        response = self._commit(txn([], [
            *(rpc.DeleteRangeRequest(key=root, range_end=prefix_range_end(root))
              for root in (self._root, self._topic_root)), self._put_last]))
        return int(response.responses[0].response_delete_range.deleted)

    # -- change feed: etcd's own history (dfpubsub/store/etcd_feed.py) ----------------------

    def follow_feed(self, after: int) -> EtcdFeedReader:
        return EtcdFeedReader(self, after)

    def _feed_head(self) -> int:
        return int(self._conn.call(lambda kv: kv.Range(rpc.RangeRequest(key=self._root, limit=1, keys_only=True),
                                                   timeout=self.timeout)).header.revision)

    def feed_last(self) -> int | None:
        kvs = self._conn.call(lambda kv: kv.Range(rpc.RangeRequest(key=self._last, keys_only=True),
                                                  timeout=self.timeout)).kvs
        return int(kvs[0].mod_revision) if kvs else None

    def read_writes(self, after: int) -> tuple[list[FeedEntry], int] | None:
        return read_log(self, after)  # the history of feedlast (dfpubsub/store/etcd_log.py)

    def feed_floor(self) -> int:
        # The newest modification among the objects, however many there are (etcd sorts on the
        # server and sends one key); a delete after it has no key left to show it.
        request = rpc.RangeRequest(key=self._root, range_end=prefix_range_end(self._root), limit=1, keys_only=True,
                                   sort_order=rpc.RangeRequest.DESCEND, sort_target=rpc.RangeRequest.MOD)
        kvs = self._conn.call(lambda kv: kv.Range(request, timeout=self.timeout)).kvs
        return int(kvs[0].mod_revision) if kvs else 0

    def _read_feed(self, after: int, limit: int, wait: float) -> tuple[list[FeedEntry], int]:
        """A watch opened for one read: history before the head arrives within etcd's
        catch-up round (100 ms), so this waits at least a little longer than that."""
        reader = EtcdFeedReader(self, after)
        try:
            return reader.read(limit, max(wait, 0.3)), reader.position
        finally:
            reader.close()

    def _compact_feed(self, retention: FeedRetention) -> int:
        return 0  # the server's --auto-compaction-retention bounds the history of its whole keyspace
