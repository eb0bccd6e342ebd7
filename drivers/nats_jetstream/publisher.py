"""The NATS publisher transport: one acknowledged JetStream publish per envelope, retried under
its message id, failing fast while the server is away."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext

from dfpubsub.errors import ClosedError, ConfigError, TransportError
from dfpubsub.logs import RateLimitedLog
from dfpubsub.metrics import Stats
from dfpubsub.retry import Backoff
from dfpubsub.transport import PublisherTransport

from .connection import Connection, cluster_size, ensure_stream, join_subject
from .layout import msg_id, subject_of

if TYPE_CHECKING:
    from . import NatsOptions

__all__ = ["NatsPublisher"]

#: What an envelope costs beyond the publisher: a message written to the stream's file store and
#: delivered to every subscriber's pull consumer, each of which also wakes for it.
_ENVELOPE_COST = 50e-6
#: Unacknowledged envelopes that are only the pipeline's usual depth: a publish goes out behind
#: them without waiting, so counting them as backlog would hold light events for the linger for
#: nothing. Beyond it the server is behind (starved, stalled).
_AHEAD = 4


class NatsPublisher(PublisherTransport):
    """Used under the publisher's lock only; the NATS work runs on the connection's loop.

    ``send`` hands the envelope to the loop and returns; up to ``max_inflight``
    envelopes await their acknowledgement at once, in the order sent, and
    ``send`` waits (up to ``timeout``) for room beyond that. A publish whose
    acknowledgement did not come is sent again with the same ``Nats-Msg-Id``
    until ``timeout`` has passed: if the first one was stored after all, the
    stream drops the second (duplicate window). One that failed for good is
    counted (``drops{reason="unacknowledged"}``; subscribers see the gap) and
    the next ``send`` raises :class:`TransportError`; sends then fail at once
    for a growing pause (50 ms to 1 s), so a dead server does not stall every
    ``publish()``.
    """

    envelope_cost = _ENVELOPE_COST
    # send_waits stays False: send() waits for no acknowledgement (only for room behind
    # max_inflight of them, which backlog reports first), so a long one was the OS preempting us.

    def __init__(self, url: str, opts: NatsOptions, stats: Stats, log: RateLimitedLog):
        self.stats = stats
        self._opts = opts
        self._root = f"{opts.prefix}.ps."
        self._subjects: dict[str, str] = {}
        self._log = log
        self._conn = Connection(url, "dfpubsub-nats-pub", opts.timeout, log)
        self._backoff = Backoff(0.05, 1.0)
        self._slots = threading.BoundedSemaphore(opts.max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        # Each counted by one thread only (send's, the loop's): their difference needs no lock.
        self._sent = 0
        self._settled = 0
        self._failure = ""  # why an envelope was lost since the last send (set on the loop)
        self._acked_at = 0.0  # when an acknowledgement last came (set on the loop)
        self._failed_at = 0.0
        self._stream_ok = False
        self._joins = 0  # join notices received (counted on the loop)
        self._joins_seen = 0  # ... of which new_subscribers() told (read on the publisher's thread)
        self._join_sub: Subscription | None = None
        self._closed = False

    @property
    def uri(self) -> str:
        return self._conn.uri

    @property
    def backlog(self) -> int:
        """Envelopes sent and not yet acknowledged, when more than the pipeline's usual few: the
        server is behind and the next one would queue behind them, so the publisher batches."""
        waiting = self._sent - self._settled
        return waiting if waiting > _AHEAD else 0

    def send(self, topic: str, frame: bytes) -> None:
        if self._closed:
            raise ClosedError("nats publisher is closed")
        now = time.monotonic()
        failure, self._failure = self._failure, ""
        if failure:
            self._failed(now, f"an envelope sent before was not acknowledged: {failure}")
        if now < self._backoff.until:
            raise TransportError(f"NATS at {self.uri} failed a moment ago; not trying again yet")
        if self._acked_at > self._failed_at:
            self._backoff.reset()
        if not self._stream_ok:
            try:
                self._conn.call(self._ensure_stream)
            except ConfigError as exc:  # the stream is not one the driver can use: said on every try
                self._failed(now, str(exc))
            except TransportError as exc:
                self._failed(now, str(exc))
        subject = self._subjects.get(topic)
        if subject is None:
            subject = self._subjects[topic] = subject_of(self._root, topic)
        ident = msg_id(frame)
        headers = {"Nats-Msg-Id": ident} if ident else None
        if not self._slots.acquire(timeout=self._opts.timeout):
            self._failed(now, f"NATS at {self.uri} acknowledged nothing for {self._opts.timeout:g} s")
        self._sent += 1
        self._conn.loop.call_soon_threadsafe(self._start, subject, frame, headers)

    def _failed(self, now: float, error: str) -> NoReturn:
        self._failed_at = now
        self._backoff.failed(now)
        self._log.warning("send", "NATS publish failed", uri=self.uri, error=error)
        raise TransportError(error)

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        if self._join_sub is None:  # kept through reconnects by the client
            self._join_sub = await self._conn.nc().subscribe(join_subject(self._opts.prefix), cb=self._joined)
        await ensure_stream(js, self._opts.stream, self._root + ">", self._opts.stream_limits(cluster_size(self._conn.nc(), self._conn.servers)))
        self._stream_ok = True

    async def _joined(self, msg: Msg) -> None:
        self._joins += 1

    def new_subscribers(self) -> int:
        """Subscribers that said they joined since the last call (their notice is best effort: one
        lost waits for the next idle hello, as with every other driver)."""
        joins = self._joins
        joined, self._joins_seen = joins - self._joins_seen, joins
        return joined

    def _start(self, subject: str, frame: bytes, headers: dict[str, Any] | None) -> None:
        """On the loop, in the order sent: tasks start in the order they are made, so the
        messages go out in that order too."""
        task = self._conn.loop.create_task(self._publish(subject, frame, headers))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, subject: str, frame: bytes, headers: dict[str, Any] | None) -> None:
        deadline = time.monotonic() + self._opts.timeout
        try:
            js = await self._conn.jetstream()
            while True:
                left = deadline - time.monotonic()
                try:
                    ack = await js.publish(subject, frame, timeout=max(0.05, min(left, self._opts.ack_timeout)),
                                           stream=self._opts.stream, headers=headers)
                    break
                except (TimeoutError, NatsError, OSError):
                    # Retrying is safe only with an id the stream deduplicates on.
                    if headers is None or time.monotonic() + 0.05 >= deadline:
                        raise
                    await asyncio.sleep(0.05)
            self._acked_at = time.monotonic()
            if ack.duplicate:
                self.stats.inc("drops", reason="nats_duplicate")
        except (TimeoutError, NatsError, OSError) as exc:
            self.stats.inc("drops", reason="unacknowledged")
            self._failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._settled += 1
            self._slots.release()

    def close(self) -> None:
        """Wait (up to ``timeout``) for the acknowledgements still due, then disconnect."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self._opts.timeout
        taken = 0
        while taken < self._opts.max_inflight and self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            taken += 1
        self._conn.close()
