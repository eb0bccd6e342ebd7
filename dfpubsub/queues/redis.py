"""Redis queues: ``redis://host:port/db`` through redis-py, one atomic Lua script per call.

Layout under ``{prefix}:q:``:

- ``queues``: the set of queue names (the registry of queues).
- ``m:{name}``: a hash of the queue's limits, counters (``seq``, ``bytes``,
  ``reserved_bytes``) and lease (``owner``, ``owner_until``).
- ``r:{name}``: a sorted set of the live reservations scored by expiry time;
  a member is ``{size}.{n}`` (``n`` from the ``rid`` counter), and is the
  reservation id the caller gets, so no other key holds a reservation.
- ``e:{name}``: a stream of the entries, the entry of marker ``s`` at stream
  id ``s-0``, with fields ``t`` (enqueued at) and ``d`` (the data).
- ``d:{name}``: a hash of dead letters, marker -> msgpack ``[data, reason, at]``.
- ``rec:{kind}``: a hash of records, name -> data.
- ``epoch``: the replication id of the server that last handed out reservation ids and
  sequences. When another server takes over (a replica promoted by a failover, a restarted
  server), the first connection to it moves ``rid`` and every queue's ``seq`` ``TAKEOVER_JUMP``
  ahead (``_TAKEOVER``): a reservation id or marker the old master gave out is never given
  out again, so a commit or ``remove(up_to)`` made with one cannot touch a newer entry.

Entries are counted by the stream's length and reservations by the sorted
set's; ``bytes`` and ``reserved_bytes`` change in the script that adds or
removes what they count, so they cannot drift. Scripts format integers with
``%d``: Lua numbers are doubles, and Redis would write large ones in
exponent notation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgpack
import redis

from ..backends import foreign
from ..backends.redis import (
    TAKEOVER,
    TAKEOVER_JUMP,
    ProcessClient,
    Script,
    open_client,
    redacted,
    redis_errors,
    scripts_of,
    server_location,
)
from ..errors import ConfigError, ForeignRecord, QueueFull, QueueNotFound, ReservationNotFound
from ..store.outbox import MAX_PREFIX_BYTES, Outbox, RedisOutbox
from .api import Aside, DeadLetter, QueueEntry, QueueInfo, QueueStats, QueueStore, marker
from .readback import dead_letter, foreign_entry, named_records, queue_meta, queue_names

__all__ = ["RedisQueues"]

T = TypeVar("T")

#: Past any lease's expiry (Unix seconds): a larger one, or nan or inf, is another writer's.
_MAX_UNTIL = 1e12
_MISSING, _FULL, _FOREIGN = -1, -2, -4  # script status codes; -3: unknown or expired reservation

# int(): integers as Redis wants them. sweep(): drops the expired reservations at now.
_LIB = """
local function int(x) return string.format('%d', x) end
local function sweep(meta, res, now)
  local gone = redis.call('ZRANGEBYSCORE', res, '-inf', '(' .. now)
  if #gone == 0 then return 0 end
  local freed = 0
  for i = 1, #gone do freed = freed + (tonumber(string.match(gone[i], '^%d+')) or 0) end
  redis.call('ZREMRANGEBYSCORE', res, '-inf', '(' .. now)
  redis.call('HINCRBY', meta, 'reserved_bytes', int(-freed))
  return freed
end
local function count(x) return x and string.len(x) <= 15 and string.match(x, '^%d+$') ~= nil end
-- Appends data to the stream entries after sequence seq; the sequence it took, or nil when the
-- stream holds an id no sequence can pass. An id at or past seq + 1 is another writer's (an
-- entry added there, perhaps removed since): the append goes on after it, as a reader's position
-- only grows and must not be passed over. XINFO, which finds that id, runs only then: it is
-- the dearest read of a notified write.
local function append(entries, seq, now, data)
  local id = redis.pcall('XADD', entries, int(seq + 1) .. '-0', 't', now, 'd', data)
  if type(id) ~= 'table' then return seq + 1 end
  local info = redis.call('XINFO', 'STREAM', entries)
  for j = 1, #info, 2 do
    if info[j] == 'last-generated-id' then
      local last = tonumber(string.match(info[j + 1], '^(%d+)'))
      if not last or last >= 2^53 then return nil end
      seq = math.max(seq, last)
    end
  end
  id = redis.pcall('XADD', entries, int(seq + 1) .. '-0', 't', now, 'd', data)
  if type(id) == 'table' then return nil end
  return seq + 1
