"""Redis Streams driver: ``redis://[[user]:password@]host:port/db`` (also ``rediss://``, ``unix://``).

Layout. Each topic is one stream, ``{prefix}:ps:{topic}``; the control topic is
``{prefix}:ps:$ctl`` (topics never start with ``$``, so it cannot collide). An
entry has one field, ``e``, holding the envelope bytes. Publishers append with
``XADD key MAXLEN ~ maxlen * e <frame>``, one command per envelope (the core
already packs up to ``batch_max_events`` events into one). ``{prefix}:ps:$joins``
counts subscribers that joined: a subscriber increments it once its control
stream is in place, and publishers poll it (at most every 0.1 s) so that they
greet newcomers with a hello at once, as over ZeroMQ.

Reading. A subscriber reads with ``XREAD BLOCK COUNT STREAMS`` over all its
streams, data topics first and ``$ctl`` last, so a hello never overtakes the
batches it counts. It keeps, per stream, a cursor: the id of the last entry it
returned and that entry's position in the stream (Redis 7 counts every entry
ever added, ``entries-added``). A topic starts where its stream ends when it is
subscribed: ``$`` is resolved to the stream's last-generated id at once, so
nothing added between ``subscribe()`` and the first read is missed (a missing
stream is ``0-0``).

Resume. A lost connection is logged (rate-limited) and counted once
(``drops{reason="disconnected"}``); ``recv`` returns nothing and retries on later
calls with a growing pause (50 ms to 1 s), resuming from each cursor: whatever is
still in the stream is delivered, in order, without loss. A publisher's send fails
with :class:`~dfpubsub.errors.TransportError` (the core counts the drop and
subscribers see a sequence gap) and, after a failure, fails fast for the same
growing pause instead of stalling every ``publish()`` on a dead server.

Trimming. ``MAXLEN ~`` bounds each stream, so a subscriber far enough behind
loses entries it never read. Before reading a stream after a reconnect, after
``recv`` was not called for 0.25 s, or after a read that returned a full
``count`` (the reader lags), the subscriber probes the stream (a read-only Lua
script: last id, ``entries-added``, length, first id) in the same ``MULTI`` as a
non-blocking ``XREAD``, so the probe describes exactly what was read. Entries
were lost if the stream's first entry is past the cursor and more entries were
removed from its head than the cursor had seen; the driver then calls
``on_lost(topic, "trimmed")`` and the core resyncs the topic. A stream that went
back in time (server restarted without its data, key deleted) is reported as
``"reset"`` and the cursor rewinds to its new end. Losses the probe cannot see
(trimmed between two ordinary reads) still show as sequence gaps in the core.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from dfpubsub.api import Driver, PublisherTransport, SubscriberTransport
from dfpubsub.errors import ClosedError, ConfigError, TransportError
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.metrics import Stats

__all__ = ["RedisStreamsDriver", "RedisStreamsOptions"]

log = logging.getLogger(__name__)

_SCHEMES = ("redis://", "rediss://", "unix://")
#: Pause after a failure before the next attempt: doubles from the first to the second.
_BACKOFF = (0.05, 1.0)
#: How often a publisher looks at the join counter (seconds).
_JOIN_POLL = 0.1
#: A subscriber whose ``recv`` was not called for this long probes its streams for trimming.
_STALE = 0.25
#: Streams that are not streams (another application's keys) are probed again this often.
_RECHECK = 5.0
_DISCONNECTED = (RedisConnectionError, RedisTimeoutError)  # BusyLoadingError is a ConnectionError

# KEYS: streams. Per key: {last-generated-id, entries-added (-1 before Redis 7), length, first id};
# {'0-0', 0, 0, '0-0'} if missing, {'', -1, -1, ''} if the key is not a stream. Read-only.
_PROBE = """
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'stream' then
    local info = redis.call('XINFO', 'STREAM', key)
    local m = {}
    for j = 1, #info, 2 do m[info[j]] = info[j + 1] end
    local first = '0-0'
    if m['first-entry'] then first = m['first-entry'][1] end
    out[i] = {m['last-generated-id'], m['entries-added'] or -1, m['length'], first}
  elseif kind == 'none' then
    out[i] = {'0-0', 0, 0, '0-0'}
  else
    out[i] = {'', -1, -1, ''}
  end
