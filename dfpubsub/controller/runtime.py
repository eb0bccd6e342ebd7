"""The controller runtime: an informer feeding a work queue of keys to level-triggered reconcilers.

Subscribe, full-sync from the store, then apply events newer than the cache;
resyncs (gaps, a dead publisher, an overflow, the periodic store reconcile)
list the store for the affected topics and reconcile the cache. That is the
*dispatch* thread, and all it does per change is apply it to the cache (and
its indexes) and note the key, queued with the others of its envelope (or
resync) on a :class:`~dfpubsub.controller.workqueue.WorkQueue` in one step.
``workers`` threads take keys from the queue and call the table's
:class:`~dfpubsub.controller.reconciler.Reconciler` with the cache's current state; a key
is never with two workers at once, changes arriving meanwhile collapse into
one more reconcile, and a failure is retried with per-key exponential backoff
under an overall token bucket. After ``max_retries`` failures a key moves to
the failed set until its next change or the next periodic re-delivery
(``resync_period``), which hands every cached key to the reconcilers again.

A repair costs what was missed: the controller knows the store revision up
to which its cache is complete (its *position*, set by its first listing)
and repairs a gap, a dead publisher, an overflow or a healed partition by
replaying the store's change feed from there (:mod:`.replay`); it relists
only on its first sync, when the feed's history no longer reaches back, when
the replay would read more than a listing, and on the periodic reconcile
(the safety net). A checkpoint replay every ``checkpoint_interval`` keeps the
position within the feed's history when nothing goes wrong.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import NamedTuple

from ..config import ControllerSettings
from ..console import stop_on_signals
from ..errors import BadValue, HistoryGone
from ..events import Action, Bookmark, Event, VersionedObject
from ..logs import RateLimitedLog
from ..metrics import Stats
from ..resync import ResyncTopics
from ..store import Store
from ..subscriber import Subscriber, SubscriberOptions
from ..tracker import ResyncRequest
from ..transport import SubscriberTransport
from .admission import RelistAdmission
from .bookmarks import FeedStreams
from .cache import DEFAULT_DECODED, Change, Transform, VersionedCache
from .indexer import Indexer, IndexFunc, Lister
from .ratelimit import ExponentialBackoff, RateLimiter, TokenBucket
from .reconciler import HandlerReconciler, ObjectKey, Reconciler, Result, TableHandler
from .relist import relist
from .replay import AheadOfStore, TooFarBehind, replay, replay_limit
from .snapshot import Snapshots
from .workqueue import WorkQueue

__all__ = ["TableHandler", "Controller", "ControllerOptions", "FailedKey", "Bootstrap", "Repair"]

_new = tuple.__new__
_DELETE = Action.DELETE  # an enum member's lookup costs more than the rest of a test for it

log = logging.getLogger(__name__)

#: A first sync from elsewhere than a full listing: (store, topics) -> the listing of those
#: topics, or None to list the store (see dfpubsub.pipeline.bootstrap.SnapshotBootstrap).
Bootstrap = Callable[[Store, set[str]], "list[VersionedObject] | None"]

_Ident = tuple[str, str]  # (table, key): what the work queue holds

#: A resync request's reason -> the cause its repair is counted under.
_CAUSES = {
    "subscribed": "first_sync", "periodic": "periodic", "checkpoint": "checkpoint", "manual": "manual",
    "overflow": "overflow", "feed_lost": "dead_publisher", "publisher_lost": "dead_publisher",
    "publisher_gone": "dead_publisher", "publisher_silent": "dead_publisher", "publisher_evicted": "dead_publisher",
    # The transport's own history is gone (etcd compaction, a Redis stream trimmed or reset): the
    # store's feed usually still has it.
    "compacted": "transport_history", "history_lost": "transport_history", "trimmed": "transport_history",
    "reset": "transport_history", "subscribe_delayed": "transport_history",
    "anchor": "anchor",
}
#: Requests that forget a publisher: its streams' bookmarks prove nothing from then on.
_FORGOTTEN = frozenset({"publisher_lost", "publisher_gone", "publisher_silent", "publisher_evicted"})
#: When several requests were coalesced into one repair, the cause it is counted under.
_PRIORITY = ("periodic", "first_sync", "dead_publisher", "transport_history", "overflow", "gap", "manual",
             "anchor", "checkpoint")


@dataclass(slots=True)
class ControllerOptions:
    """Tuning of a controller's work queue and workers (see the ``[controller]`` config section)."""

    workers: int = 2
    #: Seconds between re-deliveries of every cached key to the reconcilers, jittered ±10% (0: never).
    resync_period: float = 600.0
    #: Failures of a key before it moves to the failed set (0: retry for ever).
    max_retries: int = 0
    queue_size: int = 65536
    retry_base_delay: float = 0.005
    retry_max_delay: float = 1000.0
    retry_qps: float = 10.0
    retry_burst: int = 100
    #: ``synced`` waits for the work queue to drain once after the first full sync.
    sync_drains_queue: bool = True
    #: A repair replays the feed unless it holds more entries than this share of the cached
    #: objects (at least 1000), divided by what an entry costs against an object's version in a
    #: listing (``Store.feed_entry_cost``); then a relist reads less.
    replay_max_ratio: float = 0.5
    #: Seconds without a repair after which a replay moves the position on, so that it stays
    #: within the feed's history (0: never).
    checkpoint_interval: float = 60.0
    #: Objects the cache keeps decoded besides packed: the last ones written (dfpubsub.controller.cache).
    decoded_cache: int = DEFAULT_DECODED
    #: With a ``state_dir``: seconds between snapshots (0: only at a clean stop; :mod:`.snapshot`).
    snapshot_interval: float = 300.0

    @classmethod
    def from_settings(cls, s: ControllerSettings) -> ControllerOptions:
        """The work queue's and workers' share of ``[controller]``."""
        return cls(s.workers, s.resync_period, s.max_retries, s.queue_size, s.retry_base_delay, s.retry_max_delay,
                   s.retry_qps, s.retry_burst, s.sync_drains_queue, s.replay_max_ratio, s.checkpoint_interval,
                   s.decoded_cache, s.snapshot_interval)


