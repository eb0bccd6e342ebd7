"""What the Redis store, queues, discovery and leases share: a fork-aware client, their Lua
scripts run on a connection of each thread's own, and the error mapping.

Loaded only by them, so ``import dfpubsub`` does not need redis-py.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection, ConnectionPool
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import (
    AuthenticationWrongNumberOfArgsError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ..errors import AuthenticationError, ConfigError, StoreError, StoreUnavailable
from .access import redis_access
from .urls import redacted

__all__ = ["ProcessClient", "Script", "Scripts", "open_client", "redis_errors", "redacted", "server_location"]

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


class Scripts:
    """The Lua scripts of one client, each run with EVALSHA on a connection the calling thread keeps.

    Through redis-py's client a script's call costs the writer about half again the CPU of the
    same call on a connection held open (docs/performance.md): the pool's checkout and return (a
    lock, observability counters, an event), the client's wrappers, the script's own checks. A
    thread that keeps one connection of the pool for as long as it lives pays none of that. The
    connection goes back to the pool when the thread ends, and the client's ``close()`` closes
    it with the others. Each call checks it as the pool would (:meth:`connection`); a call that
    fails is not sent again, as with the client: a failed write may have happened.
    """

    def __init__(self, r: redis.Redis):
        self._pool: ConnectionPool = r.connection_pool
        self._local = threading.local()

    def register(self, text: str) -> Script:
        """A script of ``text``, loaded into the server on its first call (and again after a restart)."""
        return Script(self, text)

    def connection(self) -> AbstractConnection:
        """The calling thread's connection, checked as the pool checks one it hands out: one that
        the server closed (it restarted) or that holds a reply nobody read (a call broken off
        between its command and its reply) is opened afresh, before anything is sent on it."""
        return self._lane().conn

    def _lane(self) -> _Lane:
        lane: _Lane | None = getattr(self._local, "lane", None)
        if lane is None:
            lane = self._local.lane = _Lane(self._pool)
        conn = lane.conn
        if lane.owed:
            # Its last call was broken off before its reply was read: the reply may still be on
            # its way (a busy server), where can_read() below cannot see it yet.
            conn.disconnect()
            lane.owed = False
        conn.connect()  # nothing to do while connected; a server that is gone raises here
        try:
            fresh = not conn.can_read()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            fresh = False
        if not fresh:
            conn.disconnect()
            conn.connect()
        return lane


class Script:
    """One Lua script of :class:`Scripts`, called like redis-py's: ``script(keys=..., args=...)``."""

    __slots__ = ("_scripts", "text", "sha")

    def __init__(self, scripts: Scripts, text: str):
        self._scripts = scripts
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        lane = self._scripts._lane()
        try:
            return lane.ask("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # Not run: the server restarted or flushed its scripts. Load it, run it once more.
            lane.ask("SCRIPT", "LOAD", self.text)
            return lane.ask("EVALSHA", self.sha, len(keys), *keys, *args)


class _Lane:
    """A connection of ``pool`` that one thread keeps, and gives back when it ends (its
    ``threading.local`` is dropped then)."""

    __slots__ = ("pool", "conn", "owed")

    def __init__(self, pool: ConnectionPool):
        self.pool = pool
        self.conn = pool.get_connection()
        #: A command was sent whose reply was not read (the call was broken off in between).
        self.owed = False

    def ask(self, *command: Any) -> Any:
        self.owed = True
        self.conn.send_command(*command)
        try:
            reply = self.conn.read_response()
        except ResponseError:  # the server's own answer, read whole
            self.owed = False
            raise
        self.owed = False
        return reply

    def __del__(self) -> None:
        try:
            self.pool.release(self.conn)
        except Exception:  # noqa: S110 - at interpreter exit the pool may be gone already
            pass


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