end
-- The queue at meta, res (reservations), entries, read once and proved ours before the caller
-- writes anything (a script is not rolled back when a call fails): nil when it does not exist,
-- false plus the culprit's position (1 meta, 2 reservations, 3 entries) and why when something
-- there is foreign, else its state, expired reservations swept. The reservations are counted
-- by one ZCARD, even where the reserved bytes say 0: reservations of 0 bytes hold an entry's
-- place each. A caller that touches the reservations only through the sweep (the outbox:
-- sweep_only) makes none, so their stale_after is neither read nor proved, and a foreign key
-- in their place stops it only when the reserved bytes say it would have to sweep there.
local function queue_read(meta, res, entries, now, sweep_only)
  local m
  if sweep_only then
    m = redis.pcall('HMGET', meta, 'max_bytes', 'max_entries', 'bytes', 'reserved_bytes', 'seq')
  else
    m = redis.pcall('HMGET', meta, 'max_bytes', 'max_entries', 'bytes', 'reserved_bytes', 'seq', 'stale_after')
  end
  if m.err then return false, 1, 'queue metadata is not a hash' end
  if not m[1] then return nil end
  for j = 1, 5 do
    if not count(m[j]) then return false, 1, 'queue metadata has a field that is not a count' end
  end
  local stale_after = tonumber(m[6])
  if not sweep_only and (not stale_after or stale_after ~= stale_after) then
    return false, 1, 'queue stale_after is not a number'
  end
  local len = redis.pcall('XLEN', entries)
  if type(len) == 'table' then return false, 3, 'queue entries are not a stream' end
  -- Counted whatever the reserved bytes say: a reservation of 0 bytes holds an entry's place too.
  local reserved, held = tonumber(m[4]), redis.pcall('ZCARD', res)
  if type(held) == 'table' then
    if not sweep_only or reserved > 0 then
      return false, 2, 'queue reservations are a ' .. redis.call('TYPE', res)['ok'] .. ', not a sorted set'
    end
    held = 0  -- foreign, but with nothing reserved the outbox would not even sweep it: passed by
  end
  if held > 0 then  -- else there are no reservations to sweep
    reserved = reserved - sweep(meta, res, now)
    held = redis.call('ZCARD', res)
  end
  return {max_bytes = tonumber(m[1]), max_entries = tonumber(m[2]), used = tonumber(m[3]) + reserved,
          count = len + held, bytes = tonumber(m[3]), seq = tonumber(m[5]), reserved = reserved,
          stale_after = stale_after}
