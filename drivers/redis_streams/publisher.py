"""The Redis publisher transport: XADD per envelope (pipelined when several leave together), fail-fast
backoff, and the join counter."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import RedisError, ResponseError

from dfpubsub.backends import foreign
from dfpubsub.errors import ClosedError, TransportError
from dfpubsub.metrics import Stats
from dfpubsub.transport import PublisherTransport

from .streams import _DISCONNECTED, _failure_pacing, _public_url

if TYPE_CHECKING:
    from . import RedisStreamsOptions

#: How often a publisher looks at the join counter (seconds).
_JOIN_POLL = 0.1
#: What an envelope costs Redis beyond the XADD's round trip: the write, and a reply to every
#: subscriber blocked in XREAD on the stream (2.5-3 µs of Redis CPU per envelope with one
#: subscriber, tens of µs with sixteen, each of which also wakes for it).
_ENVELOPE_COST = 50e-6


def _count(reply: bytes | None) -> int:
    """The join counter as INCR leaves it: absent (0) or a non-negative decimal integer."""
    if reply is None:
        return 0
    if not reply.isdigit() or len(reply) > 20:
        raise ValueError(f"not a counter: {reply[:40]!r}")
    return int(reply)


class _RedisPublisher(PublisherTransport):
    """One connection, used under the publisher's lock only."""

    envelope_cost = _ENVELOPE_COST
    send_waits = True

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
        self._backoff, self._warn = _failure_pacing()
        self._closed = False
        try:
            self._joins = self._joins_now()
        except TransportError:
            pass  # the first successful poll takes the baseline

    @property
    def uri(self) -> str:
        return self._uri

    def _command(self, *args: bytes) -> Any:
        return self._pipeline([args])[0]

    def _pipeline(self, commands: list[tuple[bytes, ...]]) -> list[Any]:
        """Send ``commands`` in one round trip; return their replies, an error reply as a TransportError."""
        if self._closed:
            raise ClosedError("redis publisher is closed")
        now = time.monotonic()
        if now < self._backoff.until:
            raise TransportError(f"redis at {self._uri} is unreachable; retrying in {self._backoff.until - now:.2f}s")
        replies: list[Any] = []
        try:
            conn = self._conn
            conn.send_packed_command(conn.pack_commands(commands) if len(commands) > 1 else
                                     conn.pack_command(*commands[0]))
            for _ in commands:  # every reply, errors included, to keep the connection in step
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:  # an error reply (OOM, WRONGTYPE, ...): the connection is fine
                    replies.append(TransportError(f"redis at {self._uri}: {type(exc).__name__}: {exc}"))
        except _DISCONNECTED as exc:
            self._conn.disconnect()
            self._backoff.failed(time.monotonic())
            self._warn.warning("disconnected", "redis publisher lost its connection", uri=self._uri, error=str(exc))
            raise TransportError(f"redis at {self._uri}: {type(exc).__name__}: {exc}") from exc
        except RedisError as exc:
            raise TransportError(f"redis at {self._uri}: {type(exc).__name__}: {exc}") from exc
        self._backoff.reset()
        if len(commands) == 1 and isinstance(replies[0], TransportError):
            raise replies[0]
        return replies

    def _joins_now(self) -> int | None:
        """The join counter; None (skipped, counted) when another writer left something else there."""
        reply = self._command(b"GET", self._joins_key)
        return foreign.decode("driver_control_key", self._joins_key, _count, reply)

    def _xadd(self, topic: str, frame: bytes) -> tuple[bytes, ...]:
        key = self._keys.get(topic)
        if key is None:
            key = self._keys[topic] = (self._prefix + topic).encode()
        return b"XADD", key, b"MAXLEN", b"~", self._maxlen, b"*", b"e", frame

    def send(self, topic: str, frame: bytes) -> None:
        self._command(*self._xadd(topic, frame))

    def send_many(self, frames: list[tuple[str, bytes]]) -> list[TransportError | None]:
        try:
            replies = self._pipeline([self._xadd(topic, frame) for topic, frame in frames])
        except TransportError as exc:
            return [exc] * len(frames)
        return [r if isinstance(r, TransportError) else None for r in replies]

    def new_subscribers(self) -> int:
        now = time.monotonic()
        if now < self._next_poll:
            return 0
        self._next_poll = now + _JOIN_POLL
        joins = self._joins_now()
        if joins is None:  # nothing to learn from a foreign counter; the idle hellos still go out
            return 0
        if self._joins is None or joins < self._joins:  # first look, or the server lost its data
            self._joins = joins
            return 0
        joined, self._joins = joins - self._joins, joins
        return joined

    def close(self) -> None:
        self._closed = True
        self._conn.disconnect()
        self._pool.disconnect()