end
return out
"""


class RedisStreamsOptions(BaseModel):
    """Options of the ``redis`` driver (config table ``[driver.redis]``)."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field("dfpubsub", min_length=1, description="Key prefix: streams are {prefix}:ps:{topic}.")
    maxlen: int = Field(100_000, ge=1, description="Approximate bound of each stream, in entries (envelopes).")
    block_ms: int = Field(100, ge=1, description="Longest XREAD BLOCK, milliseconds (bounds how long close() waits).")
    count: int = Field(512, ge=1, description="Most entries one XREAD returns per stream.")
    timeout: float = Field(5.0, gt=0, description="Socket connect and read timeout, seconds.")

    @model_validator(mode="after")
    def _check(self) -> "RedisStreamsOptions":
        if self.block_ms >= self.timeout * 1000:
            raise ValueError("block_ms must be shorter than timeout")
        return self


def _sid(stream_id: bytes) -> tuple[int, int]:
    """A stream id as a comparable pair."""
    ms, _, seq = stream_id.partition(b"-")
    return int(ms), int(seq or 0)


def _public_url(url: str) -> str:
    """``url`` without its password (in the authority or the query)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user = netloc.rpartition("@")[0].partition(":")[0]
        host = netloc.rpartition("@")[2]
        netloc = f"{user}@{host}" if user else host
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class _Backoff:
    """When to try again after failures: 50 ms, doubling to 1 s; reset by a success."""

    __slots__ = ("pause", "until")

    def __init__(self) -> None:
        self.pause = 0.0
        self.until = 0.0

    def failed(self, now: float) -> None:
        self.pause = min(_BACKOFF[1], self.pause * 2) if self.pause else _BACKOFF[0]
        self.until = now + self.pause

    def ok(self) -> None:
        self.pause = self.until = 0.0


class _RateLimit:
    """Logs one warning per key per second."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def warning(self, what: str, msg: str, /, **fields: object) -> None:
        now = time.monotonic()
        if now - self._last.get(what, float("-inf")) >= 1.0:
            self._last[what] = now
            log.warning(msg, extra=fields)


class _RedisPublisher(PublisherTransport):
    """One connection, used under the publisher's lock only."""

    def __init__(self, url: str, pool: redis.ConnectionPool, opts: RedisStreamsOptions, stats: Stats):
        self.stats = stats
        self._uri = _public_url(url)
        self._pool = pool
        self._conn = pool.make_connection()  # connects on first use
        self._prefix = f"{opts.prefix}:ps:"
        self._maxlen = str(opts.maxlen).encode()
        self._keys: dict[str, bytes] = {}
        self._joins_key = f"{opts.prefix}:ps:$joins".encode()
        self._joins: int | None = None
        self._next_poll = 0.0
        self._backoff = _Backoff()
        self._warn = _RateLimit()
        self._closed = False
        try:
            self._joins = self._command(b"GET", self._joins_key, as_int=True)
        except TransportError:
            pass  # the first successful poll takes the baseline

    @property
    def uri(self) -> str:
        return self._uri

    def _command(self, *args: bytes, as_int: bool = False) -> Any:
        if self._closed:
            raise ClosedError("redis publisher is closed")
        now = time.monotonic()
        if now < self._backoff.until:
            raise TransportError(f"redis at {self._uri} is unreachable; retrying in {self._backoff.until - now:.2f}s")
        try:
            self._conn.send_command(*args)
            reply = self._conn.read_response()
        except _DISCONNECTED as exc:
            self._conn.disconnect()
            self._backoff.failed(time.monotonic())
            self._warn.warning("disconnected", "redis publisher lost its connection", uri=self._uri, error=str(exc))
            raise TransportError(f"redis at {self._uri}: {type(exc).__name__}: {exc}") from exc
        except RedisError as exc:  # an error reply (OOM, WRONGTYPE, ...): the connection is fine
            raise TransportError(f"redis at {self._uri}: {type(exc).__name__}: {exc}") from exc
        self._backoff.ok()
        return int(reply or 0) if as_int else reply

    def send(self, topic: str, frame: bytes) -> None:
        key = self._keys.get(topic)
        if key is None:
            key = self._keys[topic] = (self._prefix + topic).encode()
        self._command(b"XADD", key, b"MAXLEN", b"~", self._maxlen, b"*", b"e", frame)

    def new_subscribers(self) -> int:
        now = time.monotonic()
        if now < self._next_poll:
            return 0
        self._next_poll = now + _JOIN_POLL
        joins = self._command(b"GET", self._joins_key, as_int=True)
        if self._joins is None or joins < self._joins:  # first look, or the server lost its data
            self._joins = joins
            return 0
        joined, self._joins = joins - self._joins, joins
        return joined

    def close(self) -> None:
        self._closed = True
        self._conn.disconnect()
        self._pool.disconnect()


