"""The Redis subscriber transport: the XREAD loop over per-stream cursors, trim/reset detection, close."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import RedisError, ResponseError

from dfpubsub.errors import ClosedError
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.metrics import Stats
from dfpubsub.transport import SubscriberTransport

from .streams import _DISCONNECTED, _PROBE, _apply_probe, _Cursor, _failure_pacing, log

if TYPE_CHECKING:
    from . import RedisStreamsOptions

#: A subscriber whose ``recv`` was not called for this long probes its streams for trimming.
_STALE = 0.25
#: Streams that are not streams (another application's keys) are probed again this often.
_RECHECK = 5.0


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
        self._backoff, self._warn = _failure_pacing()

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
                _apply_probe(cursor, pipe.execute()[0][0], time.monotonic(), self._warn)
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
            self._backoff.reset()
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
            reason = _apply_probe(cursor, row, now, self._warn)
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

