"""Leases in Redis (``redis://host:port/db``): ``SET NX PX`` takes the lease, a script renews and
releases it only while it is still the caller's, ``INCR`` of a counter gives the fencing token.

Keys: ``{prefix}:leader:{name}`` holds ``"{token} {identity}"`` with a ``PX``
expiry of the lease duration (Redis deletes it when renewals stop);
``{prefix}:leader:{name}:token`` is the counter, without expiry. Taking the
lease is one script (``SET NX PX``, then ``INCR`` and the token written into
the value), so a token is never spent on a lease not taken, and no two
holders ever see the same one.

The counter must outlive a Redis restart for tokens to keep growing: run the
Redis that holds leases with persistence (``appendonly yes``). A replica promoted
by a failover may have missed the last acquisitions (replication is
asynchronous), so tokens never go backwards by another way: the first connection
to a server that took over (:data:`~dfpubsub.backends.redis.TAKEOVER`) moves the
counter ``TAKEOVER_JUMP`` ahead, past every token the old master can have given
(docs/leader.md).
"""

from __future__ import annotations

from typing import Any

import redis

from ..backends.foreign import skip
from ..backends.redis import (
    TAKEOVER,
    TAKEOVER_JUMP,
    ProcessClient,
    Script,
    open_client,
    redacted,
    redis_errors,
    scripts_of,
)
from ..errors import ForeignRecord
from .api import Holder

__all__ = ["RedisLease"]

# KEYS: lease, counter. ARGV: identity, duration ms. The new token, or false while the lease is held.
_ACQUIRE = """
if not redis.call('SET', KEYS[1], '', 'NX', 'PX', ARGV[2]) then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
"""
# KEYS: lease. ARGV: "token identity", duration ms. 1 if renewed, 0 if no longer the caller's.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
# KEYS: lease. ARGV: "token identity". Deletes the lease if it is still the caller's.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Run on each new connection (TAKEOVER). KEYS: epoch, counter. ARGV: jump.
_TAKEOVER = TAKEOVER.format(move="if redis.call('EXISTS', KEYS[2]) == 1 then redis.pcall('INCRBY', KEYS[2], JUMP) end")


class RedisLease:
    """The lease ``name`` in the Redis of ``url``, under ``prefix``."""

    backend = "redis"

    def __init__(self, url: str, name: str, timeout: float, prefix: str = "dfpubsub"):
        self.name = name
        self.where = f"Redis leader lease at {redacted(url)}"
        self._key = f"{prefix}:leader:{name}"
        self._keys = [self._key, f"{self._key}:token"]
        self._client: ProcessClient[tuple[redis.Redis, dict[str, Script]]] = ProcessClient(
            lambda: self._connect(url, timeout), lambda c: c[0].close())

    def _connect(self, url: str, timeout: float) -> tuple[redis.Redis, dict[str, Script]]:
        r = open_client(url, timeout, "leader lease",
                        on_connect=(_TAKEOVER, [f"{self._key}:epoch", self._keys[1]], [TAKEOVER_JUMP]))
        scripts = scripts_of(r, timeout)
        return r, {"acquire": scripts.register(_ACQUIRE), "renew": scripts.register(_RENEW),
                   "release": scripts.register(_RELEASE)}

    def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with redis_errors(self.where):
            return self._client.get()[1][script](keys=keys, args=args)

    def acquire(self, identity: str, duration: float) -> int | None:
        token = self._run("acquire", self._keys, [identity, max(1, round(duration * 1000))])
        return None if token is None else int(token)

    def renew(self, identity: str, token: int, duration: float) -> bool:
        return bool(self._run("renew", self._keys[:1], [f"{token} {identity}", max(1, round(duration * 1000))]))

    def release(self, identity: str, token: int) -> None:
        self._run("release", self._keys[:1], [f"{token} {identity}"])

    def holder(self) -> Holder | None:
        with redis_errors(self.where):
            r = self._client.get()[0]
            pipe = r.pipeline(transaction=True)
            pipe.get(self._key)
            pipe.pttl(self._key)
            value, pttl = pipe.execute()
        if value is None:
            return None
        token, _, identity = value.partition(b" ")
        if not token.isdigit() or not identity:
            detail = f"not a lease: {value[:80]!r}"
            skip("leader lease", self._key, "malformed", detail)
            raise ForeignRecord(self._key, detail)
        return Holder(identity.decode(errors="replace"), int(token), pttl / 1000.0)

    def close(self) -> None:
        self._client.close()
