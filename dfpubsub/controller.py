"""The controller runtime: keep a local cache equal to the store, in the manner of an informer.

Subscribe, then full-sync from the store, then apply events newer than the
cache; per-table handlers see every create, update and delete exactly as the
cache changes, whether it came from an event or from a resync that found what
the events missed. Resyncs (gaps, a dead publisher, an overflow, a periodic
reconcile) list the store for the affected topics and reconcile; they are
rate-limited with jittered backoff by the subscriber.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from .api import SubscriberTransport
from .cache import Change, VersionedCache
from .events import Action, Event, VersionedObject
from .metrics import Stats
from .relist import relist
from .store import Store
from .subscriber import Subscriber, SubscriberOptions
from .tracker import ResyncRequest

__all__ = ["TableHandler", "Controller", "Bootstrap"]

log = logging.getLogger(__name__)


class TableHandler(Protocol):
    """What a controller does when an object of one table changes."""

    def on_create(self, obj: VersionedObject) -> None:
        """A new object (or one the cache did not have)."""

    def on_update(self, obj: VersionedObject, previous: VersionedObject) -> None:
        """A newer version of a cached object."""

    def on_delete(self, previous: VersionedObject) -> None:
        """The object is gone; ``previous`` is what the cache held."""


#: A first sync from elsewhere than a full listing: (store, topics) -> the listing of those
#: topics, or None to list the store (see dfpubsub.pipeline.bootstrap.SnapshotBootstrap).
Bootstrap = Callable[[Store, set[str]], "list[VersionedObject] | None"]


class Controller:
    """A cache of ``topics`` kept equal to ``store``, calling ``handlers`` per table.

    ``reconcile_interval`` > 0 adds a periodic full reconcile (jittered by
    ±10%), which also repairs a write whose publisher died before publishing.
    ``on_gap`` observes every resync request; ``on_reconciled(topics, changes)``
    is told what each resync found that the events had missed. ``bootstrap``
    replaces the store listing of the first sync of each topic (from a
    compacted snapshot, docs/pipeline.md); later resyncs list the store.
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
    ):
        self.store = store
        self.name = name
        self.handlers = dict(handlers or {})
        self.cache = VersionedCache(tombstone_horizon)
        self.stats = Stats("controller", name)
        self.reconcile_interval = reconcile_interval
        self.on_reconciled = on_reconciled
        self.bootstrap = bootstrap
        self._listed: set[str] = set()  # topics synced once: bootstrap no longer applies to them
        self.subscriber = Subscriber(
            transport, topics, self._on_event, self._on_resync, options, name, on_gap, self.stats
        )
        self._stop = threading.Event()
        self._reconciler: threading.Thread | None = None

    @property
    def synced(self) -> threading.Event:
        """Set once every topic was synced from the store."""
        return self.subscriber.synced

    def connect(self, uri: str) -> None:
        """Add a publisher endpoint."""
        self.subscriber.connect(uri)

    def start(self) -> "Controller":
        """Subscribe and start syncing; returns at once (see :attr:`synced`)."""
        self.subscriber.start()
        if self.reconcile_interval > 0:
            self._reconciler = threading.Thread(target=self._reconcile_loop, name=f"dfpubsub-reconcile-{self.name}",
                                                daemon=True)
            self._reconciler.start()
        return self

    def stop(self) -> None:
        """Stop receiving and reconciling."""
        self._stop.set()
        self.subscriber.close()
        if self._reconciler is not None:
            self._reconciler.join(timeout=5)

    def run_forever(self) -> None:
        """Start, then block until SIGTERM or SIGINT; stop cleanly."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.start()
        self._stop.wait()
        log.info("controller stopping", extra={"controller": self.name})
        self.stop()

    # -- called on the subscriber's dispatch thread -------------------------------

    def _on_event(self, event: Event) -> None:
        previous = self.cache.get(event.table, event.key)
        if not self.cache.apply(event):
            self.stats.inc("stale_events")
            return
        if event.action is Action.DELETE:
            if previous is not None:
                self._dispatch(Action.DELETE, previous, None)
            return
        obj = VersionedObject(event.topic, event.table, event.key, event.version, event.value)
        self._dispatch(Action.CREATE if previous is None else Action.UPDATE, obj, previous)

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
        if self.bootstrap is not None and topics - self._listed:
            truth = self._list(topics)
            changes, listed = self.cache.reconcile(topics, truth), len(truth)
        else:  # versions first, truth wins (dfpubsub.relist)
            changes, listed = relist(self.store, self.cache, topics)
            self._listed |= topics
        handlers = self.handlers
        for ch in changes:
            if ch.table not in handlers:
                continue
            obj = VersionedObject(ch.topic, ch.table, ch.key, ch.version, ch.value)
            if ch.action is Action.DELETE:
                self._dispatch(Action.DELETE, ch.previous or obj, None)
            else:
                self._dispatch(ch.action, obj, ch.previous)
        self.stats.inc("resync_changes", len(changes))
        if self.on_reconciled is not None:
            self.on_reconciled(topics, changes)
        log.info("resynced", extra={"controller": self.name, "topics": sorted(topics),
                                    "objects": listed, "changes": len(changes)})

    def _dispatch(self, action: Action, obj: VersionedObject, previous: VersionedObject | None) -> None:
        handler = self.handlers.get(obj.table)
        if handler is None:
            return
        try:
            if action is Action.CREATE:
                handler.on_create(obj)
            elif action is Action.UPDATE and previous is not None:
                handler.on_update(obj, previous)
            else:
                handler.on_delete(obj)
        except Exception:  # a handler is user code: log it and keep the daemon alive
            self.stats.inc("handler_errors")
            log.exception("table handler failed", extra={"table": obj.table, "key": obj.key})

    def _reconcile_loop(self) -> None:
        rng = random.Random()
        while not self._stop.wait(self.reconcile_interval * rng.uniform(0.9, 1.1)):
            self.subscriber.request_resync(self.subscriber.topics, reason="periodic")
