"""The publisher side: an XPUB socket bound to the driver's URL."""

from __future__ import annotations

from time import monotonic

import zmq

from dfpubsub.codec import topic_frame
from dfpubsub.errors import TransportError
from dfpubsub.metrics import Stats
from dfpubsub.transport import PublisherTransport

from .curve import AllowedKeys, load_secret_key, serve, unguard
from .ipc import bind, unlink_ipc
from .options import ZmqOptions, common_options
from .peers import PeerBudget, PeerGuard
from .subscriptions import Subscriptions

__all__ = ["ZmqPublisher"]

# Plain ints: pyzmq's flags are enums, and each ``&`` or call with one costs a Python-level
# enum operation on the send path.
_EVENTS, _POLLIN, _SNDMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.SNDMORE)
#: How often (seconds) a send first looks for subscriptions waiting. Looking costs a call into
#: libzmq's command processing (about a microsecond and a half, more than the send); libzmq
#: itself attaches new peers on the send path at most about once a millisecond, so looking
#: more often than that would not let a new subscriber in any sooner.
_SUBSCRIPTIONS_EVERY = 0.001


class ZmqPublisher(PublisherTransport):
    """A bound XPUB socket in manual mode; reading it applies subscriptions (subscriptions.py)
    and tells when subscribers join; its peers are held to a budget (peers.py)."""

    def __init__(self, url: str, opts: ZmqOptions, stats: Stats):
        self.stats = stats
        self._topics: dict[str, bytes] = {}
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.XPUB)
        try:
            common_options(self.sock, opts)
            self.sock.setsockopt(zmq.SNDHWM, opts.sndhwm)
            self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
            self.sock.setsockopt(zmq.XPUB_MANUAL, 1)
            # Two messages waiting per peer: each call into libzmq then takes at most two
            # subscriptions from each into its trie, and the peers' budget is checked between
            # (peers.py). With one, a CURVE peer's subscriptions never came through (libzmq
            # queues its credential ahead of them).
            self.sock.setsockopt(zmq.RCVHWM, 2)
            secret = load_secret_key(opts.curve_secret_key_file) if opts.curve_secret_key_file \
                else opts.curve_secret_key
            #: The CURVE public key (Z85) subscribers pin; discovery rows carry it.
            self.public_key = self._zap_domain = ""
            if secret:
                allowed = AllowedKeys(opts.curve_allowed_keys, opts.curve_allowed_dir, stats) \
                    if opts.curve_allowed_keys or opts.curve_allowed_dir else None
                self.public_key, self._zap_domain = serve(self.sock, secret, allowed)
        except zmq.ZMQError as exc:
            self.sock.close(0)
            raise TransportError(f"cannot set up the publisher socket: {exc}") from exc
        self._subscriptions = Subscriptions(self.sock, stats, opts.max_subscriptions)
        self._joined = 0
        self._looked = 0.0  # when a send last looked for subscriptions waiting (monotonic)
        self._peers = PeerGuard(PeerBudget(opts.max_peer_bytes, opts.peer_bytes_per_second, opts.peer_stall_timeout,
                                           opts.max_peers, opts.max_peers_bytes), stats)
        self._uri = bind(self.sock, url, opts.ipc_mode)
        self._peers.bound(self._uri)

    @property
    def uri(self) -> str:
        return self._uri

    def send(self, topic: str, frame: bytes | memoryview) -> None:
        # Wider than PublisherTransport.send: the relay also hands on the views WorkerIngress made.
        tf = self._topics.get(topic)
        if tf is None:
            tf = self._topics[topic] = topic_frame(topic)
            self._subscriptions.published.add(tf)
        data: bytes | memoryview | zmq.Frame = frame
        if type(frame) is memoryview:
            obj = frame.obj
            if isinstance(obj, zmq.Frame) and frame.nbytes == len(obj):
                # A whole frame this driver received (the relay): send the same message,
                # which ZeroMQ shares by reference count instead of copying.
                data = obj
        try:
            now = monotonic()
            if now - self._looked >= _SUBSCRIPTIONS_EVERY:
                self._looked = now
                # pyzmq types every option int | bytes; EVENTS is an int (no cast() call on the hot path).
                events: int = self.sock.getsockopt(_EVENTS)  # type: ignore[assignment]
                if events & _POLLIN:
                    # A subscription waits (XPUB_MANUAL): take it first, so that a subscriber that
                    # subscribed before this send gets it, as with automatic subscriptions.
                    self._take_subscriptions()
            self.sock.send(tf, _SNDMORE)
            self.sock.send(data)
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq send failed: {exc}") from exc

    def new_subscribers(self) -> int:
        try:
            self._take_subscriptions()
            self._peers.poll()
        except zmq.ZMQError as exc:
            raise TransportError(f"zmq recv failed: {exc}") from exc
        # However many joined since the last poll (a flood of them included), one welcome hello.
        joined, self._joined = self._joined, 0
        return joined

    def subscriptions(self, topic: str) -> int:
        """How many subscriptions to ``topic`` this publisher has taken (one per subscriber and
        connection). A subscriber counted in ``new_subscribers()`` may not have subscribed to its
        topics yet (subscriptions.py): this tells when one has."""
        return self._subscriptions.taken.get(topic_frame(topic), 0)

    def _take_subscriptions(self) -> None:
        """Apply the (un)subscriptions waiting on the socket; count the subscribers that joined."""
        take, read = self._subscriptions.take, self._peers.read
        try:
            while True:
                self._joined += take(self.sock.recv(zmq.NOBLOCK))
                read(1)
        except zmq.Again:
            pass

    def close(self) -> None:
        self.sock.close()
        if self._zap_domain:
            unguard(self._zap_domain)
        unlink_ipc(self._uri)
