"""Opening a semaphore of relist slots by URL (the store's, where the slots are shared)."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..backends.extras import needs_extra
from ..backends.urls import REDIS_SCHEMES
from ..errors import ConfigError
from .api import SlotBackend

__all__ = ["open_slots"]


def open_slots(url: str, name: str, timeout: float, prefix: str = "dfpubsub") -> SlotBackend:
    """The semaphore ``name`` in the backend of ``url`` (sqlite:///, etcd://, redis://); ``timeout``
    bounds each call. ConfigError for another scheme; MissingExtra naming the extra to install."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from .sqlite import SqliteSlots

        return SqliteSlots(url, name, timeout)
    if scheme == "etcd":
        with needs_extra("the etcd relist slots"):
            from .etcd import EtcdSlots

        return EtcdSlots(url, name, timeout, prefix)
    if scheme in REDIS_SCHEMES:
        with needs_extra("the Redis relist slots"):
            from .redis import RedisSlots

        return RedisSlots(url, name, timeout, prefix)
    raise ConfigError(f"unknown relist slots URL {url!r}; use the store's: sqlite:///path, etcd://host:port, "
                      "redis://host:port/db or redis+sentinel://host:port[,host:port]/master/db")
