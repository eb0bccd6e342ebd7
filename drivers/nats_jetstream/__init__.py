"""NATS JetStream driver: ``nats://host:port[,host:port...]`` (``nats+tls://host:port`` for TLS).

Layout. Every envelope is one message in a JetStream stream of the driver's own
(``stream``, default ``DFPUBSUB``) holding the subjects ``{prefix}.ps.>``; the
topic is the last token, ``{prefix}.ps.{topic}`` (bytes a subject token cannot
hold written ``~XX``), the control topic ``{prefix}.ps.$ctl``. The stream is
created at start with the configured limits (``max_age``, ``max_msgs``,
``max_bytes``, ``duplicate_window``) and ``num_replicas`` (by default 3 on a
cluster of three servers or more, which keeps it through the loss of one) or, if
it exists, checked to hold exactly those subjects; the limits of an existing
stream are left to its operator.

Clusters. The URL may name several servers; the client connects to one and moves
to another when it is lost. A publish whose acknowledgement does not come (a
stream leader that died or stepped down) is sent again with the same
``Nats-Msg-Id`` until ``timeout``, which must be shorter than the duplicate
window. A pull answered ``409 Leadership Change`` (the consumer's leader moved)
is simply asked again.

Publishing. ``send`` hands the envelope over and returns; up to ``max_inflight``
await their acknowledgement at once, in order. An event envelope carries ``Nats-Msg-Id: {publisher id}:{first sequence}:{topic}``, so the
retries a publish makes after a lost acknowledgement are stored once (within
the stream's duplicate window). An envelope never acknowledged is counted
(``drops{reason="unacknowledged"}``), subscribers see the sequence gap, and the
next send raises :class:`~dfpubsub.errors.TransportError`; sends then fail fast
for a growing pause.

Subscribing. A subscriber reads the whole stream with one ephemeral pull
consumer (ack none, in memory) and keeps the envelopes of its topics, so
envelopes and hellos come in the order they were stored. It starts at the
stream's end when the first topic is subscribed, or after the sequence in its
``position_file`` (written as recv() hands envelopes over), and resumes after
the last stream sequence it received whenever the consumer is made again: after
a reconnect, a server restart, or a consumer that vanished. Sequences of a stream
of our own run without holes, so a hole means the stream's limits (MaxAge,
MaxMsgs, MaxBytes) or a purge removed messages the subscriber never read: it
counts them (``drops{reason="stream_limits"}``) and reports its topics lost,
which the core resyncs. A stream that was deleted and made again, or a server
that lost its store, is reported as ``"reset"`` and read on from its end.

Joining. A subscriber whose control topic is subscribed and start fixed sends one
core NATS message on ``{prefix}.joins`` (outside the stream); publishers count
them and answer with a welcome hello, stored after the newcomer's start.

JetStream is required: a server without it (nothing answers the JetStream API)
is a :class:`~dfpubsub.errors.ConfigError` at ``subscribe()`` and a
:class:`~dfpubsub.errors.TransportError` naming it at every ``send()``.

Credentials and TLS come from the ``[nats]`` settings section (user and
password, token, NKey seed file or creds file; CA, client certificate).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dfpubsub.errors import ConfigError
from dfpubsub.logs import RateLimitedLog
from dfpubsub.metrics import Stats
from dfpubsub.transport import Driver, PublisherTransport, SubscriberTransport

from .connection import parse_servers
from .publisher import NatsPublisher
from .subscriber import NatsSubscriber

__all__ = ["NatsJetStreamDriver", "NatsOptions"]

log = logging.getLogger(__name__)


class NatsOptions(BaseModel):
    """Options of the ``nats`` driver (config table ``[driver.nats]``)."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field("dfpubsub", pattern=r"^[A-Za-z0-9_-]+$", description="Subjects are {prefix}.ps.{topic}.")
    stream: str = Field("DFPUBSUB", pattern=r"^[A-Za-z0-9_-]+$",
                        description="The JetStream stream of the driver's own, holding {prefix}.ps.>.")
    max_age: float = Field(86400.0, ge=0, description="Stream limit: seconds a message is kept (0: no limit).")
    max_msgs: int = Field(1_000_000, ge=-1, description="Stream limit: messages (envelopes) kept (-1: no limit).")
    max_bytes: int = Field(1 << 30, ge=-1, description="Stream limit: bytes kept (-1: no limit).")
    duplicate_window: float = Field(120.0, gt=0, description="Seconds the stream remembers message ids to drop retries.")
    num_replicas: int = Field(
        0, ge=0, le=5, description="Servers that hold a new stream (R1, R3, R5); 0: 3 when the cluster has at least "
        "3 servers (those the URL names, or the cluster tells the client of), else 1.")
    timeout: float = Field(5.0, gt=0, description="Connect timeout and longest a publish retries, seconds.")
    ack_timeout: float = Field(1.0, gt=0, description="Wait for one publish acknowledgement before sending again, seconds.")
    max_inflight: int = Field(256, ge=1, description="Envelopes a publisher has sent and awaits acknowledgements of, at most.")
    count: int = Field(512, ge=1, description="Messages one pull request asks for.")
    pull_expires: float = Field(1.0, gt=0, description="Seconds a pull request waits on the server for messages.")
    max_pending_bytes: int = Field(
        64 << 20, ge=1, description="Bytes a subscriber holds for recv(); beyond, it pulls no more until recv() catches up.")
    consumer_inactive_threshold: float = Field(
        60.0, gt=0, description="Seconds the server keeps a subscriber's consumer after it stopped pulling.")
    position_file: str = Field("", description="File where a subscriber keeps the last stream sequence it handed over "
                               "and resumes from on restart (empty: start at the stream's end).")
    position_interval: float = Field(1.0, gt=0, description="Seconds between writes of the position file.")

    @model_validator(mode="after")
    def _check(self) -> NatsOptions:
        if self.ack_timeout > self.timeout:
            raise ValueError("ack_timeout must be at most timeout")
        if self.pull_expires >= self.consumer_inactive_threshold:
            raise ValueError("pull_expires must be shorter than consumer_inactive_threshold")
        if self.timeout >= self.duplicate_window:
            raise ValueError("timeout must be shorter than duplicate_window: a publish retried after it would be "
                             "stored twice")
        return self

    def stream_limits(self, cluster: int = 1) -> dict[str, Any]:
        """The stream's limits as nats-py's StreamConfig fields, for a cluster of ``cluster`` servers."""
        replicas = self.num_replicas or (3 if cluster >= 3 else 1)
        return {"max_age": self.max_age, "max_msgs": self.max_msgs, "max_bytes": self.max_bytes,
                "duplicate_window": self.duplicate_window, "num_replicas": replicas}


class NatsJetStreamDriver(Driver):
    """``nats://host:port``: topics are subjects of one JetStream stream, read by pull consumers."""

    name = "nats"
    options_model = NatsOptions

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        try:
            self.nats_options = NatsOptions(**self.options)
        except ValidationError as exc:
            raise ConfigError(f"invalid [driver.nats] options: {exc}") from exc
        if not url:
            raise ConfigError("the nats driver needs a URL such as nats://127.0.0.1:4222")
        parse_servers(url)
        self._url: str = url
        self._log = RateLimitedLog(log)

    def publisher(self, stats: Stats) -> PublisherTransport:
        return NatsPublisher(self._url, self.nats_options, stats, self._log)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        return NatsSubscriber(self._url, self.nats_options, stats, self._log)
