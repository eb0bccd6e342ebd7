"""The gRPC connection of an etcd transport: a :class:`~dfpubsub.backends.etcd.EtcdChannel` with
the stubs of the KV, Lease and Watch services, options for long watches, and TransportError.

Endpoints, reconnection and the care around ``os.fork()`` are the store's
(:mod:`dfpubsub.backends.etcd`): a channel is opened on first use, dropped
after a failure (the next call connects again, to the next endpoint) and
closed just before a fork once the calls in flight have ended (cancelling
them after ``timeout``); both processes then reopen it. The transports call
its fork hooks from their own, which stop their threads around it.
"""

from __future__ import annotations

from typing import Any

import grpc
from aetcd import rpc

from dfpubsub.backends.etcd import RECONNECT_OPTIONS, EtcdChannel
from dfpubsub.errors import TransportError

__all__ = ["Stubs", "connect"]

_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # One watch response carries up to 1000 revisions: far above gRPC's default 4 MiB.
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    *RECONNECT_OPTIONS,
    # A watch may wait for writes for ever: pings find a server that vanished without a word
    # (etcd refuses pings more often than every 5 s).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class Stubs:
    """The stubs of the etcd services on one channel."""

    __slots__ = ("kv", "lease", "watch")

    def __init__(self, channel: grpc.Channel):
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)


def connect(url: str, timeout: float) -> EtcdChannel[Stubs]:
    """The connection of one transport: every failure is a TransportError, and a fork gives the
    calls in flight ``timeout`` to end before it cancels them."""
    return EtcdChannel(url, timeout, Stubs, refused=TransportError, unavailable=TransportError, fork_grace=timeout,
                       options=[*_CHANNEL_OPTIONS, ("grpc.keepalive_timeout_ms", int(timeout * 1000))])
