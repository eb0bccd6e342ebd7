"""Redis store: ``redis://host:port/db`` through redis-py (hiredis), atomic Lua scripts.

Layout under ``{prefix}:nb:``:

- ``rev``: the store-wide revision counter; every write (deletes included)
  takes its version from one ``INCR``. It survives :meth:`Store.drop_all`, so
  versions never go back. It also marks the store as made (:meth:`Store.initialized`):
  ``df-db init`` and a writer's open set it to 0 if it is absent.
- ``o:{table}:{key}``: a hash per object with fields ``topic``, ``version``
  and ``value`` (the msgpack blob the base class encodes).
- ``t:{table}``: a set per table of its keys, for listing.
- ``feed``: the change feed (:mod:`dfpubsub.store.feed`), a stream whose entry
  ids are ``{revision}-0``, appended by every write script (see ``_FEED``) and
  trimmed there to the retained count. Every revision has its entry, so
  history is gone below the oldest entry kept (or, once the stream is empty,
  up to the revision counter); ``_FEED_READ`` reads both with the entries.
- ``epoch``, ``holes``: when a server takes over (a replica promoted by a Sentinel failover, a
  restarted server; :data:`~dfpubsub.backends.redis.TAKEOVER`), the first connection to it moves
  the revision counter ``TAKEOVER_JUMP`` ahead and appends a takeover entry at the new revision
  (fields ``a`` = ``takeover``, ``f`` = the revision the server had), noted in the sorted set
  ``holes`` too (score: the new revision). A reader whose position lies between the two read
  revisions this server never had: :class:`~dfpubsub.errors.HistoryRewound`, and it relists
  (docs/store.md#failover).

Each write is one Lua script (``EVALSHA``, reloaded automatically after
``SCRIPT FLUSH`` or a restart) that checks existence and the expected version,
bumps the counter and updates the hash and the set atomically; it answers a
status code that Python turns into the typed errors. Listing reads a table's
set (``SMEMBERS``), then its hashes in chunks of 1000 through a read-only
script that returns the existing objects of the wanted topics in one reply.

Connection failures (refused, reset, timeouts, a server still loading its
data) raise :class:`~dfpubsub.errors.StoreUnavailable`; a write that fails so
may or may not have happened, so writes are never retried automatically. The
connection pool reconnects on the next call, so the same store object works
again once the server is back. A forked child builds its own client.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from ..backends import foreign
from ..backends.redis import (
    TAKEOVER,
    TAKEOVER_JUMP,
    ProcessClient,
    Script,
    Scripts,
    open_client,
    redacted,
    redis_errors,
    scripts_of,
    server_location,
)
from ..errors import (
    AlreadyExists,
    ConfigError,
    ForeignRecord,
    HistoryGone,
    HistoryRewound,
    NotEnoughReplicas,
    NotFound,
    QueueFull,
    StoreUnavailable,
    VersionConflict,
    WriteOutcomeUnknown,
)
from ..events import VersionedObject
from .api import DEFAULT_MAX_VALUE_BYTES, Pages, Store, decode_value
from .feed import FeedEntry, FeedRetention, parse_entry
from .outbox import Outbox, RedisOutbox

__all__ = ["RedisStore"]

#: Feed entries per XRANGE, and keys per batch of drop_all.
_CHUNK = 1000
#: Objects a script reads in one call (listings, get_many). A script holds the server for its whole
#: run, ~5 us an object, and every other client's command waits behind it: 1,000 took ~5 ms, and a
#: fleet relisting at once queued an API worker's writes behind several of them (p99 14-16 ms against
#: 2 ms idle, docs/performance.md#fleet; 7 ms with 250, 4.7-4.9 ms with 100). Listing 200,000
#: objects took as long with 100 as with 1,000 (2.0-2.2 s, values; the round trips are loopback's).
_SCRIPT_KEYS = 100
#: Keys of a table's index per SSCAN when a listing reads them all: SMEMBERS of 20,000 held the
#: server ~6 ms.
_SCAN_KEYS = 1000
_FIELDS = ("topic", "version", "value")
_MISSING, _CONFLICT, _EXISTS, _OUTBOX_FULL, _OUTBOX_FOREIGN = 1, 2, 3, 4, 5  # script status codes; 0 is success

# Versions travel as strings: Lua numbers are doubles, exact only up to 2**53, so
# the scripts format INCR's number below that and re-read the counter at or past it
# (_NEXT: one Redis call fewer per write than reading it back always).
_NEXT = """
local v = redis.call('INCR', {counter})
if v < 9007199254740992 then v = string.format('%d', v) else v = redis.call('GET', {counter}) end
"""

# KEYS: object hash, table set, revision counter. ARGV: key, topic, blob.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {3} end
""" + _NEXT.format(counter="KEYS[3]") + """redis.call('HSET', KEYS[1], 'topic', ARGV[2], 'version', v, 'value', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return {0, v}
"""

