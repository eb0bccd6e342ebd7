"""Warm restarts: a controller resumes from a local snapshot and reads only what changed while it was down.

A controller with a ``state_dir`` writes its packed cache, its positions, its
tombstones, the objects still to be verified (touched) and its pending deletes
to a snapshot (:mod:`.snapfile`): every ``snapshot_interval`` seconds off the
dispatch thread, and at a clean stop. Under the controller's repair lock (no
repair runs, so no version goes down and nothing takes the touched set) the
positions the store last proved are read, then the cache is copied a chunk of
keys at a time under its own lock (:meth:`VersionedCache.export`: the dispatch
thread waits for one chunk at most, not for a whole table's copy), then the
touched set is read. The copy is not of one instant, and need not be: what
events change while it is read has versions above every position (the
controller applies none at or below its position), so the start reads it back
or replays it like anything else written after the position; a delete is in the
feed; a value evicted as bad is in the touched set. Packing, hashing and
writing happen outside both locks. Along with it go a few feed entries at the position (the
*witness*) and the store's public name.

On start the snapshot is loaded into the empty cache before anything is
subscribed, with its positions; the first repair then replays the feed from
them, as any repair does, and the start *resumes*. Before that repair, on the
dispatch thread, the snapshot is checked against the store: its identity
(:meth:`Store.identity`, whose key also seals the file), the witness entries
(the feed must still hold them, the same), and the position (not above the
store's head, not in a hole a failover left). A snapshot that fails any check
is dropped from the cache whole and the start *relists*, counted with its
reason (``dfpubsub_warm_starts_total{result, reason}``):

==================== ==================================================================
no_snapshot          no file (first start, or the directory was emptied)
unreadable           the file cannot be read (permissions, I/O error)
truncated            shorter than written (a zero-length file included)
other_format         not a snapshot of this format, or its contents do not decode
bad_checksum         damaged, or edited without its checksum made again
bad_seal             edited (the checksum made again) by someone without the store's key
other_store          written from another store (or before ``df-db init --new-identity``)
no_store_identity    the store keeps no identity, or refused to make one
history_gone         the feed no longer holds the witness or the position
history_rewound      the store's history at the position is not the one the snapshot saw
                     (a restore from an older backup, a failover that lost writes)
other_topics         written for other topics
other_transforms     written for other transforms
too_far_behind       more changed while down than a replay may read: a relist reads less
==================== ==================================================================

A snapshot is a hint, never the truth (docs/reliability.md#warm-restarts):
an object the snapshot holds at a version above its position cannot be the
store's at that position and is read back, as is every object it notes as
touched; tombstones are capped at the position; everything written since is
in the feed the replay reads. After the first repair the cache equals the
store for everything the snapshot could have got wrong, and reconcilers are
handed every key (level-triggered: as after a relist).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any, NamedTuple, Protocol

import msgpack

from ..errors import HistoryGone, StoreError, StoreUnavailable
from ..events import VersionedObject
from ..logs import RateLimitedLog
from ..metrics import LabelledCounter, Stats
from ..store import Store
from ..store.api import PackedTable, decode_value
from ..subscriber import Subscriber
from .cache import Transform, VersionedCache
from .indexer import Indexer
from .relist import _gc_paused
from .snapfile import (
    FORMAT,
    SnapshotFile,
    SnapshotRejected,
    check_seal,
    read_file,
    remove_temporaries,
    store_name,
    write_file,
)

__all__ = ["Snapshots", "WarmStart", "WARM_STARTS", "transforms_fingerprint", "witness_of", "check_witness"]

log = logging.getLogger(__name__)

WARM_STARTS = LabelledCounter(
    "warm_starts", "Starts of controllers with a state_dir: resumed from their snapshot, or relisted (and why).",
    ("name", "result", "reason"))

#: Objects per chunk of a snapshot: each is packed in one call that holds the GIL, and the GIL is
#: handed over between chunks (at a million objects, events applied meanwhile waited p99 0.6-0.9
#: ms, at most 2.3 ms; 4,096: 2.4-3.1 and 6 ms).
CHUNK = 1024
#: Feed entries kept as the witness of the history at the position.
WITNESS = 16

_Ident = tuple[str, str]


class Host(Protocol):
    """What a snapshot reads and restores of its controller (:class:`~dfpubsub.controller.Controller`)."""

    name: str
    store: Store
    cache: VersionedCache
    positions: dict[str, int]
    _proven: dict[str, int]
    _touched: set[_Ident]
    _gone: dict[_Ident, VersionedObject]
    _gone_lock: threading.Lock
    _listed: set[str]
    _repair_lock: threading.Lock
    indexers: dict[str, Indexer]
    stats: Stats
    synced: threading.Event

    subscriber: Subscriber

    def redeliver(self) -> int: ...


class WarmStart(NamedTuple):
    """How a controller with a ``state_dir`` started: ``result`` "resumed" or "relisted", its
    ``reason``, the feed entries and objects its first repair read, the objects the snapshot held,
    its age at the start (seconds; None without one), and the seconds from start to the repair's end."""

    result: str
    reason: str
    entries: int
    objects: int
    snapshot_objects: int
    snapshot_age: float | None
    seconds: float


