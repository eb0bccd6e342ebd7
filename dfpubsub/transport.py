"""The driver API: what a pub/sub transport must provide.

A driver moves opaque frames on topics; it knows nothing of sequences, hellos
or resyncs, which the core (:mod:`dfpubsub.publisher`, :mod:`dfpubsub.subscriber`)
adds on top of any driver. Drivers register a :class:`Driver` subclass under
the entry-point group ``dfpubsub.drivers`` (see :mod:`dfpubsub.plugins`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import ConfigError, TransportError
from .metrics import Stats

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["Driver", "IngressTransport", "PublisherTransport", "SubscriberTransport"]


class PublisherTransport(abc.ABC):
    """Sends frames. The core calls it under one lock, so it need not be thread-safe.

    The class attributes tell the core's batching what an envelope costs
    (:mod:`dfpubsub.publisher`).
    """

    #: Seconds of work one envelope costs beyond this process, whatever its size: a server's
    #: write and every subscriber's read of it (Redis, etcd). The publisher counts it with the
    #: time ``send()`` took when it decides whether to batch.
    envelope_cost: ClassVar[float] = 0.0
    #: Whether ``send()`` waits for a server's reply (or for room behind the write in flight):
    #: then all of its time counts as sending. Otherwise a long send was the OS preempting the
    #: process, not a slow transport, and counts only up to a bound.
    send_waits: ClassVar[bool] = False

    @property
    def backlog(self) -> int:
        """Envelopes accepted by :meth:`send` and not yet written (a transport that writes from a
        thread of its own): while there are any, a new envelope would wait behind them anyway, so
        the publisher batches."""
        return 0

    def send_many(self, frames: list[tuple[str, bytes]]) -> list[TransportError | None]:
        """Send ``(topic, frame)`` pairs in order, as :meth:`send` would one by one; return, for
        each, None or the error that lost it. A transport that can write them in one request
        (one round trip to a server) overrides it."""
        errors: list[TransportError | None] = []
        for topic, frame in frames:
            try:
                self.send(topic, frame)
                errors.append(None)
            except TransportError as exc:
                errors.append(exc)
        return errors

    @abc.abstractmethod
    def send(self, topic: str, frame: bytes) -> None:
        """Send one envelope frame on ``topic`` (control frames use ``CONTROL_TOPIC``).

        May drop silently where the transport does (ZeroMQ PUB at its high-water
        mark): subscribers detect the loss by sequence. Raises
        :class:`~dfpubsub.errors.TransportError` when the transport failed.
        """

    def new_subscribers(self) -> int:
        """How many subscribers appeared since the last call (the core then says hello).

        Transports that cannot tell return 0; subscribers still learn the
        publisher's sequences from the periodic hello.
        """
        return 0

    @property
    def uri(self) -> str:
        """Where subscribers reach this publisher (registered in discovery)."""
        return ""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets and connections; sending afterwards is an error."""


class SubscriberTransport(abc.ABC):
    """Receives frames of subscribed topics.

    ``recv`` is called from the subscriber's receive thread only; every other
    method may be called from any thread.

    A transport that keeps history (etcd revisions, Redis stream ids) resumes
    from the last position it delivered after a reconnect; when that history
    is gone (compacted, trimmed) it calls ``on_lost(topic, reason)``, which the
    subscriber sets to request a resync of the topic.
    """

    #: Set by the subscriber; drivers call it from their receive path when history is gone.
    on_lost: Callable[[str, str], None] | None = None

    @abc.abstractmethod
    def subscribe(self, topic: str) -> None:
        """Start receiving ``topic`` (exact match; the core re-checks)."""

    @abc.abstractmethod
    def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic``."""

    def connect(self, uri: str) -> None:
        """Add a publisher endpoint (for drivers where subscribers connect to publishers)."""

    def disconnect(self, uri: str) -> None:
        """Remove a publisher endpoint added with :meth:`connect`."""

    @abc.abstractmethod
    def recv(self, timeout: float) -> list[bytes]:
        """Wait up to ``timeout`` seconds and return the envelope frames received (maybe none)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop receiving; a blocked :meth:`recv` returns promptly."""


class IngressTransport(abc.ABC):
    """The publisher service's end of the socket its host's API workers publish into.

    Workers send envelopes their own :class:`~dfpubsub.publisher.Publisher`
    made (own id, own sequences); the service relays them unchanged, so the
    gap detection of subscribers covers the hop from worker to service too.
    """

    @abc.abstractmethod
    def recv(self, timeout: float) -> list[tuple[str, bytes | memoryview]]:
        """``(topic, frame)`` pairs received within ``timeout`` seconds (maybe none).

        A frame may be a memoryview of the received message rather than a
        copy of it. Frames that are not ``(topic, envelope)`` are counted and
        dropped here.
        """

    @property
    def uri(self) -> str:
        """The bound endpoint workers push to."""
        return ""

    @abc.abstractmethod
    def close(self) -> None:
        """Unbind and release the socket (a bound socket file is removed)."""


class Driver(abc.ABC):
    """A pub/sub backend: a factory of publisher and subscriber transports.

    ``url`` is the transport address, such as ``tcp://127.0.0.1:8866`` for
    ``zmq+tcp://127.0.0.1:8866``; ``options`` are the driver's own settings
    (the ``[driver.<name>]`` table of the config), validated at construction.
    """

    name: ClassVar[str] = ""
    #: The model of the driver's ``[driver.<name>]`` options (None: it takes none or
    #: checks them itself); the sample configuration is written from it.
    options_model: ClassVar[type[BaseModel] | None] = None
    #: Whether forked workers publish through a publisher service (:meth:`worker_publisher`).
    publisher_service: ClassVar[bool] = False

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        self.url = url
        self.options = dict(options or {})

    @abc.abstractmethod
    def publisher(self, stats: Stats) -> PublisherTransport:
        """Create a publisher transport (binds or connects as the driver requires)."""

    @abc.abstractmethod
    def subscriber(self, stats: Stats) -> SubscriberTransport:
        """Create a subscriber transport."""

    def worker_publisher(self, stats: Stats, socket_path: str) -> PublisherTransport:
        """A forked API worker's transport into the host's publisher service at ``socket_path``.

        Only "bind based" drivers, whose publishers own a port, need a
        publisher service; connect-based ones (brokers) publish directly from
        every worker, so the default refuses.
        """
        raise ConfigError(f"driver {self.name!r} has no publisher service")

    def worker_ingress(self, stats: Stats, socket_path: str) -> IngressTransport:
        """The publisher service's side of :meth:`worker_publisher`: bind ``socket_path``."""
        raise ConfigError(f"driver {self.name!r} has no publisher service")
