"""Opening a lease by URL, and an elector as ``[leader]`` says."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..backends.extras import needs_extra
from ..backends.urls import REDIS_SCHEMES
from ..errors import ConfigError
from .api import LeaseBackend
from .elector import LeaderElector

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["default_identity", "elector_from_settings", "open_lease"]


def open_lease(url: str, name: str, timeout: float, prefix: str = "dfpubsub") -> LeaseBackend:
    """The lease ``name`` in the backend of ``url`` (sqlite:///, etcd://, redis://); ``timeout``
    bounds each call. ConfigError for another scheme; MissingExtra naming the extra to install."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from .sqlite import SqliteLease

        return SqliteLease(url, name, timeout)
    if scheme == "etcd":
        with needs_extra("the etcd leader lease"):
            from .etcd import EtcdLease

        return EtcdLease(url, name, timeout, prefix)
    if scheme in REDIS_SCHEMES:
        with needs_extra("the Redis leader lease"):
            from .redis import RedisLease

        return RedisLease(url, name, timeout, prefix)
    raise ConfigError(f"unknown leader lease URL {url!r}; use sqlite:///path, etcd://host:port, redis://host:port/db or redis+sentinel://host:port[,host:port]/master/db")


def default_identity() -> str:
    """``host:pid``: unique among the instances that share a lease, and telling where to look."""
    return f"{socket.gethostname()}:{os.getpid()}"


def elector_from_settings(settings: Settings, daemon: str) -> LeaderElector:
    """An elector (not started) as ``[leader]`` says: its lease in ``leader.url`` (default:
    ``store.url``) named ``leader.name`` (default: ``daemon``)."""
    s = settings.leader
    # Each call well within a renewal period, so a slow backend cannot hold a renewal past the deadline.
    timeout = max(0.1, min(s.retry_period, s.renew_deadline / 3))
    backend = open_lease(s.url or settings.store.url, s.name or daemon, timeout, settings.store.prefix)
    return LeaderElector(backend, s.name or daemon, s.identity or default_identity(),
                         lease_duration=s.lease_duration, renew_deadline=s.renew_deadline,
                         retry_period=s.retry_period, clock_skew=s.clock_skew)
