"""The gRPC connection of an etcd transport: the stubs on a channel, reconnection, and fork safety.

A channel is opened on first use, dropped after a failure (the next call
connects again, to the next endpoint) and closed just before ``os.fork()``
once the calls in flight have ended; both processes then reopen it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import grpc
from aetcd import rpc

from dfpubsub.backends.etcd import RECONNECT_OPTIONS, UNAVAILABLE, answers, open_channel, parse_endpoints
from dfpubsub.errors import ClosedError, TransportError

__all__ = ["LIVE", "Conn", "Stubs"]

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
    """A channel and the stubs of the etcd services on it."""

    __slots__ = ("channel", "kv", "lease", "watch")

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)


class Conn:
    """The gRPC channel of one transport: opened on demand, dropped after a failure, closed before a fork."""

    def __init__(self, url: str, timeout: float):
        self.url = url
        self.timeout = timeout
        self._endpoints = [f"{host}:{port}" for host, port in parse_endpoints(url)]
        self._index = 0  # endpoint in use; moves on after a failure
        self._cond = threading.Condition(threading.Lock())  # guards the fields below
        self._stubs: Stubs | None = None
        self._pid = os.getpid()
        self._calls = 0  # calls in flight
        self._suspended = False  # a fork is under way: new calls wait
        self._closed = False

    @contextlib.contextmanager
    def call(self) -> Iterator[Stubs]:
        """The stubs to make calls with; a fork waits until the block is left."""
        with self._cond:
            if self._pid != os.getpid():  # forked without our hooks: the parent's channel is not ours
                self._stubs, self._calls, self._suspended, self._pid = None, 0, False, os.getpid()
            self._cond.wait_for(lambda: not self._suspended)
            if self._closed:
                raise ClosedError(f"etcd connection to {self.url} is closed")
            if self._stubs is None:
                self._stubs = Stubs(self._open())
            stubs = self._stubs
            self._calls += 1
        try:
            yield stubs
        finally:
            del stubs
            with self._cond:
                self._calls -= 1
                if not self._calls:
                    self._cond.notify_all()

    def _open(self) -> grpc.Channel:
        first, n = self._index, len(self._endpoints)
        options = [*_CHANNEL_OPTIONS, ("grpc.keepalive_timeout_ms", int(self.timeout * 1000))]
        for i in range(n):
            self._index = (first + i) % n
            channel = open_channel(self._endpoints[self._index], options)
            if n == 1 or answers(channel, self.timeout / n):  # several: take the first that answers
                return channel
            channel.close()
        raise TransportError(f"none of the etcd endpoints of {self.url} answered")

    def error(self, stubs: Stubs, exc: grpc.RpcError | ValueError) -> TransportError:
        """What a failed call means; a lost or slow server also drops the channel (the next call reconnects)."""
        where = self._endpoints[self._index]
        if isinstance(exc, ValueError):  # gRPC refuses calls on a channel that a failure or a fork closed
            return TransportError(f"etcd channel to {where} was closed during the call")
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code is not None and code not in UNAVAILABLE:
            return TransportError(f"etcd at {where} refused the request: {code.name}: {details}")
        with self._cond:
            if stubs is self._stubs:
                self._stubs = None
                stubs.channel.close()
                self._index = (self._index + 1) % len(self._endpoints)
        return TransportError(f"etcd at {where} is unavailable: {details}")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            stubs, self._stubs = self._stubs, None
            self._cond.notify_all()
        if stubs is not None and self._pid == os.getpid():
            stubs.channel.close()

    def before_fork(self) -> None:
        """Close the channel once the calls in flight have ended (cancelling them after ``timeout``);
        return holding the lock, so that no call starts until :meth:`after_fork`."""
        self._cond.acquire()
        self._suspended = True
        stubs, self._stubs = self._stubs, None
        if stubs is not None and self._pid == os.getpid():
            if not self._cond.wait_for(lambda: not self._calls, self.timeout):
                stubs.channel.close()
                self._cond.wait_for(lambda: not self._calls, self.timeout)
            stubs.channel.close()

    def after_fork(self, child: bool) -> None:
        if child:
            self._pid, self._calls = os.getpid(), 0
        self._suspended = False
        self._cond.notify_all()
        self._cond.release()


# -- fork safety -----------------------------------------------------------------------------
# gRPC cannot fork while a thread is inside it (the child crashes or hangs): every live
# transport stops its calls and closes its channel just before a fork, and starts again after.

LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_FORKING: list[Any] = []


def _before_fork() -> None:
    for transport in list(LIVE):
        transport._before_fork()
        _FORKING.append(transport)


def _after_fork(child: bool) -> None:
    while _FORKING:
        _FORKING.pop()._after_fork(child)


os.register_at_fork(before=_before_fork, after_in_parent=lambda: _after_fork(False),
                    after_in_child=lambda: _after_fork(True))
