"""A controller's work queue of keys, with client-go's guarantees.

* A key waits at most once: adding a key already waiting is a no-op (changes
  arriving meanwhile collapse into one piece of work, which reads the newest
  state when it runs).
* A key is never handed to two workers at once: a key added while a worker
  holds it is marked dirty and queued again only when that worker calls
  :meth:`WorkQueue.done`.
* Retries wait ``RateLimiter.when(key)`` (per-key exponential backoff, overall
  token bucket) in a delayed set; :meth:`WorkQueue.forget` resets the backoff.
  A key handed to a worker leaves the delayed set: that run reads the newest
  state and schedules its own retry if it fails.
* The queue is bounded: :meth:`WorkQueue.add` blocks while ``max_depth`` keys
  wait (back-pressure on the caller); retries and re-adds of dirty keys never
  block, so a worker cannot deadlock on its own queue.

Depth, adds, retries, the oldest key's age and the wait and work latencies are
exported through :class:`~dfpubsub.metrics.Stats`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from .metrics import Stats
from .ratelimit import RateLimiter

__all__ = ["WorkQueue"]

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys waiting for a worker; see the module docstring for the guarantees. Thread-safe."""

    def __init__(
        self,
        limiter: RateLimiter | None = None,
        max_depth: int = 65536,
        stats: Stats | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_depth < 1:
            raise ValueError("max_depth must be at least 1")
        self.limiter = limiter or RateLimiter()
        self.max_depth = max_depth
        self.stats = stats or Stats("workqueue", "workqueue")
        self._clock = clock
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._changed = threading.Condition(self._lock)  # for wait_idle
        self._queue: deque[K] = deque()
        self._dirty: dict[K, float] = {}  # key -> when it became dirty; every queued key is dirty
        self._processing: dict[K, float] = {}  # key -> when a worker took it
        self._delayed: list[tuple[float, int, K]] = []  # heap of (due, tie-breaker, key)
        self._due: dict[K, float] = {}  # key -> its earliest due time in the heap
        self._seq = itertools.count()
        self._batches: dict[int, deque[K]] = {}  # worker thread -> its last batch (see done_and_take)
        # Threads blocked in get(), add() and wait_idle(): notify only when someone listens.
        self._getters = self._adders = self._idlers = 0
        self._shutdown = False
        self._wait = self.stats.histogram("workqueue_wait")
        self._work = self.stats.histogram("workqueue_work")
        stats = self.stats
        stats.set("workqueue_depth", self.__len__)
        stats.set("workqueue_oldest_seconds", self.oldest_age)
        stats.set("workqueue_delayed", lambda: len(self._due))
        stats.set("workqueue_processing", lambda: len(self._processing))

    # -- producers -----------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` unless it waits already; block while the queue is full."""
        with self._lock:
            self._put_locked(key, self._clock())

    def add_many(self, keys: Iterable[K]) -> None:
        """:meth:`add` each of ``keys``, under one lock (a batch of changes costs one wake-up)."""
        with self._lock:
            if self._shutdown:
                return
            now = self._clock()
            dirty, processing, queue, max_depth = self._dirty, self._processing, self._queue, self.max_depth
            added = 0
            for key in keys:  # the dispatch thread's hot path: _put_locked inlined but for a full queue
                if key in dirty:
                    continue
                if key in processing:
                    dirty[key] = now
                    added += 1
                elif len(queue) < max_depth:
                    dirty[key] = now
                    queue.append(key)
                    added += 1
                else:
                    self._put_locked(key, now)  # waits for room, the lock released meanwhile
                    if self._shutdown:
                        break
            if added:
                self.stats.inc("workqueue_adds", added)
                if self._getters:
                    self._not_empty.notify(min(added, self._getters))

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` once ``delay`` seconds have passed (at once when ``delay`` <= 0)."""
        with self._lock:
            if self._shutdown:
                return
            self.stats.inc("workqueue_retries")
            now = self._clock()
            if delay <= 0:
                self._add_locked(key, now)
                return
            due = now + delay
            if self._due.get(key, float("inf")) <= due:
                return
            self._due[key] = due
            heapq.heappush(self._delayed, (due, next(self._seq), key))
            if self._getters:
                self._not_empty.notify()  # a sleeping worker may need to wake earlier

    def add_rate_limited(self, key: K) -> None:
        """Queue ``key`` after its rate-limited delay (one more failure of it)."""
        self.add_after(key, self.limiter.when(key))

    def forget(self, key: K) -> None:
        """``key`` succeeded: its next failure backs off from the start."""
        if key in self.limiter.failing:  # most keys never failed: one lookup for them
            self.limiter.forget(key)

    def retries(self, key: K) -> int:
        """Rate-limited retries of ``key`` since it was last forgotten."""
        return self.limiter.failures(key)

    # -- workers -----------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> K | None:
        """Take the next key (the caller must call :meth:`done` with it); None on timeout or shutdown."""
        with self._lock:
            return self._get_locked(timeout)

    def done(self, key: K) -> None:
        """The worker is finished with ``key``; if it changed meanwhile it is queued again."""
        with self._lock:
            self._done_locked((key,))

    def done_and_take(self, keys: Iterable[K], most: int = 32) -> deque[K]:
        """:meth:`done` with each of ``keys``, then take the next keys, under one lock: one (waiting
        for it as :meth:`get` does), and up to ``most`` more that are ready, so that a busy queue
        costs a worker one lock round per batch instead of one per key. Empty on shutdown.

        The caller takes the batch's keys one by one with ``popleft()`` and passes those it took
        to its next call. Until then, workers that find the queue empty take keys from the other
        end of the batch, so that no key waits behind a slow one taken with it while a worker
        is idle (work stealing; each key still goes to one worker only)."""
        with self._lock:
            if keys:
                self._done_locked(keys)
            first = self._get_locked(None)
            if first is None:
                return deque()
            more = min(most, len(self._queue))
            if more <= 0:
                return deque((first,))
            out = self._take_locked(self._clock(), more)
            out.appendleft(first)
            if self._adders:
                self._not_full.notify(more)
            # One batch per worker thread at a time, so the map stays as small as the pool.
            self._batches[threading.get_ident()] = out
            if self._getters:
                self._not_empty.notify()  # an idle worker may share it
            return out

    def start(self, key: K) -> None:
        """The worker begins ``key``, taken earlier in a batch, now. Changes of it queued until now
        are in the state it is about to read (a caller applies a change before adding its key),
        so they need no second run after :meth:`done`. Lock-free: one atomic dict removal (the
        key stays with this worker until its done, so nothing else moves it meanwhile)."""
        if key in self._processing:  # a key still queued must keep its mark
            self._dirty.pop(key, None)

    # -- state ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys waiting for a worker (not counting delayed retries nor keys being processed)."""
        return len(self._queue)

    def oldest_age(self) -> float:
        """Seconds the longest-waiting key has waited (0 when none waits)."""
        with self._lock:
            if not self._queue:
                return 0.0
            return max(0.0, self._clock() - self._dirty[self._queue[0]])

    def delayed(self) -> int:
        """Keys waiting for their retry delay."""
        with self._lock:
            return len(self._due)

    def idle(self) -> bool:
        """Nothing queued and nothing being processed (delayed retries do not count)."""
        with self._lock:
            return not self._queue and not self._processing

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until :meth:`idle` (or shutdown); return whether the queue was idle."""
        with self._lock:
            self._idlers += 1
            try:
                return self._changed.wait_for(lambda: self._shutdown or not (self._queue or self._processing),
                                              timeout) and not self._shutdown
            finally:
                self._idlers -= 1

    @property
    def shutting_down(self) -> bool:
        return self._shutdown

    def shutdown(self) -> None:
        """Stop handing out keys: blocked and later :meth:`get` calls return None, adds are ignored.
        Workers still holding a key finish it and call :meth:`done` as usual."""
        with self._lock:
            self._shutdown = True
            self._not_empty.notify_all()
            self._not_full.notify_all()
            self._changed.notify_all()

    # -- internals ---------------------------------------------------------------------

    def _get_locked(self, timeout: float | None) -> K | None:
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            if self._shutdown:
                return None
            now = self._clock()
            if self._delayed:
                self._promote_locked(now)
            if self._queue:
                key = self._take_locked(now, 1)[0]
                if self._adders:
                    self._not_full.notify()
                return key
            if self._batches:
                stolen = self._steal_locked()
                if stolen is not None:
                    return stolen
            wait = None if deadline is None else deadline - now
            if self._delayed:
                until_due = self._delayed[0][0] - now
                wait = until_due if wait is None else min(wait, until_due)
            if wait is not None and wait <= 0:
                if deadline is not None and now >= deadline:
                    return None
                continue
            self._getters += 1
            try:
                self._not_empty.wait(wait)
            finally:
                self._getters -= 1

    def _take_locked(self, now: float, n: int) -> deque[K]:
        """Hand the first ``n`` queued keys to the calling worker."""
        popleft, dirty, due, processing = self._queue.popleft, self._dirty, self._due, self._processing
        out: deque[K] = deque()
        queued: list[float] = []
        for _ in range(n):  # a lone worker's hot path, a batch of keys at a time
            key = popleft()
            queued.append(dirty.pop(key))
            # This run reads the newest state and decides about retries itself:
            # a retry still pending would only run it again for nothing.
            if due:
                due.pop(key, None)
            processing[key] = now
            out.append(key)
        self._wait.observe_since(now, queued)
        return out

    def _steal_locked(self) -> K | None:
        """A key another worker took in a batch and has not started (None: there is none)."""
        for batch in self._batches.values():
            try:
                key = batch.pop()  # atomic against the owner's popleft(), which needs no lock
            except IndexError:
                continue
            self.stats.inc("workqueue_steals")
            return key
        return None

    def _done_locked(self, keys: Iterable[K]) -> None:
        release, dirty, queue = self._processing.pop, self._dirty, self._queue
        started: list[float] = []
        requeued = 0
        for key in keys:
            t = release(key, None)
            if t is not None:
                started.append(t)
            if key in dirty and not self._shutdown:
                queue.append(key)
                requeued += 1
        self._work.observe_since(self._clock(), started)
        if requeued and self._getters:
            self._not_empty.notify(requeued)
        if self._idlers:
            self._changed.notify_all()

    def _put_locked(self, key: K, now: float) -> None:
        if self._shutdown or key in self._dirty:
            return
        if key not in self._processing and len(self._queue) >= self.max_depth:
            self.stats.inc("workqueue_full")
            self._adders += 1
            try:
                while len(self._queue) >= self.max_depth and not self._shutdown:
                    self._not_full.wait()
            finally:
                self._adders -= 1
            if self._shutdown or key in self._dirty:
                return
            now = self._clock()
        self._add_locked(key, now)

    def _add_locked(self, key: K, now: float) -> None:
        if key in self._dirty:
            return
        self.stats.inc("workqueue_adds")
        self._dirty[key] = now
        if key in self._processing:
            return  # queued again by done()
        self._queue.append(key)
        if self._getters:
            self._not_empty.notify()

    def _promote_locked(self, now: float) -> None:
        delayed, due = self._delayed, self._due
        while delayed and delayed[0][0] <= now:
            when, _, key = heapq.heappop(delayed)
            if due.get(key) == when:  # else superseded by an earlier due time
                del due[key]
                self._add_locked(key, now)
