"""Secondary indexes over a controller's cache, and the read-only lister reconcilers use.

An index is a function of an object returning the values it is filed under
(``lambda port: [port.value["network"]]`` files ports by network); the
controller keeps each declared index in step with the cache, on the thread
that applies the change, so a reconciler finds related objects without
scanning the table.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping

from ..events import VersionedObject
from ..logs import RateLimitedLog
from .cache import VersionedCache

__all__ = ["IndexFunc", "Indexer", "Lister"]

log = logging.getLogger(__name__)

_NOTHING = object()  # not filed

#: An object -> the index values it is filed under (none, one or several).
IndexFunc = Callable[[VersionedObject], Iterable[Hashable]]


class _Many(frozenset[Hashable]):
    """The values a key is filed under when there are several (one is kept bare)."""

    __slots__ = ()


class Indexer:
    """The declared indexes of one table: index name -> value -> keys. Thread-safe.

    Sized for millions of keys: most keys are filed under one value, and most values of a
    unique index (a MAC address) hold one key, so each is kept bare, not in a set of one
    (~200 bytes a set, per key and index)."""

    def __init__(self, table: str, funcs: Mapping[str, IndexFunc]):
        self.table = table
        self._funcs = dict(funcs)
        self._lock = threading.Lock()
        #: index name -> value -> its key, or the set of its keys when several
        self._index: dict[str, dict[Hashable, str | set[str]]] = {name: {} for name in self._funcs}
        #: index name -> key -> its value, or a _Many of its values when several
        self._filed: dict[str, dict[str, Hashable]] = {name: {} for name in self._funcs}
        self._badlog = RateLimitedLog(log)

    @property
    def names(self) -> list[str]:
        return list(self._funcs)

    def update(self, key: str, obj: VersionedObject | None) -> None:
        """File ``key`` under the values of ``obj`` (None: the object is gone), moving it from its old ones."""
        values = {name: self._values(name, fn, obj) for name, fn in self._funcs.items()}
        with self._lock:
            for name, new in values.items():
                index, filed = self._index[name], self._filed[name]
                held = filed.pop(key, _NOTHING)
                old = held if isinstance(held, _Many) else frozenset() if held is _NOTHING else frozenset((held,))
                for v in old - new:
                    keys = index[v]
                    if isinstance(keys, set):
                        keys.discard(key)
                        if len(keys) == 1:
                            index[v] = next(iter(keys))
                    else:
                        del index[v]
                for v in new - old:
                    others = index.get(v)
                    if others is None:
                        index[v] = key
                    elif isinstance(others, set):
                        others.add(key)
                    else:
                        index[v] = {others, key}
                if new:
                    filed[key] = next(iter(new)) if len(new) == 1 else _Many(new)

    def keys(self, name: str, value: Hashable) -> list[str]:
        """Keys filed under ``value`` in index ``name``."""
        with self._lock:
            try:
                keys = self._index[name].get(value, ())
            except KeyError:
                raise KeyError(f"table {self.table} has no index {name!r}") from None
            return [keys] if isinstance(keys, str) else sorted(keys)

    def values(self, name: str) -> list[Hashable]:
        """The values index ``name`` holds keys under."""
        with self._lock:
            return list(self._index[name])

    def _values(self, name: str, fn: IndexFunc, obj: VersionedObject | None) -> frozenset[Hashable]:
        if obj is None:
            return frozenset()
        try:
            return frozenset(fn(obj))
        except Exception as exc:  # user code on the dispatch thread: the object is just not filed
            self._badlog.warning(f"{self.table}:{name}", "index function failed; object not indexed",
                                 table=self.table, index=name, key=obj.key, error=repr(exc))
            return frozenset()


class Lister:
    """Read-only view of one table of a controller's cache, with its indexes."""

    def __init__(self, cache: VersionedCache, table: str, indexer: Indexer | None,
                 last_known: Callable[[str, str], VersionedObject | None]):
        self.table = table
        self._cache = cache
        self._indexer = indexer
        self._last_known = last_known

    def get(self, key: str) -> VersionedObject | None:
        """The cached object, or None."""
        return self._cache.get(self.table, key)

    def list(self) -> list[VersionedObject]:
        """Every cached object of the table."""
        return self._cache.items(table=self.table)

    def by_index(self, name: str, value: Hashable) -> builtins.list[VersionedObject]:
        """Cached objects filed under ``value`` in index ``name``."""
        get = self._cache.get
        found = (get(self.table, k) for k in self.index_keys(name, value))
        return [o for o in found if o is not None]

    def index_keys(self, name: str, value: Hashable) -> builtins.list[str]:
        """Keys filed under ``value`` in index ``name``."""
        if self._indexer is None:
            raise KeyError(f"table {self.table} has no indexes")
        return self._indexer.keys(name, value)

    def last_known(self, key: str) -> VersionedObject | None:
        """The cached object, or for a deleted one whose delete is not yet reconciled, its final state."""
        return self._cache.get(self.table, key) or self._last_known(self.table, key)