class Snapshots:
    """The snapshots of one controller in ``directory``, written every ``interval`` seconds (0: only
    at a clean stop). Driven by the controller: :meth:`start`, :meth:`verify` and :meth:`started`
    around its first repair, :meth:`close` at its stop."""

    def __init__(self, host: Host, directory: str, interval: float, transforms: Mapping[str, Transform]):
        self.host = host
        self.directory = directory
        self.interval = interval
        self.fingerprint = transforms_fingerprint(transforms)
        #: Set by the first repair after :meth:`start`.
        self.warm_start: WarmStart | None = None
        self.written_at: float | None = None
        self.size = 0
        self._snapshot: SnapshotFile | None = None  # loaded, not yet checked against the store
        self._rejected: SnapshotRejected | None = None
        self._objects = 0
        self._age: float | None = None
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._badlog = RateLimitedLog(log)
        self._problem: str | None = None
        stats = host.stats
        stats.set("snapshot_age_seconds", lambda: 0.0 if self.written_at is None else time.time() - self.written_at)
        stats.set("snapshot_bytes", lambda: float(self.size))

    def problem(self) -> str | None:
        """Why the last snapshot could not be written (None: it was, or none was due yet): a
        readiness check for a daemon configured to require snapshots."""
        return self._problem

    @property
    def pending(self) -> bool:
        """The first repair has not run yet."""
        return self.warm_start is None

    # -- start ----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the snapshot into the (empty) cache, if there is one for these topics and transforms,
        and start writing them. Reads no store."""
        self._started = time.monotonic()
        try:
            os.makedirs(self.directory, exist_ok=True)
            remove_temporaries(self.directory)
            snapshot = read_file(self.directory)
            self._check_header(snapshot.header)
            self._load(snapshot)
        except SnapshotRejected as exc:
            self._rejected = exc
            if exc.reason != "no_snapshot":
                log.warning("snapshot not used: %s", exc, extra={"controller": self.host.name, "reason": exc.reason})
        except OSError as exc:  # the directory cannot be made: no warm start, and no snapshot either
            self._rejected = SnapshotRejected("unreadable", f"state_dir {self.directory}: {exc.strerror or exc}")
            self._problem = str(self._rejected)
            log.warning("snapshot not used: %s", self._rejected, extra={"controller": self.host.name})
        if self.interval > 0:
            self._thread = threading.Thread(target=self._loop, name=f"dfpubsub-snapshot-{self.host.name}",
                                            daemon=True)
            self._thread.start()

    def _check_header(self, header: dict[str, Any]) -> None:
        positions = header.get("positions")
        if not isinstance(positions, dict) or not all(isinstance(p, int) for p in positions.values()):
            raise SnapshotRejected("other_format", "the snapshot holds no positions")
        if sorted(self.host.subscriber.topics) != header.get("topics") or set(positions) != set(self.host.subscriber.topics):
            raise SnapshotRejected("other_topics", f"the snapshot was written for topics {header.get('topics')}")
        if header.get("transforms") != self.fingerprint:
            raise SnapshotRejected("other_transforms", "the snapshot was written for other transforms")

    def _load(self, snapshot: SnapshotFile) -> None:
        """The snapshot into the cache, its positions into the controller; touched: whatever the
        store must answer for at the first repair."""
        host, header = self.host, snapshot.header
        positions: dict[str, int] = header["positions"]
        floor = min(positions.values(), default=0)
        future: list[_Ident] = []
        tombstones: list[tuple[_Ident, int]] = []

        def parts() -> Iterator[PackedTable]:
            for chunk in snapshot.chunks():
                if chunk[0] == "o":
                    _, table, topic, keys, versions, blobs = chunk
                    if not (len(keys) == len(versions) == len(blobs) and isinstance(table, str)
                            and isinstance(topic, str) and set(map(type, keys)) <= {str}
                            and set(map(type, versions)) <= {int} and set(map(type, blobs)) <= {bytes}):
                        raise ValueError(f"a chunk of table {table!r} is malformed")
                    # Above the position no write of the store explains it: the store answers.
                    future.extend((table, k) for k, v in zip(keys, versions) if v > floor)
                    yield PackedTable(table, [topic] * len(keys), keys, versions, blobs)
                elif chunk[0] == "t":
                    _, table, keys, versions = chunk
                    # A tombstone blocks older writes: never above what the position proves.
                    tombstones.extend(((table, k), min(int(v), floor)) for k, v in zip(keys, versions))
        try:
            with _gc_paused():  # a million records: as a relist's, out of the young generation's collections
                added = host.cache.fill(parts(), transformed=True) or 0
            host.cache.correct(set(), [], tombstones)
            touched = {(t, k) for t, k in header.get("touched", ())}
            gone = {(t, k): VersionedObject(topic, t, k, int(v), decode_value(blob))
                    for topic, t, k, v, blob in header.get("gone", ())}
        except (ValueError, TypeError, KeyError) as exc:
            self._unload()
            raise SnapshotRejected("other_format", f"the snapshot's contents do not decode: {exc}") from exc
        host.cache.take_touched()  # from now on, what events change is noted for the replay
        host._touched |= touched | set(future)
        with host._gone_lock:
            host._gone.update(gone)
        host.positions.update(positions)
        host._proven = dict(positions)
        host._listed |= set(positions)  # a bootstrap is for a cold start
        for table, indexer in host.indexers.items():
            for obj in host.cache.items(table):
                indexer.update(obj.key, obj)
        self._snapshot, self._objects = snapshot, added
        self._age = max(0.0, time.time() - float(header.get("written_at", time.time())))
        log.info("snapshot loaded", extra={"controller": host.name, "objects": added, "tombstones": len(tombstones),
                                           "positions": positions, "age": round(self._age, 1)})

    def _unload(self) -> None:
        """Undo :meth:`_load`: the cache empty again, no position (the first repair relists)."""
        host = self.host
        for table, indexer in host.indexers.items():
            for _, key in host.cache.keys(table):
                indexer.update(key, None)
        host.cache.clear()
        if self._snapshot is not None:
            host._listed.difference_update(self._snapshot.header["positions"])  # a bootstrap may serve again
        host.positions.clear()
        host._proven = {}
        host._touched.clear()
        with host._gone_lock:
            host._gone.clear()
        self._snapshot = None

    def verify(self) -> None:
        """Before the first repair (on the dispatch thread): drop the snapshot unless it is this
        store's and the store's history at its positions is the one it saw. Store errors propagate
        (the repair is retried with backoff; the snapshot stays loaded meanwhile)."""
        snapshot = self._snapshot
        if snapshot is None:
            return
        store = self.host.store
        try:
            try:
                identity = store.identity()
            except NotImplementedError as exc:
                raise SnapshotRejected("no_store_identity", str(exc)) from exc
            except StoreUnavailable:
                raise
            except StoreError as exc:  # refused (a read-only user on a store that has none yet)
                raise SnapshotRejected("no_store_identity", str(exc)) from exc
            if snapshot.header.get("store") != store_name(identity):
                raise SnapshotRejected("other_store", f"the snapshot was written from store {snapshot.header.get('store')}"
                                                      f", not {store_name(identity)}")
            check_seal(snapshot, identity)
            check_witness(store, snapshot.header)
        except SnapshotRejected as exc:
            self._rejected = exc
            log.warning("snapshot not used: %s", exc, extra={"controller": self.host.name, "reason": exc.reason})
            self._unload()
            return
        self._snapshot = None  # checked: the first repair replays from its positions

    def started(self, kind: str, cause: str, entries: int, objects: int) -> None:
        """The first repair is done: count how the start went, and hand every key to the reconcilers
        when it resumed (they must see each key once after a start, as after a relist)."""
        if self._rejected is None and kind != "relist":
            result, reason = "resumed", "replay"
            self.host.redeliver()
        else:
            result = "relisted"
            reason = self._rejected.reason if self._rejected is not None else cause
        self.warm_start = WarmStart(result, reason, entries, objects, self._objects, self._age,
                                    time.monotonic() - self._started)
        self._rejected = None
        WARM_STARTS.inc(self.host.name, result, reason)
        log.info("start %s (%s)", result, reason, extra={
            "controller": self.host.name, "result": result, "reason": reason, "entries_read": entries,
            "objects_read": objects, "snapshot_objects": self._objects, "seconds": round(self.warm_start.seconds, 3)})

    # -- writing --------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def close(self) -> None:
        """Stop writing; write a last snapshot (the controller has stopped: nothing changes it now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.write()

    def write(self) -> bool:
        """Write a snapshot now, if the controller has one to write (its first repair done); whether
        it did. A failure (a full disk, a read-only directory, the store unreachable for the
        witness) is counted and logged, and the last good snapshot stays."""
        host = self.host
        if self.pending:
            return False
        with host._repair_lock:  # no repair moves the positions, lowers a version or takes the touched set meanwhile
            positions = dict(host._proven)
            # A table a chunk at a time: touched is read after it. Without the young collections
            # meanwhile: a part of the copy the collector untracked (all its records were) is
            # tracked again, young, by the next record an event makes, and a young collection
            # then walks it whole (a million entries: 28-31 ms of GIL at once); at the end the
            # parts go to the oldest generation, as a relist's records do.
            with _gc_paused():
                tables, tombs, recent = host.cache.export()
            touched = set(host._touched)
            with host._gone_lock:
                gone = list(host._gone.values())
        if set(positions) != set(host.subscriber.topics):
            return False
        try:
            identity = host.store.identity()
            witness = witness_of(host.store, min(positions.values(), default=0))
        except (StoreError, NotImplementedError) as exc:
            host.stats.inc("snapshot_errors", reason="store")
            self._problem = f"snapshot not written: {exc}"
            self._badlog.warning("store", self._problem, controller=host.name)
            return False
        written_at = time.time()
        header = {
            "format": FORMAT, "controller": host.name, "written_at": written_at, "store": store_name(identity),
            "topics": sorted(host.subscriber.topics), "transforms": self.fingerprint, "positions": positions,
            "witness": witness, "objects": sum(len(part) for parts in tables.values() for part in parts),
            "tombstones": sum(map(len, tombs.values())),
            "touched": [list(i) for i in touched | recent],
            "gone": [[o.topic, o.table, o.key, o.version, msgpack.packb(o.value)] for o in gone],
        }
        began = time.monotonic()
        try:
            self.size = write_file(self.directory, header, _chunks(tables, tombs), identity)
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, "os_error")
            host.stats.inc("snapshot_errors", reason=reason)
            self._problem = f"snapshot not written to {self.directory}: {exc.strerror or exc}"
            self._badlog.warning(reason, self._problem, controller=host.name)
            return False
        self.written_at, self._problem = written_at, None
        host.stats.inc("snapshots_written")
        log.debug("snapshot written", extra={"controller": host.name, "bytes": self.size, "objects": header["objects"],
                                             "seconds": round(time.monotonic() - began, 3)})
        return True


