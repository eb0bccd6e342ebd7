"""Redis Streams driver: ``redis://[[user]:password@]host:port/db`` (also ``rediss://``, ``unix://``).

Layout. Each topic is one stream, ``{prefix}:ps:{topic}``; the control topic is
``{prefix}:ps:$ctl`` (topics never start with ``$``, so it cannot collide). An
entry has one field, ``e``, holding the envelope bytes. Publishers append with
``XADD key MAXLEN ~ maxlen * e <frame>``, one command per envelope (the core
already packs up to ``batch_max_events`` events into one); envelopes the core
flushes together (several topics' batches) go in one pipelined round trip. ``{prefix}:ps:$joins``
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

from collections.abc import Mapping
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dfpubsub.errors import ConfigError
from dfpubsub.metrics import Stats
from dfpubsub.transport import Driver, PublisherTransport, SubscriberTransport

from .publisher import _RedisPublisher
from .streams import _SCHEMES, _make_pool, _public_url
from .subscriber import _RedisSubscriber

__all__ = ["RedisStreamsDriver", "RedisStreamsOptions"]


class RedisStreamsOptions(BaseModel):
    """Options of the ``redis`` driver (config table ``[driver.redis]``)."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field("dfpubsub", min_length=1, description="Key prefix: streams are {prefix}:ps:{topic}.")
    maxlen: int = Field(100_000, ge=1, description="Approximate bound of each stream, in entries (envelopes).")
    block_ms: int = Field(100, ge=1, description="Longest XREAD BLOCK, milliseconds (bounds how long close() waits).")
    count: int = Field(512, ge=1, description="Most entries one XREAD returns per stream.")
    timeout: float = Field(5.0, gt=0, description="Socket connect and read timeout, seconds.")

    @model_validator(mode="after")
    def _check(self) -> RedisStreamsOptions:
        if self.block_ms >= self.timeout * 1000:
            raise ValueError("block_ms must be shorter than timeout")
        return self


class RedisStreamsDriver(Driver):
    """``redis://host:port/db``: topics are Redis streams under ``{prefix}:ps:``."""

    name = "redis"
    options_model = RedisStreamsOptions

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
        return _make_pool(self.url, self.redis_options.timeout)

    def publisher(self, stats: Stats) -> PublisherTransport:
        assert self.url is not None
        return _RedisPublisher(self.url, self._pool(), self.redis_options, stats)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        assert self.url is not None
        return _RedisSubscriber(self._pool(), self.redis_options, stats, _public_url(self.url))
