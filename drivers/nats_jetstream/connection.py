"""One NATS connection on an asyncio loop of its own thread, called from synchronous code.

nats-py is asyncio-only while transports are called from the core's threads,
so each transport owns a loop thread and runs coroutines on it with
:meth:`Connection.call`. The connection reconnects by itself (nats-py retries
forever); :attr:`Connection.epoch` counts the reconnects so that a subscriber
knows its consumer may be gone with a restarted server. A first connect that
fails is tried again at the next call, so a transport made while the server is
down works once it is up.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError, ServiceUnavailableError

from dfpubsub.backends.access import nats_access
from dfpubsub.errors import ClosedError, ConfigError, TransportError
from dfpubsub.logs import RateLimitedLog

__all__ = ["Connection", "cluster_size", "ensure_stream", "join_subject", "no_jetstream", "parse_servers", "public_url"]

T = TypeVar("T")
_SCHEMES = ("nats", "tls")


def parse_servers(url: str) -> list[str]:
    """``nats://host:port[,host:port...]`` (or ``tls://``) as nats-py's server list."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _SCHEMES or not rest:
        raise ConfigError(f"the nats driver needs a URL such as nats://127.0.0.1:4222, got {public_url(url)!r}")
    auth, at, hosts = rest.rpartition("@")
    servers = []
    for host in hosts.rstrip("/").split(","):
        parts = urlsplit(f"{scheme}://{host}")
        try:
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"invalid NATS URL {public_url(url)!r}: {exc}") from exc
        if not parts.hostname:
            raise ConfigError(f"invalid NATS URL {public_url(url)!r}: no host in {host!r}")
        servers.append(f"{scheme}://{auth + at if at else ''}{parts.hostname}:{port or 4222}")
    return servers


def public_url(url: str) -> str:
    """``url`` without the password or token of its authority."""
    scheme, sep, rest = url.partition("://")
    auth, at, hosts = rest.rpartition("@")
    if not at:
        return url
    user = auth.partition(":")[0] if ":" in auth else ""
    return f"{scheme}{sep}{user + '@' if user else ''}{hosts}"


