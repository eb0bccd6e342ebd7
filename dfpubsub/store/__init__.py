"""The northbound store: versioned objects in tables, behind one contract.

``open_store(url, tables)`` picks the backend by URL scheme:

- ``sqlite:///path/nb.sqlite`` (the default; ``sqlite:///:memory:`` for tests)
- ``etcd://host:port`` (etcd 3.4+ through aetcd)
- ``redis://host:port/db`` (Redis 7 through redis-py, atomic Lua scripts)

Backends are imported only when opened, so the SQLite default needs neither
aetcd nor redis installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from .api import DEFAULT_MAX_VALUE_BYTES, AsyncStore, ObjectVersion, Store
from .feed import FeedEntry, FeedReader, FeedRetention

__all__ = ["Store", "AsyncStore", "ObjectVersion", "open_store", "sqlite_path", "DEFAULT_MAX_VALUE_BYTES",
           "FeedEntry", "FeedReader", "FeedRetention"]


def sqlite_path(url: str) -> str:
    """The file of ``sqlite:///path`` (``:memory:`` for ``sqlite:///:memory:``); ConfigError without one."""
    path = url[len("sqlite://"):]
    if path in ("/:memory:", ":memory:"):
        return ":memory:"
    if not path:
        raise ConfigError(f"sqlite URL needs a path, e.g. sqlite:///var/lib/dfpubsub/nb.sqlite: {url!r}")
    return path


def open_store(url: str, tables: Iterable[str], **options: Any) -> Store:
    """Open the store at ``url`` with the schema ``tables``.

    ``options`` go to the backend: ``max_value_bytes`` for all, ``feed_retention``
    (a :class:`FeedRetention`) for all, ``prefix`` for etcd and Redis (namespace
    of the keys), ``synchronous`` for SQLite.
    """
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from .sqlite import SqliteStore

        return SqliteStore(sqlite_path(url), tables, **options)
    if scheme == "etcd":
        from .etcd import EtcdStore

        return EtcdStore(url, tables, **options)
    if scheme == "redis":
        from .redis import RedisStore

        return RedisStore(url, tables, **options)
    raise ConfigError(f"unknown store URL {url!r}; use sqlite:///path, etcd://host:port or redis://host:port/db")
