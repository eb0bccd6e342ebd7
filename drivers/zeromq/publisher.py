"""The publisher side: an XPUB socket bound to the driver's URL."""

from __future__ import annotations

import zmq

from dfpubsub.api import PublisherTransport
from dfpubsub.codec import topic_frame
from dfpubsub.errors import TransportError
from dfpubsub.metrics import Stats

from .ipc import bind, unlink_ipc
from .options import CONTROL_SUBSCRIBE, ZmqOptions, common_options

__all__ = ["ZmqPublisher"]


class ZmqPublisher(PublisherTransport):
    """A bound XPUB socket; reading it tells when subscribers join."""

    def __init__(self, url: str, opts: ZmqOptions, stats: Stats):
        self.stats = stats
        self._topics: dict[str, bytes] = {}
        self.sock = zmq.Context.instance().socket(zmq.XPUB)
        try:
            common_options(self.sock, opts)
            self.sock.setsockopt(zmq.SNDHWM, opts.sndhwm)
            self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
            if opts.curve_secret_key:
                self.sock.curve_server = True
                self.sock.curve_secretkey = opts.curve_secret_key.encode()
                self.sock.curve_publickey = zmq.curve_public(opts.curve_secret_key.encode())
        except zmq.ZMQError as exc:
            self.sock.close(0)
            raise TransportError(f"cannot set up the publisher socket: {exc}") from exc
        self._uri = bind(self.sock, url, opts.ipc_mode)

    @property
    def uri(self) -> str:
        return self._uri

    def send(self, topic: str, frame: bytes) -> None:
        tf = self._topics.get(topic)
        if tf is None:
            tf = self._topics[topic] = topic_frame(topic)
        if type(frame) is memoryview:
            obj = frame.obj
            if type(obj) is zmq.Frame and frame.nbytes == len(obj):
                # A whole frame this driver received (the relay): send the same message,
                # which ZeroMQ shares by reference count instead of copying.
                frame = obj  # type: ignore[assignment]
        try:
            self.sock.send(tf, zmq.SNDMORE)
            self.sock.send(frame)
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq send failed: {exc}") from exc

    def new_subscribers(self) -> int:
        joined = 0
        try:
            while True:
                if self.sock.recv(zmq.NOBLOCK) == CONTROL_SUBSCRIBE:
                    joined += 1
        except zmq.Again:
            return joined
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq recv failed: {exc}") from exc

    def close(self) -> None:
        self.sock.close()
        unlink_ipc(self._uri)