class _Cursor:
    """Where a subscriber is in one stream."""

    __slots__ = ("topic", "key", "last", "seen", "lagging", "not_stream", "probed")

    def __init__(self, topic: str, key: bytes):
        self.topic = topic
        self.key = key
        #: Id of the last entry returned (or the stream's end when subscribed); None: not resolved yet.
        self.last: bytes | None = None
        #: Position of ``last`` in the stream (entries-added); -1 when unknown.
        self.seen = -1
        #: The last read returned a full ``count``: probe before the next.
        self.lagging = False
        #: The key holds something else than a stream: left out of XREAD until it does.
        self.not_stream = False
        self.probed = 0.0


class _RedisSubscriber(SubscriberTransport):
    """Cursors per stream; ``recv`` runs on the receive thread, the rest from any thread.

    The receive thread reads on a connection of its own, so every failure
    reaches it (a pooled connection would be replaced silently on checkout);
    subscribe() resolves positions through a thread-safe pooled client. Cursors
    are replaced copy-on-write, so recv() reads the current set without taking
    the lock that subscribe/unsubscribe/close hold.
    """

    def __init__(self, pool: redis.ConnectionPool, opts: RedisStreamsOptions, stats: Stats, uri: str):
        self.opts = opts
        self.stats = stats
        self._uri = uri
        self._client = redis.Redis(connection_pool=pool)
        self._conn = pool.make_connection()  # the receive thread's; connects on first use
        self._prefix = f"{opts.prefix}:ps:"
        self._joins_key = f"{opts.prefix}:ps:$joins"
        self._cursors: dict[bytes, _Cursor] = {}
        self._lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._shut = False
        self._connected = True
        self._probe_all = False
        self._last_read = time.monotonic()
        self._backoff = _Backoff()
        self._warn = _RateLimit()

    # -- subscriptions (any thread) ---------------------------------------------------

    def subscribe(self, topic: str) -> None:
        key = (self._prefix + topic).encode()
        with self._lock:
            if self._closed:
                raise ClosedError("redis subscriber is closed")
            if key in self._cursors:
                return
            cursor = _Cursor(topic, key)
            try:
                pipe = self._client.pipeline(transaction=False)
                pipe.eval(_PROBE, 1, key)
                if topic == CONTROL_TOPIC:  # after the position is fixed: a welcome hello lands after it
                    pipe.incr(self._joins_key)
                self._apply_probe(cursor, pipe.execute()[0][0], time.monotonic())
            except RedisError as exc:
                # recv() resolves it once the server answers, and reports the topic lost meanwhile.
                self._warn.warning("subscribe", "redis subscribe deferred", topic=topic, error=str(exc))
            self._cursors = {**self._cursors, key: cursor}

    def unsubscribe(self, topic: str) -> None:
        key = (self._prefix + topic).encode()
        with self._lock:
            if key in self._cursors:
                self._cursors = {k: c for k, c in self._cursors.items() if k != key}

    # -- receiving (receive thread) ----------------------------------------------------

    def recv(self, timeout: float) -> list[bytes]:
        with self._recv_lock:
            if self._closed:
                self._shutdown()
                raise ClosedError("redis subscriber is closed")
            now = time.monotonic()
            cursors = self._cursors
            if now < self._backoff.until or not cursors:
                self._wake.wait(max(0.0, min(timeout, self._backoff.until - now) if cursors else timeout))
                return []
            probe_all = self._probe_all or now - self._last_read > _STALE  # reconnected, or stalled
            probe = [
                c for c in cursors.values()
                if (now - c.probed > _RECHECK if c.not_stream else c.last is None or c.lagging or probe_all)
            ]
            live = [c for c in cursors.values() if c.last is not None and not c.not_stream]
            lost: list[tuple[str, str]] = []
            skip: set[bytes] = set()
            try:
                if probe:
                    reply, skip = self._probe_and_read(probe, live, lost, now)
                elif live:
                    reply = self._read(live, timeout)
                else:
                    reply = None
            except _DISCONNECTED as exc:
                self._disconnected(exc)
                return self._after_failure(timeout)
            except RedisError as exc:  # an error reply: find out which key is to blame
                self._probe_all = True
                self._warn.warning("error", "redis subscriber read failed", uri=self._uri, error=str(exc))
                self.stats.inc("drops", reason="redis_error")
                return self._after_failure(timeout)
            self._last_read = time.monotonic()
            self._backoff.ok()
            if not self._connected:
                self._connected = True
                log.info("redis subscriber reconnected", extra={"uri": self._uri})
            frames = self._frames(reply, {c.key: c for c in live if c.key not in skip}) if reply else []
            if self._closed:
                self._shutdown()
                raise ClosedError("redis subscriber is closed")
        on_lost = self.on_lost
        for topic, reason in lost:
            log.warning("redis stream history lost", extra={"topic": topic, "reason": reason})
            if on_lost is not None and topic != CONTROL_TOPIC:  # hellos repeat: nothing to resync
                on_lost(topic, reason)
        return frames

    def _xread_args(self, live: list[_Cursor]) -> list[Any]:
        # Data topics first, the control stream last: a hello read with batches comes after them.
        live.sort(key=lambda c: c.topic == CONTROL_TOPIC)
        return [b"COUNT", self.opts.count, b"STREAMS", *(c.key for c in live), *(c.last for c in live)]

    def _read(self, live: list[_Cursor], timeout: float) -> Any:
        block = int(min(timeout, self.opts.block_ms / 1000) * 1000)
        args = self._xread_args(live)
        if block > 0:  # BLOCK 0 would wait forever
            args[:0] = [b"BLOCK", block]
        self._conn.send_command(b"XREAD", *args)
        return self._conn.read_response()

    def _probe_and_read(self, probe: list[_Cursor], live: list[_Cursor], lost: list[tuple[str, str]],
                        now: float) -> tuple[Any, set[bytes]]:
        """Probe ``probe`` and read ``live`` in one MULTI, so the probe describes what was read.

        Returns the XREAD reply and the streams whose entries in it are to be skipped.
        """
        commands: list[tuple[Any, ...]] = [(b"MULTI",), (b"EVAL", _PROBE, len(probe), *(c.key for c in probe))]
        if live:
            commands.append((b"XREAD", *self._xread_args(live)))  # no BLOCK inside MULTI
        commands.append((b"EXEC",))
        conn = self._conn
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:  # read every reply, errors included, to keep the connection in step
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        results = replies[-1]
        if isinstance(results, Exception):
            raise results
        if isinstance(results[0], Exception):
            raise results[0]
        self._probe_all = False
        skip: set[bytes] = set()
        for cursor, row in zip(probe, results[0]):
            reason = self._apply_probe(cursor, row, now)
            if reason:
                lost.append((cursor.topic, reason))
                if reason == "reset":
                    skip.add(cursor.key)  # read from a stream we no longer know: the resync covers it
        reply = results[1] if len(results) > 1 else None
        if isinstance(reply, Exception):
            if not any(c.not_stream for c in probe):
                raise reply
            reply = None  # the culprit is found and left out from now on
        return reply, skip

    def _apply_probe(self, c: _Cursor, row: list[Any], now: float) -> str | None:
        """Update ``c`` from a probe row; return why its history is lost, if it is."""
        last_id, added, length, first = row[0], int(row[1]), int(row[2]), row[3]
        c.probed = now
        c.lagging = False
        if length < 0:
            if not c.not_stream:
                self._warn.warning("type", "redis key is not a stream; ignoring it", key=c.key.decode())
            c.not_stream = True
            return None
        c.not_stream = False
        if c.last is None:
            c.last, c.seen = last_id, added
            return "subscribe_delayed"  # (not a loss when subscribe() itself resolves it)
        if _sid(last_id) < _sid(c.last) or 0 <= added < c.seen:
            c.last, c.seen = last_id, added  # the stream went back: read on from its new end
            return "reset"
        ours = _sid(c.last)
        past_us = _sid(first) > ours if length else _sid(last_id) > ours
        removed = added - length
        if past_us and (added < 0 or c.seen < 0 or removed > c.seen):
            c.seen = removed if added >= 0 else -1
            return "trimmed"
        return None

    def _frames(self, reply: Any, live: dict[bytes, _Cursor]) -> list[bytes]:
        out: list[bytes] = []
        append = out.append
        current = self._cursors
        count = self.opts.count
        bad = 0
        for key, entries in reply.items() if isinstance(reply, dict) else reply:
            c = live.get(key)
            if c is None:  # a stream that was reset: the resync covers it
                continue
            if current.get(key) is not c:  # unsubscribed (or re-subscribed) meanwhile
                self.stats.inc("drops", len(entries), reason="foreign_topic")
                continue
            for _, fields in entries:
                if fields and len(fields) == 2 and fields[0] == b"e" and type(fields[1]) is bytes:
                    append(fields[1])
                    continue
                frame = None
                for i in range(0, len(fields or ()) - 1, 2):
                    if fields[i] == b"e" and type(fields[i + 1]) is bytes:
                        frame = fields[i + 1]
                if frame is None:
                    bad += 1
                else:
                    append(frame)
            c.last = entries[-1][0]
            if c.seen >= 0:
                c.seen += len(entries)
            c.lagging = len(entries) >= count
        if bad:
            self.stats.inc("decode_errors", bad, reason="bad_frames")
            self._warn.warning("bad", "redis stream entries without an 'e' field dropped", count=bad)
        return out

    def _disconnected(self, exc: Exception) -> None:
        self._probe_all = True
        if self._connected:
            self._connected = False
            self.stats.inc("drops", reason="disconnected")
        self._warn.warning("disconnected", "redis subscriber lost its connection; retrying",
                           uri=self._uri, error=f"{type(exc).__name__}: {exc}")

    def _after_failure(self, timeout: float) -> list[bytes]:
        now = time.monotonic()
        self._backoff.failed(now)
        self._wake.wait(max(0.0, min(timeout, self._backoff.until - now)))
        return []

    # -- closing ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        if not self._shut:
            self._shut = True
            self._conn.disconnect()
            self._client.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        # A recv in progress returns within block_ms, sees the flag and shuts down itself.
        if self._recv_lock.acquire(timeout=self.opts.block_ms / 1000 + 0.2):
            try:
                self._shutdown()
            finally:
                self._recv_lock.release()