# KEYS: object hash, revision counter. ARGV: topic ('' keeps the current one), blob, expected version ('' for any).
_UPDATE = """
local cur = redis.call('HMGET', KEYS[1], 'topic', 'version')
if not cur[2] then return {1} end
if ARGV[3] ~= '' and ARGV[3] ~= cur[2] then return {2, cur[2]} end
local topic = ARGV[1]
if topic == '' then topic = cur[1] end
""" + _NEXT.format(counter="KEYS[2]") + """redis.call('HSET', KEYS[1], 'topic', topic, 'version', v, 'value', ARGV[2])
return {0, v, topic}
"""

# KEYS: object hash, table set, revision counter. ARGV: key, expected version ('' for any).
_DELETE = """
local cur = redis.call('HMGET', KEYS[1], 'topic', 'version')
if not cur[2] then return {1} end
if ARGV[2] ~= '' and ARGV[2] ~= cur[2] then return {2, cur[2]} end
""" + _NEXT.format(counter="KEYS[3]") + """redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return {0, v, cur[1]}
"""

# Read-only. KEYS: object hashes. ARGV: wanted topics (none: all). Returns flat
# (index in KEYS, topic, version, value) for each existing, wanted object; a key that is not a
# hash (a foreign record) answers (index, nil, nil, nil) so the caller can skip and name it.
_FETCH = """
local want = nil
if #ARGV > 0 then
  want = {}
  for _, t in ipairs(ARGV) do want[t] = true end
end
local out = {}
for i, k in ipairs(KEYS) do
  local r = redis.pcall('HMGET', k, 'topic', 'version', 'value')
  if r.err then
    out[#out + 1] = i
    out[#out + 1] = false
    out[#out + 1] = false
    out[#out + 1] = false
  elseif r[2] and (want == nil or want[r[1]]) then
    out[#out + 1] = i
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = r[3]
  end
end
return out
"""

# Read-only, like _FETCH without the values: (index in KEYS, topic, version) per wanted object.
_VERSIONS = """
local want = {}
for _, t in ipairs(ARGV) do want[t] = true end
local out = {}
for i, k in ipairs(KEYS) do
  local r = redis.pcall('HMGET', k, 'topic', 'version')
  if r.err then
    out[#out + 1] = i
    out[#out + 1] = false
    out[#out + 1] = false
  elseif r[2] and want[r[1]] then
    out[#out + 1] = i
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
  end
end
return out
"""


# A write with an outbox (dfpubsub/store/outbox.py) runs the write's script wrapped: the
# outbox's check before it (a full queue answers {4, index}, a foreign queue record {5, key
# index, why}, and nothing is written), its appends after it succeeded (their skipped count in
# the answer's 4th slot). Both see the value the write stores (nil for a deletion), which
# completes the entries of an outbox built with_value.
_FUSED = """
local KB, AB, OB_VALUE = {nkeys}, {nargs}, {value}
{check}
local r = (function()
{write}
end)()
if r[1] == 0 then
  r[3] = r[3] or ''
  local OB_VERSION, OB_SKIPPED = r[2], 0
{append}
  r[4] = OB_SKIPPED
end
return r
"""

