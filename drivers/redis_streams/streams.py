"""What both Redis transports share: the connection pool, failure pacing, and stream cursors.

A cursor is where a subscriber is in one stream; the read-only Lua probe
describes a stream (last id, ``entries-added``, length, first id), and
:func:`_apply_probe` compares the two to tell a trimmed or reset stream.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from dfpubsub.backends.access import redis_access
from dfpubsub.backends.redis import sentinel_pool
from dfpubsub.backends.urls import SENTINEL_SCHEMES
from dfpubsub.errors import ConfigError
from dfpubsub.logs import RateLimitedLog
from dfpubsub.retry import Backoff

log = logging.getLogger(__package__)  # one logger for the whole driver, as before the split

_SCHEMES = ("redis://", "rediss://", "unix://", *(f"{scheme}://" for scheme in SENTINEL_SCHEMES))
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


def _make_pool(url: str, timeout: float) -> redis.ConnectionPool:
    """A pool for ``url`` that never retries on its own; raises ConfigError for a bad URL. Through
    Sentinel (``redis+sentinel://``) each connection asks the sentinels for the master as it
    connects, so the transports' reconnection after a failure follows a failover."""
    if url.startswith(tuple(f"{scheme}://" for scheme in SENTINEL_SCHEMES)):
        return sentinel_pool(url, timeout, protocol=2)
    target, access = redis_access().connect_args(url)  # [redis]: user and TLS over the URL's
    try:
        return redis.ConnectionPool.from_url(
            target, socket_timeout=timeout, socket_connect_timeout=timeout, protocol=2,
            retry=Retry(NoBackoff(), 0),  # the transports decide when to try again
            **access,
        )
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {_public_url(url)!r}: {exc}") from exc


def _failure_pacing() -> tuple[Backoff, RateLimitedLog]:
    """A transport's pause after failures (50 ms, doubling to 1 s; reset by a success) and its
    warnings (one line per key per second)."""
    return Backoff(0.05, 1.0), RateLimitedLog(log)


def _sid(stream_id: bytes) -> tuple[int, int]:
    """A stream id as a comparable pair."""
    ms, _, seq = stream_id.partition(b"-")
    return int(ms), int(seq or 0)


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


def _apply_probe(c: _Cursor, row: list[Any], now: float, warn: RateLimitedLog) -> str | None:
    """Update ``c`` from a probe row; return why its history is lost, if it is."""
    last_id, added, length, first = row[0], int(row[1]), int(row[2]), row[3]
    c.probed = now
    c.lagging = False
    if length < 0:
        if not c.not_stream:
            warn.warning("type", "redis key is not a stream; ignoring it", key=c.key.decode())
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
