"""Slots in Redis (``redis://host:port/db``, the store's own server): a key per slot holding its
holder's ticket with a ``PX`` expiry of the lease, taken by one script.

Keys: ``{prefix}:relist:{name}:{slot}``. The script walks the slots and takes
the first that is absent or garbage (not a string, no expiry, an expiry
beyond :data:`.api.MAX_LEASE`, or a value that is not a ticket): garbage is
replaced and its slot numbers returned, so that the caller counts them.
Renewing and releasing are scripts that compare the ticket first.
"""

from __future__ import annotations

from typing import Any

import redis

from ..backends.foreign import skip
from ..backends.redis import ProcessClient, Script, open_client, redacted, redis_errors, scripts_of
from .api import MAX_LEASE, SKIP_KIND, SlotHolder, is_ticket

__all__ = ["RedisSlots"]

# KEYS: the slots' keys. ARGV: ticket, duration ms, MAX_LEASE ms. {slot taken (0-based) or -1, garbage slots}.
_ACQUIRE = """
local garbage = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  local free = kind == 'none'
  if not free then
    local ttl = redis.call('PTTL', key)
    local value = kind == 'string' and redis.call('GET', key) or ''
    if kind ~= 'string' or ttl < 0 or ttl > tonumber(ARGV[3]) or string.len(value) > 288
        or not string.match(value, '^' .. string.rep('%x', 32) .. ' %S') then
      table.insert(garbage, i - 1)
      redis.call('DEL', key)
      free = true
    end
  end
  if free then
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
    return {i - 1, garbage}
  end
end
return {-1, garbage}
"""
# KEYS: the slot. ARGV: ticket, duration ms. 1 if renewed, 0 if no longer the caller's.
_RENEW = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' or redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
# KEYS: the slot. ARGV: ticket.
_RELEASE = """
if redis.call('TYPE', KEYS[1])['ok'] == 'string' and redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisSlots:
    """The semaphore ``name`` in the Redis of ``url``, under ``prefix``."""

    backend = "redis"

    def __init__(self, url: str, name: str, timeout: float, prefix: str = "dfpubsub"):
        self.name = name
        self.where = f"Redis relist slots at {redacted(url)}"
        self._base = f"{prefix}:relist:{name}:"
        self._client: ProcessClient[tuple[redis.Redis, dict[str, Script]]] = ProcessClient(
            lambda: self._connect(url, timeout), lambda c: c[0].close())

    def _connect(self, url: str, timeout: float) -> tuple[redis.Redis, dict[str, Script]]:
        r = open_client(url, timeout, "relist slots")
        scripts = scripts_of(r, timeout)
        return r, {"acquire": scripts.register(_ACQUIRE), "renew": scripts.register(_RENEW),
                   "release": scripts.register(_RELEASE)}

    def _key(self, slot: int) -> str:
        return f"{self._base}{slot}"

    def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with redis_errors(self.where):
            return self._client.get()[1][script](keys=keys, args=args)

    def acquire(self, ticket: str, slots: int, duration: float) -> int | None:
        taken, garbage = self._run("acquire", [self._key(i) for i in range(slots)],
                                   [ticket, max(1, round(duration * 1000)), round(MAX_LEASE * 1000)])
        for slot in garbage:
            skip(SKIP_KIND, self._key(int(slot)), "malformed", "not a slot's ticket with a lease; replaced")
        return None if int(taken) < 0 else int(taken)

    def renew(self, ticket: str, slot: int, duration: float) -> bool:
        return bool(self._run("renew", [self._key(slot)], [ticket, max(1, round(duration * 1000))]))

    def release(self, ticket: str, slot: int) -> None:
        self._run("release", [self._key(slot)], [ticket])

    def holders(self, slots: int) -> list[SlotHolder]:
        with redis_errors(self.where):
            pipe = self._client.get()[0].pipeline(transaction=False)
            for i in range(slots):
                pipe.type(self._key(i))
                pipe.pttl(self._key(i))
            kinds = pipe.execute()
            pipe = self._client.get()[0].pipeline(transaction=False)
            strings = [i for i in range(slots) if kinds[2 * i] == b"string"]
            for i in strings:
                pipe.get(self._key(i))
            values = dict(zip(strings, pipe.execute()))
        out = []
        for i in range(slots):
            kind, pttl = kinds[2 * i], kinds[2 * i + 1]
            if kind == b"none":
                continue
            value = values.get(i)
            if not is_ticket(value) or not 0 <= pttl <= MAX_LEASE * 1000:
                skip(SKIP_KIND, self._key(i), "malformed", f"not a slot: {kind!r} {value!r:.60}, pttl {pttl}")
                continue
            out.append(SlotHolder(i, value.decode(), pttl / 1000.0))  # type: ignore[union-attr]
        return out

    def close(self) -> None:
        self._client.close()
