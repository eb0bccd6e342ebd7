"""Persistent notification queues: bounded two-phase-commit queues on SQLite, Redis or etcd.

``open_queues(url)`` picks the backend by URL scheme, as ``open_store`` does:

- ``sqlite:///path/queues.sqlite`` (the default; it may be the store's own file)
- ``redis://host:port/db`` (Redis 7 through redis-py, one Lua script per call)
- ``etcd://host:port[,host:port]`` (etcd 3.4+, one compare-and-set ``Txn`` per change)

Backends are imported only when opened. See docs/queues.md.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ..backends.extras import needs_extra
from ..backends.sqlite import sqlite_path
from ..backends.urls import REDIS_SCHEMES
from ..errors import ConfigError
from .api import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENTRIES,
    DEFAULT_STALE_AFTER,
    DeadLetter,
    QueueEntry,
    QueueInfo,
    QueueStats,
    QueueStore,
)
from .sharding import shard_for, shard_index, shard_names

__all__ = [
    "QueueStore",
    "QueueEntry",
    "QueueInfo",
    "QueueStats",
    "DeadLetter",
    "open_queues",
    "shard_names",
    "shard_index",
    "shard_for",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_STALE_AFTER",
]


def open_queues(url: str, **options: Any) -> QueueStore:
    """Open the queues at ``url``.

    ``options`` go to the backend: ``prefix`` (key namespace) and ``timeout``
    for Redis and etcd, ``synchronous`` and ``busy_timeout`` for SQLite,
    ``clock`` for all.
    """
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from .sqlite import SqliteQueues

        return SqliteQueues(sqlite_path(url), **options)
    if scheme in REDIS_SCHEMES:
        with needs_extra("the Redis queues"):
            from .redis import RedisQueues

        return RedisQueues(url, **options)
    if scheme == "etcd":
        with needs_extra("the etcd queues"):
            from .etcd import EtcdQueues

        return EtcdQueues(url, **options)
    raise ConfigError(f"unknown queues URL {url!r}; use sqlite:///path, redis://host:port/db, redis+sentinel://host:port[,host:port]/master/db or etcd://host:port")