class Connection:
    """A nats-py client on a private loop thread; :meth:`call` runs a coroutine on it."""

    def __init__(self, url: str, name: str, timeout: float, log: RateLimitedLog):
        self.servers = parse_servers(url)
        self.uri = public_url(url)
        self.timeout = timeout
        self._name = name
        self._log = log
        self._access = nats_access().connect_args()
        #: Reconnects so far: a subscriber's consumer made before one may be gone.
        self.epoch = 0
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._connecting: asyncio.Lock | None = None  # made on the loop, which it belongs to
        #: What NATS said last went wrong: nats-py retries a first connect forever and tells only this.
        self.last_error = ""
        #: An error the server reported (not a socket's) is in last_error since the last connect.
        self._server_said = False
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"dfpubsub-{name}", daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def call(self, fn: Callable[[JetStreamContext], Awaitable[T]], timeout: float | None = None) -> T:
        """Run ``fn(js)`` on the loop (connecting first if need be) and return its result.

        Raises :class:`TransportError` for anything NATS raised or a timeout.
        """
        if self._closed:
            raise ClosedError(f"{self._name} is closed")
        future = asyncio.run_coroutine_threadsafe(self._run(fn), self._loop)
        try:
            return future.result(timeout if timeout is not None else self.timeout * 2 + 1)
        except TimeoutError as exc:
            future.cancel()
            why = f" (last error: {self.last_error})" if self.last_error else ""
            raise TransportError(f"NATS at {self.uri} did not answer in time{why}") from exc

    async def _run(self, fn: Callable[[JetStreamContext], Awaitable[T]]) -> T:
        try:
            return await fn(await self.jetstream())
        except ServiceUnavailableError as exc:
            if exc.code is None:  # no responders: nothing serves the JetStream API here
                raise ConfigError(no_jetstream(self.uri)) from exc
            raise TransportError(f"NATS at {self.uri}: {type(exc).__name__}: {exc}") from exc
        except (TimeoutError, NatsError, OSError) as exc:
            raise TransportError(f"NATS at {self.uri}: {type(exc).__name__}: {exc}") from exc

    def nc(self) -> Client:
        """The client (after :meth:`jetstream` connected it)."""
        assert self._nc is not None
        return self._nc

    async def jetstream(self) -> JetStreamContext:
        """The JetStream context, connecting first (on the loop thread)."""
        if self._js is not None and self._nc is not None and not self._nc.is_closed:
            return self._js
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # one connection, however many callers wait for it
            if self._js is None or self._nc is None or self._nc.is_closed:
                await self._connect()
        assert self._js is not None
        return self._js

    async def _connect(self) -> None:
        self._nc = await nats.connect(
            self.servers, name=self._name, connect_timeout=self.timeout, allow_reconnect=True,
            max_reconnect_attempts=-1, reconnect_time_wait=0.25, ping_interval=5, max_outstanding_pings=2,
            error_cb=self._error, disconnected_cb=self._disconnected, reconnected_cb=self._reconnected,
            **self._access,
        )
        self._js = self._nc.jetstream(timeout=self.timeout)
        self.last_error = ""
        self._server_said = False

    async def _error(self, exc: Exception) -> None:
        # A server that refused the credentials then closes the connection: the socket errors that
        # follow must not hide its word, which is what the operator has to act on.
        if not isinstance(exc, OSError) or not self._server_said:
            self.last_error = f"{type(exc).__name__}: {exc}"
        self._server_said = self._server_said or not isinstance(exc, OSError)
        self._log.warning("error", "NATS connection error", uri=self.uri, error=f"{type(exc).__name__}: {exc}")

    async def _disconnected(self) -> None:
        if not self._closed:
            self._log.warning("disconnected", "NATS connection lost; reconnecting", uri=self.uri)

    async def _reconnected(self) -> None:
        self.epoch += 1
        self._log.warning("reconnected", "NATS connection re-established", uri=self.uri)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shut() -> None:
            if self._nc is not None and not self._nc.is_closed:
                try:
                    await self._nc.close()
                except (NatsError, OSError):
                    pass

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(self.timeout)
        except (TimeoutError, RuntimeError):
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout)
        if not self._thread.is_alive():
            self._loop.close()


def no_jetstream(uri: str) -> str:
    """What a server without JetStream is told: the driver keeps every envelope in a stream, core
    NATS alone (at most once, no replay) would lose what a subscriber misses while away."""
    return (f"NATS at {uri} has no JetStream (nothing answers its API): the nats driver keeps envelopes in a "
            "JetStream stream; start nats-server with -js (or a jetstream block in its config), or enable "
            "JetStream for the account")


def join_subject(prefix: str) -> str:
    """Where a subscriber says it joined, so that publishers welcome it with a hello: a core NATS
    subject outside the stream (``{prefix}.ps.>``), whose messages nobody needs to keep."""
    return f"{prefix}.joins"


def cluster_size(nc: Client, servers: list[str]) -> int:
    """How many servers the cluster has, as far as the client knows: those the URL names, or those
    in the client's pool (the URL's and those the cluster told it of), whichever is more."""
    pool = {(uri.hostname, uri.port) for uri in nc.servers}
    return max(len(servers), len(pool))


async def ensure_stream(js: JetStreamContext, name: str, subjects: str, limits: dict[str, Any]) -> None:
    """Create the stream with ``limits``, or check that the one there holds exactly ``subjects``.

    A stream with other subjects would interleave foreign messages with ours, and the
    subscribers' test for dropped messages (consecutive stream sequences) would fail.
    Limits of an existing stream are the operator's: they are left as they are.
    """
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        config = StreamConfig(name=name, subjects=[subjects], storage=StorageType.FILE,
                              discard=DiscardPolicy.OLD, **limits)
        try:
            await js.add_stream(config)
        except NatsError as exc:  # created meanwhile by another transport: check it as ours
            info = await js.stream_info(name)
            if list(info.config.subjects or []) != [subjects]:
                raise ConfigError(f"cannot create the NATS stream {name!r}: {exc}") from exc
        return
    if list(info.config.subjects or []) != [subjects]:
        raise ConfigError(f"the NATS stream {name!r} holds subjects {info.config.subjects}, not just "
                          f"{subjects!r}: give the driver a stream of its own")
