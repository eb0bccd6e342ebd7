"""AMQP 0-9-1 (RabbitMQ): one persistent message per notification, the publisher confirm is the ack (aio-pika).

``amqp://user:password@host:5672/vhost?exchange=x&routing_key=rk``: the
endpoint options may sit in the URL query or in ``options`` (which win).
Messages are published ``mandatory`` on a channel with publisher confirms:
a broker nack, an unroutable message (returned), a missing exchange, a lost
connection or a timeout raise :class:`EndpointError`. The connection is made
on the first send and made again on the next send after it was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiormq

from ..errors import EndpointConfigError, EndpointError
from ..notify.notification import Notification
from .api import Endpoint, split_query_options

__all__ = ["AmqpEndpoint"]

_OPTIONS = frozenset({"exchange", "routing_key", "persistent"})


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiormq.exceptions.PublishError):
        return "unroutable (returned by the broker)"
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return "nacked by the broker"
    return f"{type(exc).__name__}: {exc or 'timed out'}"


class AmqpEndpoint(Endpoint):
    """Publishes to an exchange (default: the default exchange) with a routing key
    (default: the notification's topic).

    Options: ``exchange``, ``routing_key``, ``persistent`` (delivery mode 2,
    default true), ``timeout`` (connect and confirm, default 10 s),
    ``max_batch`` (messages awaiting confirms at once, default 100).
    The exchange is not declared: it must exist.
    """

    OPTIONS = _OPTIONS

    def __init__(self, url: str, format: str = "s3", options: Mapping[str, str] | None = None):
        broker_url, from_query = split_query_options(url, _OPTIONS | Endpoint.COMMON_OPTIONS)
        super().__init__(broker_url, format, {**from_query, **(options or {})})
        parts = urlsplit(broker_url)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise EndpointConfigError(f"not an amqp(s) URL with a host: {self.safe_url!r}")
        self.exchange_name = self.options.get_str("exchange", "")
        self.routing_key = self.options.get_str("routing_key", "")
        self.delivery_mode = (
            aio_pika.DeliveryMode.PERSISTENT if self.options.get_bool("persistent", True)
            else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        self._connection: Any = None
        self._channel: Any = None
        self._exchange: Any = None

    def _connected(self) -> bool:
        # aio-pika learns of a lost connection a little after aiormq: ask both.
        c = self._connection
        return c is not None and not c.is_closed and c.transport is not None and not c.transport.connection.is_closed

    async def _ready_exchange(self) -> Any:
        if not self._connected():
            await self._drop()
            self._channel = None
            self._connection = await aio_pika.connect(self.url, timeout=self.timeout)
        if self._channel is None or self._channel.is_closed:
            # A broker error (e.g. a missing exchange) closes the channel, not the connection.
            self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            self._exchange = (
                await self._channel.get_exchange(self.exchange_name, ensure=False)
                if self.exchange_name else self._channel.default_exchange
            )
        return self._exchange

    def _message(self, n: Notification) -> aio_pika.Message:
        content_type, body = self.message(n)
        return aio_pika.Message(
            body, content_type=content_type, message_id=n.id, delivery_mode=self.delivery_mode,
            timestamp=n.event_time, type=n.event_name,
        )

    async def send(self, batch: Sequence[Notification]) -> None:
        """Publish ``batch`` in order, up to :attr:`max_batch` unconfirmed at once; return when all are confirmed."""
        acked = 0
        for chunk in self.chunks(batch):
            messages = [self._message(n) for n in chunk]
            try:
                async with asyncio.timeout(self.timeout):
                    exchange = await self._ready_exchange()
                    # Publishes queue on the channel's lock in task order, so the broker gets them in order.
                    results = await asyncio.gather(
                        *(
                            exchange.publish(m, self.routing_key or n.topic, mandatory=True)
                            for m, n in zip(messages, chunk)
                        ),
                        return_exceptions=True,
                    )
            # RuntimeError: what aio-pika and aiormq raise on a closed connection or channel.
            except (TimeoutError, aiormq.exceptions.AMQPError, RuntimeError, ConnectionError, OSError) as exc:
                # A half-open connection could hold confirms forever: start afresh next time.
                await self._drop()
                raise EndpointError(f"{self.safe_url}: {_describe(exc)}", acked) from exc
            for i, result in enumerate(results):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    raise EndpointError(f"{self.safe_url}: message {chunk[i].id!r} {_describe(result)}", acked + i) from result
            acked += len(chunk)

    async def _drop(self) -> None:
        connection, self._connection, self._channel, self._exchange = self._connection, None, None, None
        if connection is not None and not connection.is_closed:
            try:
                await asyncio.wait_for(connection.close(), self.timeout)
            except (TimeoutError, aiormq.exceptions.AMQPError, RuntimeError, ConnectionError, OSError):
                pass  # it is being dropped because it misbehaved

    async def close(self) -> None:
        """Close the connection."""
        await self._drop()
