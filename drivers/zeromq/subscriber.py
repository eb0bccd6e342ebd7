"""The subscriber side: one SUB socket connected to any number of publishers."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

import zmq

from dfpubsub.codec import topic_frame
from dfpubsub.errors import ClosedError, ConfigError, TransportError
from dfpubsub.metrics import Stats
from dfpubsub.transport import SubscriberTransport

from .curve import load_secret_key
from .options import SCHEMES, ZmqOptions, common_options, recv_messages

__all__ = ["ZmqSubscriber"]

log = logging.getLogger("dfpubsub.drivers.zeromq")


class ZmqSubscriber(SubscriberTransport):
    """SUB socket owned by the receive thread; other threads queue commands and wake it."""

    def __init__(self, opts: ZmqOptions, stats: Stats, endpoints: list[str]):
        self.opts = opts
        self.stats = stats
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        own = load_secret_key(opts.curve_secret_key_file) if opts.curve_secret_key_file \
            else opts.curve_client_secret_key
        #: CURVE is on when the subscriber has a publisher key or a key pair of its own; then
        #: every endpoint is connected with its pinned key (pin()), or curve_server_key.
        self._curve = bool(opts.curve_server_key or own)
        self._secret = (own or zmq.curve_keypair()[1].decode()).encode() if self._curve else b""
        self._pins: dict[str, bytes] = {}
        self._subscribed: set[bytes] = set()  # the topic frames the socket is subscribed to
        self.sock = self._socket()
        wake_addr = f"inproc://dfpubsub-wake-{id(self):x}"
        self._wake_rx = ctx.socket(zmq.PAIR)
        self._wake_rx.bind(wake_addr)
        self._wake_tx = ctx.socket(zmq.PAIR)
        self._wake_tx.connect(wake_addr)
        self._wake_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self._poller.register(self._wake_rx, zmq.POLLIN)
        self._commands: deque[Callable[[], None]] = deque()
        self._accepted: frozenset[bytes] = frozenset()
        self.endpoints: set[str] = set()
        self._closed = False
        self._closing = False
        for ep in endpoints:
            self.connect(ep)

    def _socket(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        common_options(sock, self.opts)
        sock.setsockopt(zmq.RCVHWM, self.opts.rcvhwm)
        if self._curve:
            sock.curve_secretkey = self._secret
            sock.curve_publickey = zmq.curve_public(self._secret)
        return sock

    # Commands run on the receive thread, inside recv().
    def _command(self, fn: Callable[[], None]) -> None:
        if self._closing:
            raise ClosedError("zmq subscriber is closed")
        self._commands.append(fn)
        with self._wake_lock:
            if not self._closed:
                self._wake_tx.send(b"", zmq.NOBLOCK)

    def subscribe(self, topic: str) -> None:
        tf = topic_frame(topic)
        self._accepted = self._accepted | {tf}

        def run() -> None:
            if tf not in self._subscribed:  # libzmq counts subscriptions: once each
                self._subscribed.add(tf)
                self.sock.setsockopt(zmq.SUBSCRIBE, tf)

        self._command(run)

    def unsubscribe(self, topic: str) -> None:
        tf = topic_frame(topic)
        self._accepted = self._accepted - {tf}

        def run() -> None:
            if tf in self._subscribed:
                self._subscribed.discard(tf)
                self.sock.setsockopt(zmq.UNSUBSCRIBE, tf)

        self._command(run)

    def connect(self, uri: str) -> None:
        if not uri.startswith(SCHEMES):
            raise ConfigError(f"zmq endpoint must start with one of {SCHEMES}, got {uri!r}")

        def run() -> None:
            if uri not in self.endpoints:
                self._connect(uri)
                self.endpoints.add(uri)

        self._command(run)

    def _connect(self, uri: str) -> None:
        try:
            if self._curve:  # libzmq takes the key in force when connect() is called
                self.sock.curve_serverkey = self._pins.get(uri) or (self.opts.curve_server_key or "").encode()
            self.sock.connect(uri)
        except zmq.ZMQError as exc:
            self.stats.inc("drops", reason="bad_endpoint")
            raise TransportError(f"cannot connect to {uri}: {exc}") from exc

    def pin(self, uri: str, public_key: str) -> None:
        """Connect ``uri`` (from now on) only to the publisher holding ``public_key`` (Z85), when
        CURVE is on: what discovery rows carry (docs/security.md)."""
        if len(public_key) != 40:
            raise ConfigError(f"a CURVE public key is 40 Z85 characters, not {public_key!r}")
        self._pins[uri] = public_key.encode()

    def disconnect(self, uri: str) -> None:
        def run() -> None:
            if uri in self.endpoints:
                self.endpoints.discard(uri)
                self._reopen()

        self._command(run)

    def _reopen(self) -> None:
        """Replace the socket by a new one connected to the remaining endpoints.

        Not ``zmq_disconnect``, which ends the endpoint's pipe at once: with libzmq 4.3.5 it
        aborted the process (``Assertion failed: !_more (src/fq.cpp:80)``, libzmq's check that
        the frames of a message come from one pipe) in half the runs of
        tests/functional/security/test_curve.py on a slow machine, and never after this change. Messages
        in flight from the other publishers are lost with the old socket; the sequence tracker
        sees the gap and resyncs.
        """
        self._poller.unregister(self.sock)
        self.sock.close(0)
        self.sock = self._socket()
        self._poller.register(self.sock, zmq.POLLIN)
        for tf in self._subscribed:
            self.sock.setsockopt(zmq.SUBSCRIBE, tf)
        for uri in list(self.endpoints):
            try:
                self._connect(uri)
            except TransportError as exc:  # connected before, so hardly; counted, and the rest goes on
                self.endpoints.discard(uri)
                log.warning("zmq command failed", extra={"error": str(exc)})
        self.stats.inc("reopens")

    def _run_commands(self) -> None:
        while self._commands:
            try:
                self._commands.popleft()()
            except TransportError as exc:
                # A bad endpoint must not stop the subscriber; it is counted and logged.
                log.warning("zmq command failed", extra={"error": str(exc)})

    def recv(self, timeout: float) -> list[bytes]:
        with self._recv_lock:
            if self._closing:
                self._shutdown()
                raise ClosedError("zmq subscriber is closed")
            self._run_commands()
            ready = dict(self._poller.poll(int(timeout * 1000)))
            if self._wake_rx in ready:
                try:
                    while True:
                        self._wake_rx.recv(zmq.NOBLOCK)
                except zmq.Again:
                    pass
                if self._closing:
                    self._shutdown()
                    raise ClosedError("zmq subscriber is closed")
                self._run_commands()
            if self.sock not in ready:
                return []
            return self._drain()

    def _drain(self) -> list[bytes]:
        accepted = self._accepted
        out: list[bytes] = []
        for topic, frame in recv_messages(self.sock, self.opts.recv_batch, self.stats):
            if topic not in accepted:  # in flight when its topic was unsubscribed
                self.stats.inc("drops", reason="foreign_topic")
                continue
            out.append(frame)
        return out

    def _shutdown(self) -> None:
        if not self._closed:
            with self._wake_lock:
                self._closed = True
                self.sock.close(0)
                self._wake_rx.close(0)
                self._wake_tx.close(0)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        with self._wake_lock:
            if not self._closed:
                self._wake_tx.send(b"", zmq.NOBLOCK)
        with self._recv_lock:  # a recv in progress sees the flag and shuts down itself
            self._shutdown()
