"""What the Redis store and Redis discovery share: a fork-aware client and the error mapping.

Loaded only by them, so ``import dfpubsub`` does not need redis-py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import AuthenticationWrongNumberOfArgsError, ReadOnlyError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ..errors import AuthenticationError, ConfigError, StoreError, StoreUnavailable
from .access import redis_access
from .urls import redacted

__all__ = ["ProcessClient", "open_client", "redis_errors", "redacted", "server_location"]

T = TypeVar("T")


def open_client(url: str, timeout: float, what: str) -> redis.Redis:
    """A redis-py client for ``url`` with ``timeout`` on every socket and no automatic retries.

    A failed write may have happened, so nothing is ever resent behind the
    caller's back. ``what`` names the client in a ConfigError for a bad URL.
    """
    target, access = redis_access().connect_args(url)  # [redis]: user and TLS over the URL's
    try:
        return redis.Redis.from_url(
            target, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0), decode_responses=False, **access,
        )
    except ValueError as exc:
        raise ConfigError(f"invalid Redis {what} URL {redacted(url)!r}: {exc}") from exc


def server_location(r: redis.Redis) -> str:
    """The server and database ``r`` talks to, e.g. ``127.0.0.1:6379/0``: what the store and the
    queues compare to find out whether one script can write both."""
    kw = r.connection_pool.connection_kwargs
    where = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
    return f"{where}/{kw.get('db', 0)}"


class ProcessClient(Generic[T]):
    """A client (and whatever is built with it) made by ``factory``, one per process.

    After ``fork()`` the child builds its own on first use; the parent's is
    dropped, not closed, since its sockets belong to the parent.
    """

    def __init__(self, factory: Callable[[], T], close: Callable[[T], None]):
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._value: tuple[int, T] | None = None

    def get(self) -> T:
        """This process's client, built on first use."""
        value = self._value
        if value is not None and value[0] == os.getpid():
            return value[1]
        with self._lock:
            if self._value is None or self._value[0] != os.getpid():
                self._value = (os.getpid(), self._factory())
            return self._value[1]

    def close(self) -> None:
        """Close this process's client; the next :meth:`get` builds a new one."""
        with self._lock:
            value, self._value = self._value, None
        if value is not None and value[0] == os.getpid():
            self._close(value[1])


@contextmanager
def redis_errors(where: str) -> Iterator[None]:
    """Map redis-py errors: a server gone, slow, loading or read-only is StoreUnavailable."""
    try:
        yield
    except (RedisAuthenticationError, AuthenticationWrongNumberOfArgsError) as exc:
        raise AuthenticationError(f"{where} refused the credentials: {exc}") from exc
    except (RedisConnectionError, RedisTimeoutError, ReadOnlyError) as exc:  # BusyLoadingError included
        raise StoreUnavailable(f"{where} unavailable: {type(exc).__name__}: {exc}") from exc
    except RedisError as exc:
        raise StoreError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
