"""NATS JetStream: one message per notification; the stream's acknowledgement is the ack (nats-py).

``nats://[user:password@]host:port[,host:port...]/subject``: the subject is the
URL's path (``{topic}`` is replaced by the notification's topic; default
``notify.{topic}``). A stream holding the subject must exist, as an AMQP
exchange must. Every message carries ``Nats-Msg-Id`` = the notification id, so
a batch sent again after a failure (delivery is at least once) is stored once
within the stream's duplicate window. The body is an S3 event message with one
record or one structured CloudEvent, its type in ``Content-Type``. The
connection is made on the first send and made again after it was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from urllib.parse import unquote, urlsplit

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.errors import NoStreamResponseError

from ..errors import EndpointConfigError, EndpointError
from ..notify.notification import Notification
from .api import Endpoint, split_query_options

__all__ = ["JetStreamEndpoint"]


class JetStreamEndpoint(Endpoint):
    """Publishes notifications to a JetStream subject, up to :attr:`max_batch` unacknowledged at once.

    Options: ``timeout`` (connect and acknowledgement, default 10 s),
    ``max_batch`` (default 100).
    """

    def __init__(self, url: str, format: str = "s3", options: Mapping[str, str] | None = None):
        server_url, from_query = split_query_options(url, Endpoint.COMMON_OPTIONS)
        super().__init__(server_url, format, {**from_query, **(options or {})})
        parts = urlsplit(server_url)
        hosts = parts.netloc.rpartition("@")[2]
        if parts.scheme != "nats" or not hosts:
            raise EndpointConfigError(f"not a nats URL with a server: {self.safe_url!r}")
        auth = parts.netloc.rpartition("@")[0]
        self.servers = [f"nats://{auth + '@' if auth else ''}{h}" for h in hosts.split(",") if h]
        self.subject = unquote(parts.path.lstrip("/")) or "notify.{topic}"
        if any(c in self.subject for c in " *>"):
            raise EndpointConfigError(f"endpoint {self.safe_url}: {self.subject!r} is not a subject to publish to")
        self._nc: Client | None = None

    async def _client(self) -> Client:
        if self._nc is None or self._nc.is_closed:
            self._nc = await nats.connect(self.servers, connect_timeout=self.timeout, allow_reconnect=True,
                                          max_reconnect_attempts=-1, reconnect_time_wait=0.25)
        return self._nc

    async def send(self, batch: Sequence[Notification]) -> None:
        """Publish ``batch`` in order; return once the stream acknowledged every message."""
        acked = 0
        for chunk in self.chunks(batch):
            try:
                async with asyncio.timeout(self.timeout):
                    js = (await self._client()).jetstream(timeout=self.timeout)
                    # Tasks start in the order made, so the messages leave in that order.
                    results = await asyncio.gather(*(
                        js.publish(self.subject.replace("{topic}", n.topic), body,
                                   headers={"Nats-Msg-Id": n.id, "Content-Type": content_type})
                        for n, (content_type, body) in ((n, self.message(n)) for n in chunk)
                    ), return_exceptions=True)
            except (TimeoutError, NatsError, OSError) as exc:
                raise EndpointError(f"{self.safe_url}: {type(exc).__name__}: {exc or 'timed out'}", acked) from exc
            for i, result in enumerate(results):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    why = "no stream holds the subject" if isinstance(result, NoStreamResponseError) else result
                    raise EndpointError(f"{self.safe_url}: message {chunk[i].id!r}: {why}", acked + i) from result
            acked += len(chunk)

    async def close(self) -> None:
        """Close the connection."""
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except (NatsError, OSError):
                pass
