"""The publisher service's relay: worker envelopes in, the same bytes out.

Forked API workers each run their own :class:`~dfpubsub.publisher.Publisher`
(own id, own sequences) and push its envelopes to the host's publisher
service, which binds the one port subscribers connect to. The relay forwards
every frame unchanged, so sequence checking stays end to end: a frame lost
between a worker and the service, in the service, or after it is the same
hole to a subscriber, repaired the same way.

What the relay adds is the welcome: workers cannot see subscribers join the
service's socket, so the relay greets each new subscriber with a hello on
behalf of every live worker, carrying the last sequence it relayed (or a
worker's hello announced) per topic. It reads only envelope headers; a frame
that does not decode or claims another topic than it travels on is counted
and dropped, never relayed. Frames may be views of the received messages,
which the egress transport of the same driver sends on without copying.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .codec import decode_header, encode_hello, hello_parts
from .errors import DecodeError, InvalidEvent, TransportError
from .events import CONTROL_TOPIC, Bye, EventBatch, Hello, kept_text, validate_topic
from .logs import RateLimitedLog
from .metrics import Stats
from .transport import IngressTransport, PublisherTransport

__all__ = ["Relay", "RelayOptions"]

log = logging.getLogger(__name__)

#: How often the relay looks for new subscribers to welcome (seconds).
_WELCOME_POLL = 0.05
#: After a step that relayed something, how long the relay lets more frames gather (seconds).
_GATHER = 0.001


@dataclass(slots=True)
class RelayOptions:
    """Tuning of a :class:`Relay` (from ``[pubsub]``)."""

    max_idle_time: float = 5.0
    dead_after_idles: float = 3.0
    max_message_bytes: int = 1 << 20
    #: Workers tracked for the welcomes, and topics (per worker, and in all); frames beyond are
    #: relayed all the same, untracked (``untracked{reason}``): a flood of made-up publisher ids or
    #: topics costs bounded memory, and the workers already tracked keep their place.
    max_workers: int = 1024
    max_topics: int = 10_000


@dataclass(slots=True)
class _Worker:
    name: str
    host: str
    max_idle: float
    last_seen: float
    seqs: dict[str, int] = field(default_factory=dict)


class Relay:
    """Relays ``ingress`` to ``egress``. Not thread-safe: one thread calls :meth:`step`.

    ``id``, ``name``, ``transport`` and :meth:`sequences` make it announceable
    in discovery like a publisher (the row lists the service's tcp endpoint).
    """

    def __init__(
        self,
        ingress: IngressTransport,
        egress: PublisherTransport,
        name: str,
        options: RelayOptions | None = None,
        stats: Stats | None = None,
    ):
        self.ingress = ingress
        self.transport = egress
        self.name = name
        self.id = uuid.uuid4().hex
        self.options = options or RelayOptions()
        self.stats = stats or Stats("relay", name)
        self._workers: dict[str, _Worker] = {}
        self._topics: dict[str, int] = {}
        self._log = RateLimitedLog(log)
        self._next_forget = 0.0
        self._next_welcome = 0.0

    def sequences(self) -> dict[str, int]:
        """Topics relayed so far (values: envelopes relayed); safe from any thread."""
        return dict(self._topics)

    def workers(self) -> dict[str, str]:
        """Live workers: publisher id -> name."""
        return {pid: w.name for pid, w in self._workers.items()}

    def step(self, timeout: float) -> int:
        """Relay what arrives within ``timeout`` seconds, greet new subscribers; return frames relayed."""
        try:
            frames = self.ingress.recv(timeout)
        except TransportError as exc:
            self._log.warning("recv", "receiving from workers failed", error=str(exc))
            frames = []
        now = time.monotonic()
        relayed = 0
        for topic, frame in frames:
            if self._track(topic, frame, now) and self._send(topic, frame):
                relayed += 1
        if relayed:
            self.stats.inc("envelopes_relayed", relayed)
        if now >= self._next_welcome:
            # On a timer, not every step: looking costs a failed non-blocking read.
            self._next_welcome = now + _WELCOME_POLL
            self._welcome()
        self._forget(now)
        return relayed

    def run(self, stop: threading.Event, drain_timeout: float = 2.0, beat: Callable[[], None] = lambda: None) -> None:
        """Relay until ``stop`` is set, then drain what workers already sent (up to ``drain_timeout``);
        ``beat`` is called at every turn (a liveness probe's heartbeat)."""
        while not stop.is_set():
            beat()
            if self.step(0.1):
                # Under load, relay what came meanwhile in one step: every step wakes this
                # thread and ZeroMQ's I/O thread, which costs more than relaying a frame.
                # Idle, the next frame is relayed as soon as it arrives.
                time.sleep(_GATHER)
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline and self.step(0.05):
            pass

    # -- internals ---------------------------------------------------------------

    def _track(self, topic: str, frame: bytes | memoryview, now: float) -> bool:
        """Learn from the frame's header; False if it must not be relayed."""
        try:
            env = decode_header(frame, self.options.max_message_bytes, check_events=False)
        except DecodeError as exc:
            self.stats.inc("decode_errors", reason=exc.reason)
            self._log.warning("decode", "dropped an undecodable frame from a worker", reason=exc.reason)
            return False
        expected = env.topic if isinstance(env, EventBatch) else CONTROL_TOPIC
        if topic != expected:
            self.stats.inc("drops", reason="topic_mismatch")
            return False
        if isinstance(env, EventBatch) and self._room(self._topics, topic):
            self._topics[topic] = self._topics.get(topic, 0) + 1
        worker = self._workers.get(env.publisher_id)
        if isinstance(env, Bye):
            self._workers.pop(env.publisher_id, None)
            return True
        if worker is None:
            if len(self._workers) >= self.options.max_workers:
                self.stats.inc("untracked", reason="worker")
                return True
            worker = self._workers[env.publisher_id] = _Worker(
                self._kept(env.publisher_name, "name"), "", self.options.max_idle_time, now
            )
            self.stats.inc("workers_seen")
        worker.last_seen = now
        if isinstance(env, EventBatch):
            if self._room(worker.seqs, topic):
                worker.seqs[topic] = env.seq + env.count - 1
        elif isinstance(env, Hello):
            worker.host = self._kept(env.host, "host")
            # 0 or less included: that worker sends no idle hellos and is never taken as dead.
            worker.max_idle = env.max_idle_time
            for t, seq in env.seqs.items():
                if seq > worker.seqs.get(t, 0) and self._valid_topic(t) and self._room(worker.seqs, t):
                    worker.seqs[t] = seq
        return True

    def _room(self, tracked: dict[str, int], topic: str) -> bool:
        """Whether ``topic`` is in ``tracked`` or may join it (``max_topics``)."""
        if topic in tracked or len(tracked) < self.options.max_topics:
            return True
        self.stats.inc("untracked", reason="topic")
        return False

    def _kept(self, text: str, name: str) -> str:
        """A worker's name or host as kept (and re-sent in welcomes): at most 255 characters."""
        kept = kept_text(text)
        if kept is not text:
            self.stats.inc("strings_clamped", reason=name)
        return kept

    def _valid_topic(self, topic: str) -> bool:
        """Whether a hello's topic is one a publisher may send on; no subscriber takes another."""
        try:
            validate_topic(topic)
        except InvalidEvent:
            self.stats.inc("drops", reason="invalid_topic")
            return False
        return True

    def _send(self, topic: str, frame: bytes | memoryview) -> bool:
        try:
            # A view comes from the ingress of the same driver, whose egress sends it as it is.
            self.transport.send(topic, frame)  # type: ignore[arg-type]
        except TransportError as exc:
            self.stats.inc("drops", reason="send_failed")
            self._log.warning("send", "relaying failed; subscribers will resync", topic=topic, error=str(exc))
            return False
        return True

    def _welcome(self) -> None:
        try:
            joined = self.transport.new_subscribers()
        except TransportError:
            return
        if not joined:
            return
        self.stats.inc("subscribers_joined", joined)
        now = time.time()
        for pid, w in list(self._workers.items()):
            hello = Hello(pid, w.name, now, dict(w.seqs), "welcome", w.max_idle, w.host)
            for part in hello_parts(hello, self.options.max_message_bytes):
                if self._send(CONTROL_TOPIC, encode_hello(part)):
                    self.stats.inc("hellos_out", reason="welcome")

    def _forget(self, now: float) -> None:
        """Drop workers silent so long that subscribers count them dead: no welcome for them."""
        if now < self._next_forget:
            return
        self._next_forget = now + 1.0
        stale = [pid for pid, w in self._workers.items()
                 if w.max_idle > 0 and now - w.last_seen > w.max_idle * self.options.dead_after_idles]
        for pid in stale:
            del self._workers[pid]
            self.stats.inc("workers_forgotten")
