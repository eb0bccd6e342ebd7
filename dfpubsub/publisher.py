"""The reliable publisher: sequence numbers, micro-batching and hellos over any driver.

Every event gets the next sequence number of its topic. Batching adapts to the
load, as Nagle's algorithm does: while the traffic is light (at most
``_BATCH_FROM`` events in a ``_WINDOW`` of time, what controllers mostly see,
and after any quiet spell), the transport keeps up (sending took at most half
of the window) and it holds nothing unwritten, an event leaves at once, in an
envelope of its own, with the latency of an unbatched send. Beyond that, events
of a topic are gathered into one envelope until ``batch_max_events`` or
``batch_max_bytes`` is reached or ``batch_linger`` has passed since the first
one, so a busy publisher, or one on a slow transport, sends full envelopes as
before. A linger of 0 turns batching off. A burst that does not fill its batches
does not wait out the linger: once no event has come for ``batch_pause``, the
background thread sends the pending batches (unless the transport holds a
backlog), as a caller's ``flush()`` at the end of its burst would.

The signals rise when batching is needed, never fall because the machine is
busy: the time spent sending (all of it on a transport whose send waits for a
server, where a publisher starved of CPU waits longest), what each envelope
costs the server and the subscribers (``PublisherTransport.envelope_cost``),
and envelopes the transport holds unwritten (``backlog``). A publisher starved
of CPU publishes in spells between long waits for the processor: a busy window
keeps the windows after it batching across such gaps, up to ``_QUIET``, so
that each spell does not start with envelopes of one event; any publish
flushes the batches that outlived their linger, so the tail of a spell does not
wait for a background thread the machine runs late. Batches due
together leave together (``send_many``: one round trip on Redis), and where
sends are round trips that envelopes can share, a full batch takes the other
pending ones along.

A background thread flushes lingering batches and sends a hello when the
publisher starts, when a new subscriber appears, and whenever its quietest
topic has been silent for ``max_idle_time`` since the last hello.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from .codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PACKED_SCHEMA,
    SCHEMA_VERSION,
    SCHEMAS,
    BatchHeader,
    encode_batch,
    encode_bye,
    encode_hello,
    hello_parts,
    unpack_value,
)
from .errors import ClosedError, InvalidEvent, PayloadTooLarge, TransportError
from .events import ACTIONS, CONTROL_TOPIC, Action, Bye, Event, Hello, validate_topic
from .logs import RateLimitedLog
from .metrics import Stats
from .retry import Backoff
from .transport import PublisherTransport

__all__ = ["Publisher", "PublisherOptions"]

_DELETE = Action.DELETE  # a module global: cheaper to look up per event than the enum's attribute

log = logging.getLogger(__name__)

#: How often the background thread looks for new subscribers (seconds).
_WELCOME_POLL = 0.1
#: The rate above which events are batched: more than ``_BATCH_FROM`` events in a ``_WINDOW``
#: (30k events/s). Below it the envelopes an event each costs the subscribers little CPU;
#: above it they would crowd out the events (a publisher service relays envelopes, not events).
_WINDOW = 0.001
_BATCH_FROM = 30
#: Nor while sending took more than this of the window: a transport whose send() waits for
#: a server (Redis' XADD) or for room (etcd's group commit) would otherwise hold the rate
#: under ``_BATCH_FROM`` by its own slowness and never batch.
_SENDING = _WINDOW / 2
#: A busy window keeps the next one batching unless this long passed without a send in
#: between: a publisher that sixteen subscribers starve of CPU runs for a few milliseconds
#: every ten or twenty, and must not start each run with envelopes of one event.
_QUIET = 0.025
#: The longest wait before the background thread restarts after an unexpected error (seconds).
_RESTART_MAX = 5.0


@dataclass(slots=True)
class PublisherOptions:
    """Tuning of a :class:`Publisher` (see the ``[pubsub]`` config section)."""

    max_idle_time: float = 5.0
    batch_max_events: int = 128
    batch_max_bytes: int = 256 * 1024
    batch_linger: float = 0.002
    batch_pause: float = 0.0001
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: The wire schema of event envelopes (docs/protocol.md §10.2): 2 carries each value as its
    #: msgpack bytes, which only subscribers of this version or later accept.
    schema: int = SCHEMA_VERSION


class _Topic(BatchHeader):
    """A topic's envelope header, byte budgets, last sequence and pending batch.

    One object per topic, so that publishing looks up one dict entry.
    """

    __slots__ = ("room", "limit", "seq", "events", "first", "size", "deadline")

    def __init__(self, publisher_id: str, publisher_name: str, topic: str, opts: PublisherOptions):
        super().__init__(publisher_id, publisher_name, topic, opts.schema)
        #: Most bytes of packed events one envelope can carry.
        self.room = opts.max_message_bytes - self.overhead
        #: Where a batch is closed.
        self.limit = min(opts.batch_max_bytes, self.room)
        #: Last sequence number assigned (0: none yet).
        self.seq = 0
        #: The pending batch's packed events (None: no batch), its first sequence,
        #: its size in bytes and when its linger ends.
        self.events: list[bytes] | None = None
        self.first = 0
        self.size = 0
        self.deadline = 0.0


class Publisher:
    """Publishes change events reliably through ``transport``.

    Thread-safe. ``name`` is stable and meant for people; ``id`` is new at
    every start, so a restarted process is a new publisher to subscribers.
    ``stats`` may be shared with the transport so that its drops count here too.
    """

    def __init__(
        self,
        transport: PublisherTransport,
        name: str = "",
        options: PublisherOptions | None = None,
        stats: Stats | None = None,
    ):
        self.transport = transport
        self.options = options or PublisherOptions()
        if self.options.schema not in SCHEMAS:
            raise ValueError(f"schema must be one of {sorted(SCHEMAS)}, got {self.options.schema!r}")
        self._packed = self.options.schema == PACKED_SCHEMA
        self.id = uuid.uuid4().hex
        self.name = name or f"{socket.gethostname()}:{id(self):x}"
        self.stats = stats or Stats("publisher", self.name)
        self._host = socket.gethostname()
        # A transport that is down fails every send: one line a second says it.
        self._send_log = RateLimitedLog(log)
        # A plain Lock (not the RLock a bare Condition makes): "with" on it is C-fast.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._max_events = 1 if self.options.batch_linger <= 0 else self.options.batch_max_events
        #: What the transport says an envelope costs (PublisherTransport).
        self._cost = transport.envelope_cost
        self._waits = transport.send_waits
        #: Each send is a round trip and several envelopes can share one (Redis' pipeline): when a
        #: full batch must go, the other pending ones go with it rather than each in a trip of its own.
        self._coalesce = self._waits and type(transport).send_many is not PublisherTransport.send_many
        self._topics: dict[str, _Topic] = {}
        #: Topics with a pending batch.
        self._pending: dict[str, _Topic] = {}
        self._pack = msgpack.Packer().pack
        self._topic_sent: dict[str, float] = {}
        self._closed = False
        #: Earliest linger deadline of the pending batches (may be early, never late).
        self._due = float("inf")
        #: The background thread sleeps long (nothing pending lately) and must be woken.
        self._ticker_asleep = True
        self._last_batch = float("-inf")
        now = time.monotonic()
        self._last_publish = now
        #: Events in the current rate window, its end, and whether the window before was busy
        #: (too many events, or too long sending them).
        self._in_window = 0
        self._window_end = now
        self._busy = False
        #: Seconds spent in transport.send() in the current rate window.
        self._sending = 0.0
        self._last_hello = now
        self._last_send = now
        self._rev: int | None = None  # the bookmark every hello carries (see bookmark())
        self._bursts = 0  # callers inside burst(): no event leaves on its own
        with self._lock:
            self._send_hello("start")
        self._thread = threading.Thread(target=self._run, name=f"dfpubsub-pub-{self.name}", daemon=True)
        self._thread.start()

    # -- publishing ----------------------------------------------------------

    def publish(
        self,
        topic: str,
        table: str,
        key: str,
        action: Action | str,
        version: int,
        value: Any = None,
        timestamp: float | None = None,
        packed: bytes | None = None,
    ) -> int:
        """Publish one change; return its sequence number on ``topic``.

        ``packed``: the value's msgpack bytes as the store holds them, given instead of
        ``value`` (which is then ignored): schema 2 sends them as they are, without packing the
        value again, schema 1 decodes them. Schema 2 carries maps only (:class:`InvalidEvent`
        for another value).

        Raises :class:`InvalidEvent` for a bad field, :class:`PayloadTooLarge`
        when the event cannot fit in one message, :class:`ClosedError` after
        :meth:`close`. Transport failures are not raised: the event is counted
        as dropped and subscribers repair the loss by resync.
        """
        st = self._topics.get(topic)
        if st is None:
            st = self._topic(topic)
        try:
            # Action is a str subclass hashing as its value: one lookup takes "create" and Action.CREATE.
            act = ACTIONS[action]
        except (KeyError, TypeError):
            raise InvalidEvent(f"action must be one of {sorted(ACTIONS)}, got {action!r}") from None
        if type(table) is not str or not table or type(key) is not str:
            raise InvalidEvent(f"table and key must be strings, got {table!r}, {key!r}")
        if type(version) is not int or version < 0:
            raise InvalidEvent(f"version must be a non-negative int, got {version!r}")
        if timestamp is None:
            timestamp = time.time()
        elif type(timestamp) not in (float, int):
            raise InvalidEvent(f"timestamp must be Unix seconds (float), got {timestamp!r}")
        if act is _DELETE:
            value = packed = None
        elif self._packed:
            if packed is None:
                if type(value) is not dict:
                    raise InvalidEvent(f"event {table}/{key}: schema 2 carries maps as values, got {type(value).__name__}")
            elif not packed or not (0x80 <= packed[0] <= 0x8F or packed[0] in (0xDE, 0xDF)):
                raise InvalidEvent(f"event {table}/{key}: schema 2 carries maps as values")
        elif packed is not None:
            try:
                value, packed = unpack_value(packed), None
            except ValueError as exc:
                raise InvalidEvent(f"event {table}/{key}: its packed value does not decode: {exc}") from exc
        with self._lock:
            if self._closed:
                raise ClosedError("publisher is closed")
            try:
                # One Packer reused under the lock: a third cheaper than msgpack.packb.
                if self._packed and packed is None and value is not None:
                    packed = self._pack(value)
                event = self._pack((table, key, act, version, packed if self._packed else value, timestamp))
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidEvent(f"event {table}/{key} is not serialisable: {exc}") from exc
            size = len(event)
            self._last_publish = now = time.monotonic()
            if now >= self._due:
                # A batch outlived its linger: the background thread is late (a busy caller holds
                # the GIL for whole switch intervals, a loaded machine runs it late) or asleep.
                self._flush_due(now)
            events = st.events
            if now >= self._window_end:
                # A busy window keeps the next one batching from its start, unless a quiet spell
                # followed it (a send that outlasted the window is no quiet spell).
                self._busy = (self._in_window > _BATCH_FROM or self._sending > _SENDING) and (
                    now - self._last_send < _QUIET)
                self._window_end, self._in_window, self._sending = now + _WINDOW, 0, 0.0
            self._in_window += 1
            light = events is None and not self._busy and self._in_window <= _BATCH_FROM and \
                self._sending <= _SENDING and not self.transport.backlog and not self._bursts
            if events is None or st.size + size > st.limit:
                # limit <= room: an event too large for any envelope never fits the current one.
                if size > st.room:
                    raise PayloadTooLarge(
                        f"event {table}/{key} is {size} bytes packed; the limit is {st.room} (max_message_bytes)"
                    )
                events = self._open_batch(topic, st, now)
            seq = st.seq = st.seq + 1
            events.append(event)
            st.size += size
            if light:
                self._flush_topic(topic)
            elif len(events) >= self._max_events:
                self._flush_full(topic)
            elif self._ticker_asleep:
                # Waking a thread costs a GIL hand-off: only the first batch after a
                # quiet spell does; while batches keep coming the thread polls.
                self._ticker_asleep = False
                self._cond.notify()
        return seq

    def publish_event(self, event: Event) -> int:
        """Publish an :class:`Event` (its ``publisher_id`` and ``seq`` are ignored)."""
        return self.publish(
            event.topic, event.table, event.key, event.action, event.version, event.value, event.timestamp or None,
            event.packed if event.value is None else None,
        )

    def flush(self) -> None:
        """Send every pending batch now."""
        with self._lock:
            self._flush_all()

    @contextlib.contextmanager
    def burst(self) -> Iterator[None]:
        """Publish a burst whose end the caller knows, and flush it at the end of the block: meanwhile
        no event leaves in an envelope of its own (the light-traffic path), each joins its topic's
        batch, which leaves when full, at its linger, or at the end. df-feed publishes each page of
        the feed so: a page of a thousand entries went out as ~200 envelopes (the first thirty events
        of every millisecond alone), and each send cost more than packing the events it held."""
        with self._lock:
            self._bursts += 1
        try:
            yield
        finally:
            with self._lock:
                self._bursts -= 1
                self._flush_all()

    def hello(self, reason: str = "idle") -> None:
        """Flush, then send a hello with the current sequence of every topic."""
        with self._lock:
            if self._closed:
                raise ClosedError("publisher is closed")
            self._send_hello(reason)

    def bookmark(self, rev: int, send: bool = True) -> None:
        """Claim that every change of the store's change feed up to revision ``rev`` has been
        published (and is flushed by this call): every hello from now on carries ``rev`` as its
        bookmark (docs/protocol.md §4.4), and with ``send`` one goes out at once
        (``reason: bookmark``). Only a publisher that follows the feed in order and publishes
        each of its entries may say so (df-feed); a lower ``rev`` than the last one is ignored."""
        with self._lock:
            if self._closed:
                raise ClosedError("publisher is closed")
            if self._rev is not None and rev <= self._rev:
                return
            self._rev = rev
            if send:
                self._send_hello("bookmark")

    def declare_lost(self, topics: Iterable[str], reason: str = "lost") -> None:
        """Tell every subscriber that changes of ``topics`` were lost before reaching this publisher
        (a change feed's history gone, say): each topic's sequence moves on by one with nothing
        sent, and a hello announces it, so each subscriber finds a gap and resyncs those topics."""
        streams = [self._topic(t) for t in sorted(set(topics))]
        with self._lock:
            if self._closed:
                raise ClosedError("publisher is closed")
            self._flush_all()
            for st in streams:
                st.seq += 1
            self._send_hello(reason)

    def sequences(self) -> dict[str, int]:
        """Last sequence number assigned per topic."""
        with self._lock:
            return self._sequences()

    def close(self) -> None:
        """Flush, say bye to subscribers, stop the background thread, close the transport."""
        with self._lock:
            if self._closed:
                return
            self._flush_all()
            self._control(encode_bye(Bye(self.id, self.name, time.time(), self._sequences())))
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self.transport.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (called with the lock held) ---------------------------------

    def _topic(self, topic: str) -> _Topic:
        validate_topic(topic)
        with self._lock:
            st = self._topics.get(topic)
            if st is None:
                st = self._topics[topic] = _Topic(self.id, self.name, topic, self.options)
            return st

    def _sequences(self) -> dict[str, int]:
        return {topic: st.seq for topic, st in self._topics.items() if st.seq}

    def _open_batch(self, topic: str, st: _Topic, now: float) -> list[bytes]:
        """Send the topic's full batch if any, start its next one; return the new batch's events."""
        if st.events is not None:
            self._flush_full(topic)
        events: list[bytes] = []
        st.events, st.first, st.size = events, st.seq + 1, 0
        st.deadline = now + self.options.batch_linger
        self._pending[topic] = st
        if st.deadline < self._due:
            self._due = st.deadline
        return events

    def _flush_all(self) -> None:
        self._flush_topics(list(self._pending))

    def _flush_full(self, topic: str) -> None:
        """Send ``topic``'s full batch (with every pending one, where they can share its round trip)."""
        if self._coalesce:
            self._flush_all()
        else:
            self._flush_topic(topic)

    def _flush_due(self, now: float) -> float:
        """Flush the batches whose linger has passed; return the next deadline (or inf)."""
        due = float("inf")
        ready = []
        for topic, st in self._pending.items():
            if st.deadline <= now:
                ready.append(topic)
            elif st.deadline < due:
                due = st.deadline
        self._flush_topics(ready)
        self._due = due
        return due

    def _flush_topics(self, topics: list[str]) -> None:
        """Send the pending batches of ``topics`` together (in one request where the transport can)."""
        if len(topics) < 2:
            for topic in topics:
                self._flush_topic(topic)
            return
        sent_at = time.time()
        batches: list[tuple[str, int]] = []
        frames: list[tuple[str, bytes]] = []
        for topic in topics:
            st = self._pending.pop(topic)
            events, st.events = st.events, None
            assert events is not None
            batches.append((topic, len(events)))
            frames.append((topic, encode_batch(st, st.first, sent_at, events)))
        start = time.monotonic()
        try:
            errors = self.transport.send_many(frames)
        finally:
            self._sent(start, len(frames))
        for (topic, count), error in zip(batches, errors):
            self._counted(topic, count, error)

    def _flush_topic(self, topic: str) -> None:
        st = self._pending.pop(topic)
        events, st.events = st.events, None
        assert events is not None
        self._counted(topic, len(events), self._send(topic, encode_batch(st, st.first, time.time(), events)))

    def _counted(self, topic: str, count: int, error: TransportError | None) -> None:
        """Count an envelope of ``count`` events as sent, or as lost to ``error``."""
        if error is None:
            self.stats.inc("events_out", count)
            self.stats.inc("envelopes_out")
        else:
            self._failed(topic, error)
            self.stats.inc("drops", count, reason="send_failed")
        self._topic_sent[topic] = self._last_send

    def _failed(self, topic: str, error: TransportError) -> None:
        self.stats.inc("send_errors")
        self._send_log.warning("send", "publish failed; subscribers will resync", topic=topic, error=str(error))

    def _send(self, topic: str, frame: bytes) -> TransportError | None:
        """Send one frame; return the error that lost it, if any."""
        start = time.monotonic()
        try:
            self.transport.send(topic, frame)
        except TransportError as exc:
            return exc
        finally:
            self._sent(start, 1)
        return None

    def _sent(self, start: float, envelopes: int) -> None:
        """Count the time of a send that began at ``start`` and the cost of its ``envelopes``."""
        self._last_send = end = time.monotonic()
        spent = end - start
        if not self._waits:
            # A send the OS preempted is no slow transport: capped, unless it waits for a server.
            spent = min(spent, _SENDING / 2)
        self._sending += spent + envelopes * self._cost

    def _control(self, frame: bytes) -> bool:
        """Send a hello or a bye; return whether it went."""
        error = self._send(CONTROL_TOPIC, frame)
        if error is not None:
            self._failed(CONTROL_TOPIC, error)
        return error is None

    def _send_hello(self, reason: str) -> None:
        self._flush_all()
        sent = True
        hello = Hello(self.id, self.name, time.time(), self._sequences(), reason, self.options.max_idle_time, self._host,
                      rev=self._rev)
        for part in hello_parts(hello, self.options.max_message_bytes):
            sent &= self._control(encode_hello(part))
        if sent:
            self.stats.inc("hellos_out", reason=reason)
        self._last_hello = time.monotonic()

    def _idle_hello_due(self, now: float) -> float:
        """When the next idle hello is due (monotonic time)."""
        quietest = min(self._topic_sent.values(), default=self._last_send)
        return max(self._last_hello, quietest) + self.options.max_idle_time

    def _run(self) -> None:
        """The background thread. An unexpected error (a transport's bug, a foreign value it
        chokes on) is logged and counted, and the loop starts again after a backoff: a
        publisher whose thread died would never flush or say hello again, silently."""
        restarts = Backoff(_WELCOME_POLL, _RESTART_MAX)
        while not self._closed:
            started = time.monotonic()
            try:
                self._loop()
            except Exception:
                self.stats.inc("background_errors")
                log.exception("publisher background thread failed; restarting it", extra={"publisher": self.name})
                if time.monotonic() - started > _RESTART_MAX:
                    restarts.reset()  # it ran a while: a fresh failure, not a loop of them
                with self._lock:
                    self._cond.wait(restarts.failed())

    def _loop(self) -> None:
        max_idle = self.options.max_idle_time
        pause = self.options.batch_pause
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                wake = min(now + _WELCOME_POLL, self._flush_due(now))
                if self._pending and pause > 0 and not self.transport.backlog:
                    # The caller has paused, so its burst has most likely ended: the rest of the
                    # linger would add latency for few events more. (Behind a backlog the envelopes
                    # would wait unwritten anyway, and batching there saves the server work.)
                    paused = self._last_publish + pause
                    if now >= paused:
                        self._flush_all()
                    else:
                        wake = min(wake, paused)
                try:
                    joined = self.transport.new_subscribers()
                except TransportError:
                    joined = 0
                if joined:
                    self.stats.inc("subscribers_joined", joined)
                    self._send_hello("welcome")
                if max_idle > 0:
                    due = self._idle_hello_due(now)
                    if due <= now:
                        self._send_hello("idle")
                        due = self._idle_hello_due(now)
                    wake = min(wake, due)
                if self._pending:
                    self._last_batch = now
                if now - self._last_batch < _WELCOME_POLL:
                    # Busy: poll every linger, so publish() need not wake this thread.
                    wake = min(wake, now + self.options.batch_linger)
                else:
                    self._ticker_asleep = True
                self._cond.wait(max(0.0, wake - time.monotonic()))
