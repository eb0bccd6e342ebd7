"""The NATS subscriber transport: a pull consumer over the whole stream, read from the stream
sequence after the last one received, with dropped messages detected by sequence."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from dfpubsub.errors import ClosedError, ConfigError, TransportError
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.logs import RateLimitedLog
from dfpubsub.metrics import Stats
from dfpubsub.retry import Backoff
from dfpubsub.transport import SubscriberTransport

from .connection import Connection, cluster_size, ensure_stream, join_subject
from .layout import subject_of, topic_of
from .position import Position, PositionFile
from .pull import Pull

if TYPE_CHECKING:
    from . import NatsOptions

__all__ = ["NatsSubscriber"]

_RECV_BATCH = 512  # most frames one recv() returns


class NatsSubscriber(SubscriberTransport):
    """One ephemeral pull consumer, read by a task on the connection's loop into a bounded inbox.

    The consumer starts at the stream sequence after the last one put in the
    inbox; it is made again, from there, after a reconnect (a restarted server
    forgets ephemeral consumers), a failure, or when it vanished. Sequences
    run without holes in a stream of our own, so a message that comes after
    a hole means the stream's limits (or a purge) removed what was in it: the
    subscribed topics are reported lost (resynced by the core) and the removed
    messages counted as ``drops{reason="stream_limits"}``.
    """

    def __init__(self, url: str, opts: NatsOptions, stats: Stats, log: RateLimitedLog):
        self.stats = stats
        self._opts = opts
        self._log = log
        self._root = f"{opts.prefix}.ps."
        self._conn = Connection(url, "dfpubsub-nats-sub", opts.timeout, log)
        self._file = PositionFile(opts.position_file) if opts.position_file else None
        self._cond = threading.Condition(threading.Lock())  # guards the fields below
        self._topics: dict[str, str] = {}  # copy-on-write: subject -> topic
        self._inbox: deque[tuple[int, bytes] | str] = deque()  # (stream seq, frame); a str marks a loss
        self._pending = 0  # bytes in the inbox
        self._next = 0  # the stream sequence to read next; 0: not known yet
        self._created = ""  # when the stream we read was created (a recreated one is another stream)
        self._handed = 0  # last stream sequence recv() returned
        self._applied = 0  # last stream sequence of the recv() before: taken by the core
        self._errors = 0  # connection failures not yet counted by recv()
        self._closed = False
        self._task: concurrent.futures.Future[None] | None = None
        self._saved_at = 0.0
        self._joined = False  # the join notice went out (or is on its way)

    @property
    def position(self) -> int:
        """The last stream sequence received (0 before any)."""
        return max(self._next - 1, 0)

    # -- subscriptions (any thread) -------------------------------------------------------

    def subscribe(self, topic: str) -> None:
        with self._cond:
            if self._closed:
                raise ClosedError("nats subscriber is closed")
            self._topics = {**self._topics, subject_of(self._root, topic): topic}
            start = self._task is None
        if not start:
            self._maybe_join()
            return
        saved = self._file.load() if self._file is not None else None
        if saved is not None and saved.stream != self._opts.stream:
            saved = None  # another stream's: it says nothing of this one
        try:
            info = self._conn.call(self._stream_state)
        except TransportError as exc:
            # The reader resolves the start once the server answers, and reports the topics lost.
            self._log.warning("subscribe", "nats subscribe deferred", topic=topic, error=str(exc))
            info = None
        except ConfigError:  # a server without JetStream, a stream not ours: no retry can help
            with self._cond:
                self._topics = {}
            raise
        with self._cond:
            if saved is not None:
                self._next, self._created = saved.seq + 1, saved.created
            elif info is not None:
                self._next, self._created = info.last + 1, info.created
            if self._task is None and not self._closed:
                self._task = asyncio.run_coroutine_threadsafe(self._run(), self._conn.loop)
        self._maybe_join()

    def _maybe_join(self) -> None:
        """Once the control topic is subscribed and the start is fixed, tell the publishers (a core
        NATS message they count, :meth:`NatsPublisher.new_subscribers`), so that each says a welcome
        hello: stored after the start, it is read, and the subscriber learns every publisher's
        sequences now rather than at its next idle hello."""
        with self._cond:
            if self._joined or self._closed or not self._next or CONTROL_TOPIC not in self._topics.values():
                return
            self._joined = True
        asyncio.run_coroutine_threadsafe(self._say_joined(), self._conn.loop)

    async def _say_joined(self) -> None:
        try:
            await self._conn.jetstream()  # connected
            await self._conn.nc().publish(join_subject(self._opts.prefix), b"")
        except (TimeoutError, NatsError, OSError) as exc:  # best effort: the idle hellos still come
            self._log.warning("join", "nats subscriber could not announce itself", uri=self._conn.uri,
                              error=f"{type(exc).__name__}: {exc}")

    def unsubscribe(self, topic: str) -> None:
        subject = subject_of(self._root, topic)
        with self._cond:
            self._topics = {s: t for s, t in self._topics.items() if s != subject}

    # -- receiving (receive thread) ---------------------------------------------------------

    def recv(self, timeout: float) -> list[bytes]:
        with self._cond:
            if not self._inbox and not self._errors and not self._closed:
                self._cond.wait(timeout)
            if self._closed:
                raise ClosedError("nats subscriber is closed")
            applied = self._applied = self._handed  # what the previous call returned has been taken by now
            inbox = self._inbox
            lost = inbox.popleft() if inbox and isinstance(inbox[0], str) else None
            frames: list[bytes] = []
            size = 0
            while inbox and len(frames) < _RECV_BATCH:
                item = inbox[0]
                if isinstance(item, str):  # told at the start of the next call
                    break
                inbox.popleft()
                size += len(item[1])
                frames.append(item[1])
                self._handed = item[0]
            self._pending -= size
            errors, self._errors = self._errors, 0
            topics = list(self._topics.values())
            created = self._created
        if errors:
            self.stats.inc("drops", errors, reason="disconnected")
        if isinstance(lost, str) and self.on_lost is not None:
            for topic in topics:
                if topic != CONTROL_TOPIC:  # hellos repeat: nothing to resync
                    self.on_lost(topic, lost)
        self._save(applied, created, force=False)
        return frames

    def _save(self, seq: int, created: str, force: bool) -> None:
        now = time.monotonic()
        if self._file is not None and seq and (force or now - self._saved_at >= self._opts.position_interval):
            self._saved_at = now
            try:
                self._file.save(Position(self._opts.stream, created, seq))
            except OSError as exc:
                self._log.warning("position", "cannot write the position file", path=self._file.path, error=str(exc))

    # -- the reader (connection loop) ---------------------------------------------------------

    async def _stream_state(self, js: JetStreamContext) -> _StreamState:
        await ensure_stream(js, self._opts.stream, self._root + ">", self._opts.stream_limits(cluster_size(self._conn.nc(), self._conn.servers)))
        info = await js.stream_info(self._opts.stream)
        return _StreamState(info.state.last_seq, str(info.created or ""))

    async def _run(self) -> None:
        backoff = Backoff(0.05, 1.0)
        while not self._closed:
            try:
                await self._consume()
                backoff.reset()
                continue
            except (TimeoutError, NatsError, TransportError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            except ConfigError as exc:
                error = str(exc)
            with self._cond:
                if self._closed:
                    return
                self._errors += 1
                self._cond.notify_all()
            self._log.warning("consume", "nats consumer failed; resuming after the last sequence received",
                              uri=self._conn.uri, error=error, sequence=self.position)
            await asyncio.sleep(backoff.failed())

    async def _consume(self) -> None:
        """Read from ``_next`` on until the connection was re-established or the consumer is gone."""
        js = await self._conn.jetstream()
        epoch = self._conn.epoch
        state = await self._stream_state(js)
        with self._cond:
            if not self._next:  # subscribe() could not resolve it: what came meanwhile is unknown
                self._next, self._created = state.last + 1, state.created
                self._lose("subscribe_delayed")
            elif state.created != self._created or state.last < self._next - 1:
                # Another stream than the one we read (deleted and made again, or a server that lost
                # its store): our position means nothing in it. Read on from its end.
                self._next, self._created = state.last + 1, state.created
                self._lose("reset")
            start = self._next
        self._maybe_join()  # where subscribe() could not fix the start
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start, ack_policy=AckPolicy.NONE,
            filter_subject=self._root + ">", mem_storage=True, num_replicas=1,
            inactive_threshold=self._opts.consumer_inactive_threshold,
        )
        name = (await js.add_consumer(self._opts.stream, config)).name
        pull = Pull(self, self._conn.nc(), f"$JS.API.CONSUMER.MSG.NEXT.{self._opts.stream}.{name}",
                    self._opts.count, self._opts.pull_expires)
        try:
            await pull.run(lambda: self._closed or self._conn.epoch != epoch)
            if not self._closed:
                await js.consumer_info(self._opts.stream, name)  # NotFoundError: made again
        finally:
            await pull.stop()
            if not self._closed:
                await _forget(js, self._opts.stream, name)

    @property
    def full(self) -> bool:
        """Whether the inbox holds ``max_pending_bytes``: the reader asks for no more until recv() took some."""
        return self._pending >= self._opts.max_pending_bytes

    def take(self, seq: int, subject: str, data: bytes) -> None:
        """One message of the stream, in stream order (on the loop thread)."""
        with self._cond:
            if seq < self._next:  # read again by a consumer made anew: already in the inbox
                return
            if seq > self._next:
                self.stats.inc("drops", seq - self._next, reason="stream_limits")
                self._lose("dropped")
            self._next = seq + 1
            if subject in self._topics:
                self._inbox.append((seq, data))
                self._pending += len(data)
                self._cond.notify_all()
            elif topic_of(self._root, subject) is None:
                self.stats.inc("drops", reason="foreign_subject")

    def _lose(self, reason: str) -> None:
        """Mark (under the lock) that history before what follows is lost; one mark per loss."""
        if not (self._inbox and isinstance(self._inbox[-1], str)):
            self._inbox.append(reason)
        self._cond.notify_all()
        self._log.warning(reason, "nats stream no longer holds messages this subscriber needed; resyncing",
                          stream=self._opts.stream, sequence=self._next)

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            task, applied, created = self._task, self._applied, self._created
            self._cond.notify_all()
        if task is not None:
            task.cancel()
        self._save(applied, created, force=True)
        self._conn.close()


async def _forget(js: JetStreamContext, stream: str, name: str) -> None:
    """Delete a consumer we no longer read (best effort: its inactivity threshold removes it too)."""
    try:
        await asyncio.wait_for(js.delete_consumer(stream, name), 1.0)
    except (TimeoutError, NatsError, NotFoundError, OSError):
        pass


class _StreamState:
    __slots__ = ("last", "created")

    def __init__(self, last: int, created: str):
        self.last, self.created = last, created
