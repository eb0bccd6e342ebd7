"""Delivering persistent notifications: the worker that df-notify runs.

Every ``renew_interval`` the worker walks the registry of topics: for each
shard of each persistent topic it renews the lease it holds, skips one that
another worker holds, and takes one whose lease expired (after ``lease``
seconds without renewal; Ceph's 30 s / 90 s by default). Only the owner
lists, delivers and removes.

Each owned shard has one task, which keeps per-key order (all events of a key
hash to one shard): it lists the head of the queue, sends it to the topic's
endpoint in batches, and removes entries only once the endpoint acknowledged
them (at least once: a crash after the ack and before the removal sends them
again). Failures are retried with tenacity every ``retry_sleep`` seconds; an
entry past the topic's ``time_to_live`` or ``max_retries``, refused for good
by the endpoint, or undecodable goes to the dead-letter record with the
reason, never into the void. A dead endpoint blocks only its own topic's
shards; sends in flight across all topics are bounded by ``max_inflight``.

Queue calls are blocking (SQLite, Redis, etcd clients) and run in worker
threads; endpoints are asyncio.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_never, wait_fixed

from ..endpoints import Endpoint, open_endpoint
from ..errors import DfPubSubError, EndpointError, EndpointRejected, NotificationDecodeError
from ..logs import RateLimitedLog
from ..metrics import Stats
from ..queues import QueueEntry, QueueStore
from .notification import Notification, decode
from .registry import NotificationRegistry
from .topics import Topic

__all__ = ["DeliveryOptions", "DeliveryWorker", "DeliveryThread"]

log = logging.getLogger(__name__)

_Item = tuple[QueueEntry, Notification]


@dataclass(slots=True)
class DeliveryOptions:
    """Tuning of a :class:`DeliveryWorker` (the ``[notify]`` settings)."""

    worker_id: str
    renew_interval: float = 30.0
    lease: float = 90.0
    poll_interval: float = 0.2
    batch_size: int = 100
    max_inflight: int = 64


class _Shard:
    """An owned shard: its task and until when the lease surely holds (monotonic)."""

    __slots__ = ("topic", "task", "until")

    def __init__(self, topic: Topic, task: asyncio.Task[None], until: float):
        self.topic = topic
        self.task = task
        self.until = until


class DeliveryWorker:
    """Owns shards through leases and delivers their entries. Run :meth:`run` in an event loop."""

    def __init__(self, queues: QueueStore, registry: NotificationRegistry, options: DeliveryOptions):
        if options.renew_interval * 2 >= options.lease:
            raise DfPubSubError("renew_interval must be well under the lease (a renewal may be late or fail)")
        self.queues = queues
        self.registry = registry
        self.options = options
        self.stats: dict[str, Stats] = {}
        self._shards: dict[str, _Shard] = {}
        self._endpoints: dict[tuple[str, str, str, tuple[tuple[str, str], ...]], Endpoint] = {}
        self._inflight = asyncio.Semaphore(options.max_inflight)
        self._log = RateLimitedLog(log, interval=5.0)

    def owned(self) -> dict[str, str]:
        """Shards this worker owns now: shard -> topic."""
        return {name: s.topic.name for name, s in self._shards.items()}

    def topic_stats(self, topic: str) -> Stats:
        """The delivery counters of ``topic`` (delivered, retries, dead_letters by reason...)."""
        st = self.stats.get(topic)
        if st is None:
            st = self.stats[topic] = Stats("notify", topic)
        return st

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and deliver until ``stop`` is set; then stop the shards and release their leases."""
        try:
            while not stop.is_set():
                try:
                    await self._claim()
                except DfPubSubError as exc:
                    self._log.warning("claim", "walking the queues failed; retrying", error=str(exc))
                try:
                    await asyncio.wait_for(stop.wait(), self.options.renew_interval)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self._release_all()

    # -- ownership ------------------------------------------------------------------------

    async def _claim(self) -> None:
        topics = await asyncio.to_thread(self.registry.list_topics)
        wanted = {shard: t for t in topics if t.persistent for shard in self.registry.shard_names(t)}
        for name in [n for n in self._shards if n not in wanted]:
            await self._drop(name)  # its topic was deleted or made non-persistent
        for name, topic in wanted.items():
            asked = time.monotonic()
            try:
                held = await asyncio.to_thread(self.queues.lock, name, self.options.worker_id, self.options.lease)
            except DfPubSubError as exc:
                self._log.warning("lock", "lease call failed", shard=name, error=str(exc))
                continue
            shard = self._shards.get(name)
            if not held:
                if shard is not None:
                    log.warning("lost the lease of a shard", extra={"shard": name})
                    await self._drop(name)
                continue
            until = asked + self.options.lease
            if shard is not None and shard.topic != topic:
                await self._drop(name)  # the topic's attributes changed: start over with them
                shard = None
            if shard is None:
                task = asyncio.create_task(self._serve(name, topic), name=f"notify-{name}")
                self._shards[name] = _Shard(topic, task, until)
                log.info("took a shard", extra={"shard": name, "worker": self.options.worker_id})
            else:
                shard.until = until
        await self._measure({t.name: t for t in wanted.values()})

    async def _measure(self, topics: dict[str, Topic]) -> None:
        """Refresh the per-topic gauges: entries pending, shards owned here."""
        for name in topics:
            try:
                pending = (await asyncio.to_thread(self.registry.topic_stats, name)).entries
            except DfPubSubError:
                continue
            st = self.topic_stats(name)
            st.set("pending", pending)
            st.set("shards_owned", sum(1 for s in self._shards.values() if s.topic.name == name))

    async def _drop(self, name: str) -> None:
        shard = self._shards.pop(name, None)
        if shard is not None:
            shard.task.cancel()
            await asyncio.gather(shard.task, return_exceptions=True)

    async def _release_all(self) -> None:
        names = list(self._shards)
        for name in names:
            await self._drop(name)
        for name in names:
            try:
                await asyncio.to_thread(self.queues.unlock, name, self.options.worker_id)
            except DfPubSubError:
                pass  # the lease expires by itself
        for endpoint in self._endpoints.values():
            await endpoint.close()
        self._endpoints.clear()

    def _leased(self, name: str) -> bool:
        shard = self._shards.get(name)
        return shard is not None and time.monotonic() < shard.until

    # -- delivery -------------------------------------------------------------------------

    def _endpoint(self, topic: Topic) -> Endpoint:
        options = tuple(sorted(topic.endpoint_options.items()))
        key = (topic.name, topic.endpoint, topic.format, options)
        ep = self._endpoints.get(key)
        if ep is None:
            ep = self._endpoints[key] = open_endpoint(topic.endpoint, format=topic.format, options=dict(options))
        return ep

    async def _serve(self, name: str, topic: Topic) -> None:
        stats = self.topic_stats(topic.name)
        try:
            endpoint = self._endpoint(topic)
        except EndpointRejected as exc:
            endpoint = None
            log.error("bad endpoint; its entries go to the dead letters", extra={"topic": topic.name,
                                                                                   "error": str(exc)})
        while True:
            if not self._leased(name):
                await asyncio.sleep(self.options.poll_interval)  # renewal pending: deliver nothing meanwhile
                continue
            try:
                entries, _ = await asyncio.to_thread(self.queues.list, name, self.options.batch_size)
            except DfPubSubError as exc:
                self._log.warning("list", "listing a shard failed", shard=name, error=str(exc))
                await asyncio.sleep(self.options.poll_interval)
                continue
            if not entries:
                await asyncio.sleep(self.options.poll_interval)
                continue
            items: list[_Item] = []
            for e in entries:
                try:
                    items.append((e, decode(e.data)))
                except NotificationDecodeError as exc:
                    await self._dead(name, stats, [(e, None)], f"undecodable: {exc.reason}")
            if not items:
                await self._done(name, entries[-1:])
            elif endpoint is None:
                await self._dead(name, stats, items, "bad endpoint")
            else:
                await self._deliver(name, topic, endpoint, stats, items)

    async def _deliver(self, name: str, topic: Topic, endpoint: Endpoint, stats: Stats, items: list[_Item]) -> None:
        pending = items
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(EndpointError),
            wait=wait_fixed(topic.retry_sleep),
            stop=stop_after_attempt(topic.max_retries + 1) if topic.max_retries else stop_never,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        stats.inc("retries")
                    pending = await self._expire(name, topic, stats, pending)
                    if not pending:
                        return
                    pending = await self._send(name, endpoint, stats, pending)
        except EndpointError as exc:
            await self._dead(name, stats, pending, f"max_retries ({topic.max_retries}): {exc}")
        except EndpointRejected as exc:
            await self._dead(name, stats, pending, f"rejected: {exc}")

    async def _send(self, name: str, endpoint: Endpoint, stats: Stats, pending: list[_Item]) -> list[_Item]:
        """Send ``pending``; on a failure remove what the endpoint did acknowledge and re-raise."""
        try:
            async with self._inflight:
                await endpoint.send([n for _, n in pending])
        except (EndpointError, EndpointRejected) as exc:
            stats.inc("send_failures", reason="rejected" if isinstance(exc, EndpointRejected) else "retryable")
            self._log.warning("send", "delivery failed", topic=pending[0][1].topic, endpoint=endpoint.safe_url,
                              error=str(exc))
            if exc.acked:
                await self._done(name, [e for e, _ in pending[:exc.acked]])
                stats.inc("delivered", exc.acked)
                del pending[:exc.acked]
            raise
        stats.inc("delivered", len(pending))
        await self._done(name, [e for e, _ in pending])
        return []

    async def _expire(self, name: str, topic: Topic, stats: Stats, pending: list[_Item]) -> list[_Item]:
        if not topic.time_to_live:
            return pending
        now = time.time()
        expired = [i for i in pending if now - i[0].enqueued_at > topic.time_to_live]
        if not expired:
            return pending
        await self._dead(name, stats, expired, f"time_to_live ({topic.time_to_live:g} s)")
        gone = {e.marker for e, _ in expired}
        return [i for i in pending if i[0].marker not in gone]

    async def _dead(self, name: str, stats: Stats, items: Sequence[tuple[QueueEntry, Notification | None]],
                    reason: str) -> None:
        """Record ``items`` as dead letters, then remove them (the record is idempotent per marker)."""
        for e, _ in items:
            await asyncio.to_thread(self.queues.dead_letter, name, e.marker, e.data, reason)
        stats.inc("dead_letters", len(items), reason=reason.split(" ", 1)[0].rstrip(":"))
        log.warning("dead-lettered notifications", extra={"shard": name, "count": len(items), "reason": reason})
        await self._done(name, [e for e, _ in items])

    async def _done(self, name: str, entries: Sequence[QueueEntry]) -> None:
        """Remove the queue's head up to the last of ``entries`` (everything before is handled)."""
        if entries:
            await asyncio.to_thread(self.queues.remove, name, entries[-1].marker)


class DeliveryThread:
    """A :class:`DeliveryWorker` on an event loop of its own thread (for embedding and tests)."""

    def __init__(self, worker: DeliveryWorker):
        self.worker = worker
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="dfpubsub-notify", daemon=True)

    def start(self) -> "DeliveryThread":
        """Start delivering; returns at once."""
        self._thread.start()
        self._ready.wait()
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop = asyncio.Event()
        self._ready.set()
        self._loop.run_until_complete(self.worker.run(self._stop))
        self._loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the shards, release the leases, wait for the thread."""
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> "DeliveryThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
