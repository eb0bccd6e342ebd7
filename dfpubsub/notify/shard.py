"""One round of delivery of one owned shard: list the head, set aside, send, remove exactly.

A round lists up to ``batch_size`` entries from the head of the shard's queue
and handles each of them exactly once: an undecodable one, one past the
topic's ``time_to_live``, or one that ran out of retries or was refused for
good is **set aside** (recorded as a dead letter and removed in one atomic
step of the queue backend); one the endpoint acknowledged is **removed by its
marker**. Nothing else is removed: an entry the worker still holds stays
queued, so a worker killed at any step loses nothing (the next owner lists it
again, at least once).

Retry counts are kept with the shard (a ``notify-attempts`` record naming the
queue's creation time, the markers tried and how many attempts failed), so a
takeover goes on with the budget of ``max_retries`` where the previous owner
left it; a record of an earlier queue of the same name (its topic deleted and
made again: markers start over) does not apply. The record is written only
when an attempt fails and read once per owner, so a healthy shard pays nothing
for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from ..endpoints import Endpoint
from ..errors import EndpointError, EndpointRejected, ForeignRecord, NotificationDecodeError
from ..logs import RateLimitedLog
from ..metrics import Stats
from ..queues import QueueEntry, QueueStore
from .notification import Notification, decode
from .steps import step
from .topics import Topic

__all__ = ["ShardRound", "Slots", "ATTEMPTS_KIND"]

log = logging.getLogger(__name__)

#: The record kind of the retry counts of shards (one record per shard, named like it).
ATTEMPTS_KIND = "notify-attempts"

T = TypeVar("T")
_Item = tuple[QueueEntry, Notification]


class Slots:
    """The in-flight limits one send must fit in: its topic's, then the worker's.

    The topic's slots are taken first, so a hung endpoint holds at most its own
    number of the worker's slots and the other topics keep the rest.
    """

    def __init__(self, own: asyncio.Semaphore, shared: asyncio.Semaphore):
        self.own = own
        self.shared = shared

    async def __aenter__(self) -> None:
        await self.own.acquire()
        try:
            await self.shared.acquire()
        except BaseException:
            self.own.release()
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.shared.release()
        self.own.release()


class ShardRound:
    """Delivers the shard ``name`` of ``topic`` a round at a time (see the module docstring)."""

    def __init__(self, name: str, topic: Topic, queues: QueueStore, endpoint: Endpoint | None, slots: Slots,
                 stats: Stats, batch_size: int, leased: Callable[[], bool], rate_log: RateLimitedLog):
        self.name = name
        self.topic = topic
        self.queues = queues
        self.endpoint = endpoint
        self.slots = slots
        self.stats = stats
        self.batch_size = batch_size
        self.leased = leased
        self._log = rate_log
        self._attempts: dict[str, Any] | None = None  # the stored retry count, as last read or written
        self._created: float | None = None  # the queue's creation time, once read

    async def _queue(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, self.name, *args)

    async def run(self) -> bool:
        """One round; False if the shard was empty."""
        entries, _ = await self._queue(self.queues.list, self.batch_size)
        if not entries:
            return False
        items: list[_Item] = []
        bad: dict[str, list[QueueEntry]] = {}
        for e in entries:
            try:
                items.append((e, decode(e.data)))
            except NotificationDecodeError as exc:
                bad.setdefault(f"undecodable: {exc.reason}", []).append(e)
        for reason, undecodable in bad.items():
            await self._set_aside(undecodable, reason)
        if items:
            if self.endpoint is None:
                await self._set_aside([e for e, _ in items], "bad endpoint")
            else:
                await self._deliver(self.endpoint, items)
        return True

    # -- delivery --------------------------------------------------------------------------

    async def _deliver(self, endpoint: Endpoint, items: list[_Item]) -> None:
        """Send ``items`` until they are delivered or set aside, or the lease is in doubt."""
        topic = self.topic
        attempts = await self._stored_attempts(items)
        pending = items
        while pending and self.leased():
            pending = await self._expire(pending)
            if not pending:
                break
            try:
                await self._send(endpoint, pending)
                pending = []
            except EndpointRejected as exc:
                await self._set_aside([e for e, _ in pending], f"rejected: {exc}")
                pending = []
            except EndpointError as exc:
                attempts += 1
                if topic.max_retries and attempts > topic.max_retries:
                    await self._set_aside([e for e, _ in pending], f"max_retries ({topic.max_retries}): {exc}")
                    pending = []
                    break
                self.stats.inc("retries")
                await self._store_attempts(pending, attempts)
                await asyncio.sleep(topic.retry_sleep)
        if not pending and self._attempts is not None:
            await self._clear_attempts()

    async def _send(self, endpoint: Endpoint, pending: list[_Item]) -> None:
        """Send ``pending`` and remove it; on a failure remove what the endpoint did acknowledge
        (and drop it from ``pending``), then re-raise."""
        try:
            async with self.slots:
                await endpoint.send([n for _, n in pending])
        except (EndpointError, EndpointRejected) as exc:
            self.stats.inc("send_failures", reason="rejected" if isinstance(exc, EndpointRejected) else "retryable")
            self._log.warning(f"send:{self.name}", "delivery failed", topic=self.topic.name, shard=self.name,
                              endpoint=endpoint.safe_url, error=str(exc))
            if exc.acked:
                await self._remove(pending[:exc.acked])
                del pending[:exc.acked]
            raise
        await self._remove(pending)

    async def _remove(self, delivered: Sequence[_Item]) -> None:
        step("after_send")
        await self._queue(self.queues.remove_markers, [e.marker for e, _ in delivered])
        self.stats.inc("delivered", len(delivered))

    async def _expire(self, pending: list[_Item]) -> list[_Item]:
        """Set aside the entries past the topic's time to live, wherever they are in ``pending``."""
        ttl = self.topic.time_to_live
        if not ttl:
            return pending
        now = time.time()
        expired = [e for e, _ in pending if now - e.enqueued_at > ttl]
        if not expired:
            return pending
        await self._set_aside(expired, f"time_to_live ({ttl:g} s)")
        gone = {e.marker for e in expired}
        return [i for i in pending if i[0].marker not in gone]

    async def _set_aside(self, entries: list[QueueEntry], reason: str) -> None:
        """Record ``entries`` as dead letters and remove them, in one atomic step."""
        for i in range(0, len(entries), self.queues.max_batch):
            await self._queue(self.queues.set_aside, entries[i:i + self.queues.max_batch], reason)
        step("after_set_aside")
        self.stats.inc("dead_letters", len(entries), reason=reason.split(" ", 1)[0].rstrip(":"))
        log.warning("dead-lettered notifications", extra={"shard": self.name, "count": len(entries),
                                                          "reason": reason})

    # -- retry counts kept with the shard -------------------------------------------------------

    async def _stored_attempts(self, items: list[_Item]) -> int:
        """Failed attempts already spent on the head of ``items`` (by this owner or an earlier one)."""
        if self._created is None:
            try:
                self._created = (await self._queue(self.queues.queue_info)).created_at
            except ForeignRecord:
                # Another writer overwrote the queue's limits (counted, named): delivering needs
                # none of them, and the retry counts are then tied to no incarnation in particular.
                self._created = 0.0
            blob = await asyncio.to_thread(self.queues.get_record, ATTEMPTS_KIND, self.name)
            self._attempts = _parse_attempts(blob)
        stored = self._attempts
        if stored is None:
            return 0
        if stored["queue"] == self._created and stored["first"] <= items[0][0].marker <= stored["last"]:
            return int(stored["attempts"])  # an int, as _parse_attempts checked
        await self._clear_attempts()  # about entries handled since
        return 0

    async def _store_attempts(self, pending: list[_Item], attempts: int) -> None:
        record = {"queue": self._created, "first": pending[0][0].marker, "last": pending[-1][0].marker, "attempts": attempts}
        await asyncio.to_thread(self.queues.put_record, ATTEMPTS_KIND, self.name, json.dumps(record).encode())
        self._attempts = record

    async def _clear_attempts(self) -> None:
        await asyncio.to_thread(self.queues.delete_record, ATTEMPTS_KIND, self.name)
        self._attempts = None


def _parse_attempts(blob: bytes | None) -> dict[str, Any] | None:
    """A stored retry count, or None if there is none or it is not one (then it is ignored)."""
    if blob is None:
        return None
    try:
        record = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("queue"), (int, float)):
        return None
    if not isinstance(record.get("first"), str) or not isinstance(record.get("last"), str):
        return None
    attempts = record.get("attempts")
    return record if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts >= 0 else None
