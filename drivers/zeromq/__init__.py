"""ZeroMQ driver, the reference transport: ``zmq+tcp://host:port`` or ``zmq+ipc:///path``.

Publishers bind an XPUB socket (XPUB so they see subscribers join and can greet
them with a hello at once); subscribers connect a SUB socket to any number of
publishers, added and removed at run time. Every message is two frames: the
topic followed by NUL, then the envelope. Subscribing to ``topic + NUL`` makes
ZeroMQ's prefix filter exact. High-water marks, ZMTP heartbeats and optional
CURVE encryption are set from the driver options.

Forked API workers publish through the host's publisher service instead
(:mod:`.workers`): PUSH sockets into one PULL socket over ipc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from dfpubsub.errors import ConfigError
from dfpubsub.metrics import Stats
from dfpubsub.transport import Driver, IngressTransport, PublisherTransport, SubscriberTransport

from .options import SCHEMES, ZmqOptions
from .publisher import ZmqPublisher
from .subscriber import ZmqSubscriber
from .workers import WorkerIngress, WorkerPush

__all__ = ["ZmqDriver", "ZmqOptions", "ZmqPublisher", "ZmqSubscriber", "WorkerIngress", "WorkerPush"]


class ZmqDriver(Driver):
    """``zmq+tcp://host:port`` / ``zmq+ipc:///path``: the publisher binds the URL,
    subscribers connect to it and to ``options["publishers"]``."""

    name = "zmq"
    options_model = ZmqOptions
    publisher_service = True

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        try:
            self.zmq_options = ZmqOptions(**self.options)
        except ValidationError as exc:
            raise ConfigError(f"invalid [driver.zmq] options: {exc}") from exc
        if url is not None and not url.startswith(SCHEMES):
            raise ConfigError(f"zmq URL must be zmq+tcp://, zmq+ipc:// or zmq+inproc://, got {url!r}")
        if url is not None and url.startswith("tcp://"):
            port = url.rpartition(":")[2]
            # "*" and 0 bind an ephemeral port; anything else must be one (checked before any bind).
            if port != "*" and not (port.isdigit() and int(port) < 65536):
                raise ConfigError(f"zmq URL {url!r}: the port must be a number from 0 to 65535 or *")

    def publisher(self, stats: Stats) -> PublisherTransport:
        if not self.url:
            raise ConfigError("a zmq publisher needs a URL to bind, such as zmq+tcp://127.0.0.1:8866")
        return ZmqPublisher(self.url, self.zmq_options, stats)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        endpoints = list(self.zmq_options.publishers)
        if self.url and self.url not in endpoints:
            endpoints.insert(0, self.url)
        return ZmqSubscriber(self.zmq_options, stats, endpoints)

    def worker_publisher(self, stats: Stats, socket_path: str) -> PublisherTransport:
        return WorkerPush(socket_path, self.zmq_options, stats)

    def worker_ingress(self, stats: Stats, socket_path: str) -> IngressTransport:
        return WorkerIngress(socket_path, self.zmq_options, stats)
