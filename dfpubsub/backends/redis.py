"""What the Redis store, queues, discovery and leases share: a fork-aware client of one server or
of the master Sentinel names, their Lua scripts run on a connection of each thread's own
(:mod:`.redis_scripts`), what each component moves past when a server takes over (:data:`TAKEOVER`),
and the error mapping.

Loaded only by them, so ``import dfpubsub`` does not need redis-py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import AbstractConnection, Connection, SSLConnection
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import (
    AuthenticationWrongNumberOfArgsError,
    InvalidResponse,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from ..errors import AuthenticationError, ConfigError, NotEnoughReplicas, StoreError, StoreUnavailable
from .access import redis_access
from .redis_scripts import ReplicasBehind, Script, Scripts, refused
from .urls import SENTINEL_SCHEMES, redacted

__all__ = ["TAKEOVER", "TAKEOVER_JUMP", "ProcessClient", "Script", "Scripts", "open_client", "redis_errors", "redacted",
           "scripts_of", "sentinel_pool", "server_location", "settled"]

T = TypeVar("T")

#: How far a component's counters (store revisions, reservation ids, queue sequences, fencing
#: tokens) jump when a server takes over: past any number of writes an old master can have made
#: that the new one lacks (16.7 million: minutes of a busy store cut off with its clients).
TAKEOVER_JUMP = 1 << 24

#: The check a component runs on every new connection, with its ``{move}`` (Lua) inserted: when
#: the server is a master whose replication id is not the one this component last saw (a replica
#: promoted by a failover, a restarted server), ``move`` pushes its counters ``JUMP`` ahead, so
#: nothing the old master handed out (a revision, a token, a sequence) is ever handed out again.
#: KEYS[1]: the component's epoch key; the others and ARGV[2...] are ``move``'s. ARGV[1]: JUMP.
#: Nothing on a replica, nothing the first time ever (no epoch before it), and nothing where the
#: ACL user may not run INFO (-1; the check then protects nothing: grant it ``+info``).
TAKEOVER = """
local info = redis.pcall('INFO', 'replication')
if type(info) ~= 'string' then return -1 end
if not string.find(info, 'role:master', 1, true) then return 0 end
local id = string.match(info, 'master_replid:(%x+)') or ''
local seen = redis.call('GET', KEYS[1])
if seen == id then return 0 end
redis.call('SET', KEYS[1], id)
if not seen then return 0 end
local JUMP = ARGV[1]
{move}
return 1
"""

#: Retries of a client call through Sentinel while a failover is under way (from 50 ms apart,
#: doubling up to a quarter of the timeout: a few seconds in all).
_SENTINEL_RETRIES = 8


class _MasterConnection(SentinelManagedConnection):
    """A connection to the master Sentinel names that keeps ``READONLY`` what it is (redis-py's
    turns it into a ConnectionError, which a writer must take for a write that may have been
    made): dropped all the same, so that the next call asks the sentinels again.

    It also asks the sentinels however it is connected: redis-py's connects through the
    sentinels only in ``connect()``, while a command sent on a connection that is not connected
    (``send_packed_command``, as the Streams driver's transports do) connects to the host and
    port it was made with: ``localhost:6379``, whatever that server is."""

    _addressed = False  # connect_to() is connecting to the address the sentinels gave

    def connect_to(self, address: Any) -> None:
        self._addressed = True
        try:
            super().connect_to(address)
        finally:
            self._addressed = False

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if self._sock is None and not self._addressed:
            self.connect()  # through the sentinels, then back here with their address
            return
        super().connect_check_health(*args, **kwargs)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return Connection.read_response(self, *args, **kwargs)
        except ReadOnlyError:
            self.disconnect()
            raise


class _MasterSSLConnection(_MasterConnection, SSLConnection):
    pass


def settled(state: dict[str, Any]) -> bool:
    """Whether a sentinel's view of its master (``SENTINEL MASTERS``) is one to connect to: the
    sentinel that leads a failover keeps showing the old master there (flag
    ``failover_in_progress``) until the failover ends, some 10 s after the promotion, when it has
    told the old master; a client that believed it would write to a master being replaced. The
    next sentinel is asked instead."""
    return "failover_in_progress" not in str(state.get("flags", ""))


class _Sentinel(Sentinel):
    def check_master_state(self, state: dict[str, Any], service_name: str) -> bool:
        return settled(state) and bool(super().check_master_state(state, service_name))


def open_client(url: str, timeout: float, what: str,
                on_connect: tuple[str, list[Any], list[Any]] | None = None) -> redis.Redis:
    """A redis-py client for ``url`` with ``timeout`` on every socket.

    ``redis://`` (``rediss://``): one server, no automatic retries: a failed write may have
    happened, so nothing is ever resent behind the caller's back. ``redis+sentinel://``: the
    master the sentinels name, found again after a failover; the client's own calls (reads,
    and writes that are safe to repeat) are retried on connection errors and ``READONLY`` for
    a few seconds. ``on_connect``: a Lua script with its keys and arguments, run on every new
    connection (:data:`TAKEOVER`). ``what`` names the client in a ConfigError.
    """
    hook = None if on_connect is None else _run_on_connect(*on_connect)
    try:
        if url.partition("://")[0] in SENTINEL_SCHEMES:
            retry = Retry(ExponentialBackoff(cap=max(timeout / 4, 0.1), base=0.05), _SENTINEL_RETRIES,
                          (RedisConnectionError, RedisTimeoutError, ReadOnlyError))
            return redis.Redis(connection_pool=sentinel_pool(url, timeout, redis_connect_func=hook, retry=retry),
                               retry=retry)
        target, kwargs = redis_access().connect_args(url)  # [redis]: user and TLS over the URL's
        return redis.Redis.from_url(
            target, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0), decode_responses=False, redis_connect_func=hook, **kwargs,
        )
    except ValueError as exc:
        raise ConfigError(f"invalid Redis {what} URL {redacted(url)!r}: {exc}") from exc


def sentinel_pool(url: str, timeout: float, **kwargs: Any) -> SentinelConnectionPool:
    """A connection pool of the master a ``redis+sentinel://`` URL names, with ``[redis]``'s user
    and TLS (the sentinels with their own user) and ``timeout`` on every socket; its connections
    ask the sentinels where the master is each time they connect. ``kwargs``: more connection
    arguments (``retry`` defaults to none)."""
    parsed, master, sentinel = redis_access().sentinel_args(url)
    tls = master.pop("ssl", False)
    sentinel.pop("ssl", None)
    if tls:
        sentinel["connection_class"] = redis.SSLConnection
    sockets = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    manager = _Sentinel(list(parsed.sentinels), sentinel_kwargs={**sockets, "retry": Retry(NoBackoff(), 0), **sentinel})
    return SentinelConnectionPool(
        parsed.service, manager, connection_class=_MasterSSLConnection if tls else _MasterConnection,
        **{"retry": Retry(NoBackoff(), 0), **sockets, **master, **kwargs})


def scripts_of(r: redis.Redis, timeout: float) -> Scripts:
    """The :class:`Scripts` of client ``r``: through Sentinel they follow the master for up to
    ``timeout`` seconds; each write waits for ``[redis] wait_replicas`` replicas."""
    access = redis_access()
    return Scripts(r, sentinel=is_sentinel(r), failover_wait=timeout, wait_replicas=access.wait_replicas,
                   wait_timeout=access.wait_timeout)


def is_sentinel(r: redis.Redis) -> bool:
    """Whether ``r`` reaches its master through Sentinel."""
    return hasattr(r.connection_pool, "service_name")


def _run_on_connect(text: str, keys: list[Any], args: list[Any]) -> Callable[[AbstractConnection], None]:
    def connected(conn: AbstractConnection) -> None:
        conn.on_connect()
        conn.send_command("EVAL", text, len(keys), *keys, *args)
        conn.read_response()
    return connected


def server_location(r: redis.Redis) -> str:
    """The server and database ``r`` talks to, e.g. ``127.0.0.1:6379/0`` (through Sentinel, the
    master's name: ``sentinel:mymaster/0``): what the store and the queues compare to find out
    whether one script can write both."""
    pool = r.connection_pool
    kw = pool.connection_kwargs
    if is_sentinel(r):
        return f"sentinel:{pool.service_name}/{kw.get('db', 0)}"  # type: ignore[attr-defined]
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
    """Map redis-py errors: a server gone, slow, loading, read-only, unblocked by a change of role or
    failing over is StoreUnavailable; one that refused a write for want of replicas
    (``NOREPLICAS``, ``MASTERDOWN``) is NotEnoughReplicas (nothing was written); a write made
    but not acknowledged by ``wait_replicas`` replicas in time is StoreUnavailable too (the
    store's writers turn it into WriteOutcomeUnknown)."""
    try:
        yield
    except (RedisAuthenticationError, AuthenticationWrongNumberOfArgsError) as exc:
        raise AuthenticationError(f"{where} refused the credentials: {exc}") from exc
    except (RedisConnectionError, RedisTimeoutError, ReadOnlyError, ReplicasBehind, InvalidResponse) as exc:
        # BusyLoadingError is a ConnectionError; InvalidResponse: what came back was no Redis reply
        # (something else answered on that address): the connection is dropped like a broken one.
        raise StoreUnavailable(f"{where} unavailable: {type(exc).__name__}: {exc}") from exc
    except ResponseError as exc:
        if refused(exc):
            raise NotEnoughReplicas(f"{where} refused the write: {exc}") from exc
        if str(exc).startswith("UNBLOCKED"):  # a blocking read ended by the server's demotion
            raise StoreUnavailable(f"{where} unavailable: {exc}") from exc
        raise StoreError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
    except RedisError as exc:
        raise StoreError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
