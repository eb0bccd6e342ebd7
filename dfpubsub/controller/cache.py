"""The subscriber's local cache of versioned objects, with tombstones.

An update is applied only if its version is newer than what the cache holds;
a delete leaves a tombstone carrying its version, so a late create or update
of an older version cannot bring the object back. Tombstones are purged once
``tombstone_horizon`` seconds passed since their deletion (and within a quarter
more), which must exceed the longest delay a message can have (the delay
window plus transport buffering).

Memory (tools/bench/cache_memory.py): a controller keeps every object of its
tables on every host, and most are never read between two changes. So each
value is kept **packed**, as the msgpack bytes the store writes (the store's
own bytes where a listing hands them over, :meth:`Store.list_packed_at`), in a
dict per table of key -> (version, topic, bytes), and decoded on read. What
was just applied is what reconcilers read next: the last ``decoded`` objects
written are also kept decoded (a small LRU), so a worker reconciling a change
does not decode it. Table and topic names are interned (one string per name,
not one per object); tombstones are dicts per table of key -> version, in
generations purged whole, so purging costs nothing per tombstone.

Values that arrive packed (wire schema 2: ``Event.packed``, the store's own
bytes) are kept as they came, and decoded only where something needs the
value: a transform, an index (``decoded_tables``: decoded as applied, once,
into the decoded window) or a read. A value that passed the check at receipt
but does not decode (docs/protocol.md §6.4) is never handed on: at apply it is
not applied, at a read its key is evicted and :class:`~dfpubsub.errors.BadValue`
raised; either way ``on_bad_value`` is told, to count it and repair the key
from the store.

A per-table **transform** (client-go's ``SetTransform``) maps each value
before it is cached, so a controller keeps only the fields it needs; versions,
not values, decide what is newer, so a transform never makes a resync see a
change that is not one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import compress, groupby
from typing import Any, NamedTuple, cast

import msgpack

from ..codec import unpack_value
from ..errors import BadValue
from ..events import Action, Event, VersionedObject
from ..logs import RateLimitedLog
from ..store.api import PackedTable
from .graves import Graves

__all__ = ["VersionedCache", "Change", "TableUsage", "Transform", "DEFAULT_DECODED"]

log = logging.getLogger(__name__)

# Per event: an enum member's lookup and the named tuple's Python-level __new__ cost more than
# the rest of an apply's test and store together.
_DELETE = Action.DELETE
_CREATE = Action.CREATE
_UPDATE = Action.UPDATE
_new = tuple.__new__
#: The value of packed bytes: those of a store's listing were proved by the store; those that came
#: over the wire are proved here, at their first decode (BadValue).
_unpack = unpack_value

#: A value -> what the cache keeps of it (the same value, or a smaller one).
Transform = Callable[[Any], Any]
#: Told of a packed value that does not decode: (topic, table, key, the error).
BadValueHandler = Callable[[str, str, str, BadValue], None]
#: Objects kept decoded besides their packed form: the last ones written.
DEFAULT_DECODED = 4096
#: Keys :meth:`VersionedCache.export` reads under the lock at a time, yielding between chunks:
#: at a million objects, events applied meanwhile waited p99 1.6 ms, at most 3 ms (4,096: 4.9 and
#: 6.3 ms; 256: 0.6 and 2.9 ms, a walk of 1.0 s instead of 0.73).
EXPORT_CHUNK = 1024
#: Parts (dicts) an ordered export spreads a table over: ~4,000 objects each at a million.
EXPORT_PARTS = 256
#: Stale keys a key log may hold beyond as many as the live ones before it is rebuilt.
_ORDER_SLACK = 65536

#: A cached object: (version, topic, the value's msgpack bytes).
_Record = tuple[int, str, bytes]


def _kept(version: int, ident: tuple[str, str], revision: int | None, recent: set[tuple[str, str]]) -> bool:
    """Whether a cached version a listing at ``revision`` does not show stays: it is provably newer
    (above the revision and applied since the relist began), or the listing has no revision."""
    return revision is None or (version > revision and ident in recent)


class Change(NamedTuple):
    """What reconciling the cache with the source of truth changed.

    ``previous`` is the object the cache held before (None on create).
    """

    action: Action
    topic: str
    table: str
    key: str
    version: int
    value: Any = None
    previous: VersionedObject | None = None


class TableUsage(NamedTuple):
    """What one table holds in a cache: live objects, the bytes of their packed values and keys
    (the payload; the containers around them cost ~90 bytes more an object), and tombstones."""

    objects: int
    bytes: int
    tombstones: int


class VersionedCache:
    """Objects by (table, key), applying only newer versions. Thread-safe.

    ``transforms`` maps a table to a :data:`Transform` applied to every value before it is
    cached; ``decoded`` is how many of the last objects written are also kept decoded.
    ``decoded_tables``: tables whose packed values are decoded as they are applied (their
    indexes read each one); ``on_bad_value`` is told of every packed value that does not decode.
    ``ordered``: keep a log of each table's keys in the order they came, which lets
    :meth:`export` copy a table a chunk at a time (a controller that writes snapshots); it
    costs a list append per object created and ~9 bytes an object.
    """

    def __init__(self, tombstone_horizon: float = 300.0, clock: Callable[[], float] = time.monotonic, *,
                 transforms: Mapping[str, Transform] | None = None, decoded: int = DEFAULT_DECODED,
                 decoded_tables: Iterable[str] = (), on_bad_value: BadValueHandler | None = None,
                 ordered: bool = False):
        self.tombstone_horizon = tombstone_horizon
        self._clock = clock
        self._lock = threading.Lock()
        #: table -> key -> (version, topic, packed value)
        self._tables: dict[str, dict[str, _Record]] = {}
        #: table -> bytes of its packed values and keys
        self._bytes: dict[str, int] = {}
        #: With ``ordered``: table -> its keys in the order they were created, with the keys deleted
        #: since and those created twice (a key log: a list can be read by index a chunk at a time
        #: while the dict grows and shrinks, which a dict's own iterator cannot). Compacted by
        #: :meth:`export`, and here once it holds more stale keys than live ones.
        self._order: dict[str, list[str]] | None = {} if ordered else None
        #: Keys :meth:`export` reads under the lock at a time, with ``ordered``.
        self.export_chunk = EXPORT_CHUNK
        self._names: dict[str, str] = {}  # one string per table and topic name
        self._graves = Graves(tombstone_horizon)
        self._transforms = dict(transforms or {})
        #: Tables whose packed values are decoded at apply: the transformed ones and ``decoded_tables``.
        self._eager = frozenset(decoded_tables) | self._transforms.keys()
        self.on_bad_value = on_bad_value
        #: Packed values that did not decode.
        self.bad_values = 0
        self._decoded_max = max(0, decoded)
        # Read without the lock (OrderedDict.get is one C call); written under it, always after
        # the record it mirrors, so a reader sees the old object or the new one.
        self._decoded: OrderedDict[tuple[str, str], VersionedObject] = OrderedDict()
        self._pack = msgpack.Packer().pack  # used under the lock only: a Packer is not thread-safe
        self._badlog = RateLimitedLog(log)
        #: Values a transform raised on (kept whole: the transform is the user's, the value the truth).
        self.transform_errors = 0
        #: What events changed since :meth:`begin_relist` (None: no relist under way).
        self._recent: set[tuple[str, str]] | None = None
        #: What events changed since :meth:`take_touched` (None: nobody asks), for a replay to
        #: check against the store's feed.
        self._touched: set[tuple[str, str]] | None = None

    # -- writes ---------------------------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Apply ``event`` if it is newer than the cached state; return whether it was."""
        table, key, version = event.table, event.key, event.version
        with self._lock:
            rows = self._tables.get(table)
            held = rows.get(key) if rows is not None else None
            if held is not None:
                if version <= held[0]:
                    return False
            elif self._graves.gens:
                tomb = self._graves.get(table, key)
                if tomb is not None and version <= tomb:
                    return False
            ident = (table, key)
            if event.action is _DELETE:
                if held is not None:
                    self._drop_locked(rows, table, key, held)  # type: ignore[arg-type]
                self._graves.add(table, key, version, self._clock())
            else:
                # _put_locked, inlined: the dispatch thread's hot path.
                value, blob = event.value, event.packed
                if blob is not None and value is None and table in self._eager:
                    try:
                        value = unpack_value(blob)
                    except BadValue as exc:  # not applied: the store's value replaces it
                        self._bad_locked(event.topic, table, key, exc)
                        return False
                if self._graves.gens:
                    self._graves.discard(table, key)
                if self._transforms:
                    transform = self._transforms.get(table)
                    if transform is not None:
                        kept = self._transformed(transform, table, key, value)
                        if kept is not value:
                            value, blob = kept, None
                topic = event.topic
                topic = self._names.get(topic) or self._name(topic)
                if blob is None:
                    blob = self._pack(value)
                if rows is None:
                    rows = self._tables[self._name(table)] = {}
                    self._bytes[table] = 0
                rows[key] = (version, topic, blob)
                self._bytes[table] += len(blob) - (len(held[2]) if held is not None else -len(key))
                if held is None and (log := self._order) is not None:
                    self._log_key_locked(log, table, key, rows)
                if self._decoded_max:
                    decoded = self._decoded
                    if ident in decoded:
                        del decoded[ident]
                    if value is not None or event.packed is None:  # packed, not decoded: decoded on read
                        decoded[ident] = _new(VersionedObject, (topic, table, key, version, value))
                        if len(decoded) > self._decoded_max:
                            decoded.popitem(last=False)
            if self._recent is not None:
                self._recent.add(ident)
            if self._touched is not None:
                self._touched.add(ident)
            return True

    def reconcile(self, topics: Iterable[str], truth: Iterable[VersionedObject], revision: int | None = None,
                  same: Iterable[tuple[str, str]] = (), blobs: Iterable[bytes] | None = None,
                  values: bool = True) -> list[Change]:
        """Make the objects of ``topics`` equal to ``truth`` (a full listing of them).

        Returns the changes the cache had missed, as an informer's relist does:
        creates and updates for objects that differ in the truth, deletes for
        objects the truth no longer has. ``same`` are more objects of the
        listing, which the cache holds exactly as listed (see :meth:`diff`).
        ``blobs``, in step with ``truth``, are the values' bytes as the store
        holds them (:meth:`Store.list_packed_at`): kept as they are, not packed again.
        ``values=False``: the objects of ``truth`` carry None, the blobs are their values; a
        first sync then makes creates that carry None too (what a controller whose changes
        feed no index nor ``on_reconciled`` asks, to never hold every value decoded at once).

        Truth wins: ``revision`` is the store revision the listing reflects
        (:meth:`Store.list_at`). A cached version the listing does not show is
        kept only if it is provably newer than the listing: above ``revision``
        and applied since :meth:`begin_relist`. Anything else (a forged version,
        however high) is replaced by the store's. Without ``revision`` (a
        listing from elsewhere, such as a snapshot), cached versions higher
        than the listing's are kept. The caller must not apply events between
        reading the listing and reconciling it unless it called
        :meth:`begin_relist` before the listing was read.
        """
        topics = set(topics)
        truth = truth if isinstance(truth, list) else list(truth)
        packed = self._packed(truth, blobs, values)
        changes: list[Change] = []
        with self._lock:
            recent, self._recent = self._recent or set(), None
            if revision is not None and not self._tables and not self._graves.gens:  # a first sync: all new
                return self._first_sync_locked(truth, packed if blobs is not None else None, values)
            same = same if isinstance(same, (list, tuple, set)) else list(same)
            listed, present = self._merge_locked(truth, packed, revision, recent, values, changes)
            if revision is not None and present + len(same) == len(self):
                # A store's listing names each object once: every cached object is listed, none
                # is to be deleted, and the pass over all of them can be left out.
                return changes
            seen = set(same)
            seen.update(listed)
            self._sweep_locked(topics, seen, revision, recent, changes)
        return changes

    def reconcile_page(self, truth: list[VersionedObject], revision: int, blobs: list[bytes], *,
                       values: bool = True, fresh: bool = False, build: bool = True) -> list[Change]:
        """One page of a listing read in pages (:meth:`Store.list_pages_at`, after
        :meth:`begin_relist`): merged as :meth:`reconcile` merges a whole listing, and nothing
        deleted yet; :meth:`end_relist` deletes what no page showed. ``fresh``: the cache held
        nothing of the listing's topics when it began, and each object is in one page only, so
        that a page no event changed since goes in by column, as a first sync's listing does.
        ``build=False``: nobody acts on the changes, none is built (see :meth:`fill`)."""
        packed = self._packed(truth, blobs, values)
        changes: list[Change] = []
        with self._lock:
            recent = self._recent or set()
            if fresh and not recent:
                if not build:
                    self._fill_columns_locked(truth, packed)
                    return changes
                return self._first_sync_locked(truth, packed, values)
            self._merge_locked(truth, packed, revision, recent, values, changes)
        return changes

    def end_relist(self, topics: set[str], seen: set[tuple[str, str]], revision: int) -> list[Change]:
        """The end of a listing read in pages: delete the cached objects of ``topics`` that no page
        showed (``seen``: the (table, key) of every object listed), unless provably newer than the
        listing (above ``revision`` and applied since :meth:`begin_relist`), as :meth:`reconcile` does."""
        changes: list[Change] = []
        with self._lock:
            recent, self._recent = self._recent or set(), None
            self._sweep_locked(topics, seen, revision, recent, changes)
        return changes

    def undo(self, changes: Iterable[Change]) -> None:
        """Put back what ``changes`` replaced (the merged pages of a relist that failed part way,
        newest first), so that its retry finds them again: the changes never reached whatever
        acts on them. A create is dropped, an update's previous object restored."""
        with self._lock:
            tables = self._tables
            for ch in reversed(list(changes)):
                rows = tables.get(ch.table)
                held = rows.get(ch.key) if rows is not None else None
                if ch.previous is not None:
                    self._put_locked(ch.previous, None, held)
                elif held is not None and rows is not None:
                    self._drop_locked(rows, ch.table, ch.key, held)

    @staticmethod
    def _packed(truth: list[VersionedObject], blobs: Iterable[bytes] | None, values: bool) -> list[bytes | None]:
        packed: list[bytes | None] = list(blobs) if blobs is not None else [None] * len(truth)
        if len(packed) != len(truth) or (not values and blobs is None):
            raise ValueError(f"{len(packed)} blobs for {len(truth)} objects")
        return packed

    def _merge_locked(self, truth: list[VersionedObject], packed: list[bytes | None], revision: int | None,
                      recent: set[tuple[str, str]], values: bool,
                      changes: list[Change]) -> tuple[list[tuple[str, str]], int]:
        """Put what ``truth`` shows differently into the cache (truth wins, see :meth:`reconcile`),
        adding a change for each; the idents listed, and how many of them the cache holds now."""
        graves = self._graves
        listed: list[tuple[str, str]] = []  # the idents of truth
        present = 0  # listed objects the cache holds after the loop
        append, note, tables = changes.append, listed.append, self._tables
        for obj, blob in zip(truth, packed):  # the hot loop of a resync: 100k objects and more
            topic, table, key, version, value = obj
            ident = (table, key)
            note(ident)
            rows = tables.get(table)
            held = rows.get(key) if rows is not None else None
            if held is not None:
                present += 1
                if version == held[0] or (version < held[0] and _kept(held[0], ident, revision, recent)):
                    continue
                previous: VersionedObject | None = self._object(table, key, held)
            else:
                if graves.gens:
                    tomb = graves.get(table, key)
                    if tomb is not None:
                        if version <= tomb and _kept(tomb, ident, revision, recent):
                            continue
                        graves.discard(table, key)
                present += 1
                previous = None
            if not values:
                obj = _new(VersionedObject, (topic, table, key, version, _unpack(blob)))  # type: ignore[arg-type]
                value = obj[4]
            obj = self._cached(obj)
            if obj[4] is not value:
                blob = None  # transformed: the store's bytes are not what is kept
            self._put_locked(obj, blob, held)
            append(_new(Change, (_CREATE if held is None else _UPDATE, *obj, previous)))
        return listed, present

    def _sweep_locked(self, topics: set[str], seen: set[tuple[str, str]], revision: int | None,
                      recent: set[tuple[str, str]], changes: list[Change]) -> None:
        """Delete the cached objects of ``topics`` not in ``seen`` (unless provably newer), adding a
        change for each."""
        graves, now = self._graves, self._clock()
        for table, rows in list(self._tables.items()):
            for key, held in list(rows.items()):
                if held[1] in topics and (table, key) not in seen:
                    if revision is not None and _kept(held[0], (table, key), revision, recent):
                        continue  # created after the listing was read
                    obj = self._object(table, key, held)
                    self._drop_locked(rows, table, key, held)
                    # The deletion's own version is unknown; the object's marks a floor, and the
                    # listing's revision bounds it (a forged version must not block later writes).
                    graves.add(table, key, held[0] if revision is None else min(held[0], revision), now)
                    changes.append(_new(Change, (_DELETE, *obj[:4], None, obj)))

    def _fill_columns_locked(self, truth: list[VersionedObject], packed: list[bytes | None]) -> None:
        """Objects of ``truth`` the cache holds nothing of, with their values' bytes, by column and
        table (:meth:`fill`'s way, from a page's objects)."""
        if not truth:
            return
        topic_col, table_col, key_col, version_col, _ = zip(*truth)
        at = 0
        for table, run in groupby(table_col):
            end = at + len(list(run))
            self._fill_locked(table, topic_col[at:end], key_col[at:end], version_col[at:end],
                              cast("list[bytes]", packed[at:end]), None)
            at = end

    def fill(self, tables: Iterable[PackedTable], transformed: bool = False) -> int | None:
        """A first sync that builds no :class:`Change`, for a caller nobody hands them to (a
        controller without reconcilers, indexes nor ``on_reconciled``): a full listing, by table
        and column (:meth:`Store.list_packed_tables_at`), into an empty cache. Returns how many
        objects it added (each a create), or None, and does nothing, when the cache holds anything,
        tombstones included: then :meth:`reconcile` a listing. ``transformed``: the values are
        what a cache with these transforms kept (a snapshot's, :meth:`export`), not transformed again."""
        with self._lock:
            if self._tables or self._graves.gens:
                return None
            self._recent = None
            added = 0
            for part in tables:
                self._fill_locked(part.table, part.topics, part.keys, part.versions, part.blobs, None, transformed)
                added += len(part.keys)
            return added

    def export(self) -> tuple[dict[str, list[dict[str, _Record]]], dict[str, dict[str, int]], set[tuple[str, str]]]:
        """A copy of what the cache holds, for a snapshot (:mod:`dfpubsub.controller.snapshot`): per
        table, its records key -> (version, topic, packed value) in one or more parts (each key in
        one part), the tombstones per table (key -> version), and what events changed since the
        last :meth:`take_touched` (read last). The caller packs outside the lock.

        With ``ordered``, each table is read through its key log ``export_chunk`` keys at a time,
        each chunk under the lock, into :data:`EXPORT_PARTS` parts by the keys' hashes: the
        dispatch thread never waits for more than a chunk, where a whole table's ``dict.copy()``
        holds the lock and the GIL (27 ms a million objects on a quiet machine, 249 ms on a loaded
        one), and no part grows big enough for its resizing to hold the GIL long (one dict of a
        million grows by copies of 10-20 ms). The copy is then not of one instant: each record is
        as it was when its chunk was read. A caller that keeps every repair out meanwhile gets
        records that are each the one at the walk's start or one an event applied since (a
        version above every position, a delete, an eviction noted as touched), which is what a
        snapshot may hold (docs/reliability.md, "Warm restarts"). Without ``ordered``: one C-level
        copy of each table's dict under the lock."""
        if self._order is None:
            with self._lock:
                tables = {table: [rows.copy()] for table, rows in self._tables.items()}
        else:
            with self._lock:
                names = list(self._tables)
            tables = {table: self._walk(table, max(1, self.export_chunk)) for table in names}
        with self._lock:
            tombs: dict[str, dict[str, int]] = {}
            for gen in self._graves.gens:
                for table, keys in gen.tables.items():
                    tombs.setdefault(table, {}).update(keys)
            return tables, tombs, set(self._touched or ())

    def _walk(self, table: str, chunk: int) -> list[dict[str, _Record]]:
        """The records of ``table`` read through its key log, ``chunk`` keys under the lock at a
        time, in parts by hash (see :meth:`export`: a key logged twice lands in one part, where
        the later read wins). A log with many stale keys is replaced by the keys found live,
        gathered chunk by chunk as well: nothing here copies or grows anything of a whole
        table's size in one C call, which would hold the GIL as long as the lock it replaces."""
        logs = self._order
        assert logs is not None
        parts: list[dict[str, _Record]] = [{} for _ in range(EXPORT_PARTS)]
        mask = EXPORT_PARTS - 1
        fresh: list[str] | None = None
        log: list[str] | None = None
        at = 0
        while True:
            with self._lock:
                rows, current = self._tables.get(table), logs.get(table)
                if rows is None or current is None:
                    break
                if current is not log:  # rebuilt meanwhile (too many stale keys): read it from its start
                    log, at = current, 0
                    fresh = [] if len(log) > len(rows) + len(rows) // 4 + chunk else None
                part = log[at:at + chunk]
                if not part:  # the end, under the lock: every key created meanwhile was read
                    if fresh is not None:
                        logs[table] = fresh
                    break
                held = list(map(rows.get, part))
            # Let a thread waiting for the lock have it: woken by the release, it still needs the
            # GIL, and without a yield this loop takes the lock again first, chunk after chunk
            # (measured: events waited up to 97 ms of a 430 ms walk).
            time.sleep(0)
            at += len(part)
            live = list(compress(part, held))  # a deleted key reads None
            for key, record in zip(live, filter(None, held)):
                parts[hash(key) & mask][key] = record
            if fresh is not None:
                fresh.extend(live)
        return parts

    def clear(self) -> None:
        """Forget every object and tombstone (a snapshot loaded, then found not to be the store's)."""
        with self._lock:
            self._tables.clear()
            self._bytes.clear()
            if self._order is not None:
                self._order.clear()
            self._graves = Graves(self.tombstone_horizon)
            self._decoded.clear()
            self._recent = None
            if self._touched is not None:
                self._touched = set()

    def _first_sync_locked(self, truth: list[VersionedObject], packed: list[bytes | None] | None,
                           values: bool) -> list[Change]:
        """Every object of ``truth`` into an empty cache, and the creates that makes.

        A million objects and more: the records are built by C loops (zip, map) over the
        listing's columns, table by table, before any Change, so that the Changes, dropped
        soon after, are not interleaved with what stays (their memory is then reused whole
        rather than left as holes between records, tools/bench/cache_memory.py)."""
        if not truth:
            return []
        topic_col, table_col, key_col, version_col, value_col = zip(*truth)
        out_values: list[Any] | None = None  # the values the creates carry, where transformed
        at = 0
        for table, run in groupby(table_col):
            end = at + len(list(run))
            kept = self._fill_locked(table, topic_col[at:end], key_col[at:end], version_col[at:end],
                                     None if packed is None else cast("list[bytes]", packed[at:end]),
                                     value_col[at:end] if values else None)
            if kept is not None:
                if out_values is None:
                    out_values = list(value_col)
                out_values[at:end] = kept
            at = end
        if out_values is None:
            return [_new(Change, (_CREATE, *obj, None)) for obj in truth]
        return [_new(Change, (_CREATE, *obj[:4], value, None)) for obj, value in zip(truth, out_values)]

    def _fill_locked(self, table: str, topics: Sequence[str], keys: Sequence[str], versions: Sequence[int],
                     blobs: Sequence[bytes] | None, values: Sequence[Any] | None,
                     transformed: bool = False) -> list[Any] | None:
        """Objects of ``table`` the cache holds nothing of, by column, with their values' bytes or
        their values (or both; the bytes are decoded only for a transform). Returns the values
        kept where the table has a transform (what its creates carry), else None."""
        table = self._name(table)
        names = {t: self._name(t) for t in set(topics)}
        kept: list[Any] | None = None
        transform = None if transformed else self._transforms.get(table)
        if transform is not None:
            raw = values if values is not None else map(_unpack, cast("Sequence[bytes]", blobs))
            kept = [self._transformed(transform, table, k, v) for k, v in zip(keys, raw)]
            blobs = list(map(self._pack, kept))
        elif blobs is None:
            blobs = list(map(self._pack, cast("Sequence[Any]", values)))
        rows = self._tables.setdefault(table, {})
        rows.update(zip(keys, zip(versions, map(names.__getitem__, topics), blobs)))
        if self._order is not None:
            self._order.setdefault(table, []).extend(keys)
        self._bytes[table] = self._bytes.get(table, 0) + sum(map(len, blobs)) + sum(map(len, keys))
        return kept

    def correct(self, topics: set[str], objects: Iterable[VersionedObject],
                deleted: Iterable[tuple[tuple[str, str], int]]) -> list[Change]:
        """Make these objects what the store says, whatever the cache held (truth wins).

        ``objects`` were read from the store (their versions are the store's own); one whose
        topic is not in ``topics`` has left them and is deleted here. ``deleted`` are (table, key)
        the store deleted at a version. Returns what changed, as :meth:`reconcile` does.
        """
        changes: list[Change] = []
        now = self._clock()
        with self._lock:
            tables, graves = self._tables, self._graves
            for obj in objects:
                table, key = obj[1], obj[2]
                rows = tables.get(table)
                held = rows.get(key) if rows is not None else None
                if held is not None and held[0] == obj[3] and held[1] == obj[0] and obj[0] in topics:
                    continue  # nothing to decode: the store's version is the one held
                previous = None if held is None else self._object(table, key, held)
                if obj[0] not in topics:
                    if held is not None and previous is not None:
                        self._drop_locked(rows, table, key, held)  # type: ignore[arg-type]
                        graves.add(table, key, obj[3], now)
                        changes.append(_new(Change, (_DELETE, *previous[:4], None, previous)))
                    continue
                graves.discard(table, key)
                obj = self._cached(obj)
                self._put_locked(obj, None, held)
                changes.append(_new(Change, (_CREATE if previous is None else _UPDATE, *obj, previous)))
            for (table, key), version in deleted:
                rows = tables.get(table)
                held = rows.get(key) if rows is not None else None
                graves.add(table, key, version, now)
                if held is not None and rows is not None:
                    previous = self._object(table, key, held)
                    self._drop_locked(rows, table, key, held)
                    changes.append(_new(Change, (_DELETE, *previous[:4], None, previous)))
        return changes

    def begin_relist(self) -> None:
        """Note from now on which objects events change, until the next :meth:`reconcile`: the
        only cached versions a listing read after this call may fail to show."""
        with self._lock:
            self._recent = set()

    def take_touched(self) -> set[tuple[str, str]]:
        """The (table, key) of every object events changed since the last call, and start anew.

        A replay (:mod:`dfpubsub.controller.replay`) checks each against the store's feed: a
        version no write of the store explains came from a forged or foreign event.
        """
        with self._lock:
            touched, self._touched = self._touched or set(), set()
            return touched

    def vouch(self, events: list[Event], applied: list[bool]) -> list[tuple[str, str]]:
        """A feed publisher's events, each with whether :meth:`apply` took it: the objects the
        cache now holds as these events say are no longer *touched* (:meth:`take_touched`).

        One that applied is the feed's now. One that did not is vouched for only if the cache
        holds it at exactly its version with the same (transformed) value, or holds no object where
        it says deleted: a forged event with the genuine version and another value that came first
        stays touched, and the next replay reads it. Returns the objects vouched for."""
        out: list[tuple[str, str]] = []
        with self._lock:
            touched, tables = self._touched, self._tables
            for event, took in zip(events, applied):
                ident = (event.table, event.key)
                if not took:
                    rows = tables.get(event.table)
                    held = rows.get(event.key) if rows is not None else None
                    if event.action is _DELETE:
                        if held is not None:
                            continue
                    elif held is None or held[0] != event.version or held[1] != event.topic:
                        continue
                    else:
                        value = event.value
                        transform = self._transforms.get(event.table) if self._transforms else None
                        if transform is None and event.packed is not None:
                            if event.packed != held[2]:
                                continue
                        else:
                            if value is None and event.packed is not None:
                                try:
                                    value = _unpack(event.packed)
                                except BadValue:
                                    continue
                            if transform is not None:
                                value = self._transformed(transform, event.table, event.key, value)
                            if self._pack(value) != held[2]:
                                continue
                if touched is not None:
                    touched.discard(ident)
                out.append(ident)
        return out

    # -- reads ----------------------------------------------------------------------------

    def get(self, table: str, key: str) -> VersionedObject | None:
        """The live object, or None if absent or deleted."""
        # No lock: a reader takes one dict lookup or two, each atomic, and reconcilers on worker
        # threads call this for every key while the dispatch thread applies events under the
        # lock; contending for it cost a GIL hand-off per key (tools/bench/controller.py).
        return self._read((table, key))

    def _read(self, ident: tuple[str, str]) -> VersionedObject | None:
        obj = self._decoded.get(ident)
        if obj is not None:
            return obj
        rows = self._tables.get(ident[0])
        if rows is None:
            return None
        held = rows.get(ident[1])
        if held is None:
            return None
        try:
            value = _unpack(held[2])
        except ValueError as exc:  # only bytes that came packed over the wire can fail (BadValue)
            self._evict_bad(ident[0], ident[1], held, exc)
            raise
        return _new(VersionedObject, (held[1], ident[0], ident[1], held[0], value))

    def lookup(self) -> Callable[[tuple[str, str]], VersionedObject | None]:
        """A lock-free reader of live objects by ``(table, key)``, valid for the cache's life: for a
        reader that looks up every key it is handed, such as a controller's workers (no key
        tuple to build per key, as :meth:`get` needs)."""
        return self._read

    def live_version(self, table: str, key: str) -> int | None:
        """The version of the live object, or None if absent or deleted: :meth:`get` without
        decoding the value (lock-free, as :meth:`get`)."""
        rows = self._tables.get(table)
        held = rows.get(key) if rows is not None else None
        return None if held is None else held[0]

    def version(self, table: str, key: str) -> int:
        """Version of the object or its tombstone; 0 when unknown."""
        with self._lock:
            rows = self._tables.get(table)
            held = rows.get(key) if rows is not None else None
            if held is not None:
                return held[0]
            tomb = self._graves.get(table, key)
            return tomb if tomb is not None else 0

    def items(self, table: str | None = None, topic: str | None = None) -> list[VersionedObject]:
        """Live objects, optionally of one table and/or one topic (each decoded: a copy)."""
        with self._lock:
            held = [(t, k, h) for t, rows in self._tables.items() if table is None or t == table
                    for k, h in rows.items() if topic is None or h[1] == topic]
        out = []
        for t, k, h in held:
            try:
                out.append(_new(VersionedObject, (h[1], t, k, h[0], _unpack(h[2]))))
            except BadValue as exc:  # left out, evicted and repaired
                self._evict_bad(t, k, h, exc)
        return out

    def keys(self, table: str | None = None) -> list[tuple[str, str]]:
        """The (table, key) of every live object, optionally of one table, without decoding any."""
        with self._lock:
            return [(t, k) for t, rows in self._tables.items() if table is None or t == table for k in rows]

    def diff(self, versions: Iterable[tuple[str, str, str, int]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Split a listing of (topic, table, key, version) into the (table, key) of the objects the
        cache holds otherwise (to be read) and of those it holds exactly so."""
        stale: list[tuple[str, str]] = []
        same: list[tuple[str, str]] = []
        empty: dict[str, _Record] = {}
        with self._lock:
            tables = self._tables
            for topic, table, key, version in versions:
                held = tables.get(table, empty).get(key)
                if held is None or held[0] != version or held[1] != topic:
                    stale.append((table, key))
                else:
                    same.append((table, key))
        return stale, same

    def __len__(self) -> int:
        return sum(len(rows) for rows in list(self._tables.values()))

    def __iter__(self) -> Iterator[VersionedObject]:
        return iter(self.items())

    def tombstones(self) -> int:
        """Number of tombstones held (for metrics and tests)."""
        with self._lock:
            return len(self._graves)

    def usage(self) -> dict[str, TableUsage]:
        """Per table: live objects, the bytes of their packed values and keys, tombstones."""
        with self._lock:
            tombs = self._graves.per_table()
            names = sorted(self._tables.keys() | tombs.keys())
            return {t: TableUsage(len(self._tables.get(t, ())), self._bytes.get(t, 0), tombs.get(t, 0))
                    for t in names}

    # -- under the lock -------------------------------------------------------------------

    def _name(self, name: str) -> str:
        """The one string the cache keeps for a table or topic name."""
        return self._names.get(name) or self._names.setdefault(name, name)

    def _transformed(self, transform: Transform, table: str, key: str, value: Any) -> Any:
        try:
            return transform(value)
        except Exception as exc:  # user code on the dispatch thread: keep the whole value
            self.transform_errors += 1
            self._badlog.warning(table, "transform failed; the whole value is cached", table=table, key=key,
                                 error=repr(exc))
            return value

    def _cached(self, obj: VersionedObject) -> VersionedObject:
        """``obj`` as the cache keeps it: names interned, value transformed."""
        topic, table, key, version, value = obj
        transform = self._transforms.get(table)
        if transform is not None:
            value = self._transformed(transform, table, key, value)
        return _new(VersionedObject, (self._name(topic), self._name(table), key, version, value))

    def _put_locked(self, obj: VersionedObject, blob: bytes | None, held: _Record | None) -> None:
        """Store ``obj`` (as the cache keeps it), replacing ``held``; ``blob``: its value's bytes, if known."""
        table, key = obj[1], obj[2]
        if blob is None:
            blob = self._pack(obj[4])
        rows = self._tables.get(table)
        if rows is None:
            rows = self._tables[self._name(table)] = {}
            self._bytes[table] = 0
        rows[key] = (obj[3], obj[0], blob)
        self._bytes[table] += len(blob) - (len(held[2]) if held is not None else -len(key))
        if held is None and (log := self._order) is not None:
            self._log_key_locked(log, table, key, rows)
        if self._decoded_max:
            decoded, ident = self._decoded, (table, key)
            decoded.pop(ident, None)
            decoded[ident] = obj
            if len(decoded) > self._decoded_max:
                decoded.popitem(last=False)

    def _log_key_locked(self, logs: dict[str, list[str]], table: str, key: str, rows: dict[str, _Record]) -> None:
        """Note a created key in the table's key log (``ordered``); rebuild a log that holds more
        stale keys than live ones (one copy of the keys, paid for by as many deletes)."""
        log = logs.get(table)
        if log is None:
            log = logs[self._name(table)] = []
        log.append(key)
        if len(log) > 2 * len(rows) + _ORDER_SLACK:
            logs[table] = list(rows)

    def _drop_locked(self, rows: dict[str, _Record], table: str, key: str, held: _Record) -> None:
        del rows[key]
        self._bytes[table] -= len(held[2]) + len(key)
        self._decoded.pop((table, key), None)

    def _object(self, table: str, key: str, held: _Record) -> VersionedObject:
        """The object ``held`` is, as a repair's change names what it replaced (under the lock)."""
        obj = self._decoded.get((table, key))
        if obj is not None and obj[3] == held[0]:
            return obj
        try:
            value = _unpack(held[2])
        except BadValue as exc:  # being replaced or deleted now: what it was is not known
            self._bad_locked(held[1], table, key, exc)
            value = None
        return _new(VersionedObject, (held[1], table, key, held[0], value))

    def _bad_locked(self, topic: str, table: str, key: str, exc: BadValue) -> None:
        self.bad_values += 1
        if self._touched is not None:  # the next replay reads the object, wherever its position is
            self._touched.add((table, key))
        if self.on_bad_value is not None:
            self.on_bad_value(topic, table, key, exc)

    def _evict_bad(self, table: str, key: str, held: _Record, exc: Exception) -> None:
        """A packed value read does not decode: drop it (no tombstone: the store's version, whatever
        it is, must replace it) unless something replaced it meanwhile, and say so."""
        with self._lock:
            rows = self._tables.get(table)
            if rows is not None and rows.get(key) is held:
                self._drop_locked(rows, table, key, held)
            self._bad_locked(held[1], table, key, cast(BadValue, exc))
