"""Discovery in Redis (``redis://host:port/db``) through redis-py.

Layout under ``{prefix}:publishers``:

- ``{prefix}:publishers:{publisher_id}``: the record as JSON, with a ``PX``
  expiry of the TTL; Redis deletes it by itself when renewals stop.
- ``{prefix}:publishers``: a set of the registered ids, the index listings
  read instead of ``SCAN``-ning the keyspace. The keyspace is shared with the
  store, whose objects can number millions; a watcher that scanned them every
  second would cost a million key visits a second per subscriber. Ids whose
  key expired are removed from the set by the next listing.

A renewal is one script: ``SET key record PX ttl XX``, and if the key
vanished (expired during an outage, flushed) the same without ``XX``, then
``SADD`` of the id. A listing is one read-and-clean script returning id,
record and ``PTTL`` of every live key. Watchers poll (keyspace notifications
need server configuration, and are lost while a watcher is disconnected).

The scripts build key names from the prefix, so they assume one Redis, not
Redis Cluster. Connection failures raise
:class:`~dfpubsub.errors.StoreUnavailable`; the pool reconnects on the next
call. A forked child builds its own client.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import redis

from ..backends.redis import ProcessClient, Script, open_client, redis_errors, scripts_of
from .api import Discovery, PublisherRecord

__all__ = ["RedisDiscovery"]

# KEYS: record key, index set. ARGV: record JSON, TTL in ms, publisher id. Returns 1 if the key existed.
_RENEW = """
local existed = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'XX')
if not existed then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
redis.call('SADD', KEYS[2], ARGV[3])
if existed then return 1 end
return 0
"""

# KEYS: index set. ARGV: prefix of the record keys. Returns flat (id, record, pttl ms) of the
# live records and drops the ids whose key is gone from the index.
_LIST = """
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. id
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then  -- another type: the caller skips it as foreign
    out[#out + 1] = id
    out[#out + 1] = ''
    out[#out + 1] = -1
  elseif value then
    out[#out + 1] = id
    out[#out + 1] = value
    out[#out + 1] = redis.call('PTTL', key)
  else
    redis.call('SREM', KEYS[1], id)
  end
end
return out
"""


@dataclass(frozen=True, slots=True)
class _Client:
    """A redis-py client and its scripts (one per process: see ProcessClient)."""

    r: redis.Redis
    renew: Script
    list: Script


class RedisDiscovery(Discovery):
    """``redis://host:port/db``; keys under ``{prefix}:publishers``."""

    backend = "redis"

    def __init__(self, url: str, ttl: float, renew_interval: float, prefix: str = "dfpubsub",
                 timeout: float | None = None):
        super().__init__(url, ttl, renew_interval, prefix, timeout)
        self._index = f"{prefix}:publishers"
        self._key_prefix = f"{prefix}:publishers:"
        self._ttl_ms = max(1, int(self.ttl * 1000))
        self._client = ProcessClient(self._new_client, lambda c: c.r.close())
        self._client.get()  # validates the URL; connections open on first use

    def _new_client(self) -> _Client:
        r = open_client(self.url, self.timeout, "discovery")
        scripts = scripts_of(r, self.timeout)
        return _Client(r, scripts.register(_RENEW), scripts.register(_LIST))

    def _connect(self) -> _Client:
        return self._client.get()

    def _errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return redis_errors(f"Redis discovery ({what})")

    def _keys(self, record: PublisherRecord) -> list[str]:
        return [self._key_prefix + record.publisher_id, self._index]

    def _create(self, record: PublisherRecord) -> None:
        c = self._connect()
        with self._errors("register"):
            c.renew(keys=self._keys(record), args=[record.to_json(), self._ttl_ms, record.publisher_id])

    def _renew(self, handle: Any, record: PublisherRecord, rewrite: bool) -> None:
        c = self._connect()
        # The record is rewritten every time (a few hundred bytes): one script either way.
        with self._errors("renew"):
            existed = c.renew(keys=self._keys(record), args=[record.to_json(), self._ttl_ms, record.publisher_id])
        if not existed:
            self._trouble.warning(f"vanished-{record.publisher_id}", "discovery row vanished; re-created it",
                                  backend=self.backend, publisher_id=record.publisher_id)

    def _remove(self, handle: Any, record: PublisherRecord) -> None:
        c = self._connect()
        with self._errors("unregister"):
            pipe = c.r.pipeline(transaction=True)
            pipe.delete(self._key_prefix + record.publisher_id)
            pipe.srem(self._index, record.publisher_id)
            pipe.execute()

    def _snapshot(self) -> dict[str, PublisherRecord]:
        c = self._connect()
        with self._errors("list"):
            flat = c.list(keys=[self._index], args=[self._key_prefix])
        out: dict[str, PublisherRecord] = {}
        for i in range(0, len(flat), 3):
            publisher_id = flat[i].decode(errors="replace")
            pttl = int(flat[i + 2])
            record = self._parse_row(publisher_id, flat[i + 1], pttl / 1000 if pttl >= 0 else None)
            if record is not None:
                out[publisher_id] = record
        return out

    def _close(self) -> None:
        self._client.close()
