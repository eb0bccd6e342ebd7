"""Delivering persistent notifications: the worker that df-notify runs.

Every ``renew_interval`` the worker walks the registry of topics: for each
shard of each persistent topic it renews the lease it holds, skips one that
another worker holds, and takes one whose lease expired (after ``lease``
seconds without renewal; Ceph's 30 s / 90 s by default). Only the owner
lists, delivers and removes.

Each owned shard has one task, which keeps per-key order (all events of a key
hash to one shard) and runs rounds of :class:`~dfpubsub.notify.shard.ShardRound`:
list the head, set aside what cannot be delivered, send the rest, remove
exactly what was delivered (at least once: a crash after the ack and before
the removal sends them again).

**Supervision.** A round that fails unexpectedly (the queue backend is down,
a bug) is logged with the shard and tried again with a growing pause; a shard
that keeps failing for longer than a ``lease`` is given up: its lease is
released at once, so another worker can take it, and this worker does not
take it back before its next walk. A shard's task never ends silently while
its lease is renewed.

**Isolation.** A send takes one of its topic's in-flight slots
(``endpoint_inflight``, or the topic's ``max_inflight`` endpoint option)
before one of the worker's (``max_inflight``): a hung endpoint holds only its
own slots, and the other topics keep theirs.

Queue calls are blocking (SQLite, Redis, etcd clients) and run in worker
threads; endpoints are asyncio.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from ..endpoints import Endpoint, open_endpoint
from ..errors import DfPubSubError, EndpointRejected
from ..logs import RateLimitedLog
from ..metrics import Stats
from ..queues import QueueStore
from ..retry import backoff_delay
from .registry import NotificationRegistry
from .shard import ShardRound, Slots
from .topics import Topic

__all__ = ["DeliveryOptions", "DeliveryWorker", "DeliveryThread"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DeliveryOptions:
    """Tuning of a :class:`DeliveryWorker` (the ``[notify]`` settings)."""

    worker_id: str
    renew_interval: float = 30.0
    lease: float = 90.0
    poll_interval: float = 0.2
    batch_size: int = 100
    max_inflight: int = 64
    endpoint_inflight: int = 8


class _Shard:
    """An owned shard: its task and until when the lease surely holds (monotonic)."""

    __slots__ = ("topic", "task", "until")

    def __init__(self, topic: Topic, task: asyncio.Task[None], until: float):
        self.topic = topic
        self.task = task
        self.until = until


class _Link:
    """A topic's endpoint and its in-flight slots."""

    __slots__ = ("endpoint", "slots")

    def __init__(self, endpoint: Endpoint | None, slots: Slots):
        self.endpoint = endpoint
        self.slots = slots


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
        self._links: dict[tuple[str, str, str, tuple[tuple[str, str], ...]], _Link] = {}
        self._inflight = asyncio.Semaphore(options.max_inflight)
        self._benched: dict[str, float] = {}  # shards given up: not taken back before (monotonic)
        self._log = RateLimitedLog(log, interval=5.0)
        #: When the last walk of the queues went well (monotonic; None: never), and why the last
        #: one failed (None: it did not): what df-notify's readiness probe reports.
        self.walked: float | None = None
        self.walk_error: str | None = None

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
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                # A walk makes a backend call per shard: a stop does not wait for the rest of them.
                walk = asyncio.ensure_future(self._claim())
                await asyncio.wait((walk, stopped), return_when=asyncio.FIRST_COMPLETED)
                if not walk.done():
                    walk.cancel()
                    await asyncio.gather(walk, return_exceptions=True)
                    break
                try:
                    walk.result()
                    self.walked, self.walk_error = time.monotonic(), None
                except DfPubSubError as exc:
                    self.walk_error = str(exc)
                    self._log.warning("claim", "walking the queues failed; retrying", error=str(exc))
                try:
                    await asyncio.wait_for(stop.wait(), self.options.renew_interval)
                except TimeoutError:
                    pass
        finally:
            stopped.cancel()
            await self._release_all()

    # -- ownership ------------------------------------------------------------------------

    async def _claim(self) -> None:
        topics = await asyncio.to_thread(self.registry.list_topics)
        wanted = {shard: t for t in topics if t.persistent for shard in self.registry.shard_names(t)}
        for name in [n for n in self._shards if n not in wanted]:
            await self._drop(name)  # its topic was deleted or made non-persistent
        now = time.monotonic()
        self._benched = {n: t for n, t in self._benched.items() if t > now}
        for name, topic in wanted.items():
            shard = self._shards.get(name)
            if shard is not None and shard.task.done():
                # Cannot happen (the task is supervised); if it does, never renew a lease nobody serves.
                log.error("a shard's task ended; releasing the shard", extra={"shard": name})
                await self._release(name)
                continue
            if name in self._benched:
                continue
            asked = time.monotonic()
            try:
                held = await asyncio.to_thread(self.queues.lock, name, self.options.worker_id, self.options.lease)
            except DfPubSubError as exc:
                self._log.warning("lock", "lease call failed", shard=name, error=str(exc))
                continue
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

    async def _unlock(self, name: str) -> None:
        try:
            await asyncio.to_thread(self.queues.unlock, name, self.options.worker_id)
        except DfPubSubError:
            pass  # the lease expires by itself

    async def _release(self, name: str) -> None:
        """Stop serving ``name`` and release its lease at once; skip it until the next walk."""
        if self._shards.pop(name, None) is not None:
            self._benched[name] = time.monotonic() + self.options.renew_interval
        await self._unlock(name)

    async def _release_all(self) -> None:
        names = list(self._shards)
        for name in names:
            await self._drop(name)
        # Released at once so another worker takes them on its next walk, all together and for a
        # bounded time: a stop must not wait a backend timeout per shard. Unreleased (the backend
        # down: the last walk failed), a lease expires by itself.
        if names and self.walk_error is None:
            unlocks = asyncio.gather(*(self._unlock(name) for name in names))
            try:
                await asyncio.wait_for(unlocks, min(2.0, self.options.lease / 3))
            except TimeoutError:
                log.warning("stopped before every lease was released; they expire by themselves",
                            extra={"shards": len(names)})
        for link in self._links.values():
            if link.endpoint is not None:
                await link.endpoint.close()
        self._links.clear()

    def _leased(self, name: str) -> bool:
        shard = self._shards.get(name)
        return shard is not None and time.monotonic() < shard.until

    # -- delivery -------------------------------------------------------------------------

    def _link(self, topic: Topic) -> _Link:
        options = tuple(sorted(topic.endpoint_options.items()))
        key = (topic.name, topic.endpoint, topic.format, options)
        link = self._links.get(key)
        if link is None:
            own = self.options.endpoint_inflight
            try:
                opened = open_endpoint(topic.endpoint, format=topic.format, options=dict(options))
                endpoint: Endpoint | None = opened
                own = opened.max_inflight or own
            except EndpointRejected as exc:
                endpoint = None
                log.error("bad endpoint; its entries go to the dead letters", extra={"topic": topic.name,
                                                                                       "error": str(exc)})
            link = self._links[key] = _Link(endpoint, Slots(asyncio.Semaphore(own), self._inflight))
        return link

    async def _serve(self, name: str, topic: Topic) -> None:
        """The shard's task: rounds until cancelled, supervised (see the module docstring)."""
        stats = self.topic_stats(topic.name)
        link = self._link(topic)
        shard = ShardRound(name, topic, self.queues, link.endpoint, link.slots, stats, self.options.batch_size,
                           lambda: self._leased(name), self._log)
        failing_since: float | None = None
        failures = 0
        while True:
            if not self._leased(name):
                await asyncio.sleep(self.options.poll_interval)  # renewal pending: deliver nothing meanwhile
                continue
            try:
                busy = await shard.run()
            except Exception as exc:  # noqa: BLE001 - supervised: every failure is logged and retried
                now = time.monotonic()
                failing_since = failing_since or now
                failures += 1
                stats.inc("shard_failures")
                log.error("delivering a shard failed; retrying", exc_info=not isinstance(exc, DfPubSubError),
                          extra={"shard": name, "topic": topic.name, "failures": failures, "error": str(exc)})
                if now - failing_since > self.options.lease:
                    log.error("a shard keeps failing; releasing its lease for another worker",
                              extra={"shard": name, "topic": topic.name, "failures": failures})
                    await self._release(name)
                    return
                # Doubling at most 16 times: the cap is renew_interval, or poll_interval * 2**16 if smaller.
                await asyncio.sleep(backoff_delay(self.options.poll_interval, self.options.renew_interval,
                                                  min(failures, 16)))
                continue
            failing_since, failures = None, 0
            if not busy:
                await asyncio.sleep(self.options.poll_interval)


class DeliveryThread:
    """A :class:`DeliveryWorker` on an event loop of its own thread (for embedding and tests)."""

    def __init__(self, worker: DeliveryWorker):
        self.worker = worker
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="dfpubsub-notify", daemon=True)

    def start(self) -> DeliveryThread:
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

    def __enter__(self) -> DeliveryThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