def _chunks(tables: dict[str, list[dict[str, tuple[int, str, bytes]]]],
            tombs: dict[str, dict[str, int]]) -> Iterator[list[Any]]:
    """The objects, CHUNK at a time per table and topic, then the tombstones. Each part of
    ``tables`` is dropped once read: freeing the whole copy at the end would hold the GIL for
    as long as copying it did (14 ms at a million objects)."""
    for table, parts in tables.items():
        while parts:
            yield from _part_chunks(table, parts.pop())
    for table, graves in tombs.items():
        dead = iter(graves.items())
        while batch2 := list(islice(dead, CHUNK)):
            yield ["t", table, [k for k, _ in batch2], [v for _, v in batch2]]


def _part_chunks(table: str, rows: dict[str, tuple[int, str, bytes]]) -> Iterator[list[Any]]:
    """The objects of one part of a table, CHUNK at a time per topic."""
    items = iter(rows.items())
    while batch := list(islice(items, CHUNK)):
        by_topic: dict[str, tuple[list[str], list[int], list[bytes]]] = {}
        for key, (version, topic, blob) in batch:
            cols = by_topic.get(topic)
            if cols is None:
                cols = by_topic[topic] = ([], [], [])
            cols[0].append(key)
            cols[1].append(version)
            cols[2].append(blob)
        for topic, (keys, versions, blobs) in by_topic.items():
            yield ["o", table, topic, keys, versions, blobs]
        # Hand the GIL over between chunks: a thread that waits for it otherwise waits for
        # the interpreter's switch interval (5 ms) on top of whatever C call runs then.
        time.sleep(0)


