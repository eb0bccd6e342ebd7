"""Redis streams: one XADD per notification, pipelined; the XADD replies are the ack (redis.asyncio).

``redis://[:password@]host:port/db?stream=notify:{topic}&maxlen=100000``: the
endpoint options may sit in the URL query or in ``options`` (which win).
``redis+sentinel://[:password@]host:port[,host:port]/master/db?...`` reaches the master the
sentinels name (``rediss+sentinel://``: with TLS), asked again after a connection fails, so
the delivery's retry after a failover goes to the new master; the URL's user and password
are the master's (sentinels that want a password are not supported here).
Each entry has the fields ``id`` (the notification id), ``content_type`` and
``data`` (an S3 event message with one record, or one structured CloudEvent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry

from ..backends.access import RedisAccess
from ..backends.redis import settled
from ..backends.urls import REDIS_SCHEMES, SENTINEL_SCHEMES
from ..errors import ConfigError, EndpointConfigError, EndpointError, EndpointRejected
from ..notify.notification import Notification
from .api import Endpoint, split_query_options

__all__ = ["RedisStreamEndpoint"]


class _Sentinel(Sentinel):
    """Skips a sentinel still showing the master a failover it leads replaces (see ``settled``)."""

    def check_master_state(self, state: dict[str, Any], service_name: str) -> bool:
        return settled(state) and bool(super().check_master_state(state, service_name))

_OPTIONS = frozenset({"stream", "maxlen"})


class RedisStreamEndpoint(Endpoint):
    """XADDs notifications to a stream.

    Options: ``stream`` (name; ``{topic}`` is replaced by the notification's
    topic; default ``notify:{topic}``), ``maxlen`` (approximate cap,
    ``MAXLEN ~``; default none), ``timeout`` (socket timeout, default 10 s),
    ``max_batch`` (entries per pipeline, default 100).
    """

    OPTIONS = _OPTIONS

    def __init__(self, url: str, format: str = "s3", options: Mapping[str, str] | None = None):
        server_url, from_query = split_query_options(url, _OPTIONS | Endpoint.COMMON_OPTIONS)
        super().__init__(server_url, format, {**from_query, **(options or {})})
        scheme = server_url.partition("://")[0]
        if scheme not in REDIS_SCHEMES:
            raise EndpointConfigError(f"not a redis(s) or redis+sentinel URL: {self.safe_url!r}")
        self.stream = self.options.get_str("stream", "notify:{topic}")
        self.maxlen = self.options.get_int("maxlen", 0) if "maxlen" in self.options.values else None
        # No retries inside the client: a failed XADD may have happened, and the caller decides.
        sockets: dict[str, Any] = {"socket_timeout": self.timeout, "socket_connect_timeout": self.timeout,
                   "retry": Retry(NoBackoff(), 0)}
        try:
            if scheme in SENTINEL_SCHEMES:
                parsed, master, sentinel = RedisAccess().sentinel_args(server_url)
                self._client = _Sentinel(list(parsed.sentinels), sentinel_kwargs={**sockets, **sentinel}).master_for(
                    parsed.service, decode_responses=False, **sockets, **master)
            else:
                self._client = aioredis.Redis.from_url(server_url, decode_responses=False, **sockets)
        except (ValueError, ConfigError) as exc:
            raise EndpointConfigError(f"invalid Redis URL {self.safe_url!r}: {exc}") from exc

    def _stream_of(self, n: Notification) -> str:
        return self.stream.replace("{topic}", n.topic)

    async def send(self, batch: Sequence[Notification]) -> None:
        """XADD ``batch`` in order, one pipeline of :attr:`max_batch` entries after the other."""
        acked = 0
        for chunk in self.chunks(batch):
            pipe = self._client.pipeline(transaction=False)
            for n in chunk:
                content_type, body = self.message(n)
                pipe.xadd(
                    self._stream_of(n), {"id": n.id, "content_type": content_type, "data": body},
                    maxlen=self.maxlen, approximate=True,
                )
            try:
                replies = await pipe.execute(raise_on_error=False)
            except RedisError as exc:
                raise EndpointError(f"{self.safe_url}: {type(exc).__name__}: {exc}", acked) from exc
            for i, reply in enumerate(replies):
                if isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE"):
                    # The key holds something else than a stream: retrying will not help.
                    raise EndpointRejected(f"{self.safe_url}: XADD {self._stream_of(chunk[i])!r}: {reply}", acked + i)
                if isinstance(reply, Exception):
                    raise EndpointError(f"{self.safe_url}: XADD: {reply}", acked + i)
            acked += len(chunk)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()
