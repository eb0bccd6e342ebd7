"""etcd queues (``etcd://host:port[,host:port...]``): compare-and-set transactions on a state key.

etcd has no server-side arithmetic, so each queue keeps its counters and its
live reservations in one **state** key, and every change is one ``Txn`` that
compares the state's ``mod_revision`` with the one this process last saw,
writes the new state and, in the same transaction, the entry (commit) or the
deletions (remove). States are cached per process: an uncontended
``reserve()`` or ``commit()`` is one round trip; a conflict's failure branch
reads the current state, so each retry is one round trip too. A refusal
(QueueFull, an unknown reservation) is only given after checking it against
a fresh state.

Layout under ``/{prefix}/q/``:

- ``s/{name}``: msgpack ``[max_bytes, max_entries, stale_after, created_at,
  seq, entries, bytes, {reservation id: [size, expires_at]}]``; the
  registry of queues is the range of these keys.
- ``e/{name}/{marker}``: an entry, ``enqueued_at`` (8-byte big-endian
  double) then the data; key order is commit order.
- ``l/{name}``: the lease, msgpack ``[owner, until]``.
- ``d/{name}/{marker}``: a dead letter, msgpack ``[data, reason, at]``.
- ``rec/{kind}/{name}``: a record.

The channel, its reconnection and its care around ``fork()`` are the etcd
store's too (:class:`dfpubsub.backends.etcd.EtcdConnection`).
The reservations live in the state key, so keep the number outstanding
well below ten thousand per queue (etcd's request size limit).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgpack
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..backends import foreign
from ..backends.etcd import EtcdConnection, KeyValue, RangeResponse, TxnResponse, txn
from ..errors import QueueError, QueueFull, QueueNotFound, ReservationNotFound
from .api import Aside, DeadLetter, QueueEntry, QueueInfo, QueueStats, QueueStore, marker
from .readback import dead_letter, foreign_entry, named_records, queue_meta, queue_names

__all__ = ["EtcdQueues"]

_MAX_BYTES, _MAX_ENTRIES, _STALE, _CREATED, _SEQ, _ENTRIES, _BYTES, _RES = range(8)
_AT = struct.Struct(">d")
_REMOVE_PAGE = 1000
#: Entries per transaction of remove_markers / set_aside: a read of each, then a delete and a dead
#: letter each and the state, within etcd's 128 operations per transaction.
_EXACT_PAGE = 60
#: A queue's state key decoded (see the module docstring): a msgpack array of numbers and, at
#: _RES, the reservations (_state checks that shape). Changed in place, field by field, so a list.
State = list[Any]
#: The reservations of a state: id -> [size, expires_at].
Reservations = dict[str, list[float]]
R = TypeVar("R")


def _pack(obj: object) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)  # msgpack has no type information
    return packed


def _unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _state(blob: bytes) -> State:
    """A queue's state as stored; a decoding error for anything else (see readback.queue_meta).

    Its limits are not checked here: what the queue holds can be listed and delivered without
    them. A write, or a reader of the limits, checks them (:func:`_limits`)."""
    state = _unpack(blob)
    if (not isinstance(state, list) or len(state) != _RES + 1 or not isinstance(state[_RES], dict)
            or not all(_number(v) for v in state[_CREATED:_RES])
            or not all(isinstance(r, list) and len(r) == 2 and _number(r[0]) and _number(r[1])
                       for r in state[_RES].values())):
        raise TypeError("a queue state is [max_bytes, max_entries, stale_after, created_at, seq, entries, "
                        "bytes, {reservations}]")
    return state


def _limits(state: State) -> State:
    """``state`` if its limits are numbers; a decoding error otherwise (see readback.queue_meta)."""
    if not all(_number(v) for v in state[:_CREATED]):
        raise TypeError("the queue's limits (max_bytes, max_entries, stale_after) are not numbers")
    return state


def _lease(kv: KeyValue) -> tuple[str, float] | None:
    """(owner, until) of a lease key; None (skipped, counted) when it is not one."""
    return foreign.decode("queue_lease", kv.key, _owner_until, kv.value)


def _owner_until(blob: bytes) -> tuple[str, float]:
    owner, until = _unpack(blob)
    if not isinstance(owner, str) or isinstance(until, bool) or not isinstance(until, (int, float)):
        raise TypeError("a lease is [owner, until]")
    return owner, float(until)


def _mod_is(key: bytes, revision: int) -> rpc.Compare:
    return rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=revision)


def _created(key: bytes, exists: bool) -> rpc.Compare:
    return rpc.Compare(key=key, target=rpc.Compare.CREATE,
                       result=rpc.Compare.GREATER if exists else rpc.Compare.EQUAL, create_revision=0)


def _fits(state: State, sizes: Sequence[int]) -> bool:
    """Whether entries (or reservations) of ``sizes`` fit in a live ``state`` beside what it holds."""
    res = state[_RES]
    fits: bool = (state[_BYTES] + sum(r[0] for r in res.values()) + sum(sizes) <= state[_MAX_BYTES]
                  and state[_ENTRIES] + len(res) + len(sizes) <= state[_MAX_ENTRIES])  # numbers: see _state
    return fits


def _live(state: State, now: float) -> State:
    """A copy of ``state`` whose reservations are the unexpired ones (the caller may change it)."""
    new = list(state)
    new[_RES] = {rid: r for rid, r in state[_RES].items() if r[1] >= now}
    return new


class EtcdQueues(QueueStore):
    """Queues in etcd 3.4+ under ``/{prefix}/q/``."""

    backend = "etcd"
    #: etcd allows 128 operations per transaction by default (--max-txn-ops).
    max_batch = 100

    def __init__(self, url: str, prefix: str = "dfpubsub", timeout: float = 5.0,
                 clock: Callable[[], float] = time.time):
        super().__init__(clock)
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        self._conn = EtcdConnection(url, timeout)
        root = f"/{prefix}/q/".encode()
        self._states, self._entries, self._locks, self._dead, self._records = (
            root + b"s/", root + b"e/", root + b"l/", root + b"d/", root + b"rec/")
        self._cache: dict[str, tuple[int, State]] = {}
        self._cache_lock = threading.Lock()

    # -- plumbing ------------------------------------------------------------------------------

    def _send(self, compare: list[rpc.Compare], success: list[Any], failure: list[Any] | None = None) -> TxnResponse:
        return self._conn.commit(txn(compare, success, failure))

    def _state_key(self, name: str) -> bytes:
        return self._states + name.encode()

    def _entry_prefix(self, name: str) -> bytes:
        return self._entries + name.encode() + b"/"

    def _remember(self, name: str, revision: int, state: State) -> None:
        with self._cache_lock:
            cached = self._cache.get(name)
            if cached is None or cached[0] < revision:
                self._cache[name] = (revision, state)

    def _forget(self, name: str) -> None:
        with self._cache_lock:
            self._cache.pop(name, None)

    def _read(self, name: str, *more: Any) -> tuple[tuple[int, State], list[RangeResponse]]:
        """The queue's state (QueueNotFound without one) and the answers to ``more`` reads, at one revision."""
        resp = self._send([], [rpc.RangeRequest(key=self._state_key(name)), *more])
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            self._forget(name)
            raise QueueNotFound(f"no queue {name!r}")
        cached = (kvs[0].mod_revision, queue_meta(kvs[0].key, _state, kvs[0].value))
        self._remember(name, *cached)
        return cached, [r.response_range for r in resp.responses[1:]]

    def _change(self, name: str, fn: Callable[[State], tuple[State | None, list[Any], R | Exception]]) -> R:
        """Apply ``fn(state) -> (new state or None, more requests, result)`` by compare-and-set.

        ``fn`` must not change ``state``. A QueueError it raises on a cached
        state is checked against a fresh one; a result that is an exception is
        raised once the new state is written.
        """
        key = self._state_key(name)
        cached, fresh = self._cache.get(name), False
        while True:
            if cached is None:
                cached, fresh = self._read(name)[0], True
            revision, state = cached
            try:
                new, more, result = fn(state)
            except QueueError:
                if fresh:
                    raise
                cached = None
                continue
            if new is not None:
                resp = self._send([_mod_is(key, revision)], [rpc.PutRequest(key=key, value=_pack(new)), *more],
                                  [rpc.RangeRequest(key=key)])
                if not resp.succeeded:
                    kvs = resp.responses[0].response_range.kvs
                    if not kvs:
                        self._forget(name)
                        raise QueueNotFound(f"no queue {name!r}")
                    cached, fresh = (kvs[0].mod_revision, queue_meta(kvs[0].key, _state, kvs[0].value)), True
                    self._remember(name, *cached)
                    continue
                self._remember(name, resp.header.revision, new)
            if isinstance(result, Exception):
                raise result
            return result

    # -- registry --------------------------------------------------------------------------------

    def _create_queue(self, name: str, max_bytes: int, max_entries: int, stale_after: float, now: float) -> bool:
        key = self._state_key(name)
        state: State = [max_bytes, max_entries, stale_after, now, 0, 0, 0, {}]
        resp = self._send([_created(key, False)], [rpc.PutRequest(key=key, value=_pack(state))])
        if resp.succeeded:
            self._remember(name, resp.header.revision, state)
            return True

        def limits(state: State) -> tuple[State, list[Any], bool]:
            new = list(state)
            new[_MAX_BYTES], new[_MAX_ENTRIES], new[_STALE] = max_bytes, max_entries, stale_after
            return new, [], False

        return self._change(name, limits)

    def _delete_queue(self, name: str) -> bool:
        prefixes = [self._entry_prefix(name), self._dead + name.encode() + b"/"]
        resp = self._send([], [
            rpc.DeleteRangeRequest(key=self._state_key(name)),
            rpc.DeleteRangeRequest(key=self._locks + name.encode()),
            *(rpc.DeleteRangeRequest(key=p, range_end=prefix_range_end(p)) for p in prefixes)])
        self._forget(name)
        return resp.responses[0].response_delete_range.deleted > 0

    def _list_queues(self) -> list[str]:
        resp = self._send([], [rpc.RangeRequest(key=self._states, range_end=prefix_range_end(self._states),
                                                keys_only=True)])
        skip = len(self._states)
        return queue_names((kv.key[skip:], kv.key) for kv in resp.responses[0].response_range.kvs)

    def _queue_info(self, name: str) -> QueueInfo:
        (_, s), _ = self._read(name)
        s = self._limited(name, s)
        return QueueInfo(name, s[_MAX_BYTES], s[_MAX_ENTRIES], s[_STALE], s[_CREATED])

    def _limited(self, name: str, state: State) -> State:
        """``state``, whose limits a write or a reader needs: ForeignRecord (counted) when another
        writer left them as something else than numbers (a write could not be bounded)."""
        return queue_meta(self._state_key(name), _limits, state)

    # -- writers ------------------------------------------------------------------------------------

    def _reserve_many(self, name: str, sizes: list[int], now: float) -> list[str]:
        def fn(state: State) -> tuple[State, list[Any], list[str]]:
            new = _live(self._limited(name, state), now)
            res = new[_RES]
            if not _fits(new, sizes):
                raise QueueFull(name, f"no room for {len(sizes)} reservation(s) of {sum(sizes)} bytes")
            ids = []
            for size in sizes:
                rid = os.urandom(8).hex()
                res[rid] = [size, now + new[_STALE]]
                ids.append(rid)
            return new, [], ids

        return self._change(name, fn)

    def _commit_many(self, name: str, items: list[tuple[str, bytes]], now: float) -> list[str]:
        prefix = self._entry_prefix(name)

        def fn(state: State) -> tuple[State, list[Any], list[str] | ReservationNotFound]:
            for res_id, _ in items:
                if res_id not in state[_RES]:
                    raise ReservationNotFound(f"queue {name}: reservation {res_id!r} is unknown "
                                              "(committed, aborted, expired or never made)")
            new = _live(state, now)
            res: Reservations = new[_RES]
            for res_id, _ in items:
                if res_id not in res:  # expired: dropped with the others, nothing committed
                    return new, [], ReservationNotFound(f"queue {name}: reservation {res_id!r} expired")
            used = new[_BYTES] + sum(r[0] for r in res.values())
            puts, markers = [], []
            for res_id, data in items:
                size = res.pop(res_id)[0]
                used += len(data) - size  # a smaller entry frees room for a larger one after it
                if len(data) > size and used > self._limited(name, new)[_MAX_BYTES]:
                    raise QueueFull(name, f"an entry of {len(data)} bytes does not fit in its reservation of "
                                          f"{size} bytes nor in the free room")
                new[_SEQ] += 1
                new[_ENTRIES] += 1
                new[_BYTES] += len(data)
                mk = marker(new[_SEQ])
                markers.append(mk)
                puts.append(rpc.PutRequest(key=prefix + mk.encode(), value=_AT.pack(now) + data))
            return new, puts, markers

        return self._change(name, fn)

    def _abort(self, name: str, res_id: str, now: float) -> bool:
        def fn(state: State) -> tuple[State | None, list[Any], bool]:
            r: list[float] | None = state[_RES].get(res_id)
            if r is None:
                return None, [], False
            new = list(state)
            new[_RES] = {k: v for k, v in state[_RES].items() if k != res_id}
            return new, [], r[1] >= now

        return self._change(name, fn)

    # -- the owner --------------------------------------------------------------------------------------

    def _list(self, name: str, max: int, after: int) -> tuple[list[QueueEntry], bool]:
        prefix = self._entry_prefix(name)
        _, (page,) = self._read(name, rpc.RangeRequest(key=prefix + marker(after + 1).encode(),
                                                       range_end=prefix_range_end(prefix), limit=max + 1))
        skip, unpack_at = len(prefix), _AT.unpack_from
        out = []
        for kv in page.kvs[:max]:
            mk = kv.key[skip:].decode("ascii", "replace")
            try:  # free unless it raises
                out.append(QueueEntry(mk, kv.value[8:], unpack_at(kv.value)[0]))
            except foreign.DECODE_ERRORS as exc:
                out.append(foreign_entry(mk, kv.key, exc))
        return out, len(page.kvs) > max

    def _remove(self, name: str, up_to: int) -> int:
        prefix = self._entry_prefix(name)
        key, end = self._state_key(name), prefix + marker(up_to).encode() + b"\x00"
        removed = 0
        while True:
            (revision, state), (page,) = self._read(name, rpc.RangeRequest(key=prefix, range_end=end,
                                                                           limit=_REMOVE_PAGE))
            kvs = page.kvs
            if not kvs:
                return removed
            new = list(state)
            new[_ENTRIES] -= len(kvs)
            new[_BYTES] -= sum(len(kv.value) - _AT.size for kv in kvs)
            # Every key in [first, last] was read: later commits get larger markers.
            resp = self._send([_mod_is(key, revision)], [
                rpc.PutRequest(key=key, value=_pack(new)),
                rpc.DeleteRangeRequest(key=kvs[0].key, range_end=kvs[-1].key + b"\x00")])
            if resp.succeeded:
                self._remember(name, resp.header.revision, new)
                removed += len(kvs)
                if len(kvs) < _REMOVE_PAGE:
                    return removed

    def _remove_exact(self, name: str, items: list[tuple[int, bytes | None]], aside: Aside | None) -> int:
        """Page by page, each page one compare-and-set of the state: every entry deletion changes
        the state, so an unchanged state means the entries read are still there."""
        prefix, key = self._entry_prefix(name), self._state_key(name)
        removed = 0
        for i in range(0, len(items), _EXACT_PAGE):
            page = [(prefix + marker(seq).encode(), seq, data) for seq, data in items[i:i + _EXACT_PAGE]]
            while True:
                (revision, state), ranges = self._read(name, *(rpc.RangeRequest(key=k) for k, _, _ in page))
                found = [(k, seq, data, r.kvs[0]) for (k, seq, data), r in zip(page, ranges) if r.kvs]
                if not found:
                    break
                new = list(state)
                new[_ENTRIES] -= len(found)
                new[_BYTES] -= sum(len(kv.value) - _AT.size for *_, kv in found)
                ops: list[Any] = [rpc.PutRequest(key=key, value=_pack(new))]
                ops += [rpc.DeleteRangeRequest(key=k) for k, *_ in found]
                if aside is not None:
                    # A record written earlier (by dead_letter()) is replaced by this one, of the same entry.
                    ops += [rpc.PutRequest(key=self._dead + f"{name}/{marker(seq)}".encode(),
                                           value=_pack([data, *aside])) for _, seq, data, _ in found]
                resp = self._send([_mod_is(key, revision)], ops)
                if resp.succeeded:
                    self._remember(name, resp.header.revision, new)
                    removed += len(found)
                    break
        return removed

    def _stats(self, name: str, now: float) -> QueueStats:
        (_, state), (lease,) = self._read(name, rpc.RangeRequest(key=self._locks + name.encode()))
        res = _live(self._limited(name, state), now)[_RES]
        held = _lease(lease.kvs[0]) if lease.kvs else None
        return QueueStats(state[_ENTRIES], state[_BYTES], len(res), sum(r[0] for r in res.values()),
                          state[_MAX_BYTES], state[_MAX_ENTRIES],
                          *(held if held is not None and held[1] >= now else (None, None)))

    # -- leases -------------------------------------------------------------------------------------------

    def _lock(self, name: str, owner: str, now: float, until: float) -> bool:
        key = self._locks + name.encode()
        while True:
            _, (lease,) = self._read(name, rpc.RangeRequest(key=key))
            if lease.kvs:
                # A foreign lease (counted) holds nothing: it is taken over, and so repaired.
                holder, held_until = _lease(lease.kvs[0]) or (owner, now)
                if holder != owner and held_until >= now:
                    return False
                guard = _mod_is(key, lease.kvs[0].mod_revision)
            else:
                guard = _created(key, False)
            resp = self._send([_created(self._state_key(name), True), guard],
                              [rpc.PutRequest(key=key, value=_pack([owner, until]))])
            if resp.succeeded:
                return True

    def _unlock(self, name: str, owner: str) -> bool:
        key = self._locks + name.encode()
        resp = self._send([], [rpc.RangeRequest(key=key)])
        kvs = resp.responses[0].response_range.kvs
        if not kvs or (_lease(kvs[0]) or ("",))[0] != owner:
            return False
        return self._send([_mod_is(key, kvs[0].mod_revision)], [rpc.DeleteRangeRequest(key=key)]).succeeded

    # -- dead letters ---------------------------------------------------------------------------------------

    def _dead_letter(self, name: str, marker: str, data: bytes, reason: str, now: float) -> bool:
        key = self._dead + f"{name}/{marker}".encode()
        state = self._state_key(name)
        resp = self._send([_created(state, True), _created(key, False)],
                          [rpc.PutRequest(key=key, value=_pack([data, reason, now]))],
                          [rpc.RangeRequest(key=state, keys_only=True)])
        if not resp.succeeded and not resp.responses[0].response_range.kvs:
            raise QueueNotFound(f"no queue {name!r}")
        return bool(resp.succeeded)

    def _dead_prefix(self, name: str | None) -> bytes:
        return self._dead if name is None else self._dead + name.encode() + b"/"

    def _list_dead_letters(self, name: str | None, max: int) -> list[DeadLetter]:
        prefix = self._dead_prefix(name)
        resp = self._send([], [rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix), limit=max)])
        out = []
        for kv in resp.responses[0].response_range.kvs:
            queue, _, mk = kv.key[len(self._dead):].rpartition(b"/")
            letter = foreign.decode("queue_dead_letter", kv.key, dead_letter, queue, mk, kv.value)
            if letter is not None:
                out.append(letter)
        return out

    def _purge_dead_letters(self, name: str | None) -> int:
        prefix = self._dead_prefix(name)
        resp = self._send([], [rpc.DeleteRangeRequest(key=prefix, range_end=prefix_range_end(prefix))])
        return int(resp.responses[0].response_delete_range.deleted)

    def _redrive(self, name: str, mk: str, now: float) -> str | None:
        key, state_key, prefix = self._dead + f"{name}/{mk}".encode(), self._state_key(name), self._entry_prefix(name)
        while True:
            (revision, state), (found,) = self._read(name, rpc.RangeRequest(key=key))
            if not found.kvs:
                return None
            kv = found.kvs[0]
            letter = foreign.decode("queue_dead_letter", kv.key, dead_letter, name, mk, kv.value)
            if letter is None:
                return None
            new = _live(self._limited(name, state), now)
            if not _fits(new, [len(letter.data)]):
                raise QueueFull(name, f"no room to redrive a dead letter of {len(letter.data)} bytes")
            new[_SEQ] += 1
            new[_ENTRIES] += 1
            new[_BYTES] += len(letter.data)
            # Both the queue and the letter as read: a concurrent redrive or purge makes this fail
            # and the loop read again, so a letter is moved once.
            resp = self._send([_mod_is(state_key, revision), _mod_is(key, kv.mod_revision)], [
                rpc.PutRequest(key=state_key, value=_pack(new)),
                rpc.PutRequest(key=prefix + marker(new[_SEQ]).encode(), value=_AT.pack(now) + letter.data),
                rpc.DeleteRangeRequest(key=key)])
            if resp.succeeded:
                self._remember(name, resp.header.revision, new)
                return marker(new[_SEQ])

    # -- records ---------------------------------------------------------------------------------------------

    def _record_key(self, kind: str, name: str) -> bytes:
        return self._records + f"{kind}/{name}".encode()

    def _put_record(self, kind: str, name: str, data: bytes) -> None:
        self._send([], [rpc.PutRequest(key=self._record_key(kind, name), value=data)])

    def _get_record(self, kind: str, name: str) -> bytes | None:
        kvs = self._send([], [rpc.RangeRequest(key=self._record_key(kind, name))]).responses[0].response_range.kvs
        return kvs[0].value if kvs else None

    def record_key(self, kind: str, name: str) -> str:
        """See :meth:`QueueStore.record_key`."""
        return self._record_key(kind, name).decode()

    def _list_records(self, kind: str) -> dict[str, bytes]:
        prefix = self._record_key(kind, "")
        resp = self._send([], [rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix))])
        kvs = resp.responses[0].response_range.kvs
        return named_records(kind, ((kv.key[len(prefix):], kv.value, kv.key) for kv in kvs))

    def _delete_record(self, kind: str, name: str) -> bool:
        resp = self._send([], [rpc.DeleteRangeRequest(key=self._record_key(kind, name))])
        return resp.responses[0].response_delete_range.deleted > 0

    def close(self) -> None:
        self._conn.close()
