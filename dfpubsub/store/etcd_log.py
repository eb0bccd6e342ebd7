"""The etcd store's write log: the history of ``/{prefix}/feedlast``, read by range.

Every write's ``Txn`` puts ``feedlast`` (:mod:`.etcd`), so its history has one
version per store write, at that write's revision; its value names the write
(``action NUL table NUL key NUL topic``, the topic empty where the write did not
know it: an update that kept it, a delete). A ``Range`` of that one key *at*
revision ``r`` answers the last store write at or before ``r``, at once. So
the writes after a position are read by ranging over every revision up to the
newest write (128 point reads per ``Txn``, etcd's default ``--max-txn-ops``),
instead of a watch from a past revision, which etcd serves in catch-up rounds
every 100 ms (the etcd replay's p99 was 127 ms for it, tools/bench/repair.py).

Where this reads more than a watch would, or cannot tell, it says so (None)
and the caller follows the feed: more than :data:`SPAN` revisions to look at
(revisions also count other keys' writes: queues, discovery), or a version
that names no write (an older writer's empty value, ``drop_all``, a foreign
value: skipped and counted). A revision compacted away raises HistoryGone, as
the watch would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc

from ..backends import foreign
from ..backends.etcd import status_code, txn
from ..errors import HistoryGone
from ..events import Action
from .feed import FeedEntry

if TYPE_CHECKING:
    from .etcd import EtcdStore

__all__ = ["SPAN", "log_put", "read_log"]

#: Revisions one read of the log looks at, at most (32 Txns): beyond, a watch's round costs less.
SPAN = 4096
_TXN_OPS = 128
_ACTIONS = {b"c": Action.CREATE, b"u": Action.UPDATE, b"d": Action.DELETE}
#: The value of a write that changed no object (the store's mark): nothing to read there.
NO_OBJECT = b"-"


def log_put(last: bytes, action: bytes, table: str, key: str, topic: str = "") -> rpc.PutRequest:
    """The ``feedlast`` put of a write of ``action`` (``c``, ``u``, ``d``) to ``table``/``key``."""
    return rpc.PutRequest(key=last, value=b"\x00".join((action, table.encode(), key.encode(), topic.encode())))


def read_log(store: EtcdStore, after: int) -> tuple[list[FeedEntry], int] | None:
    """The store's writes after revision ``after``, oldest first, and the revision of the newest
    write (every store write up to it is among them); None where a watch must read them (see the
    module's doc). HistoryGone if ``after`` was compacted away."""
    top = store.feed_last()
    if top is None:
        return None
    if top <= after:
        return [], after
    if top - after > SPAN:
        return None
    last = store._last
    entries: dict[int, FeedEntry] = {}
    for start in range(after + 1, top + 1, _TXN_OPS):
        revisions = range(start, min(start + _TXN_OPS, top + 1))
        for response in _read(store, txn([], [rpc.RangeRequest(key=last, revision=r) for r in revisions]), after):
            kvs = response.response_range.kvs
            if not kvs or kvs[0].mod_revision <= after or kvs[0].mod_revision in entries:
                continue
            revision, value = int(kvs[0].mod_revision), kvs[0].value
            if value == NO_OBJECT:
                continue
            entry = _entry(store, revision, value)
            if entry is None:
                return None
            entries[revision] = entry
    return [entries[r] for r in sorted(entries)], top


def _read(store: EtcdStore, request: rpc.TxnRequest, after: int) -> Any:
    """The answers of the range reads of ``request``; HistoryGone where a revision was compacted."""

    def run(kv: Any) -> Any:
        try:
            return kv.Txn(request, timeout=store.timeout).responses
        except grpc.RpcError as exc:
            if status_code(exc) == grpc.StatusCode.OUT_OF_RANGE:
                raise HistoryGone(after, detail="etcd compacted the revisions a replay reads") from None
            raise

    return store._conn.call(run)


def _entry(store: EtcdStore, revision: int, value: bytes) -> FeedEntry | None:
    parts = value.split(b"\x00")
    if len(parts) != 4 or parts[0] not in _ACTIONS:
        if value:  # empty: a write of an older version (or drop_all), not foreign
            foreign.skip("store_feed", store._last, "malformed", f"revision {revision}: {value[:60]!r}")
        return None
    try:
        table, key, topic = (p.decode() for p in parts[1:])
    except UnicodeDecodeError as exc:
        foreign.skip_error("store_feed", store._last, exc)
        return None
    if table not in store.tables or not key:
        foreign.skip("store_feed", store._last, "malformed", f"revision {revision}: not this store's table or key")
        return None
    return FeedEntry(revision, topic or table, table, key, _ACTIONS[parts[0]])
