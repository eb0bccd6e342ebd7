"""The northbound store: versioned objects in tables, behind one contract.

``open_store(url, tables)`` picks the backend by URL scheme:

- ``sqlite:////abs/path/nb.sqlite``, ``sqlite:///relative/nb.sqlite`` (the default;
  ``sqlite:///:memory:`` for tests)
- ``etcd://host:port`` (etcd 3.4+ through aetcd)
- ``redis://host:port/db`` (Redis 7 through redis-py, atomic Lua scripts)

Backends are imported only when opened, so the SQLite default needs neither
aetcd nor redis installed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..backends.extras import needs_extra
from ..backends.sqlite import require_sqlite_file, sqlite_path
from ..backends.startup import retry_unreachable
from ..backends.urls import REDIS_SCHEMES, redacted
from ..console import one_line
from ..errors import ConfigError, StoreMissing
from ..logs import RateLimitedLog
from .api import DEFAULT_MAX_VALUE_BYTES, AsyncStore, ObjectVersion, Store
from .feed import FeedEntry, FeedReader, FeedRetention

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["Store", "AsyncStore", "ObjectVersion", "open_store", "open_store_from_settings",
           "DEFAULT_MAX_VALUE_BYTES", "MISSING_HINT", "FeedEntry", "FeedReader", "FeedRetention"]


_CREATE_HINT = "create it with df-db init (or set [store] create = true)"
#: What to do about a store that does not exist, as daemons say it.
MISSING_HINT = f"{_CREATE_HINT}, or fix store.url"
#: The same for a store on a server, which its prefix locates too.
_MISSING_ON_SERVER_HINT = f"{_CREATE_HINT}, or fix store.url or store.prefix"


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
        with needs_extra("the etcd store"):
            from .etcd import EtcdStore

        return EtcdStore(url, tables, **options)
    if scheme in REDIS_SCHEMES:
        with needs_extra("the Redis store"):
            from .redis import RedisStore

        return RedisStore(url, tables, **options)
    raise ConfigError(f"unknown store URL {url!r}; use sqlite:///path, etcd://host:port, redis://host:port/db or redis+sentinel://host:port[,host:port]/master/db")


def open_store_from_settings(settings: Settings, create: bool = False, *, wait: float | None = 0.0) -> Store:
    """Open the store that ``[store]`` describes. With ``create`` or ``[store] create`` it is made
    if it was not (:meth:`Store.initialize`); otherwise it must have been
    (:class:`~dfpubsub.errors.StoreMissing`, naming where it was looked for, at once).

    ``wait`` is the daemons' start-up policy (:mod:`dfpubsub.backends.startup`) for a library
    user's own: a store that does not answer, or refuses the credentials, is tried again with
    backoff (0.5 s doubling to 10 s, a warning at most every 10 s) for up to ``wait`` seconds,
    None for as long as it takes; then its StoreUnavailable (or AuthenticationError) is raised.
    The default, 0, tries once."""
    url = redacted(settings.store.url)
    store = retry_unreachable(lambda: _open_configured(settings, create), lambda exc: _warn.warning(
        url, "cannot reach the store; retrying", store=url, error=one_line(exc)), wait=wait)
    assert store is not None  # no stop event: it returns a store or raises
    return store


#: The warning a library user's wait logs, at most every 10 s per store (as a daemon's).
_warn = RateLimitedLog(logging.getLogger(__name__), interval=10.0)


def _open_configured(settings: Settings, create: bool) -> Store:
    s = settings.store
    make = create or s.create
    if not make:
        require_sqlite_file(s.url, MISSING_HINT)
    options: dict[str, Any] = {"max_value_bytes": s.max_value_bytes,
                               "feed_retention": FeedRetention(settings.feed.max_entries, settings.feed.max_age)}
    if not s.url.startswith("sqlite"):
        options["prefix"] = s.prefix
    store = open_store(s.url, s.tables, **options)
    try:
        if make:
            store.initialize()
        elif not store.initialized():
            raise StoreMissing(f"no store at {redacted(s.url)} under prefix {s.prefix!r} (nothing was ever written "
                               f"there); {_MISSING_ON_SERVER_HINT}")
    except BaseException:
        store.close()
        raise
    return store
