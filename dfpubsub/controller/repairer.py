"""The cheap repair for a plain :class:`~dfpubsub.subscriber.Subscriber` with a store: what a
:class:`~dfpubsub.controller.runtime.Controller` does, as an ``on_resync`` handler.

The first sync of a topic is a listing (:func:`.relist`); it sets the topic's *position*, the
store revision up to which the cache holds every committed write. Every later resync (a gap, a
dead publisher, an overflow) replays the store's change feed from there (:func:`.replay`) and
reads back only what the cache missed; it relists only where a replay cannot serve: the feed's
history is gone below the position, it holds more entries than a listing would read, or the
store is behind the position (a failover took it back). The controller adds to this the feed
publishers' bookmarks, checkpoints and a periodic relist (docs/controller.md).

::

    repair = Repairer(store, cache)
    sub = Subscriber(transport, ["port"], on_event=cache.apply, on_resync=repair)
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import HistoryGone
from ..store import Store
from .cache import Change, VersionedCache
from .relist import relist
from .replay import AheadOfStore, TooFarBehind, replay, replay_limit

__all__ = ["Repairer"]


class Repairer:
    """``on_resync`` for a :class:`~dfpubsub.subscriber.Subscriber` that applies events to
    ``cache``: repairs ``topics`` from ``store`` by replay, by relist on their first sync (and
    where a replay cannot). ``replay_max_ratio`` as the controller's (``[controller]``).
    ``on_changes(topics, changes)`` is told what each repair found that the events had missed.
    ``replays`` and ``relists`` count the repairs of each kind, ``last`` is the latest:
    :class:`~dfpubsub.controller.replay.Replayed` or :class:`~dfpubsub.controller.relist.Relisted`."""

    def __init__(self, store: Store, cache: VersionedCache, *, replay_max_ratio: float = 0.5,
                 on_changes: Callable[[set[str], list[Change]], None] | None = None):
        self.store = store
        self.cache = cache
        self.replay_max_ratio = replay_max_ratio
        self.on_changes = on_changes
        #: Per topic, the store revision up to which the cache holds every committed write.
        self.positions: dict[str, int] = {}
        self.replays = 0
        self.relists = 0
        self.last: object = None
        self._touched: set[tuple[str, str]] = set()  # changed by events since the last repair

    def __call__(self, topics: set[str]) -> None:
        changes = self._repair(set(topics))
        if self.on_changes is not None:
            self.on_changes(set(topics), changes)

    def _repair(self, topics: set[str]) -> list[Change]:
        positions, cache = self.positions, self.cache
        if positions and topics <= positions.keys():
            self._touched |= cache.take_touched()
            try:
                done = replay(self.store, cache, set(positions), min(positions.values()),
                              max_entries=replay_limit(self.store, cache, self.replay_max_ratio),
                              touched=self._touched)
            except (HistoryGone, TooFarBehind, AheadOfStore):
                # Every position is as far behind as the replay's start: relist them all, or the
                # next repair would start from the same place and fail the same way.
                topics |= positions.keys()
            else:
                self._touched.clear()
                positions.update(dict.fromkeys(positions, done.position))
                self.replays += 1
                self.last = done
                return done.changes
        found = relist(self.store, cache, topics)
        if topics >= positions.keys():
            self._touched.clear()
            cache.take_touched()  # the listing checked them all; from now on, note what events change
        else:
            self._touched |= cache.take_touched()
        positions.update(dict.fromkeys(topics, found.revision))
        self.relists += 1
        self.last = found
        return found.changes
