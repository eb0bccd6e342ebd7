"""The hop from forked API workers to the host's publisher service: PUSH to PULL over ipc.

Each worker connects a PUSH socket; the service binds one PULL socket. PUSH
queues up to ``worker_hwm`` envelopes while the service is away (restarting,
say) and hands them over when it is back; beyond that, sending fails at once
instead of blocking an API request, the publisher counts the drop, and the
hole in its sequence makes subscribers resync. PULL takes from all workers
fairly and keeps each worker's order.
"""

from __future__ import annotations

import zmq

from dfpubsub.codec import topic_frame
from dfpubsub.errors import TransportError
from dfpubsub.metrics import Stats
from dfpubsub.transport import IngressTransport, PublisherTransport

from .curve import AllowedKeys, load_secret_key, serve, unguard
from .ipc import bind, unlink_ipc
from .options import ZmqOptions, common_options, recv_messages

__all__ = ["WorkerPush", "WorkerIngress", "ipc_url"]


def ipc_url(socket_path: str) -> str:
    """``ipc://`` URL of a socket path (an URL is taken as it is)."""
    return socket_path if "://" in socket_path else f"ipc://{socket_path}"


class WorkerPush(PublisherTransport):
    """A worker's PUSH socket connected to the service. Create it in the process that uses it.

    It has a context of its own so that :meth:`close` can terminate it, which
    waits (up to ``linger``) until the last envelopes, the bye among them, are
    handed to the service: a worker exiting right after closing its publisher
    would otherwise take them down with its I/O thread.
    """

    def __init__(self, socket_path: str, opts: ZmqOptions, stats: Stats):
        self.stats = stats
        self._topics: dict[str, bytes] = {}
        self._ctx = zmq.Context(1)
        self.sock = self._ctx.socket(zmq.PUSH)
        common_options(self.sock, opts)
        self.sock.setsockopt(zmq.SNDHWM, opts.worker_hwm)
        if opts.worker_curve_key_file:  # present the host's key and pin it on the service
            secret = load_secret_key(opts.worker_curve_key_file).encode()
            self.sock.curve_secretkey = secret
            self.sock.curve_publickey = self.sock.curve_serverkey = zmq.curve_public(secret)
        try:
            self.sock.connect(ipc_url(socket_path))
        except zmq.ZMQError as exc:
            self.sock.close(0)
            self._ctx.term()
            raise TransportError(f"cannot connect to the publisher service at {socket_path}: {exc}") from exc

    def send(self, topic: str, frame: bytes) -> None:
        tf = self._topics.get(topic)
        if tf is None:
            tf = self._topics[topic] = topic_frame(topic)
        try:
            # The second frame of a message cannot fail once the first is queued.
            self.sock.send(tf, zmq.SNDMORE | zmq.NOBLOCK)
            self.sock.send(frame)
        except zmq.Again as exc:
            raise TransportError("publisher service unavailable and the worker buffer is full") from exc
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq send failed: {exc}") from exc

    def close(self) -> None:
        self.sock.close()
        self._ctx.term()


class WorkerIngress(IngressTransport):
    """The service's PULL socket bound to the workers' ipc path."""

    def __init__(self, socket_path: str, opts: ZmqOptions, stats: Stats):
        self.opts = opts
        self.stats = stats
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
        common_options(self.sock, opts)
        self.sock.setsockopt(zmq.RCVHWM, opts.rcvhwm)
        self._zap_domain = ""
        if opts.worker_curve_key_file:  # only workers holding the host's secret key get in
            secret = load_secret_key(opts.worker_curve_key_file)
            public = zmq.curve_public(secret.encode()).decode()
            _, self._zap_domain = serve(self.sock, secret, AllowedKeys([public], "", stats))
        self._uri = bind(self.sock, ipc_url(socket_path), opts.ipc_mode)
        self._topics: dict[bytes, str] = {}

    @property
    def uri(self) -> str:
        return self._uri

    def recv(self, timeout: float) -> list[tuple[str, bytes | memoryview]]:
        """Envelopes as memoryviews of the received frames: the relay reads their headers
        and :class:`ZmqPublisher` sends them on, neither copying them."""
        try:
            if not self.sock.poll(int(timeout * 1000)):
                return []
            messages = recv_messages(self.sock, self.opts.recv_batch, self.stats, copy=False)
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq receive failed: {exc}") from exc
        out: list[tuple[str, bytes | memoryview]] = []
        topics = self._topics
        for tf, frame in messages:
            topic = topics.get(tf)
            if topic is None:
                try:
                    topic = tf[:-1].decode()
                except UnicodeDecodeError:
                    self.stats.inc("decode_errors", reason="bad_topic")
                    continue
                if len(topics) < 65536:  # bounded: a flood of made-up topics must not grow memory
                    topics[tf] = topic
            out.append((topic, frame))
        return out

    def close(self) -> None:
        self.sock.close(0)
        unlink_ipc(self._uri)
        if self._zap_domain:
            unguard(self._zap_domain)