# Every write script runs wrapped in this piece, which appends the change feed's entry once the
# write succeeded. Its key and arguments come last and are popped first, so the script inside
# (and an outbox's, which counts KEYS) sees exactly its own. KEYS: ..., feed stream. ARGV: ...,
# table, key, action, topic ('' if the write answers it), unix time, entries kept. pcall: an
# XADD refused (a stream ahead of the revision counter, reset by hand) must not fail a write
# that is already made, as Redis does not roll scripts back.
_FEED = """
local F_KEEP, F_AT, F_TOPIC = table.remove(ARGV), table.remove(ARGV), table.remove(ARGV)
local F_ACTION, F_KEY, F_TABLE, FEED = table.remove(ARGV), table.remove(ARGV), table.remove(ARGV), table.remove(KEYS)
local r = (function()
{write}
end)()
if r[1] == 0 then
  if F_TOPIC == '' then F_TOPIC = r[3] end
  redis.pcall('XADD', FEED, 'MAXLEN', '~', F_KEEP, r[2] .. '-0', 'p', F_TOPIC, 't', F_TABLE, 'k', F_KEY,
              'a', F_ACTION, 's', F_AT)
end
return r
"""


# Run on each new connection (TAKEOVER): the counter jumps, the feed and the holes say from where.
# KEYS: epoch, revision counter, feed stream, holes. ARGV: jump, entries kept.
_TAKEOVER = TAKEOVER.format(move="""
local head = redis.call('GET', KEYS[2])
if head then
  redis.call('INCRBY', KEYS[2], JUMP)
  local to = redis.call('GET', KEYS[2])
  redis.pcall('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], to .. '-0', 'a', 'takeover', 'f', head,
              's', redis.call('TIME')[1])
  redis.call('ZADD', KEYS[4], to, head)
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -101)
end
""")

# Read-only. KEYS: revision counter, holes. ARGV: a position. The revision, the revision the
# store went back to if the position lies in a hole a takeover left (false: none), and how many
# holes lie above the position.
_SINCE = """
local hole = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[1], '+inf', 'LIMIT', 0, 1)
local back = false
if hole[1] and tonumber(hole[1]) < tonumber(ARGV[1]) then back = hole[1] end
return {redis.call('GET', KEYS[1]) or '0', back, redis.call('ZCOUNT', KEYS[2], '(' .. ARGV[1], '+inf')}
"""

# Read-only. KEYS: feed stream, revision counter. ARGV: range start, count. The entries, the
# oldest entry's id (false: none) and the revision, read together: no write falls between.
_FEED_READ = """
local rows = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
return {rows, first[1] and first[1][1] or false, redis.call('GET', KEYS[2]) or '0'}
"""


def _with_feed(script: str) -> str:
    return _FEED.format(write=script)


# The write scripts by name, with how many keys and arguments they take before an outbox's, and
# the argument that holds the value they store.
_WRITES = {"create": (_CREATE, 3, 3, "ARGV[3]"), "update": (_UPDATE, 2, 3, "ARGV[2]"), "delete": (_DELETE, 3, 2, "nil")}


def _decode_object(row: list[Any], table: str, key: str | bytes, decode: bool = True) -> VersionedObject:
    topic, version, blob = row
    if topic is None:
        raise TypeError("the object's key is not a hash")
    if blob is None:
        raise KeyError("the object's hash has no value field")
    name = key if isinstance(key, str) else key.decode()
    return VersionedObject(topic.decode(), table, name, _version(version), decode_value(blob) if decode else None)


def _object(row: list[Any], table: str, key: str | bytes, name: object, decode: bool = True) -> VersionedObject | None:
    """The object of a fetch reply's (topic, version, value), or None (skipped) if it is foreign
    (``decode=False``: its value not decoded, so not looked at)."""
    return foreign.decode("store_object", name, _decode_object, row, table, key, decode)


def _version_row(row: list[Any], table: str, key: bytes) -> tuple[str, str, str, int]:
    topic, version = row
    if topic is None:
        raise TypeError("the object's key is not a hash")
    return topic.decode(), table, key.decode(), _version(version)


def _written_topic(raw: bytes, table: str, name: str) -> str:
    """The topic of an object a write has changed: the write stands, so a foreign topic is
    skipped (counted, named) and the event goes out under the table's own topic."""
    topic = foreign.decode("store_topic", name, bytes.decode, raw)
    return table if topic is None else topic