class Repair(NamedTuple):
    """One repair of the cache: ``kind`` "replay" or "relist", its ``cause``, the feed entries and the
    objects it read, the changes it found, the revision the cache is complete up to after it, and
    when (wall clock)."""

    kind: str
    cause: str
    topics: tuple[str, ...]
    entries: int
    objects: int
    changes: int
    position: int
    at: float


class FailedKey(NamedTuple):
    """A key given up after ``max_retries``: its last error, and when (wall clock)."""

    key: ObjectKey
    error: str
    failures: int
    since: float


class Controller:
    """A cache of ``topics`` kept equal to ``store``, reconciled per table by workers.

    ``reconcilers`` maps a table to its :class:`~dfpubsub.controller.reconciler.Reconciler`;
    ``handlers`` maps a table to an edge-triggered ``TableHandler``, run through
    :class:`~dfpubsub.controller.reconciler.HandlerReconciler`. ``indexers`` declares
    secondary indexes per table (``{"port": {"by_network": fn}}``), read
    through :meth:`lister`. ``runtime`` sizes the work queue, the workers and
    the retries. ``synced`` is set once the first full sync is in the cache
    and (``sync_drains_queue``) reconciled. ``reconcile_interval`` > 0 adds a periodic store
    reconcile (jittered by ±10%), which also repairs a write whose publisher
    died before publishing. ``on_gap`` observes every resync request;
    ``on_reconciled(topics, changes)`` is told what each resync found that the
    events had missed. ``bootstrap`` replaces the store listing of the first
    sync of each topic (from a compacted snapshot, docs/pipeline.md). ``transforms`` maps a table
    to a function applied to each of its values before it is cached (client-go's
    ``SetTransform``): what reconcilers, indexes and listers see. ``feeds(publisher_id)`` names the
    feed publishers (df-feed) whose bookmarks move the positions without reading the store
    (:mod:`.bookmarks`; :class:`~dfpubsub.controller.bookmarks.FeedIds` is a set of ids that
    discovery's connector can keep up to date); None: positions move by replays only.
    ``state_dir``: a directory where the controller keeps a snapshot of its cache and positions
    and from which a start resumes, reading only what changed while it was down (:mod:`.snapshot`).
    ``admission`` bounds the relists a fleet runs against the store at once, and reads them in pages
    (:mod:`.admission`).
    """

    def __init__(
        self,
        store: Store,
        transport: SubscriberTransport,
        topics: Iterable[str],
        handlers: Mapping[str, TableHandler] | None = None,
        options: SubscriberOptions | None = None,
        name: str = "controller",
        reconcile_interval: float = 0.0,
        tombstone_horizon: float = 300.0,
        on_gap: Callable[[ResyncRequest], None] | None = None,
        on_reconciled: Callable[[set[str], list[Change]], None] | None = None,
        bootstrap: Bootstrap | None = None,
        *,
        reconcilers: Mapping[str, Reconciler] | None = None,
        indexers: Mapping[str, Mapping[str, IndexFunc]] | None = None,
        runtime: ControllerOptions | None = None,
        transforms: Mapping[str, Transform] | None = None,
        feeds: Callable[[str], bool] | None = None,
        state_dir: str | None = None,
        admission: RelistAdmission | None = None,
    ):
        self.store = store
        self.name = name
        self.runtime = rt = runtime or ControllerOptions()
        if rt.workers < 1:
            raise ValueError("a controller needs at least one worker")
        self.handlers = dict(handlers or {})
        self.reconcilers: dict[str, Reconciler] = {t: HandlerReconciler(h) for t, h in self.handlers.items()}
        self.reconcilers.update(reconcilers or {})
        # Values come packed (wire schema 2) and stay so; indexed tables' are decoded as applied.
        self.cache = VersionedCache(tombstone_horizon, transforms=transforms, decoded=rt.decoded_cache,
                                    decoded_tables=(indexers or {}).keys(), ordered=bool(state_dir))
        self.indexers = {t: Indexer(t, funcs) for t, funcs in (indexers or {}).items()}
        self.stats = stats = Stats("controller", name)
        self.queue: WorkQueue[_Ident] = WorkQueue(
            RateLimiter(ExponentialBackoff(rt.retry_base_delay, rt.retry_max_delay),
                        TokenBucket(rt.retry_qps, rt.retry_burst)),
            rt.queue_size, stats,
        )
        self.reconcile_interval = reconcile_interval
        self.on_reconciled = on_reconciled
        self.bootstrap = bootstrap
        self._listed: set[str] = set()  # topics synced once: bootstrap no longer applies to them
        # Final states of deleted keys until their delete is reconciled (for cleanup).
        self._gone: dict[_Ident, VersionedObject] = {}
        self._gone_lock = threading.Lock()
        self._failed: dict[_Ident, FailedKey] = {}
        stats.set("reconcile_failed_keys", lambda: len(self._failed))
        self._badlog = RateLimitedLog(log)
        #: Per topic, the store revision up to which the cache holds every committed write.
        self.positions: dict[str, int] = {}
        #: The positions as the store last proved them (a repair, or its head at a checkpoint):
        #: where they go back to when a bookmark turns out to be ahead of the store.
        self._proven: dict[str, int] = {}
        self.feed_streams = FeedStreams(feeds) if feeds is not None else None
        self.admission = admission
        self._touched: set[_Ident] = set()  # changed by events since the last repair, not yet checked
        self._last_repair = time.monotonic()
        #: The latest repair (None before the first sync).
        self.last_repair: Repair | None = None
        stats.set("repair_position", lambda: min(self.positions.values(), default=0))
        stats.set("cache_transform_errors", lambda: self.cache.transform_errors)
        usage = self.cache.usage
        stats.set_by("cache_objects", "table", lambda: {t: u.objects for t, u in usage().items()})
        stats.set_by("cache_bytes", "table", lambda: {t: u.bytes for t, u in usage().items()})
        stats.set_by("cache_tombstones", "table", lambda: {t: u.tombstones for t, u in usage().items()})
        self.synced = threading.Event()
        self._repair_lock = threading.Lock()  # a snapshot's cut waits for the repair under way
        #: With a ``state_dir``: warm restarts from a snapshot there (:mod:`.snapshot`).
        self.snapshots = Snapshots(self, state_dir, rt.snapshot_interval, transforms or {}) if state_dir else None
        self.subscriber = Subscriber(
            transport, topics, None, self._on_resync, replace(options or SubscriberOptions(), packed_values=True),
            name, on_gap, stats, on_events=self._on_events,
            on_bookmark=self._on_bookmark if feeds is not None else None,
            on_passed=self._on_passed if feeds is not None else None,
        )
        self.cache.on_bad_value = self.subscriber.bad_value
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def connect(self, uri: str) -> None:
        """Add a publisher endpoint."""
        self.subscriber.connect(uri)

    def lister(self, table: str) -> Lister:
        """Read-only access to ``table`` in the cache and its indexes."""
        return Lister(self.cache, table, self.indexers.get(table), self._last_known)

    def failed(self) -> list[FailedKey]:
        """Keys given up after ``max_retries`` failures, until a reconcile of theirs succeeds (after
        their next change or at the next re-delivery)."""
        return sorted(self._failed.values())

    def start(self) -> Controller:
        """Subscribe and start syncing; returns at once (see :attr:`synced`), once a ``state_dir``'s
        snapshot is loaded (a second or so per 100,000 objects)."""
        self._threads = [
            threading.Thread(target=self._work_loop, name=f"dfpubsub-reconcile-{self.name}-{i}", daemon=True)
            for i in range(self.runtime.workers)
        ]
        self._threads.append(threading.Thread(target=self._timer_loop, name=f"dfpubsub-timer-{self.name}",
                                              daemon=True))
        for t in self._threads:
            t.start()
        if self.snapshots is not None:
            self.snapshots.start()  # into the cache before anything is subscribed
        self.subscriber.start()
        return self

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads :meth:`start` started, the subscriber's included (for a liveness probe)."""
        return self._threads + self.subscriber.threads

    def stop(self, timeout: float = 5.0) -> None:
        """Stop receiving; workers finish the key they hold and exit (waited for ``timeout``
        seconds in all: a reconcile that hangs does not hold up the exit)."""
        self._stop.set()
        self.queue.shutdown()  # first: a dispatch thread blocked on a full queue returns
        self.subscriber.close()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.snapshots is not None:
            self.snapshots.close()

    def run_forever(self) -> None:
        """Start, then block until SIGTERM or SIGINT; stop cleanly."""
        stop_on_signals(self._stop)
        self.start()
        self._stop.wait()
        log.info("controller stopping", extra={"controller": self.name})
        self.stop()

    def redeliver(self) -> int:
        """Hand every cached key (and every pending delete) to the reconcilers again; return how many."""
        tables = self.reconcilers
        with self._gone_lock:
            keys = list(self._gone)
        keys += [ident for ident in self.cache.keys() if ident[0] in tables]
        keys += list(self._failed)
        add = self.queue.add
        # Once each: a failed key is cached too, and its second add could land after a worker took
        # the first, and run it again for nothing.
        keys = list(dict.fromkeys(keys))
        for ident in keys:
            add(ident)
        self.stats.inc("redeliveries", len(keys))
        return len(keys)

    # -- the dispatch thread: cache, indexes, queue ----------------------------------------

    def _on_events(self, events: list[Event]) -> None:
        """Apply an envelope's events to the cache (and indexes) and queue the keys they changed, in
        one step (one lock round and one wake-up for them all). The dispatch thread's hot path."""
        streams = self.feed_streams
        if streams is not None and events and streams.is_feed(events[0].publisher_id):
            self._on_feed_events(events, streams)
        else:
            self._apply(events, None)

    def _on_feed_events(self, events: list[Event], streams: FeedStreams) -> None:
        """A feed publisher's envelope: applied as any other; its sequences are noted for the
        bookmarks that follow (:mod:`.bookmarks`), and its objects vouched for (no longer touched:
        :meth:`VersionedCache.vouch`), so that a position that bookmarks moved leaves nothing for
        the next replay to read back."""
        first = events[0]
        took: list[bool] = []
        try:
            self._apply(events, took)
        except BaseException:
            streams.broken(first.publisher_id, first.topic)
            raise
        streams.applied(first.publisher_id, first.topic, first.seq, events[-1].seq)
        vouched = self.cache.vouch(events, took)
        if self._touched:
            self._touched.difference_update(vouched)

    def _apply(self, events: list[Event], took: list[bool] | None) -> None:
        """:meth:`_on_events`' work; ``took`` collects whether the cache took each event."""
        apply, get, reconcilers, indexers = self.cache.apply, self.cache.get, self.reconcilers, self.indexers
        pending: list[_Ident] = []
        stale = 0
        # The cache is complete up to its topic's position: an event at or below it brings nothing
        # the cache lacks, and applied it could bring back an object deleted below the position (a
        # repair leaves no tombstone for what it did not see; found by the model, docs/model.md).
        floor = self.positions.get(events[0].topic, 0) if events else 0
        try:
            for event in events:
                if event.version <= floor:
                    stale += 1
                    if took is not None:
                        took.append(False)
                    continue
                table = event.table
                if event.action is _DELETE:
                    evicted = False
                    try:
                        previous = get(table, event.key)
                    except BadValue:  # evicted (and repaired): its reconciler still hears of the delete
                        previous, evicted = None, True
                    ok = apply(event)
                    if took is not None:
                        took.append(ok)
                    if not ok:
                        stale += 1
                    elif previous is not None or evicted:
                        self._changed(table, event.key, None, previous, indexers.get(table), pending)
                    continue
                ok = apply(event)
                if took is not None:
                    took.append(ok)
                if not ok:
                    stale += 1
                    continue
                if indexers:
                    indexer = indexers.get(table)
                    if indexer is not None:
                        indexer.update(event.key, get(table, event.key))
                if table in reconcilers:
                    ident = (table, event.key)
                    if self._gone:
                        self._forget_gone(ident)
                    pending.append(ident)
        finally:  # what is in the cache must reach the reconcilers, should a later event fail
            if stale:
                self.stats.inc("stale_events", stale)
            if pending:
                self.queue.add_many(pending)

    def _on_bookmark(self, bookmark: Bookmark) -> None:
        """A feed publisher's bookmark, in band: move the positions it proves (:mod:`.bookmarks`);
        for the streams it cannot anchor yet, ask once for a replay, whose completion anchors them."""
        streams = self.feed_streams
        assert streams is not None  # set with the handler
        moved, unanchored = streams.bookmark(bookmark, self.positions)
        if moved:
            self.positions.update(moved)
            self.stats.inc("bookmark_moves")
        if unanchored:
            self.subscriber.request_resync(unanchored, reason="anchor")

    def _on_passed(self, request: ResyncRequest) -> None:
        """A resync request reached the dispatch thread: the numbers it passed over break the
        publisher's stream (:mod:`.bookmarks`), and a publisher forgotten proves nothing more."""
        streams = self.feed_streams
        if streams is None or not request.publisher_id:
            return
        if request.reason in _FORGOTTEN:
            streams.forget(request.publisher_id)
        elif request.missing is not None:
            streams.passed(request.publisher_id, request.topic, request.missing[1])

    def _list(self, topics: set[str]) -> list[VersionedObject]:
        """The source of truth for ``topics``: the bootstrap for those never synced, else the store."""
        fresh = topics - self._listed if self.bootstrap is not None else set()
        truth = self.bootstrap(self.store, fresh) if fresh and self.bootstrap is not None else None
        if truth is None:
            truth = self.store.list_topics(topics)
        elif topics - fresh:
            truth.extend(self.store.list_topics(topics - fresh))
        self._listed |= topics
        return truth

    def _on_resync(self, topics: set[str]) -> None:
        with self._repair_lock:
            self._resync(topics)

    def _resync(self, topics: set[str]) -> None:
        # Why each topic is repaired came with it from the subscriber's resync scheduler (a failed
        # repair's reasons come back with its next run): counted under one cause.
        reasons = topics.reasons if isinstance(topics, ResyncTopics) else {}
        causes = {_CAUSES.get(r, "gap") for rs in reasons.values() for r in rs}
        if self.snapshots is not None and self.snapshots.pending:
            self.snapshots.verify()
            causes.add("first_sync")  # a resumed start's replay is its first sync
        cause = next((c for c in _PRIORITY if c in causes), "manual")
        if self.bootstrap is not None and topics - self._listed:
            truth = self._list(topics)
            changes, read, entries, how = self.cache.reconcile(topics, truth), len(truth), 0, "relist"
            changed = len(changes)
            cause = "first_sync"
            self.stats.inc("relists", reason=cause)
        else:
            changes, changed, read, entries, how, cause = self._repair(topics, cause)
        self._last_repair = time.monotonic()
        position = min(self.positions.values(), default=0)
        self.last_repair = Repair(how, cause, tuple(sorted(topics)), entries, read, changed, position, time.time())
        if self.snapshots is not None and self.snapshots.pending:
            self.snapshots.started(how, cause, entries, read)
        reconcilers, indexers = self.reconcilers, self.indexers
        wanted = reconcilers.keys() | indexers.keys()
        pending: list[_Ident] = []
        for ch in changes if wanted else ():  # a cache-only controller: a million changes to skip
            if ch.table not in wanted:
                continue
            # A value is None only where no index reads it (see _repair's relist).
            obj = None if ch.action is Action.DELETE else VersionedObject(ch.topic, ch.table, ch.key, ch.version,
                                                                          ch.value)
            self._changed(ch.table, ch.key, obj, ch.previous, indexers.get(ch.table), pending)
        if pending:
            self.queue.add_many(pending)
        self.stats.inc("resync_changes", changed)
        if self.on_reconciled is not None:
            self.on_reconciled(topics, changes)
        log.log(logging.DEBUG if cause == "checkpoint" and not changes else logging.INFO, "repaired by %s", how,
                extra={"controller": self.name, "topics": sorted(topics), "cause": cause, "entries_read": entries,
                       "objects_read": read, "changes": changed, "position": position})

    def _repair(self, topics: set[str], cause: str) -> tuple[list[Change], int, int, int, str, str]:
        """Repair ``topics`` by replay, or by relist where a replay cannot (see the module's doc);
        (changes, how many (built or not), objects read, feed entries read, "replay" or "relist",
        the cause it is counted under)."""
        positions = self.positions
        if cause != "periodic" and positions and topics <= positions.keys():
            covered = set(positions)  # the feed is read for all: each topic's entries come along
            touched = self._touched
            touched |= self.cache.take_touched()
            if cause == "checkpoint" and not touched and positions != self._proven and self._prove():
                return [], 0, 0, 0, "proof", cause
            limit = replay_limit(self.store, self.cache, self.runtime.replay_max_ratio)
            try:
                try:
                    done = replay(self.store, self.cache, covered, min(positions.values()), max_entries=limit,
                                  touched=touched)
                except AheadOfStore:
                    if positions == self._proven:
                        raise
                    self._refuse_bookmarks()  # then from where the store last proved the cache complete
                    done = replay(self.store, self.cache, covered, min(positions.values()), max_entries=limit,
                                  touched=touched)
            except HistoryGone as exc:  # HistoryRewound (a failover's hole): "history_rewound"
                cause = exc.reason
            except AheadOfStore:  # the store went back below what it proved: a failover, an older backup
                cause = "history_rewound"
            except TooFarBehind:
                cause = "too_far_behind"
            else:
                touched.clear()
                for topic in covered:
                    positions[topic] = done.position
                self._proven = dict(positions)
                if done.complete and self.feed_streams is not None:
                    self.feed_streams.repaired(covered)
                self.stats.inc("replays", reason=cause)
                self.stats.inc("replay_entries", done.entries)
                self.stats.inc("replay_objects", done.objects)
                return done.changes, len(done.changes), done.objects, done.entries, "replay", cause
        elif cause != "periodic":
            cause = "first_sync"
        if cause in ("history_gone", "history_rewound", "too_far_behind"):
            # Every topic's position is as far behind as the replay's start: relist them all, or
            # the next repair would start from the same place and fail the same way.
            topics = topics | positions.keys()
        # versions first, truth wins (dfpubsub.controller.relist)
        # The changes' values feed only indexes and on_reconciled: without them a first sync never
        # holds every value decoded at once (reconcilers read the cache). Without reconcilers either,
        # nothing acts on a change: a first sync builds none.
        values = bool(self.indexers or self.on_reconciled)
        admission = self.admission
        with admission.turn(self.stats, self._stop) if admission is not None else nullcontext():
            found = relist(self.store, self.cache, topics, values=values, changes=values or bool(self.reconcilers),
                           page_size=admission.page_size if admission is not None else 0)
        self._listed |= topics
        if topics >= positions.keys():
            self._touched.clear()
            self.cache.take_touched()  # the listing checked them all; from now on, note changes
        else:
            self._touched |= self.cache.take_touched()
        for topic in topics:
            positions[topic] = found.revision
        self._proven = dict(positions)
        if self.feed_streams is not None:  # a listing reflects every write committed before it began
            self.feed_streams.repaired(topics)
        self.stats.inc("relists", reason=cause)
        self.stats.inc("relist_objects", found.objects)
        self.stats.inc("relist_pages", found.pages)
        return found.changes, found.changed, found.objects, 0, "relist", cause

    def _prove(self) -> bool:
        """A checkpoint with nothing touched since the last repair, where bookmarks moved the
        positions: one read of the store's head proves them (a bookmark can only name a revision
        the store has reached) instead of a replay of every entry since; False (and the positions
        back where the store last proved them) if one is ahead of it."""
        head = self.store.feed_head()
        if max(self.positions.values()) > head:
            self._refuse_bookmarks()
            return False
        self._proven = dict(self.positions)
        self.stats.inc("checkpoint_proofs")
        return True

    def _refuse_bookmarks(self) -> None:
        """A position is ahead of the store's head: only a bookmark (forged, or from a store that
        went back) can have put it there. Back to where the store last proved the cache complete."""
        self.stats.inc("bookmarks_refused", reason="ahead_of_store")
        self._badlog.warning("bookmark", "a bookmark named a revision the store has not reached; positions reset",
                             controller=self.name, positions=dict(self.positions), proven=dict(self._proven))
        self.positions.clear()
        self.positions.update(self._proven)

    def _changed(self, table: str, key: str, obj: VersionedObject | None, previous: VersionedObject | None,
                 indexer: Indexer | None, pending: list[_Ident]) -> None:
        """The cache changed ``key`` from ``previous`` to ``obj`` (None: deleted): index it, and note it
        in ``pending`` to be queued."""
        if indexer is not None:
            indexer.update(key, obj)
        if table not in self.reconcilers:
            return
        ident = (table, key)
        if obj is None and previous is not None:
            with self._gone_lock:
                self._gone[ident] = previous
        elif self._gone:
            self._forget_gone(ident)
        pending.append(ident)

    def _forget_gone(self, ident: _Ident, only: VersionedObject | None = None) -> None:
        with self._gone_lock:
            if only is None or self._gone.get(ident) is only:
                self._gone.pop(ident, None)

    def _last_known(self, table: str, key: str) -> VersionedObject | None:
        return self._gone.get((table, key))

    # -- workers ----------------------------------------------------------------------------

    def _work_loop(self) -> None:
        """Take keys in batches and reconcile each with the cache's current state.

        The hot path of a controller, one pass per key: the reconcile is inlined here and what
        it reads is bound once, since with the GIL every step of it delays the dispatch thread
        too (tools/bench/controller.py)."""
        queue, stats, start = self.queue, self.stats, self.queue.start
        lookup, reconcilers, gone, failed = self.cache.lookup(), self.reconcilers, self._gone, self._failed
        failing = queue.limiter.failing  # keys with a backoff to forget: usually none
        # Keys come in batches (one lock round each); idle workers take the batch's tail, so
        # no key waits behind a slow one while another worker could run it.
        taken: list[_Ident] = []
        batch = queue.done_and_take(taken, 32)
        while batch:
            taken, done = [], 0
            while batch:
                try:
                    ident = batch.popleft()
                except IndexError:  # another worker took the last one
                    break
                taken.append(ident)
                start(ident)  # changes made while it waited in the batch are read now: no extra run
                try:
                    obj = lookup(ident)  # BadValue: evicted and repaired; retried with backoff
                    last = gone.get(ident) if obj is None else None
                    # tuple.__new__: the named tuple's own __new__ is a Python lambda, a cost per key.
                    result: Result | None = reconcilers[ident[0]].reconcile(_new(ObjectKey, ident), obj)
                    if result is None or not (result.requeue or result.requeue_after > 0):
                        if failing:
                            queue.forget(ident)
                        if failed:
                            failed.pop(ident, None)
                        if last is not None:
                            self._forget_gone(ident, only=last)
                        done += 1
                    else:
                        self._requeue(ident, result)
                except Exception as exc:  # user code: retry with backoff, never kill the worker
                    self._failure(ident, exc)
            if done:
                stats.inc("reconciles", done, reason="done")
            batch = queue.done_and_take(taken, 32)

    def _requeue(self, ident: _Ident, result: Result) -> None:
        """The reconciler asked for ``ident`` again: after ``requeue_after``, else with backoff."""
        self.stats.inc("reconciles", reason="requeue")
        if result.requeue_after > 0:
            self.queue.forget(ident)
            self.queue.add_after(ident, result.requeue_after)
        else:
            self.queue.add_rate_limited(ident)

    def _failure(self, ident: _Ident, exc: Exception) -> None:
        """``ident``'s reconcile raised ``exc``: retry it with backoff, or give it up."""
        try:
            self.stats.inc("reconciles", reason="error")
            failures = self.queue.retries(ident) + 1
            limit = self.runtime.max_retries
            if limit and failures > limit:
                self.queue.forget(ident)
                self._failed[ident] = FailedKey(ObjectKey(*ident), repr(exc), failures, time.time())
                self.stats.inc("reconcile_failed")
                log.error("reconcile failed %d times; key given up until its next change or resync", failures,
                          extra={"controller": self.name, "table": ident[0], "key": ident[1], "error": repr(exc)})
                return
            self._badlog.warning(ident[0], "reconcile failed; retrying with backoff", controller=self.name,
                                 table=ident[0], key=ident[1], failures=failures, error=repr(exc))
        except Exception:  # a bug here must not cost a worker nor the key: log it and retry the key
            log.exception("controller worker failed", extra={"controller": self.name, "key": list(ident)})
        self.queue.add_rate_limited(ident)

    # -- timers -----------------------------------------------------------------------------

    def _next_checkpoint(self) -> float:
        interval = self.runtime.checkpoint_interval
        return self._last_repair + interval if interval > 0 and self.positions else float("inf")

    def _timer_loop(self) -> None:
        """Sets ``synced``, then re-delivers every ``resync_period`` and reconciles every ``reconcile_interval``."""
        rt, stop, rng = self.runtime, self._stop, random.Random()

        def jittered(period: float) -> float:
            return time.monotonic() + period * rng.uniform(0.9, 1.1) if period > 0 else float("inf")

        next_reconcile = jittered(self.reconcile_interval)
        while not self.synced.is_set() and not stop.is_set():
            if self.subscriber.synced.wait(0.1) and (not rt.sync_drains_queue or self.queue.wait_idle(0.1)):
                self.synced.set()
                log.info("controller synced", extra={"controller": self.name, "objects": len(self.cache)})
            if time.monotonic() >= next_reconcile:
                self.subscriber.request_resync(self.subscriber.topics, reason="periodic")
                next_reconcile = jittered(self.reconcile_interval)
        next_redeliver = jittered(rt.resync_period)
        while not stop.wait(min(max(0.0, min(next_redeliver, next_reconcile, self._next_checkpoint())
                                    - time.monotonic()), 3600.0)):
            now = time.monotonic()
            if now >= self._next_checkpoint():
                self._last_repair = now  # asked for: not again before the repair had its chance
                self.subscriber.request_resync(list(self.positions), reason="checkpoint")
            if now >= next_redeliver:
                n = self.redeliver()
                log.info("re-delivered every cached key", extra={"controller": self.name, "keys": n,
                                                                 "failed": len(self._failed)})
                next_redeliver = jittered(rt.resync_period)
            if now >= next_reconcile:
                self.subscriber.request_resync(self.subscriber.topics, reason="periodic")
                next_reconcile = jittered(self.reconcile_interval)
