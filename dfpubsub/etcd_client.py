"""What every etcd client of dfpubsub shares: endpoints, channel options, failure codes.

The store, publisher discovery and the etcd watch driver all talk to etcd
through aetcd's generated gRPC stubs on a synchronous channel (aetcd's own
client is asyncio-only). Loaded only by them, so ``import dfpubsub`` does not
need grpc.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc

from .errors import ConfigError

__all__ = ["RECONNECT_OPTIONS", "UNAVAILABLE", "parse_endpoints", "status_code", "answers"]

#: Retry a lost server quickly rather than with gRPC's backoff of up to two minutes.
RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
#: The server is gone or slow: drop the channel, the next call connects again.
UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """``etcd://host:port[,host:port...]`` as (host, port) pairs; ConfigError otherwise."""
    if not url.startswith("etcd://"):
        raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
    endpoints = []
    for part in url[len("etcd://"):].split("/", 1)[0].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or "@" in host:
            raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
        if not 0 < int(port) < 65536:
            raise ConfigError(f"etcd URL {url!r}: port {port} is not between 1 and 65535")
        endpoints.append((host, int(port)))
    return endpoints


def status_code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    """The gRPC status of a failed call, if it has one."""
    return exc.code() if isinstance(exc, grpc.Call) else None


def answers(channel: grpc.Channel, timeout: float) -> bool:
    """Connect; False as soon as the connection fails (refused, unreachable), or after ``timeout``."""
    done = threading.Event()
    ready: list[bool] = []

    def seen(state: grpc.ChannelConnectivity) -> None:
        if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
            ready.append(state == grpc.ChannelConnectivity.READY)
            done.set()

    channel.subscribe(seen, try_to_connect=True)
    try:
        return done.wait(timeout) and ready[0]
    finally:
        channel.unsubscribe(seen)
