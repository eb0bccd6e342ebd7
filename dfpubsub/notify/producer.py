"""The writer side of persistent notifications: in the store's own write, or around it.

:meth:`Notifier.write` wraps one store write (docs/notifications.md). When
the queues live in the store's backend it builds the notifications without
their version and hands the store an outbox (:mod:`dfpubsub.store.outbox`):
the write checks the shards' room, writes and appends them in one atomic
step. Otherwise it does what Ceph's RGW does around an object write:

1. :meth:`Notifier.prepare` finds the persistent topics whose configurations
   match the change (from the registry's cached snapshot), builds each
   notification, and reserves room for it on the shard its key hashes to. The
   version is not known yet, so the reservation is sized for the notification
   encoded with the widest version there is: the real one can only be smaller.
   A full shard raises :class:`~dfpubsub.errors.QueueFull` after giving back
   what was already reserved, so the write fails before it touches the store.
2. The caller writes to the store.
3. :meth:`Notifier.commit` fills in the version the store assigned (and the
   id, which contains it), encodes once and commits each reservation; or
   :meth:`Notifier.abort` gives the room back if the write failed.

The pub/sub bridge uses 1 and 3 for changes that already happened.

Non-persistent topics are not queued here: delivering them straight from the
change events is the delivery side's business.

**Credits.** A reservation is a round trip to the queue backend; to keep one
off every write, a notifier takes reservations for a shard ``credit`` at a
time (one ``reserve_many`` round trip) and hands them out to later writes.
Credits are fixed-size (``credit_size`` bytes, larger than a usual
notification); a notification that does not fit one gets a reservation of its
own size. A credit is used only while at least half of the queue's
``stale_after`` is left, so it cannot expire during a write; the rest of the
process's credits are given back by :meth:`Notifier.close`, or expire. Queues
too small to spare credits (``credit`` reservations would take more than
1/64 of the bound) are reserved one write at a time, so credits never make a
small queue look full to other writers.

**Order.** The changes of one key go to one shard; so that they are committed
in version order when threads of one process write the key concurrently,
:meth:`prepare` takes a lock (one of 64, by key) that :meth:`commit` or
:meth:`abort` releases: always call one of them, and prepare one change at a
time per thread. Processes writing one key at
the same instant may commit out of version order (docs/notifications.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import msgpack

from ..errors import (
    DfPubSubError,
    ForeignRecord,
    InvalidValue,
    QueueFull,
    QueueNotFound,
    ReservationNotFound,
)
from ..events import VersionedObject
from ..logs import RateLimitedLog
from ..metrics import Stats
from ..queues import QueueStore
from ..queues.sharding import key_hash, shard_for, shard_names
from ..store import Store
from ..store.outbox import Outbox
from .notification import Notification, encode, encode_change, encode_head, notification_id
from .registry import Match, NotificationRegistry
from .steps import step
from .topics import Topic, event_name

__all__ = ["Notifier", "Pending", "DEFAULT_CREDIT", "DEFAULT_CREDIT_SIZE"]

log = logging.getLogger(__name__)

#: Reservations a notifier takes ahead per shard in one round trip.
DEFAULT_CREDIT = 16
#: Size of a credit; a notification without its value is a few hundred bytes.
DEFAULT_CREDIT_SIZE = 1024
#: The widest version there is (20 decimal digits, a 9-byte msgpack integer): sizes reservations.
_WIDEST_VERSION = (1 << 64) - 1
_STRIPES = 64
#: A queue spares credits only while ``credit`` of them take at most 1/_SPARE of its bound.
_SPARE = 64


@dataclass(slots=True)
class _Reservation:
    queue: str
    res_id: str
    notification: Notification
    #: What the entry carries for delivery to derive size and etag from (see _digest).
    digest: bytes | tuple[int, str]
    #: For a credit, until when it may be handed out again; 0.0 for a reservation of its own.
    credit_until: float = 0.0


@dataclass(slots=True)
class Pending:
    """The reservations :meth:`Notifier.prepare` made for one change; hand it to
    :meth:`Notifier.commit` or :meth:`Notifier.abort`, exactly once."""

    reservations: list[_Reservation] = field(default_factory=list)
    #: The key's lock (a threading.RLock), held from prepare() to commit() or abort().
    lock: Any = None

    def __bool__(self) -> bool:
        return bool(self.reservations)

    @property
    def queues(self) -> list[str]:
        """The shards reserved on, one per matching persistent topic."""
        return [r.queue for r in self.reservations]


class _Plan(NamedTuple):
    """What the outbox entry of a change needs from one (topic, configuration) match."""

    topic: str
    #: The topic's shards, by index.
    shards: list[str]
    prefix: str
    suffix: str
    event_name: str
    opaque_data: str
    config_id: str


#: What prepare() answers for a change no persistent topic wants (no allocation on that path).
_NOTHING = Pending()
#: A deletion's digest: no value, size 0, no etag.
_DELETED = (0, "")


def _digest(table: str, key: str, action: str, value: Any) -> bytes | tuple[int, str]:
    """What an entry carries in place of the value's size and etag: the value's msgpack
    encoding, from which delivery derives both (the canonical encoding and MD5 are off the
    writer's request); ``(0, "")`` for a delete. InvalidValue, as the store, for a value
    that cannot be serialised."""
    if action == "delete":
        return _DELETED
    try:
        blob: bytes = msgpack.packb(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidValue(f"{table}/{key}: value is not serialisable: {exc}") from exc
    return blob


class _Credits:
    """Reservations of one queue taken ahead by this process: (id, usable until)."""

    __slots__ = ("batch", "ids")

    def __init__(self, batch: int):
        self.batch = batch
        self.ids: deque[tuple[str, float]] = deque()


class Notifier:
    """Reserves, commits and aborts the persistent notifications of store writes.

    ``publisher`` names the writer in every notification. ``stats`` counts
    ``notifications_enqueued``, ``notifications_refused`` (QueueFull at
    prepare, by topic) and ``notifications_lost`` (by reason: the store write
    happened but its notification could not be committed). Thread-safe; a
    forked child starts with no credits of its own.
    """

    def __init__(
        self,
        registry: NotificationRegistry,
        queues: QueueStore,
        *,
        publisher: str = "",
        credit: int = DEFAULT_CREDIT,
        credit_size: int = DEFAULT_CREDIT_SIZE,
        stats: Stats | None = None,
        close_queues: bool = False,
        clock: Callable[[], float] = time.time,
    ):
        if credit.__class__ is not int or credit < 1 or credit > queues.max_batch:
            raise InvalidValue(f"credit must be an int in 1..{queues.max_batch}, not {credit!r}")
        if credit_size.__class__ is not int or credit_size < 1:
            raise InvalidValue(f"credit_size must be a positive int, not {credit_size!r}")
        self.registry = registry
        self.queues = queues
        self.publisher = publisher
        self.credit = credit
        self.credit_size = credit_size
        self.stats = stats or Stats("notifier", publisher or "notifier")
        self._close_queues = close_queues
        self._clock = clock
        self._badlog = RateLimitedLog(log, 5.0)
        #: (table, action) -> (the registry's matches, their plans): see _plans.
        self._plan_cache: dict[tuple[str, str], tuple[list[Match], list[_Plan]]] = {}
        self._fork_safe()

    def _fork_safe(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._credits: dict[str, _Credits] = {}
        self._stripes = [threading.RLock() for _ in range(_STRIPES)]

    # -- the write path ------------------------------------------------------------------------

    def write(self, store: Store, table: str, key: str, action: str, value: Any,
              write: Callable[[Outbox | None], VersionedObject]) -> VersionedObject:
        """Run ``write`` (a store write of ``key`` in ``table`` by ``action``, leaving ``value``)
        with its persistent notifications; what it returned.

        When the queues live in ``store``'s backend, the notifications go in
        the write itself (``write`` gets an outbox for the store: one atomic
        step, no reservation); otherwise :meth:`prepare`, ``write(None)``,
        then :meth:`commit`, or :meth:`abort` if it raised. QueueFull fails
        the write before the store changes, either way.
        """
        if not self.queues.shares_store(store):
            pending = self.prepare(table, key, action, value)
            try:
                step("after_reserve")
                obj = write(None)
            except BaseException:
                self.abort(pending)
                raise
            step("after_store_write")
            self.commit(pending, obj)
            return obj
        action = getattr(action, "value", action)
        plans = self._plans(table, action) if key.__class__ is str else ()  # the store refuses another key
        if not plans:
            return write(None)
        # Each entry leaves its version to the store, which puts it in front (dfpubsub/store/outbox.py).
        # A create's or update's also leaves its last element, the value's encoding, to the store,
        # which appends the value it writes: packed once, sent once. Delivery derives size and
        # etag from it (notification.py); a delete's entry carries [0, ""] instead.
        with_value, where, when, writer = action != "delete", key_hash(table, key), self._clock(), self.publisher
        entries = [(p.shards[where % len(p.shards)],
                    encode_head(p.topic, p.event_name, action, table, key, when, p.opaque_data, writer, p.config_id,
                                None) if with_value else
                    encode_change(p.topic, p.event_name, action, table, key, None, when, p.opaque_data, writer,
                                  p.config_id, None, _DELETED))
                   for p in plans if key.startswith(p.prefix) and key.endswith(p.suffix)]
        if not entries:
            return write(None)
        outbox = self.queues.outbox(entries, with_value)
        try:
            obj = write(outbox)
        except QueueFull as exc:
            refused = next((p.topic for p in plans if exc.queue in p.shards), exc.queue)
            self.stats.inc("notifications_refused", reason=refused)
            raise
        if outbox.skipped:  # a topic was deleted or made non-persistent since the registry's snapshot
            self.registry.invalidate()
        self.stats.inc("notifications_enqueued", len(entries) - outbox.skipped)
        return obj

    def _plans(self, table: str, action: str) -> list[_Plan]:
        """What the outbox entries of a change of ``table`` by ``action`` need from each persistent
        topic that may want it, worked out once per registry snapshot."""
        matches = self.registry.persistent_matches(table, action)
        if not matches:
            return []
        cached = self._plan_cache.get((table, action))
        if cached is not None and cached[0] is matches:
            return cached[1]
        name = event_name(action)
        plans = [_Plan(topic.name, shard_names(topic.name, cast(int, topic.shards)), config.prefix, config.suffix,
                       name, topic.opaque_data, config.id) for topic, config in matches]
        self._plan_cache[(table, action)] = (matches, plans)
        return plans

    def _persistent(self, table: str, key: str, action: str) -> list[Match]:
        """The (topic, configuration) matches of a change that persistent topics want."""
        if key.__class__ is not str:  # the store refuses it; no topic can match it
            return []
        return self.registry.persistent_topics(table, key, action)

    def prepare(self, table: str, key: str, action: str, value: Any = None, *,
                publisher: str | None = None, event_time: float | None = None) -> Pending:
        """Reserve room for the notifications of a change of ``key`` in ``table`` by ``action``
        (``create``, ``update`` or ``delete``; ``value`` is the object after it).
        ``publisher`` (default: this notifier's) and ``event_time`` (default: now) go
        into the notifications.

        Raises :class:`~dfpubsub.errors.QueueFull` (nothing stays reserved) or
        the queue backend's :class:`~dfpubsub.errors.StoreUnavailable`; the
        write must not happen then. A falsy Pending means no persistent topic
        wants the change.
        """
        action = getattr(action, "value", action)
        matches = self._persistent(table, key, action)
        if not matches:
            return _NOTHING
        if self._pid != os.getpid():
            self._fork_safe()
        now = self._clock()
        digest = _digest(table, key, action, value)
        notes = self._notifications(matches, table, key, action, now if event_time is None else event_time,
                                    self.publisher if publisher is None else publisher)
        lock = self._stripes[zlib.crc32(key.encode()) % _STRIPES]
        lock.acquire()
        pending = Pending([], lock)
        try:
            for (topic, _), n in zip(matches, notes):
                reservation = self._reserve(topic, table, key, n, digest, now)
                if reservation is not None:
                    pending.reservations.append(reservation)
        except BaseException:
            self.abort(pending)
            raise
        if not pending.reservations:
            pending.lock = None
            lock.release()
            return _NOTHING
        return pending

    def commit(self, pending: Pending, obj: VersionedObject) -> int:
        """Commit the notifications of a write the store made (``obj`` carries its version);
        how many were committed.

        Never raises for a queue's sake: the write stands, so a notification
        that cannot be committed is counted in ``notifications_lost`` and
        logged (docs/notifications.md, failure windows).
        """
        lock = pending.lock
        if lock is None:
            return 0
        reservations, pending.reservations, pending.lock = pending.reservations, [], None
        committed = 0
        try:
            version = obj.version
            for r in reservations:
                n = r.notification
                n.version = version
                n.id = notification_id(n.topic, n.bucket, n.key, version)
                committed += self._commit(r, encode(n, r.digest))
        finally:
            lock.release()
        self.stats.inc("notifications_enqueued", committed)
        return committed

    def abort(self, pending: Pending) -> None:
        """Give back the room reserved for a write that did not happen. Never raises."""
        lock = pending.lock
        if lock is None:
            return
        reservations, pending.reservations, pending.lock = pending.reservations, [], None
        try:
            for r in reservations:
                if r.credit_until and self._recredit(r):
                    continue
                try:
                    self.queues.abort(r.queue, r.res_id)
                except DfPubSubError as exc:  # it expires after stale_after all the same
                    self._badlog.warning(f"abort:{r.queue}", "cannot abort a notification reservation",
                                         queue=r.queue, error=str(exc))
        finally:
            lock.release()

    # -- reservations ----------------------------------------------------------------------------

    @staticmethod
    def _notifications(matches: list[Match], table: str, key: str, action: str, when: float,
                       writer: str) -> list[Notification]:
        """The notification of the change for each match, without its version and id (size and
        etag are left to delivery: see :func:`_digest`)."""
        name = event_name(action)
        return [Notification("", topic.name, name, action, table, key, _WIDEST_VERSION, 0, "", when, None,
                             topic.opaque_data, writer, config.id) for topic, config in matches]

    def _reserve(self, topic: Topic, table: str, key: str, n: Notification, digest: bytes | tuple[int, str],
                 now: float) -> _Reservation | None:
        """A reservation for ``n`` on its shard, sized for the widest version; None if the topic's
        queues are gone."""
        assert topic.shards is not None
        queue = shard_for(topic.name, topic.shards, table, key)
        size = len(encode(n, digest))
        try:
            if size <= self.credit_size:
                credit = self._take_credit(queue, topic, now)
                if credit is not None:
                    return _Reservation(queue, credit[0], n, digest, credit[1])
            return _Reservation(queue, self.queues.reserve(queue, size), n, digest)
        except QueueNotFound:
            # The topic was deleted or made non-persistent since the snapshot: it wants nothing now.
            self.registry.invalidate()
            return None
        except QueueFull:
            self.stats.inc("notifications_refused", reason=topic.name)
            raise

    def _take_credit(self, queue: str, topic: Topic, now: float) -> tuple[str, float] | None:
        """A credit of ``queue`` (id, usable until), refilled in one round trip when none is
        left; None when the queue spares none (small, or too full for a whole batch)."""
        credits = self._credits.get(queue)
        if credits is None:
            batch = min(self.credit, topic.max_entries // _SPARE,
                        topic.max_bytes // (_SPARE * self.credit_size))
            credits = self._credits.setdefault(queue, _Credits(batch))
        if credits.batch <= 1:
            return None
        stale: list[str] = []
        found: tuple[str, float] | None = None
        with self._mutex:
            while credits.ids:
                credit = credits.ids.popleft()
                if credit[1] > now:
                    found = credit
                    break
                stale.append(credit[0])
        for old in stale:  # unused for half their life: writes are sparse here, give the room back
            self._quiet_abort(queue, old)
        if found is not None:
            return found
        try:
            ids = self.queues.reserve_many(queue, [self.credit_size] * credits.batch)
        except QueueFull:
            return None
        until = now + topic.stale_after / 2
        with self._mutex:
            credits.ids.extend((i, until) for i in ids[1:])
        return ids[0], until

    def _recredit(self, r: _Reservation) -> bool:
        """Put an unused credit back; False if it is too old to hand out again."""
        credits = self._credits.get(r.queue)
        if credits is None or r.credit_until <= self._clock():
            return False
        with self._mutex:
            credits.ids.appendleft((r.res_id, r.credit_until))
        return True

    def _drop_credits(self, queue: str) -> None:
        credits = self._credits.get(queue)
        if credits is None:
            return
        with self._mutex:
            held, credits.ids = list(credits.ids), deque()
        for res_id, _ in held:
            self._quiet_abort(queue, res_id)

    def _quiet_abort(self, queue: str, res_id: str) -> None:
        try:
            self.queues.abort(queue, res_id)
        except DfPubSubError:
            pass  # it expires after stale_after

    # -- commits ---------------------------------------------------------------------------------

    def _commit(self, r: _Reservation, data: bytes) -> bool:
        """Commit ``data``; on an expired reservation, reserve again and retry once."""
        try:
            self.queues.commit(r.queue, r.res_id, data)
            return True
        except ReservationNotFound:
            if r.credit_until:  # its batch mates are likely as old, or unknown (the queue was re-created)
                self._drop_credits(r.queue)
            try:
                self.queues.commit(r.queue, self.queues.reserve(r.queue, len(data)), data)
                return True
            except DfPubSubError as exc:
                return self._lost(r, "expired", exc)
        except QueueNotFound as exc:
            return self._lost(r, "queue_gone", exc)
        except ForeignRecord as exc:
            # The shard turned foreign after these credits were taken: the next write's reservation
            # must find out, before its store write, rather than spend another credit here.
            self._drop_credits(r.queue)
            return self._lost(r, "foreign_record", exc)
        except DfPubSubError as exc:
            return self._lost(r, type(exc).__name__, exc)

    def _lost(self, r: _Reservation, reason: str, exc: Exception) -> bool:
        self.stats.inc("notifications_lost", reason=reason)
        n = r.notification
        self._badlog.warning(f"lost:{r.queue}:{reason}", "notification lost: the write stands, its notification "
                             "could not be committed", queue=r.queue, reason=reason, table=n.bucket, key=n.key,
                             version=n.version, error=str(exc))
        return False

    # -- lifecycle -------------------------------------------------------------------------------

    def credits_held(self, queue: str | None = None) -> int:
        """Credits this process holds (on ``queue``, or on all queues)."""
        if self._pid != os.getpid():
            return 0
        with self._mutex:
            if queue is not None:
                credits = self._credits.get(queue)
                return len(credits.ids) if credits else 0
            return sum(len(c.ids) for c in self._credits.values())

    def release(self) -> int:
        """Give back every credit this process holds; how many."""
        if self._pid != os.getpid():
            self._fork_safe()  # the parent's credits are the parent's
            return 0
        with self._mutex:
            held = [(q, i) for q, c in self._credits.items() for i, _ in c.ids]
            for c in self._credits.values():
                c.ids.clear()
        for queue, res_id in held:
            self._quiet_abort(queue, res_id)
        return len(held)

    def close(self) -> None:
        """Give back the credits (and close the queues if this notifier was given them to own)."""
        try:
            self.release()
        finally:
            if self._close_queues:
                self.queues.close()