def witness_of(store: Store, position: int) -> list[list[Any]]:
    """The last feed entries at or below ``position`` (up to WITNESS of them): what a start checks
    the store's history against. Empty where the feed no longer holds them (or holds none)."""
    if position <= 0:
        return []
    span = WITNESS
    for _ in range(3):  # etcd's revisions count other keys' writes too: look further back
        try:
            entries = [e for e in store.read_feed(max(0, position - span), 1000) if e.revision <= position]
        except HistoryGone:
            return []
        if entries or position - span <= 0:
            return [[e.revision, e.table, e.key, e.action.value] for e in entries[-WITNESS:]]
        span *= 16
    return []


def check_witness(store: Store, header: dict[str, Any]) -> None:
    """:class:`SnapshotRejected` unless the store's feed holds the snapshot's witness entries as
    they were, and its positions are neither above the store's head nor in a hole a failover left."""
    positions = header["positions"]
    position = min(positions.values(), default=0)
    try:
        head, _ = store.feed_since(position)
        if max(positions.values(), default=0) > head:
            raise SnapshotRejected("history_rewound", f"the snapshot's position is above the store's head {head}")
        witness = header.get("witness") or []
        if witness:
            found = [[e.revision, e.table, e.key, e.action.value]
                     for e in store.read_feed(int(witness[0][0]) - 1, len(witness))]
            if found != witness:
                raise SnapshotRejected("history_rewound", "the store's feed at the snapshot's position holds "
                                                          "other writes than the snapshot saw")
    except HistoryGone as exc:
        raise SnapshotRejected(exc.reason, str(exc)) from exc


def transforms_fingerprint(transforms: Mapping[str, Transform]) -> str:
    """What names the transforms a cache's values went through: a snapshot written with others is not used.
    Each transform by its qualified name and its code (a changed function is another transform)."""
    digest = hashlib.sha256()
    for table, fn in sorted(transforms.items()):
        code = getattr(fn, "__code__", None)
        digest.update(f"{table}\0{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}\0"
                      .encode())
        if code is not None:
            digest.update(code.co_code + repr(code.co_consts).encode())
    return digest.hexdigest()
