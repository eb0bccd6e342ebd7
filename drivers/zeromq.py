"""ZeroMQ driver, the reference transport: ``zmq+tcp://host:port`` or ``zmq+ipc:///path``.

Publishers bind an XPUB socket (XPUB so they see subscribers join and can greet
them with a hello at once); subscribers connect a SUB socket to any number of
publishers, added and removed at run time. Every message is two frames: the
topic followed by NUL, then the envelope. Subscribing to ``topic + NUL`` makes
ZeroMQ's prefix filter exact. High-water marks, ZMTP heartbeats and optional
CURVE encryption are set from the driver options.
"""

from __future__ import annotations

import logging
import os
import socket as pysocket
import stat
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import zmq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dfpubsub.api import Driver, PublisherTransport, SubscriberTransport
from dfpubsub.codec import topic_frame
from dfpubsub.errors import ClosedError, ConfigError, TransportError
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.metrics import Stats

__all__ = ["ZmqDriver", "ZmqOptions"]

log = logging.getLogger(__name__)

_CONTROL_SUBSCRIBE = b"\x01" + topic_frame(CONTROL_TOPIC)
_SCHEMES = ("tcp://", "ipc://", "inproc://")


class ZmqOptions(BaseModel):
    """Options of the ``zmq`` driver (config table ``[driver.zmq]``)."""

    model_config = ConfigDict(extra="forbid")

    publishers: list[str] = Field(default_factory=list, description="Endpoints a subscriber connects to at start.")
    sndhwm: int = Field(10_000, ge=1, description="Envelopes queued per subscriber before the publisher drops.")
    rcvhwm: int = Field(10_000, ge=1, description="Envelopes queued in a subscriber before ZeroMQ drops.")
    heartbeat_ivl: float = Field(1.0, ge=0, description="ZMTP heartbeat interval, seconds (0 disables).")
    heartbeat_timeout: float = Field(3.0, ge=0, description="Drop a peer silent this long, seconds.")
    linger: float = Field(1.0, ge=0, description="How long close() waits to send queued messages, seconds.")
    recv_batch: int = Field(256, ge=1, description="Most envelopes one recv() call returns.")
    ipc_mode: int = Field(0o660, ge=0, le=0o777, description="Permissions of a bound ipc socket file.")
    curve_secret_key: str | None = Field(None, description="Publisher: Z85 CURVE secret key; enables encryption.")
    curve_server_key: str | None = Field(None, description="Subscriber: the publishers' Z85 CURVE public key.")
    curve_client_secret_key: str | None = Field(
        None, description="Subscriber: own Z85 CURVE secret key (a fresh one if unset)."
    )

    @model_validator(mode="after")
    def _check(self) -> "ZmqOptions":
        if self.heartbeat_ivl and self.heartbeat_timeout <= self.heartbeat_ivl:
            raise ValueError("heartbeat_timeout must be longer than heartbeat_ivl")
        for name in ("curve_secret_key", "curve_server_key", "curve_client_secret_key"):
            key = getattr(self, name)
            if key is not None and len(key) != 40:
                raise ValueError(f"{name} must be a 40-character Z85 key")
        return self


