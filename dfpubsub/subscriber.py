"""The reliable subscriber: decode, track sequences, deliver in order, resync what was lost.

Two threads: the *receive* thread reads frames from the transport, decodes
them and runs the :class:`~dfpubsub.tracker.SequenceTracker`; the *dispatch*
thread calls the event handler and the resync callback, one at a time, so a
handler never races a resync. Between them sits a bounded queue; when it
overflows the envelope is dropped, counted, and its topic resynced.

At start every topic is resynced once (the initial full sync), after the
subscription is in place: events that arrive meanwhile wait in the queue and
are delivered after it, and the cache keeps only what is newer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from .codec import DEFAULT_MAX_MESSAGE_BYTES, PACKED_SCHEMA, decode_events, decode_header, unpack_value
from .errors import BadValue, ClosedError, DecodeError
from .events import CONTROL_TOPIC, Bookmark, Bye, Event, EventBatch, Hello, validate_topic
from .logs import RateLimitedLog
from .metrics import Stats
from .resync import ResyncScheduler, ResyncTopics
from .tracker import ResyncRequest, SequenceTracker, TrackerLimits
from .transport import SubscriberTransport

__all__ = ["Subscriber", "SubscriberOptions", "EventHandler", "EventsHandler", "ResyncHandler", "BookmarkHandler",
           "PassedHandler"]

log = logging.getLogger(__name__)

EventHandler = Callable[[Event], None]
#: Called with the events of one envelope at a time (see ``Subscriber(on_events=...)``).
EventsHandler = Callable[[list[Event]], None]
#: Called with the topics to resync; must list the source of truth and reconcile. The set is a
#: :class:`~dfpubsub.resync.ResyncTopics`: its ``reasons`` say why each topic is resynced.
ResyncHandler = Callable[[set[str]], None]
#: Called with a hello's bookmark, in band behind the envelopes it vouches for (see ``Subscriber``).
BookmarkHandler = Callable[[Bookmark], None]
#: Called with a resync request as it reaches the dispatch thread, in band behind the envelopes
#: released with it: ``missing`` tells which sequence numbers of its stream were passed over.
PassedHandler = Callable[[ResyncRequest], None]

_STOP = object()
#: Upper bound on how long a thread sleeps before it looks at its stop flag.
_POLL = 0.1


#: Resync reasons that are part of normal operation, not a loss: logged at info, not as warnings
#: (a controller's checkpoint, once a minute per topic, at debug).
_ROUTINE = frozenset({"first_seen", "periodic", "manual", "checkpoint", "anchor"})


@dataclass(slots=True)
class SubscriberOptions:
    """Tuning of a :class:`Subscriber` (see the ``[pubsub]`` config section)."""

    message_delay_window: float = 0.5
    queue_size: int = 4096
    max_held: int = 1024
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    resync_base_interval: float = 0.1
    resync_max_interval: float = 5.0
    dead_after_idles: float = 3.0
    #: Assumed of a publisher not yet heard saying hello (the deployment's max_idle_time).
    max_idle_time: float = 5.0
    initial_sync: bool = True
    #: What unauthenticated peers may cost the tracker (docs/security.md).
    limits: TrackerLimits = TrackerLimits()
    #: Hand a schema 2 event's value on as its bytes (``Event.packed``, ``value`` None) for the
    #: handler to decode where it needs it (a cache that keeps values packed); otherwise every
    #: value is decoded before delivery, and one that does not decode is not delivered.
    packed_values: bool = False


class Subscriber:
    """Receives events of ``topics`` through ``transport`` and hands them to ``on_event``.

    ``on_resync(topics)`` is called (on the dispatch thread) when the topics
    must be reconciled against the source of truth; without it, lost messages
    are only counted. ``on_gap(request)`` observes every resync request as it
    is made (on the receive thread; keep it quick). ``on_events(events)``,
    given instead of ``on_event``, is handed the events of each envelope at
    once (to act on them as a batch: one call per envelope instead of one per
    event); if it raises, the envelope's topic is resynced. ``stats`` may be
    shared with the transport so that its drops count here too.

    ``on_bookmark(bookmark)`` and ``on_passed(request)`` are for a consumer that follows a
    store's change feed through a feed publisher's streams (the controller's positions,
    dfpubsub.controller.bookmarks): both run on the dispatch thread, in order with the
    envelopes, so that what they say holds of everything delivered before them.
    """

    def __init__(
        self,
        transport: SubscriberTransport,
        topics: Iterable[str],
        on_event: EventHandler | None,
        on_resync: ResyncHandler | None = None,
        options: SubscriberOptions | None = None,
        name: str = "subscriber",
        on_gap: Callable[[ResyncRequest], None] | None = None,
        stats: Stats | None = None,
        *,
        on_events: EventsHandler | None = None,
        on_bookmark: BookmarkHandler | None = None,
        on_passed: PassedHandler | None = None,
    ):
        if (on_event is None) == (on_events is None):
            raise ValueError("a subscriber needs one of on_event and on_events")
        self.transport = transport
        self.options = opts = options or SubscriberOptions()
        self.name = name
        self.stats = stats or Stats("subscriber", name)
        self.on_event = on_event
        self.on_resync = on_resync
        self.on_gap = on_gap
        self.on_events = on_events
        self.on_bookmark = on_bookmark
        self.on_passed = on_passed
        self._topics: frozenset[str] = frozenset(validate_topic(t) for t in topics)
        self.tracker = SequenceTracker(
            self._topics, opts.message_delay_window, self.stats, opts.max_held, opts.dead_after_idles,
            opts.max_idle_time, opts.limits,
        )
        self.scheduler = ResyncScheduler(opts.resync_base_interval, opts.resync_max_interval)
        self.synced = threading.Event()
        self._synced_topics: set[str] = set()
        self._queue: queue.Queue[object] = queue.Queue(maxsize=opts.queue_size)
        self._commands: deque[Callable[[], None]] = deque()
        self._running = False
        self._closed = False
        self._badlog = RateLimitedLog(log)
        self._threads: list[threading.Thread] = []
        transport.on_lost = self._transport_lost

    @property
    def topics(self) -> frozenset[str]:
        """The subscribed topics."""
        return self._topics

    def start(self) -> Subscriber:
        """Subscribe, then start the threads; the initial sync runs first thing."""
        if self._closed:
            raise ClosedError("subscriber is closed")
        # Topics before the control topic: a publisher greets the control
        # subscription with a hello, and by then the topic filters are in place.
        for topic in self._topics:
            self.transport.subscribe(topic)
        self.transport.subscribe(CONTROL_TOPIC)
        if self.options.initial_sync and self.on_resync is not None and self._topics:
            self.scheduler.request(self._topics, "subscribed")
        else:
            self._synced_topics.update(self._topics)
            self.synced.set()
        self._running = True
        self._threads = [
            threading.Thread(target=self._receive_loop, name=f"dfpubsub-recv-{self.name}", daemon=True),
            threading.Thread(target=self._dispatch_loop, name=f"dfpubsub-disp-{self.name}", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def subscribe(self, topic: str) -> None:
        """Add a topic at run time; it is synced before its events count as complete."""
        validate_topic(topic)
        if topic in self._topics:
            return
        self._set_topics(self._topics | {topic})
        self.transport.subscribe(topic)
        if self.on_resync is not None:
            self._mark_unsynced({topic})
            self._request(ResyncRequest(topic, "subscribed"))

    def unsubscribe(self, topic: str) -> None:
        """Remove a topic at run time."""
        if topic not in self._topics:
            return
        self._set_topics(self._topics - {topic})
        self.transport.unsubscribe(topic)
        self._commands.append(lambda: self.tracker.forget_topic(topic))

    def connect(self, uri: str) -> None:
        """Add a publisher endpoint (drivers where subscribers connect to publishers)."""
        self.transport.connect(uri)

    def disconnect(self, uri: str) -> None:
        """Remove a publisher endpoint."""
        self.transport.disconnect(uri)

    def is_synced(self, topic: str) -> bool:
        """Whether ``topic`` has been synced since it was subscribed."""
        return topic in self._synced_topics

    def request_resync(self, topics: Iterable[str], reason: str = "manual") -> None:
        """Ask for a resync of ``topics`` (coalesced and rate-limited)."""
        for topic in topics:
            self._request(ResyncRequest(topic, reason))

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until every topic was synced once; return whether that happened."""
        return self.synced.wait(timeout)

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads :meth:`start` started (a daemon's liveness probe watches them)."""
        return list(self._threads)

    def close(self) -> None:
        """Stop both threads and close the transport; queued events are dropped."""
        if self._closed:
            return
        self._closed = True
        self._running = False
        self.transport.close()
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> Subscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- receive thread ----------------------------------------------------------

    def _set_topics(self, topics: frozenset[str]) -> None:
        # Copy-on-write: the receive thread only reads the reference.
        self._topics = topics
        self.tracker.topics = topics

    def _receive_loop(self) -> None:
        tracker = self.tracker
        stats = self.stats
        max_bytes = self.options.max_message_bytes
        next_tick = 0.0
        while self._running:
            while self._commands:
                self._commands.popleft()()
            now = time.monotonic()
            deadline = tracker.next_deadline()
            timeout = _POLL if deadline is None else min(_POLL, max(0.0, deadline - now))
            try:
                frames = self.transport.recv(timeout)
            except ClosedError:
                return
            now = time.monotonic()
            for frame in frames:
                try:
                    env = decode_header(frame, max_bytes)
                except DecodeError as exc:
                    stats.inc("decode_errors", reason=exc.reason)
                    self._badlog.warning(exc.reason, "dropped undecodable frame", error=str(exc))
                    continue
                if type(env) is EventBatch:
                    stats.inc("envelopes_in")
                    stats.inc("envelopes_schema2" if env.schema == PACKED_SCHEMA else "envelopes_schema1")
                    if env.topic not in self._topics:
                        stats.inc("drops", env.count, reason="foreign_topic")
                        continue
                    for batch in tracker.on_batch(env, now):
                        self._enqueue(batch)
                else:
                    stats.inc("hellos_in")
                    tracker.on_hello(cast(Hello | Bye, env), now)
                    if tracker.bookmarks:
                        for bookmark in tracker.pop_bookmarks():
                            self._enqueue_bookmark(bookmark)
            deadline = tracker.next_deadline()
            if (deadline is not None and deadline <= now) or now >= next_tick:
                for batch in tracker.tick(now):
                    self._enqueue(batch)
                next_tick = now + _POLL * 5
            if tracker.requests:
                for req in tracker.pop_requests():
                    self._request(req)

    def _transport_lost(self, topic: str, reason: str) -> None:
        """The transport's history of ``topic`` is gone (compacted, trimmed): resync it."""
        self._request(ResyncRequest(topic, reason))

    def _enqueue(self, batch: EventBatch) -> None:
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.stats.inc("drops", batch.count, reason="overflow")
            self._request(ResyncRequest(batch.topic, "overflow", batch.publisher_id, (batch.seq, batch.last_seq)))

    def _enqueue_bookmark(self, bookmark: Bookmark) -> None:
        if self.on_bookmark is None:
            return
        try:
            self._queue.put_nowait(bookmark)
        except queue.Full:  # the next one will do: a bookmark only saves work
            self.stats.inc("drops", reason="bookmark_overflow")

    def _request(self, req: ResyncRequest) -> None:
        self.stats.inc("resync_requests", reason=req.reason)
        fields = {"topic": req.topic, "reason": req.reason, "publisher": req.publisher_id,
                  "missing": None if req.missing is None else list(req.missing)}
        if req.reason in _ROUTINE:
            log.log(logging.DEBUG if req.reason in ("checkpoint", "anchor") else logging.INFO, "resync of topic %r requested: %s",
                    req.topic, req.reason, extra=fields)
        else:  # one line per gap (each expired gap is one request), rate-limited per reason
            self._badlog.warning(req.reason, f"resync of topic {req.topic!r} requested: {req.reason}", **fields)
        if self.on_gap is not None:
            self.on_gap(req)
        if self.on_resync is None or req.topic not in self._topics:
            return
        try:
            # In band, behind the batches released with it, so they are applied first
            # and the resync only reports what was really missed.
            self._queue.put_nowait(req)
        except queue.Full:
            self.scheduler.request((req.topic,), req.reason)

    # -- dispatch thread ---------------------------------------------------------

    def _dispatch_loop(self) -> None:
        get = self._queue.get
        scheduler = self.scheduler
        while True:
            self._maybe_resync()
            due = scheduler.due()
            timeout = _POLL if due is None else min(_POLL, max(0.0, due - time.monotonic()))
            try:
                item = get(timeout=timeout)
            except queue.Empty:
                if not self._running:
                    return
                continue
            if item is _STOP:
                return
            if type(item) is EventBatch:
                self._deliver(item)
            elif type(item) is ResyncRequest:
                if self.on_passed is not None:
                    self._call(self.on_passed, item)
                scheduler.request((item.topic,), item.reason)
            elif type(item) is Bookmark and self.on_bookmark is not None:
                self._call(self.on_bookmark, item)

    def _deliver(self, batch: EventBatch) -> None:
        try:
            events = decode_events(batch, self.options.max_message_bytes)
        except DecodeError as exc:
            # The header was sound but an event is not: its sequence numbers are
            # taken, so the loss must be repaired like any other.
            self.stats.inc("decode_errors", reason=exc.reason)
            self._badlog.warning(exc.reason, "dropped envelope with a bad event", error=str(exc))
            self._request(ResyncRequest(batch.topic, "bad_event", batch.publisher_id, (batch.seq, batch.last_seq)))
            return
        if batch.schema == PACKED_SCHEMA and not self.options.packed_values:
            events = self._unpacked(events)
        if self.on_events is not None:
            try:
                self.on_events(events)
            except Exception as exc:  # as below, for the envelope
                self._handler_failed(exc, batch.topic, batch.publisher_id)
        else:
            handler = cast(EventHandler, self.on_event)
            for event in events:
                try:
                    handler(event)
                except Exception as exc:  # the handler is user code; one bad event must not kill the thread
                    self._handler_failed(exc, event.topic, event.publisher_id, event.key)
        self.stats.inc("events_in", len(events))

    def _unpacked(self, events: list[Event]) -> list[Event]:
        """The events with their values decoded; one whose value does not decode is left out."""
        out = []
        for event in events:
            if event.packed is not None:
                try:
                    event.value = unpack_value(event.packed)
                except BadValue as exc:
                    self.bad_value(event.topic, event.table, event.key, exc, event.publisher_id)
                    continue
            out.append(event)
        return out

    def bad_value(self, topic: str, table: str, key: str, exc: BadValue, publisher_id: str = "") -> None:
        """A schema 2 value of ``topic`` passed the check at receipt but does not decode: count it
        and resync its topic, which takes the key's value from the store (docs/protocol.md §6.4).
        Thread-safe (a controller's workers find them as they read the cache)."""
        self.stats.inc("bad_values")
        self._badlog.warning("bad_value", "a value does not decode; its key is repaired from the store",
                             topic=topic, table=table, key=key, publisher=publisher_id, error=str(exc))
        self._request(ResyncRequest(topic, "bad_value", publisher_id))

    def _call(self, handler: Callable[[Any], None], item: object) -> None:
        try:
            handler(item)
        except Exception:  # a consumer's bug must not stop delivery
            self.stats.inc("handler_errors")
            log.exception("bookmark or stream handler failed", extra={"subscriber": self.name})

    def _handler_failed(self, exc: Exception, topic: str, publisher_id: str, key: str | None = None) -> None:
        self.stats.inc("handler_errors")
        self._badlog.warning("handler", "event handler failed; resyncing its topic", topic=topic, key=key,
                             error=repr(exc))
        self._request(ResyncRequest(topic, "handler_error", publisher_id))

    def _maybe_resync(self) -> None:
        if self.on_resync is None:
            return
        topics = self.scheduler.take(time.monotonic()).only(self._topics)
        if not topics:
            return
        ok = False
        try:
            # A copy (the handler may change it; a failed run's topics go back as taken), a set with
            # the reasons behind it (ResyncTopics.reasons).
            self.on_resync(ResyncTopics(topics.reasons))
            ok = True
        except Exception as exc:  # the callback reads a remote DB: any failure means "retry later"
            self.stats.inc("resync_failures")
            # The reason goes into the message itself: it must show without a structured formatter.
            log.warning("resync of %s failed (%s: %s); will retry with backoff", sorted(topics),
                        type(exc).__name__, exc, extra={"topics": sorted(topics), "error": repr(exc)})
        finally:
            self.scheduler.done(topics, ok, time.monotonic())
        if ok:
            self.stats.inc("resyncs")
            self._synced_topics.update(topics)
            if self._topics <= self._synced_topics:
                self.synced.set()

    def _mark_unsynced(self, topics: set[str]) -> None:
        self._synced_topics.difference_update(topics)
        self.synced.clear()