def _version(text: bytes) -> int:
    """A version as stored: positive decimal digits (int() would also take ' 1_0', '-3')."""
    if not text.isdigit() or len(text) > 20:
        raise ValueError(f"version {text[:40]!r} is not a positive integer")
    return int(text)


@dataclass(frozen=True, slots=True)
class _Client:
    """A redis-py client and its scripts (one per process: see ProcessClient)."""

    r: redis.Redis
    scripts: Scripts
    create: Script
    update: Script
    delete: Script
    fetch: Script
    versions: Script
    feed: Script
    since: Script
    #: (write, outbox check) -> the fused script, registered on first use.
    fused: dict[tuple[str, str], Script] = field(default_factory=dict)

    def write(self, name: str, keys: list[Any], args: list[Any], outbox: Outbox | None,
              feed: tuple[list[Any], list[Any]]) -> list[Any]:
        """Run the write script ``name``, with ``outbox``'s entries if one is given, and ``feed``'s
        (keys, args) for the change feed's entry."""
        if outbox is None:
            return cast("list[Any]", getattr(self, name)(keys=keys + feed[0], args=args + feed[1]))
        ob = cast(RedisOutbox, outbox)
        script = self.fused.get((name, ob.CHECK))
        if script is None:
            text, nkeys, nargs, value = _WRITES[name]
            script = self.fused.setdefault((name, ob.CHECK), self.scripts.register(_with_feed(_FUSED.format(
                nkeys=nkeys, nargs=nargs, value=value, check=ob.CHECK, write=text, append=ob.APPEND))))
        all_keys = keys + ob.keys()
        res = cast("list[Any]", script(keys=all_keys + feed[0], args=args + ob.args() + feed[1]))
        if res[0] == _OUTBOX_FULL:
            raise QueueFull(ob.entries[int(res[1]) - 1][0])
        if res[0] == _OUTBOX_FOREIGN:
            key = all_keys[int(res[1]) - 1]
            foreign.skip("queue_record", key, "refused_write", res[2].decode())
            raise ForeignRecord(key, res[2].decode())
        if res[0] == 0:
            ob.skipped = int(res[3])
        return res


def _fetched(table: str, chunk: list[bytes], base: bytes, rows: list[Any], out: list[VersionedObject],
             blobs: list[bytes] | None, values: bool) -> None:
    """The objects of a fetch script's reply for ``chunk`` (keys of ``table``) added to ``out``,
    foreign ones skipped; with ``blobs``, their values' bytes in step (``values=False``: values
    checked, not kept)."""
    add, unpack = out.append, decode_value
    for i in range(0, len(rows), 4):
        # Keys deleted since they were listed are simply absent from the reply. The hot loop of a
        # resync, so _object's checks inlined: the try costs nothing unless it raises.
        key, version = chunk[rows[i] - 1], rows[i + 2]
        try:
            if len(version) > 20 or not version.isdigit():
                raise ValueError(f"version {version[:40]!r} is not a positive integer")
            value = unpack(rows[i + 3])
            add(VersionedObject(rows[i + 1].decode(), table, key.decode(), int(version), value if values else None))
        except foreign.DECODE_ERRORS as exc:  # None (not a hash, no value) included
            foreign.skip_error("store_object", base + key, exc)
        else:
            if blobs is not None:
                blobs.append(rows[i + 3])