class RedisStreamsDriver(Driver):
    """``redis://host:port/db``: topics are Redis streams under ``{prefix}:ps:``."""

    name = "redis"

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        try:
            self.redis_options = RedisStreamsOptions(**self.options)
        except ValidationError as exc:
            raise ConfigError(f"invalid [driver.redis] options: {exc}") from exc
        if not url or not url.startswith(_SCHEMES):
            shown = _public_url(url) if url else url
            raise ConfigError(f"the redis driver needs a URL such as redis://127.0.0.1:6379/0, got {shown!r}")
        self._pool()  # validates the URL; nothing connects until used

    def _pool(self) -> redis.ConnectionPool:
        assert self.url is not None
        t = self.redis_options.timeout
        try:
            return redis.ConnectionPool.from_url(
                self.url, socket_timeout=t, socket_connect_timeout=t, protocol=2,
                retry=Retry(NoBackoff(), 0),  # the transports decide when to try again
            )
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {_public_url(self.url)!r}: {exc}") from exc

    def publisher(self, stats: Stats) -> PublisherTransport:
        assert self.url is not None
        return _RedisPublisher(self.url, self._pool(), self.redis_options, stats)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        assert self.url is not None
        return _RedisSubscriber(self._pool(), self.redis_options, stats, _public_url(self.url))