def _common_options(sock: zmq.Socket, opts: ZmqOptions) -> None:
    sock.setsockopt(zmq.LINGER, int(opts.linger * 1000))
    if opts.heartbeat_ivl:
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(opts.heartbeat_ivl * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(opts.heartbeat_timeout * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TTL, int(opts.heartbeat_timeout * 1000))


def _clear_stale_ipc(path: str) -> None:
    """Remove a socket file left by a crashed process; refuse one that is alive."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        raise TransportError(f"{path} exists and is not a socket")
    probe = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
        return
    except OSError as exc:
        raise TransportError(f"cannot probe ipc socket {path}: {exc}") from exc
    finally:
        probe.close()
    raise TransportError(f"ipc socket {path} is in use by a live process")


class _ZmqPublisher(PublisherTransport):
    def __init__(self, url: str, opts: ZmqOptions, stats: Stats):
        self.stats = stats
        self._topics: dict[str, bytes] = {}
        self.sock = zmq.Context.instance().socket(zmq.XPUB)
        try:
            _common_options(self.sock, opts)
            self.sock.setsockopt(zmq.SNDHWM, opts.sndhwm)
            self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
            if opts.curve_secret_key:
                self.sock.curve_server = True
                self.sock.curve_secretkey = opts.curve_secret_key.encode()
                self.sock.curve_publickey = zmq.curve_public(opts.curve_secret_key.encode())
            if url.startswith("ipc://"):
                _clear_stale_ipc(url[len("ipc://"):])
            self.sock.bind(url)
            self._uri = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
            if url.startswith("ipc://"):
                os.chmod(url[len("ipc://"):], opts.ipc_mode)
        except zmq.ZMQError as exc:
            self.sock.close(0)
            raise TransportError(f"cannot bind {url}: {exc}") from exc
        except TransportError:
            self.sock.close(0)
            raise

    @property
    def uri(self) -> str:
        return self._uri

    def send(self, topic: str, frame: bytes) -> None:
        tf = self._topics.get(topic)
        if tf is None:
            tf = self._topics[topic] = topic_frame(topic)
        try:
            self.sock.send(tf, zmq.SNDMORE)
            self.sock.send(frame)
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq send failed: {exc}") from exc

    def new_subscribers(self) -> int:
        joined = 0
        try:
            while True:
                if self.sock.recv(zmq.NOBLOCK) == _CONTROL_SUBSCRIBE:
                    joined += 1
        except zmq.Again:
            return joined
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq recv failed: {exc}") from exc

    def close(self) -> None:
        self.sock.close()
        if self._uri.startswith("ipc://"):
            try:
                os.unlink(self._uri[len("ipc://"):])
            except FileNotFoundError:
                pass


class _ZmqSubscriber(SubscriberTransport):
    """SUB socket owned by the receive thread; other threads queue commands and wake it."""

    def __init__(self, opts: ZmqOptions, stats: Stats, endpoints: list[str]):
        self.opts = opts
        self.stats = stats
        ctx = zmq.Context.instance()
        self.sock = ctx.socket(zmq.SUB)
        _common_options(self.sock, opts)
        self.sock.setsockopt(zmq.RCVHWM, opts.rcvhwm)
        if opts.curve_server_key:
            secret = (opts.curve_client_secret_key or zmq.curve_keypair()[1].decode()).encode()
            self.sock.curve_serverkey = opts.curve_server_key.encode()
            self.sock.curve_secretkey = secret
            self.sock.curve_publickey = zmq.curve_public(secret)
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
        self._command(lambda: self.sock.setsockopt(zmq.SUBSCRIBE, tf))

    def unsubscribe(self, topic: str) -> None:
        tf = topic_frame(topic)
        self._accepted = self._accepted - {tf}
        self._command(lambda: self.sock.setsockopt(zmq.UNSUBSCRIBE, tf))

    def connect(self, uri: str) -> None:
        if not uri.startswith(_SCHEMES):
            raise ConfigError(f"zmq endpoint must start with one of {_SCHEMES}, got {uri!r}")

        def run() -> None:
            if uri not in self.endpoints:
                try:
                    self.sock.connect(uri)
                except zmq.ZMQError as exc:
                    self.stats.inc("drops", reason="bad_endpoint")
                    raise TransportError(f"cannot connect to {uri}: {exc}") from exc
                self.endpoints.add(uri)

        self._command(run)

    def disconnect(self, uri: str) -> None:
        def run() -> None:
            if uri in self.endpoints:
                self.endpoints.discard(uri)
                try:
                    self.sock.disconnect(uri)
                except zmq.ZMQError:
                    pass  # already gone: nothing to undo

        self._command(run)

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
        out: list[bytes] = []
        accepted = self._accepted
        recv_multipart = self.sock.recv_multipart
        for _ in range(self.opts.recv_batch):
            try:
                frames = recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2 or not frames[0].endswith(b"\x00"):
                self.stats.inc("decode_errors", reason="bad_frames")
                continue
            if frames[0] not in accepted:  # in flight when its topic was unsubscribed
                self.stats.inc("drops", reason="foreign_topic")
                continue
            out.append(frames[1])
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


class ZmqDriver(Driver):
    """``zmq+tcp://host:port`` / ``zmq+ipc:///path``: the publisher binds the URL,
    subscribers connect to it and to ``options["publishers"]``."""

    name = "zmq"

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        try:
            self.zmq_options = ZmqOptions(**self.options)
        except ValidationError as exc:
            raise ConfigError(f"invalid [driver.zmq] options: {exc}") from exc
        if url is not None and not url.startswith(_SCHEMES):
            raise ConfigError(f"zmq URL must be zmq+tcp://, zmq+ipc:// or zmq+inproc://, got {url!r}")

    def publisher(self, stats: Stats) -> PublisherTransport:
        if not self.url:
            raise ConfigError("a zmq publisher needs a URL to bind, such as zmq+tcp://127.0.0.1:8866")
        return _ZmqPublisher(self.url, self.zmq_options, stats)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        endpoints = list(self.zmq_options.publishers)
        if self.url and self.url not in endpoints:
            endpoints.insert(0, self.url)
        return _ZmqSubscriber(self.zmq_options, stats, endpoints)