class RedisStore(Store):
    """``redis://host:port/db``; keys live under ``{prefix}:nb:``."""

    backend = "redis"
    feed_entry_cost = 2.8  # 125 bytes an entry (XRANGE), 45 an object's version

    def __init__(
        self,
        url: str,
        tables: Iterable[str],
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        prefix: str = "dfpubsub",
        timeout: float = 5.0,
        feed_retention: FeedRetention | None = None,
    ):
        super().__init__(tables, max_value_bytes, feed_retention)
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError(f"Redis store prefix must be a non-empty string, not {prefix!r}")
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        self._where = redacted(url)
        self._ns = f"{prefix}:nb:"
        self._rev = self._ns + "rev"
        self._feed = self._ns + "feed"
        self._holes = self._ns + "holes"
        self._client = ProcessClient(self._new_client, lambda c: c.r.close())
        # Validates the URL; connections are opened on first use.
        self.location = server_location(self._client.get().r)

    # -- connection ----------------------------------------------------------------

    def _new_client(self) -> _Client:
        takeover = (_TAKEOVER, [self._ns + "epoch", self._rev, self._feed, self._holes],
                    [TAKEOVER_JUMP, self.feed_retention.max_entries])
        r = open_client(self.url, self.timeout, "store", on_connect=takeover)
        s = scripts_of(r, self.timeout)
        return _Client(r, s, s.register(_with_feed(_CREATE)), s.register(_with_feed(_UPDATE)),
                       s.register(_with_feed(_DELETE)), s.register(_FETCH, readonly=True),
                       s.register(_VERSIONS, readonly=True), s.register(_FEED_READ, readonly=True),
                       s.register(_SINCE, readonly=True))

    def _connect(self) -> _Client:
        return self._client.get()

    def initialized(self) -> bool:
        with self._errors("look for the store"):
            return bool(self._connect().r.exists(self._rev))

    def initialize(self) -> None:
        with self._errors("make the store"):
            self._connect().r.set(self._rev, 0, nx=True)

    def _identity(self, new: bytes, renew: bool) -> bytes:
        with self._errors("keep the store's identity"):
            r, key = self._connect().r, self._ns + "identity"
            kept = None if renew else r.get(key)  # read first: a read-only user has it too
            if kept is None:
                r.set(key, new, nx=not renew)
                kept = r.get(key)
            return cast(bytes, kept)

    def _errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return redis_errors(f"Redis store at {self._where} ({what})")

    @contextlib.contextmanager
    def _write_errors(self, what: str) -> Iterator[None]:
        """A write whose connection failed, or that fewer replicas than ``[redis] wait_replicas``
        acknowledged, may have been applied or be lost by a failover: WriteOutcomeUnknown. One
        refused for want of replicas was not (NotEnoughReplicas)."""
        try:
            with self._errors(what):
                yield
        except NotEnoughReplicas:
            raise
        except StoreUnavailable as exc:
            raise WriteOutcomeUnknown(f"{exc}; the write may have been applied") from exc

    def _feed_args(self, table: str, key: str, action: str, topic: str = "") -> tuple[list[Any], list[Any]]:
        return [self._feed], [table, key, action, topic, int(time.time()), self.feed_retention.max_entries]

    def _obj(self, table: str, key: str) -> str:
        return f"{self._ns}o:{table}:{key}"

    def _set(self, table: str) -> str:
        return f"{self._ns}t:{table}"

    # -- reads -------------------------------------------------------------------------

    def _get(self, table: str, key: str) -> VersionedObject | None:
        c = self._connect()
        name = self._obj(table, key)
        with self._errors(f"get {table}/{key}"):
            rows = c.fetch(keys=[name], args=[])
        return _object(rows[1:], table, key, name) if rows else None

    def _list(self, table: str | None, topics: set[str] | None, blobs: list[bytes] | None = None,
              values: bool = True) -> list[VersionedObject]:
        """The objects listed, foreign ones skipped; with ``blobs``, their values' bytes appended in step
        (``values=False``: values checked, not kept)."""
        if topics is not None and not topics:
            return []
        c = self._connect()
        out: list[VersionedObject] = []
        wanted = [] if topics is None else sorted(topics)
        for tbl in sorted(self.tables) if table is None else [table]:
            with self._errors(f"list {tbl}"):
                for chunk, base, rows in self._fetch_table(c, tbl, c.fetch, wanted):
                    _fetched(tbl, chunk, base, rows, out, blobs, values)
        return out

    def _list_pages_at(self, topics: set[str], page_size: int, values: bool) -> tuple[int, Pages]:
        c = self._connect()
        return self._revision(c), self._pages(c, sorted(topics), page_size, values)

    def _pages(self, c: _Client, wanted: list[str], page_size: int, values: bool) -> Pages:
        """Each table's objects of ``wanted`` topics, a page per ``SSCAN`` of its index (``COUNT``
        ``page_size``, a hint) and the scripts that read those keys; a key SSCAN returns again
        (it may, while the set changes) is left out."""
        for tbl in sorted(self.tables):
            index, base = self._set(tbl), self._obj(tbl, "").encode()
            seen: set[bytes] = set()
            cursor = 0
            while True:
                out: list[VersionedObject] = []
                blobs: list[bytes] = []
                with self._errors(f"list {tbl}"):
                    try:
                        cursor, scanned = cast("tuple[int, list[bytes]]", c.r.sscan(index, cursor, count=page_size))
                    except redis.ResponseError as exc:  # the index is not a set: as _fetch_table
                        foreign.skip("store_index", index, "wrong_type", str(exc))
                        break
                    keys = [k for k in scanned if k not in seen]
                    seen.update(keys)
                    for start in range(0, len(keys), _SCRIPT_KEYS):
                        chunk = keys[start:start + _SCRIPT_KEYS]
                        _fetched(tbl, chunk, base, c.fetch(keys=[base + k for k in chunk], args=wanted), out,
                                 blobs, values)
                if out:
                    yield out, blobs
                if not cursor:
                    break

    def _fetch_table(self, c: _Client, table: str, script: Script,
                     wanted: list[str]) -> Iterator[tuple[list[bytes], bytes, list[Any]]]:
        """(keys, key prefix, script reply) per chunk of ``table``'s keys.

        One script call per chunk instead of a pipeline of HMGETs: redis-py's per-command
        overhead dominated (about 2 s per 100k objects); this is one packed command.
        """
        index = self._set(table)
        try:
            # SSCAN rather than SMEMBERS, a part at a time (see _SCAN_KEYS); a key it returns twice
            # (it may, while the set changes) counts once, and one present throughout is returned.
            keys = list(dict.fromkeys(cast("Iterator[bytes]", c.r.sscan_iter(index, count=_SCAN_KEYS))))
        except redis.ResponseError as exc:  # the index is not a set: nothing of the table can be found
            foreign.skip("store_index", index, "wrong_type", str(exc))
            return
        base = self._obj(table, "").encode()
        for start in range(0, len(keys), _SCRIPT_KEYS):
            chunk = keys[start:start + _SCRIPT_KEYS]
            yield chunk, base, script(keys=[base + k for k in chunk], args=wanted)

    def _revision(self, c: _Client) -> int:
        """The revision counter, read before a listing: every write up to it is in the listing
        (writes the listing's several commands see later may be in it too)."""
        with self._errors("read the revision"):
            return int(cast("bytes | None", c.r.get(self._rev)) or 0)

    def _list_at(self, topics: set[str]) -> tuple[list[VersionedObject], int]:
        revision = self._revision(self._connect())
        return self._list(None, topics), revision

    def _list_packed_at(self, topics: set[str], values: bool) -> tuple[list[VersionedObject], list[bytes], int]:
        revision = self._revision(self._connect())
        blobs: list[bytes] = []
        return self._list(None, topics, blobs, values), blobs, revision

    def _list_versions_at(self, topics: set[str]) -> tuple[list[tuple[str, str, str, int]], int]:
        c = self._connect()
        revision = self._revision(c)
        wanted = sorted(topics)
        out: list[tuple[str, str, str, int]] = []
        for table in sorted(self.tables):
            with self._errors(f"list versions of {table}"):
                for chunk, base, rows in self._fetch_table(c, table, c.versions, wanted):
                    for i in range(0, len(rows), 3):
                        key = chunk[rows[i] - 1]
                        row = foreign.decode("store_object", base + key, _version_row, rows[i + 1:i + 3], table, key)
                        if row is not None:
                            out.append(row)
        return out, revision

    def _get_many(self, refs: list[tuple[str, str]]) -> list[VersionedObject]:
        return self._many(refs, None)

    def _get_many_packed(self, refs: list[tuple[str, str]]) -> tuple[list[VersionedObject], list[bytes]]:
        blobs: list[bytes] = []
        return self._many(refs, blobs), blobs

    def _many(self, refs: list[tuple[str, str]], blobs: list[bytes] | None) -> list[VersionedObject]:
        """The objects of ``refs``; with ``blobs``, undecoded, their values' bytes appended to it."""
        c = self._connect()
        out: list[VersionedObject] = []
        decode = blobs is None
        for start in range(0, len(refs), _SCRIPT_KEYS):
            chunk = refs[start:start + _SCRIPT_KEYS]
            names = [self._obj(t, k) for t, k in chunk]
            with self._errors("get_many"):
                rows = c.fetch(keys=names, args=[])
            for i in range(0, len(rows), 4):
                table, key = chunk[rows[i] - 1]
                obj = _object(rows[i + 1:i + 4], table, key, names[rows[i] - 1], decode)
                if obj is not None:
                    out.append(obj)
                    if blobs is not None:
                        blobs.append(rows[i + 3])
        return out

    # -- writes ----------------------------------------------------------------------

    def _create(self, table: str, key: str, topic: str, blob: bytes, value: Any,
                outbox: Outbox | None) -> VersionedObject:
        c = self._connect()
        with self._write_errors(f"create {table}/{key}"):
            res = c.write("create", [self._obj(table, key), self._set(table), self._rev], [key, topic, blob], outbox,
                          self._feed_args(table, key, "create", topic))
        if res[0] == _EXISTS:
            raise AlreadyExists(f"{table}/{key} already exists")
        return VersionedObject(topic, table, key, int(res[1]), value)

    def _update(
        self, table: str, key: str, topic: str | None, blob: bytes, value: Any, expected: int | None,
        outbox: Outbox | None,
    ) -> VersionedObject:
        c = self._connect()
        with self._write_errors(f"update {table}/{key}"):
            res = c.write("update", [self._obj(table, key), self._rev],
                          [topic or "", blob, "" if expected is None else str(int(expected))], outbox,
                          self._feed_args(table, key, "update"))
        self._check_status(res, table, key, expected)
        return VersionedObject(_written_topic(res[2], table, self._obj(table, key)), table, key, int(res[1]), value)

    def _delete(self, table: str, key: str, expected: int | None, outbox: Outbox | None) -> VersionedObject:
        c = self._connect()
        with self._write_errors(f"delete {table}/{key}"):
            res = c.write("delete", [self._obj(table, key), self._set(table), self._rev],
                          [key, "" if expected is None else str(int(expected))], outbox,
                          self._feed_args(table, key, "delete"))
        self._check_status(res, table, key, expected)
        return VersionedObject(_written_topic(res[2], table, self._obj(table, key)), table, key, int(res[1]), None)

    @staticmethod
    def _check_status(res: list[Any], table: str, key: str, expected: int | None) -> None:
        if res[0] == _MISSING:
            raise NotFound(f"{table}/{key} does not exist")
        if res[0] == _CONFLICT:
            assert expected is not None
            raise VersionConflict(table, key, expected, int(res[1]))

    def _drop_all(self) -> int:
        """Delete objects and indexes of every table (declared or not), keeping the counter.

        Not atomic: run it while nothing else writes under this prefix.
        """
        c = self._connect()
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._ns) + "*"
        objects = (self._ns + "o:").encode()
        # Versions never go back; the feed's history stays, with what says where a server took over.
        kept = {self._rev.encode(), self._feed.encode(), self._holes.encode(), (self._ns + "epoch").encode(),
                (self._ns + "identity").encode()}
        deleted = 0
        with self._errors("drop_all"):
            batch: list[bytes] = []
            for name in c.r.scan_iter(match=pattern, count=1000):
                if name not in kept:
                    batch.append(name)
                if len(batch) >= _CHUNK:
                    deleted += self._delete_keys(c.r, batch, objects)
                    batch = []
            deleted += self._delete_keys(c.r, batch, objects)
        return deleted

    @staticmethod
    def _delete_keys(r: redis.Redis, names: list[bytes], objects: bytes) -> int:
        """Delete ``names``; return how many of them were object hashes."""
        objs = [n for n in names if n.startswith(objects)]
        others = [n for n in names if not n.startswith(objects)]
        pipe = r.pipeline(transaction=False)
        if objs:
            pipe.delete(*objs)
        if others:
            pipe.delete(*others)
        results = pipe.execute() if names else []
        return int(results[0]) if objs else 0

    # -- change feed -------------------------------------------------------------------

    def _feed_head(self) -> int:
        c = self._connect()
        with self._errors("read the revision"):
            return int(c.r.get(self._rev) or 0)

    def feed_since(self, after: int) -> tuple[int, int]:
        """See :meth:`Store.feed_since`; the entries a takeover's jump skipped are not counted."""
        c = self._connect()
        with self._errors("read the revision"):
            head, back, holes = c.since(keys=[self._rev, self._holes], args=[after])
        if back is not None:
            raise HistoryRewound(after, int(back))
        return int(head), max(0, int(head) - after - int(holes) * TAKEOVER_JUMP)

    def _read_feed(self, after: int, limit: int, wait: float) -> tuple[list[FeedEntry], int]:
        c = self._connect()
        with self._errors("read the feed"):
            rows, first, head = c.feed(keys=[self._feed, self._rev], args=[f"({after}-0", limit])
            if not rows and wait > 0 and int(head) <= after:
                # The block must end before the socket's timeout would take it for a dead server.
                block = max(1, int(min(wait, self.timeout / 2) * 1000))
                if c.r.xread({self._feed: f"{after}-0"}, count=1, block=block):
                    rows, first, head = c.feed(keys=[self._feed, self._rev], args=[f"({after}-0", limit])
        if int(head) < after:  # a server without the takeover check (another client) took over
            raise HistoryRewound(after, int(head))
        horizon = _revision(first) - 1 if first else int(head)
        if horizon > after:
            # Trimmed past a position a takeover skipped (the promoted server never had it): that
            # history went back rather than away, as feed_since says (it raises HistoryRewound).
            self.feed_since(after)
            raise HistoryGone(after, horizon)
        entries, last = [], after
        for entry_id, flat in rows:
            revision = _revision(entry_id)
            fields = dict(zip(flat[::2], flat[1::2]))
            if fields.get(b"a") == b"takeover":  # a server took over here, having had up to f
                back = _takeover(fields.get(b"f"))
                if back is not None and back < last:
                    raise HistoryRewound(last, back)
                last = max(last, revision)
                continue
            last = max(last, revision)
            entry = parse_entry(revision, fields.get(b"p"), fields.get(b"t"), fields.get(b"k"), fields.get(b"a"),
                                self.tables)
            if entry is None:
                self.feed_skipped += 1
            else:
                entries.append(entry)
        return entries, last

    def _compact_feed(self, retention: FeedRetention) -> int:
        c = self._connect()
        cutoff, start = time.time() - retention.max_age, b"-"
        with self._errors("compact the feed"):
            removed = int(c.r.xtrim(self._feed, maxlen=retention.max_entries, approximate=False))
            while True:  # the oldest entry young enough to keep, in pages from the oldest
                page = cast("list[tuple[bytes, dict[bytes, bytes]]]", c.r.xrange(self._feed, start, "+", count=_CHUNK))
                young = next((eid for eid, f in page if _float(f.get(b"s")) >= cutoff), None)
                if young is not None or len(page) < _CHUNK:
                    break
                start = b"(" + page[-1][0]
            if young is not None:
                removed += int(c.r.xtrim(self._feed, minid=young, approximate=False))
            elif page or start != b"-":  # every entry is too old
                removed += int(c.r.xtrim(self._feed, maxlen=0, approximate=False))
        return removed

    def close(self) -> None:
        self._client.close()


def _float(raw: object) -> float:
    """A number field of a feed entry; a foreign one counts as infinitely young (never dropped by age)."""
    try:
        return float(raw)  # type: ignore[arg-type]  # anything a foreign writer left: float() tells
    except (TypeError, ValueError):
        return float("inf")


def _takeover(raw: object) -> int | None:
    """The revision a takeover entry says the server had; None if foreign."""
    return int(raw) if isinstance(raw, bytes) and raw.isdigit() else None


def _revision(entry_id: bytes) -> int:
    """The revision of a feed stream id ``{revision}-{n}``."""
    return int(entry_id.partition(b"-")[0])