end
"""

# KEYS: meta, reservations, entries, rid counter. ARGV: now, sizes... Returns ids, or a status.
_RESERVE = _LIB + """
local q, culprit, why = queue_read(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
if q == nil then return -1 end
if q == false then return {-4, culprit, why} end
local want, n = 0, #ARGV - 1
for i = 2, #ARGV do want = want + tonumber(ARGV[i]) end
if q.used + want > q.max_bytes or q.count + n > q.max_entries then return -2 end
local expires = tonumber(ARGV[1]) + q.stale_after
local last = redis.pcall('INCRBY', KEYS[4], n)
if type(last) == 'table' then return {-4, 4, 'the reservation counter is not an integer'} end
local reserved = q.reserved
local ids, zadd = {}, {}
for i = 1, n do
  local id = ARGV[i + 1] .. '.' .. int(last - n + i)
  ids[i] = id
  zadd[2 * i - 1] = expires
  zadd[2 * i] = id
end
redis.call('ZADD', KEYS[2], unpack(zadd))
redis.call('HSET', KEYS[1], 'reserved_bytes', int(reserved + want))
return ids
"""

# KEYS: meta, reservations, entries. ARGV: now, (id, data)... All or nothing: returns the new
# entries' sequence numbers, or {status, index of the culprit}. Expired reservations are swept
# first, so they neither count nor commit. (The one exception: a stream holding another writer's
# id no sequence can pass, 2^53 and beyond, is found at its append, after the entries before.)
_COMMIT = _LIB + """
local q, culprit, why = queue_read(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
if q == nil then return {-1, 0} end
if q == false then return {-4, culprit, why} end
local reserved, used = q.reserved, q.used
local sizes = {}
for i = 2, #ARGV, 2 do
  if not redis.call('ZSCORE', KEYS[2], ARGV[i]) then return {-3, i / 2} end
  local size = tonumber(string.match(ARGV[i], '^%d+'))
  sizes[#sizes + 1] = size
  local len = string.len(ARGV[i + 1])
  used = used + len - size  -- a smaller entry frees room for a larger one after it
  if len > size and used > q.max_bytes then return {-2, i / 2} end
end
local seq, added, out = q.seq, 0, {}
for i = 2, #ARGV, 2 do
  reserved = reserved - sizes[i / 2]
  added = added + string.len(ARGV[i + 1])
  redis.call('ZREM', KEYS[2], ARGV[i])
  seq = append(KEYS[3], seq, ARGV[1], ARGV[i + 1])
  if not seq then return {-4, 3, 'queue entries hold an id no sequence can pass'} end
  out[#out + 1] = seq
end
redis.call('HSET', KEYS[1], 'seq', int(seq), 'bytes', int(q.bytes + added), 'reserved_bytes', int(reserved))
return out
"""

# KEYS: meta, reservations. ARGV: id, now. 1 aborted, 0 unknown or expired.
_ABORT = _LIB + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local exp = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not exp then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'reserved_bytes', int(-tonumber(string.match(ARGV[1], '^%d+'))))
if tonumber(exp) < tonumber(ARGV[2]) then return 0 end
return 1
"""

# KEYS: meta, entries. ARGV: first stream id, count.
_LIST = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
return redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', ARGV[2])
"""

# KEYS: meta, entries. ARGV: last stream id removed, first stream id kept.
_REMOVE = _LIB + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local gone = redis.call('XRANGE', KEYS[2], '-', ARGV[1])
if #gone == 0 then return 0 end
local freed = 0
for i = 1, #gone do freed = freed + string.len(gone[i][2][4] or '') end  -- a foreign entry has no data
redis.call('XTRIM', KEYS[2], 'MINID', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'bytes', int(-freed))
return #gone
"""

# KEYS: meta, entries, dead letters. ARGV: then per entry its stream id, and (set aside) its marker
# and packed dead letter. Removes exactly those entries; a set-aside entry is recorded (HSETNX: the
# first record stays) in the same script, so it is never half moved. Returns how many were removed.
_REMOVE_IDS = _LIB + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local step = tonumber(ARGV[1])
local n, freed = 0, 0
for i = 2, #ARGV, step do
  local row = redis.call('XRANGE', KEYS[2], ARGV[i], ARGV[i])
  if #row > 0 then
    n = n + 1
    freed = freed + string.len(row[1][2][4] or '')  -- a foreign entry has no data
    redis.call('XDEL', KEYS[2], ARGV[i])
    if step == 3 then redis.call('HSETNX', KEYS[3], ARGV[i + 1], ARGV[i + 2]) end
  end
end
if freed > 0 then redis.call('HINCRBY', KEYS[1], 'bytes', int(-freed)) end
return n
"""

# KEYS: meta, reservations, entries. ARGV: now.
_STATS = _LIB + """
local m = redis.call('HMGET', KEYS[1], 'bytes', 'max_bytes', 'max_entries', 'owner', 'owner_until')
if not m[2] then return -1 end
sweep(KEYS[1], KEYS[2], ARGV[1])
return {redis.call('XLEN', KEYS[3]), m[1], redis.call('ZCARD', KEYS[2]),
        redis.call('HGET', KEYS[1], 'reserved_bytes'), m[2], m[3], m[4], m[5]}
"""

# KEYS: meta, registry. ARGV: name, max_bytes, max_entries, stale_after, now. 1 if created.
_CREATE = """
local created = redis.call('HSETNX', KEYS[1], 'created_at', ARGV[5])
redis.call('HSET', KEYS[1], 'max_bytes', ARGV[2], 'max_entries', ARGV[3], 'stale_after', ARGV[4])
if created == 1 then redis.call('HSET', KEYS[1], 'seq', 0, 'bytes', 0, 'reserved_bytes', 0) end
redis.call('SADD', KEYS[2], ARGV[1])
return created
"""

# KEYS: registry, meta, reservations, entries, dead letters. ARGV: name.
_DELETE = """
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return redis.call('SREM', KEYS[1], ARGV[1])
"""

# KEYS: meta. ARGV: owner, now, until. 1 taken or renewed, 0 held by another.
_LOCK = """
local cur = redis.call('HMGET', KEYS[1], 'max_bytes', 'owner', 'owner_until')
if not cur[1] then return -1 end
-- A lease whose expiry is not a time (another writer's: text, nan, inf) holds nothing: it is taken over.
local held = tonumber(cur[3]) or 0
if held ~= held or held > {max_until} then held = 0 end
if cur[2] and cur[2] ~= ARGV[1] and held >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'owner_until', ARGV[3])
return 1
""".replace("{max_until}", repr(_MAX_UNTIL))

# KEYS: meta. ARGV: owner.
_UNLOCK = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'owner', 'owner_until')
return 1
"""

# KEYS: meta, dead letters. ARGV: marker, packed.
_DEAD_LETTER = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
return redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
"""

# KEYS: meta, reservations, entries, dead letters. ARGV: now, marker, the letter as read (packed),
# its data. Moves the letter back to the end of its queue if it is still the one read: the new
# sequence number; 0 if the letter went meanwhile; -1 no queue; -2 no room; {-4, culprit, why}.
_REDRIVE = _LIB + """
if redis.call('HGET', KEYS[4], ARGV[2]) ~= ARGV[3] then
  if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
  return 0
end
local q, culprit, why = queue_read(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
if q == nil then return -1 end
if q == false then return {-4, culprit, why} end
local size = string.len(ARGV[4])
if q.used + size > q.max_bytes or q.count + 1 > q.max_entries then return -2 end
local seq = append(KEYS[3], q.seq, ARGV[1], ARGV[4])
if not seq then return {-4, 3, 'queue entries hold an id no sequence can pass'} end
redis.call('HSET', KEYS[1], 'seq', int(seq), 'bytes', int(q.bytes + size))
redis.call('HDEL', KEYS[4], ARGV[2])
return seq
"""

# KEYS: dead letters.
_PURGE = """
local n = redis.call('HLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return n
"""

# The outbox's half of a fused store write (dfpubsub/store/outbox.py, store/redis.py), as two
# pieces the store's script runs at its own top level (no closures to build on every write).
# Per entry i: KEYS[KB + 3i - 2 .. KB + 3i] its queue's meta, reservations and entries; ARGV[AB +
# 1] now, ARGV[AB + 2] '1' when each body is completed by the written value OB_VALUE
# (with_value), ARGV[AB + 2 + i] its body. The room an entry needs counts the widest version
# prefix. The check reads each queue once (two entries may share one) and the append goes on
# from what it read. A Redis script is not rolled back when a call fails, so the check first
# proves that nothing the append will touch is foreign (queue_read answers the culprit key's place
# and why): the store write and its appends then either all run or none does. Only sweeping a
# valid queue's expired reservations may have happened when a later queue turns out foreign, and
# that changes nothing anyone can see.
_OUTBOX_CHECK = _LIB + """
local OB_N, OB_NOW, OB_TAIL, OB = (#KEYS - KB) / 3, ARGV[AB + 1], ARGV[AB + 2] == '1', {}
local OB_BIN, OB_EXTRA = '', {prefix}
if OB_TAIL then  -- the msgpack bin header of the written value
  local n = string.len(OB_VALUE)
  if n < 256 then OB_BIN = string.char(196, n)
  elseif n < 65536 then OB_BIN = string.char(197, math.floor(n / 256), n % 256)
  else OB_BIN = string.char(198, math.floor(n / 16777216), math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
  end
  OB_EXTRA = OB_EXTRA + string.len(OB_BIN) + n
else
  OB_VALUE = ''
end
for i = 1, OB_N do
  local k = KB + 3 * (i - 1)
  local meta = KEYS[k + 1]
  local q = OB[meta]
  if q == nil then
    local culprit, why
    q, culprit, why = queue_read(meta, KEYS[k + 2], KEYS[k + 3], OB_NOW, true)
    if q == false then return {5, k + culprit, why} end
    OB[meta] = q or false
    q = OB[meta]
  end
  if q then
    q.used = q.used + OB_EXTRA + string.len(ARGV[AB + 2 + i])
    q.count = q.count + 1
    if q.used > q.max_bytes or q.count > q.max_entries then return {4, i} end
  end
end
""".replace("{prefix}", str(MAX_PREFIX_BYTES))
_OUTBOX_APPEND = """
local head = string.char(160 + string.len(OB_VERSION)) .. OB_VERSION
for i = 1, OB_N do
  local k = KB + 3 * (i - 1)
  local q = OB[KEYS[k + 1]]
  local seq = false
  if q then
    local data = head .. ARGV[AB + 2 + i] .. OB_BIN .. OB_VALUE
    seq = append(KEYS[k + 3], q.seq, OB_NOW, data)
    if seq then
      q.seq = seq
      q.bytes = q.bytes + string.len(data)
      redis.call('HSET', KEYS[k + 1], 'seq', int(q.seq), 'bytes', int(q.bytes))
    end
  end
  -- a queue gone, or one whose append failed: the write is made, so its notification is
  -- counted lost, never a failed write
  if not seq then OB_SKIPPED = OB_SKIPPED + 1 end
end
"""

#: Queues whose keys a RedisQueues keeps formatted for the outbox, before it starts again.
_KEYS_KEPT = 4096

# Run on each new connection (TAKEOVER). KEYS: epoch, rid counter, registry. ARGV: jump, meta key prefix.
_TAKEOVER = TAKEOVER.format(move="""
if redis.call('EXISTS', KEYS[2]) == 1 then redis.pcall('INCRBY', KEYS[2], JUMP) end
for _, name in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local meta = ARGV[2] .. name
  if redis.pcall('HEXISTS', meta, 'seq') == 1 then redis.pcall('HINCRBY', meta, 'seq', JUMP) end
end
""")

_SCRIPTS = {
    "reserve": _RESERVE, "commit": _COMMIT, "abort": _ABORT, "list": _LIST, "remove": _REMOVE, "remove_ids": _REMOVE_IDS,
    "stats": _STATS,
    "create": _CREATE, "delete": _DELETE, "lock": _LOCK, "unlock": _UNLOCK, "dead_letter": _DEAD_LETTER,
    "purge": _PURGE, "redrive": _REDRIVE,
}


@dataclass(frozen=True, slots=True)
class _Client:
    """A redis-py client and its registered scripts (one per process)."""

    r: redis.Redis
    scripts: dict[str, Script]


class _Outbox(RedisOutbox):
    """Keys and arguments of the entries for the store's fused script (see _OUTBOX_CHECK)."""

    CHECK = _OUTBOX_CHECK
    APPEND = _OUTBOX_APPEND

    def __init__(self, location: str, entries: list[tuple[str, bytes]], with_value: bool,
                 keys: Callable[[str], tuple[str, str, str]], now: float):
        super().__init__(location, entries, with_value)
        self._keys = keys
        self._now = now

    def keys(self) -> list[str]:
        of = self._keys
        return [key for name, _ in self.entries for key in of(name)]

    def args(self) -> list[Any]:
        return [repr(self._now), "1" if self.with_value else "", *(body for _, body in self.entries)]


def _stats_of(row: list[Any], now: float, meta: str) -> QueueStats:
    entries, used, n, reserved, max_bytes, max_entries, owner, until = row
    lease = _lease(owner, until, now, meta)
    return QueueStats(entries, int(used), n, int(reserved), int(max_bytes), int(max_entries),
                      lease[0] if lease else None, lease[1] if lease else None)


def _lease(owner: bytes | None, until: bytes | None, now: float, meta: str) -> tuple[str, float] | None:
    """The live lease of a queue's metadata fields; a foreign one (counted) holds nothing."""
    if owner is None:
        return None
    held = foreign.decode("queue_lease", meta, _owner_until, owner, until)
    return None if held is None or held[1] < now else held


def _owner_until(owner: bytes, until: bytes | None) -> tuple[str, float]:
    expires = float(until)  # type: ignore[arg-type]  # None raises TypeError: foreign
    if not 0 <= expires <= _MAX_UNTIL:  # nan and inf included
        raise ValueError(f"lease expiry {until!r} is not a time")
    return owner.decode(), expires


class RedisQueues(QueueStore):
    """``redis://host:port/db``; keys live under ``{prefix}:q:``."""

    backend = "redis"

    def __init__(self, url: str, prefix: str = "dfpubsub", timeout: float = 5.0,
                 clock: Callable[[], float] = time.time):
        super().__init__(clock)
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError(f"Redis queues prefix must be a non-empty string, not {prefix!r}")
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        self._where = redacted(url)
        self._ns = f"{prefix}:q:"
        self._registry = self._ns + "queues"
        self._rid = self._ns + "rid"
        self._client = ProcessClient(self._new_client, lambda c: c.r.close())
        # Each notified write names its shard's keys: formatted once per queue (see _queue_keys).
        self._outbox_keys: dict[str, tuple[str, str, str]] = {}
        # Validates the URL; connections are opened on first use.
        self.location = server_location(self._client.get().r)

    def outbox(self, entries: list[tuple[str, bytes]], with_value: bool = False) -> Outbox:
        """See :meth:`QueueStore.outbox`."""
        return _Outbox(self.location, entries, with_value, self._queue_keys, self.clock())

    def _queue_keys(self, name: str) -> tuple[str, str, str]:
        """The (meta, reservations, entries) keys of queue ``name``."""
        keys = self._outbox_keys.get(name)
        if keys is None:
            if len(self._outbox_keys) >= _KEYS_KEPT:  # names of deleted queues do not pile up
                self._outbox_keys.clear()
            ns = self._ns
            keys = self._outbox_keys[name] = (f"{ns}m:{name}", f"{ns}r:{name}", f"{ns}e:{name}")
        return keys

    def _new_client(self) -> _Client:
        takeover = (_TAKEOVER, [self._ns + "epoch", self._rid, self._registry], [TAKEOVER_JUMP, self._ns + "m:"])
        r = open_client(self.url, self.timeout, "queues", on_connect=takeover)
        scripts = scripts_of(r, self.timeout)
        return _Client(r, {name: scripts.register(src, readonly=name == "list") for name, src in _SCRIPTS.items()})

    def _errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return redis_errors(f"Redis queues at {self._where} ({what})")

    def _run(self, script: str, what: str, keys: list[str], args: list[Any]) -> Any:
        c = self._client.get()
        with self._errors(what):
            return c.scripts[script](keys=keys, args=args)

    def _on_queue(self, script: str, what: str, name: str, kinds: str, args: list[Any]) -> Any:
        """:meth:`_run` on the keys of ``kinds`` (one letter each) of queue ``name``; QueueNotFound
        when the script answers that there is no queue."""
        res = self._run(script, what, self._keys(name, *kinds), args)
        if res == _MISSING:
            raise QueueNotFound(f"no queue {name!r}")
        return res

    def _read_meta(self, name: str, what: str, read: Callable[[_Client], Any], decode: Callable[[Any], T]) -> T:
        """``decode(read(client))`` of queue ``name``'s metadata; ForeignRecord (counted) when
        a key of the queue has the wrong Redis type or its fields do not decode."""
        meta = self._keys(name, "m")[0]
        c = self._client.get()
        with self._errors(what):
            try:
                row = read(c)
            except redis.ResponseError as exc:
                if "WRONGTYPE" not in str(exc):
                    raise
                foreign.skip("queue_meta", meta, "wrong_type", str(exc))
                raise ForeignRecord(meta, "a key of the queue has the wrong Redis type") from exc
        return queue_meta(meta, decode, row)

    def _foreign(self, name: str, res: list[Any]) -> ForeignRecord:
        """The ForeignRecord (counted) of a script's {-4, culprit's position, why}: found before
        the script wrote anything."""
        key = [*self._keys(name, "m", "r", "e"), self._rid][res[1] - 1]
        foreign.skip("queue_meta", key, "wrong_type", res[2].decode())
        return ForeignRecord(key, res[2].decode())

    def _keys(self, name: str, *kinds: str) -> list[str]:
        return [f"{self._ns}{kind}:{name}" for kind in kinds]

    # -- registry ---------------------------------------------------------------------------

    def _create_queue(self, name: str, max_bytes: int, max_entries: int, stale_after: float, now: float) -> bool:
        return bool(self._run("create", f"create {name}", [*self._keys(name, "m"), self._registry],
                              [name, max_bytes, max_entries, repr(stale_after), repr(now)]))

    def _delete_queue(self, name: str) -> bool:
        return bool(self._run("delete", f"delete {name}", [self._registry, *self._keys(name, "m", "r", "e", "d")],
                              [name]))

    def _list_queues(self) -> list[str]:
        c = self._client.get()
        with self._errors("list queues"):
            try:
                members = cast("set[bytes]", c.r.smembers(self._registry))
            except redis.ResponseError as exc:  # the registry is not a set: no queue can be found
                foreign.skip("queue_name", self._registry, "wrong_type", str(exc))
                return []
            names = queue_names((n, f"{self._registry} member {n!r}") for n in members)
            # A name another writer added has no queue behind it (ours are added and removed with
            # their metadata, in one script): skipped and counted, so that no reader of the list
            # fails on it.
            pipe = c.r.pipeline(transaction=False)
            for name in names:
                pipe.exists(self._keys(name, "m")[0])
            found = pipe.execute() if names else []
        for name, there in zip(names, found):
            if not there:
                foreign.skip("queue_name", f"{self._registry} member {name!r}", "no_queue",
                             "no queue metadata behind it")
        return [name for name, there in zip(names, found) if there]

    def _queue_info(self, name: str) -> QueueInfo:
        row = self._read_meta(name, f"info {name}", lambda c: c.r.hmget(
            self._keys(name, "m")[0], ["max_bytes", "max_entries", "stale_after", "created_at"]), list)
        if row[0] is None:
            raise QueueNotFound(f"no queue {name!r}")
        return queue_meta(self._keys(name, "m")[0], lambda mb, me, st, ca: QueueInfo(
            name, int(mb), int(me), float(st), float(ca)), *row)

    # -- writers ----------------------------------------------------------------------------

    def _reserve_many(self, name: str, sizes: list[int], now: float) -> list[str]:
        c = self._client.get()
        ns = self._ns
        with self._errors(f"reserve in {name}"):
            res = c.scripts["reserve"](keys=[f"{ns}m:{name}", f"{ns}r:{name}", f"{ns}e:{name}", self._rid],
                                       args=[repr(now), *sizes])
        if res.__class__ is list:
            if res and res[0] == _FOREIGN:
                raise self._foreign(name, res)
            return [r.decode() for r in res]
        if res == _MISSING:
            raise QueueNotFound(f"no queue {name!r}")
        raise QueueFull(name, f"no room for {len(sizes)} reservation(s) of {sum(sizes)} bytes")

    def _commit_many(self, name: str, items: list[tuple[str, bytes]], now: float) -> list[str]:
        c = self._client.get()
        ns = self._ns
        args: list[Any] = [repr(now)]
        for res_id, data in items:
            args += (res_id, data)
        with self._errors(f"commit to {name}"):
            res = c.scripts["commit"](keys=[f"{ns}m:{name}", f"{ns}r:{name}", f"{ns}e:{name}"], args=args)
        status = res[0]
        if status > 0:
            return [marker(seq) for seq in res]
        if status == _FOREIGN:
            raise self._foreign(name, res)
        if status == _MISSING:
            raise QueueNotFound(f"no queue {name!r}")
        res_id, data = items[res[1] - 1]
        if status == _FULL:
            raise QueueFull(name, f"an entry of {len(data)} bytes does not fit in its reservation nor in the free room")
        raise ReservationNotFound(
            f"queue {name}: reservation {res_id!r} is unknown (committed, aborted, expired or never made)")

    def _abort(self, name: str, res_id: str, now: float) -> bool:
        return bool(self._on_queue("abort", f"abort in {name}", name, "mr", [res_id, repr(now)]))

    # -- the owner ----------------------------------------------------------------------------

    def _list(self, name: str, max: int, after: int) -> tuple[list[QueueEntry], bool]:
        rows = self._on_queue("list", f"list {name}", name, "me", [f"{after + 1}-0", max + 1])
        out = []
        key = self._keys(name, "e")[0]
        for sid, fields in rows[:max]:
            # fields: [b"t", enqueued_at, b"d", data]
            mk = marker(int(sid[:sid.index(b"-")]))
            try:  # free unless it raises
                out.append(QueueEntry(mk, fields[3], float(fields[1])))
            except foreign.DECODE_ERRORS as exc:
                out.append(foreign_entry(mk, f"{key} id {sid.decode()}", exc))
        return out, len(rows) > max

    def _remove(self, name: str, up_to: int) -> int:
        removed: int = self._on_queue("remove", f"remove from {name}", name, "me", [f"{up_to}-0", f"{up_to + 1}-0"])
        return removed

    def _remove_exact(self, name: str, items: list[tuple[int, bytes | None]], aside: Aside | None) -> int:
        if aside is None:
            what, args = "remove", [1, *(f"{s}-0" for s, _ in items)]
        else:
            what, args = "set aside", [3]
            for seq, data in items:
                args += (f"{seq}-0", marker(seq), msgpack.packb([data, *aside]))
        removed: int = self._on_queue("remove_ids", f"{what} in {name}", name, "med", args)
        return removed

    def _stats(self, name: str, now: float) -> QueueStats:
        keys = self._keys(name, "m", "r", "e")
        row = self._read_meta(name, f"stats of {name}", lambda c: c.scripts["stats"](keys=keys, args=[repr(now)]),
                              lambda row: row)
        if row == _MISSING:
            raise QueueNotFound(f"no queue {name!r}")
        return queue_meta(keys[0], _stats_of, row, now, keys[0])

    # -- leases -----------------------------------------------------------------------------------

    def _lock(self, name: str, owner: str, now: float, until: float) -> bool:
        return bool(self._on_queue("lock", f"lock {name}", name, "m", [owner, repr(now), repr(until)]))

    def _unlock(self, name: str, owner: str) -> bool:
        return bool(self._run("unlock", f"unlock {name}", self._keys(name, "m"), [owner]))

    def _owner(self, name: str, now: float) -> tuple[str, float] | None:
        meta = self._keys(name, "m")[0]
        row = self._read_meta(name, f"owner of {name}",
                              lambda c: c.r.hmget(meta, ["max_bytes", "owner", "owner_until"]), list)
        if row[0] is None:
            raise QueueNotFound(f"no queue {name!r}")
        return _lease(row[1], row[2], now, meta)

    # -- dead letters ---------------------------------------------------------------------------

    def _dead_letter(self, name: str, marker: str, data: bytes, reason: str, now: float) -> bool:
        return bool(self._on_queue("dead_letter", f"dead letter in {name}", name, "md",
                                   [marker, msgpack.packb([data, reason, now])]))

    def _list_dead_letters(self, name: str | None, max: int) -> list[DeadLetter]:
        c = self._client.get()
        out: list[DeadLetter] = []
        for queue in self._list_queues() if name is None else [name]:
            key = self._keys(queue, "d")[0]
            with self._errors(f"dead letters of {queue}"):
                try:
                    rows = cast("dict[bytes, bytes]", c.r.hgetall(key))
                except redis.ResponseError as exc:
                    foreign.skip("queue_dead_letter", key, "wrong_type", str(exc))
                    continue
            for mk in sorted(rows):
                letter = foreign.decode("queue_dead_letter", f"{key} field {foreign.key_text(mk)}", dead_letter,
                                        queue, mk, rows[mk])
                if letter is not None:
                    out.append(letter)
                if len(out) == max:
                    return out
        return out

    def _purge_dead_letters(self, name: str | None) -> int:
        return sum(self._run("purge", f"purge dead letters of {queue}", self._keys(queue, "d"), [])
                   for queue in (self._list_queues() if name is None else [name]))

    def _redrive(self, name: str, mk: str, now: float) -> str | None:
        dead = self._keys(name, "d")[0]
        c = self._client.get()
        with self._errors(f"redrive in {name}"):
            try:
                packed = c.r.hget(dead, mk)
            except redis.ResponseError as exc:  # the dead letters are not a hash: none to redrive
                foreign.skip("queue_dead_letter", dead, "wrong_type", str(exc))
                return None
        letter = None if packed is None else foreign.decode(
            "queue_dead_letter", f"{dead} field {mk}", dead_letter, name, mk, packed)
        if letter is None:
            with self._errors(f"redrive in {name}"):
                if not c.r.exists(self._keys(name, "m")[0]):
                    raise QueueNotFound(f"no queue {name!r}")
            return None
        res = self._run("redrive", f"redrive in {name}", self._keys(name, "m", "r", "e", "d"),
                        [repr(now), mk, packed, letter.data])
        if res.__class__ is list:
            raise self._foreign(name, res)
        if res == _MISSING:
            raise QueueNotFound(f"no queue {name!r}")
        if res == _FULL:
            raise QueueFull(name, f"no room to redrive a dead letter of {len(letter.data)} bytes")
        return marker(res) if res else None

    # -- records -----------------------------------------------------------------------------------

    def _record_op(self, what: str, fn: Callable[[redis.Redis, str], T], kind: str) -> T:
        c = self._client.get()
        with self._errors(what):
            return fn(c.r, f"{self._ns}rec:{kind}")

    def _put_record(self, kind: str, name: str, data: bytes) -> None:
        self._record_op(f"put {kind}/{name}", lambda r, h: r.hset(h, name, data), kind)

    def _get_record(self, kind: str, name: str) -> bytes | None:
        return self._record_op(f"get {kind}/{name}", lambda r, h: cast("bytes | None", r.hget(h, name)), kind)

    def record_key(self, kind: str, name: str) -> str:
        """See :meth:`QueueStore.record_key`."""
        return f"{self._ns}rec:{kind} field {name}"

    def _list_records(self, kind: str) -> dict[str, bytes]:
        def read(r: redis.Redis, h: str) -> dict[bytes, bytes]:
            try:
                return cast("dict[bytes, bytes]", r.hgetall(h))
            except redis.ResponseError as exc:  # the hash of records is another type: there are none
                foreign.skip(f"notify_{kind}", h, "wrong_type", str(exc))
                return {}

        rows = self._record_op(f"list {kind}", read, kind)
        return named_records(kind, ((k, v, self.record_key(kind, foreign.key_text(k))) for k, v in rows.items()))

    def _delete_record(self, kind: str, name: str) -> bool:
        return bool(self._record_op(f"delete {kind}/{name}", lambda r, h: r.hdel(h, name), kind))

    def close(self) -> None:
        self._client.close()
