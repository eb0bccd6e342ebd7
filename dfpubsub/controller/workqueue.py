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
from typing import Any, Generic, TypeVar, cast

from ..metrics import Stats
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
        self._lock = _YieldingLock()
        lock = cast(Any, self._lock)  # has what Condition uses of a lock: acquire, release
        self._not_empty = threading.Condition(lock)
        self._not_full = threading.Condition(lock)
        self._idle = threading.Condition(lock)
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()  # the keys of _queue
        # When keys joined _queue, in runs: [time, keys added then], summing to len(_queue). A
        # batch of keys queued together shares its time: no clock reading nor float per key.
        self._stamps: deque[list[float]] = deque()
        self._held: dict[K, float] = {}  # key -> when a worker took it
        self._changed: set[K] = set()  # held keys added again since their reconcile started
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
        stats.set("workqueue_processing", lambda: len(self._held))

    # -- producers -----------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` unless it waits already; block while the queue is full."""
        with self._lock:
            self._put_locked(key)

    def add_many(self, keys: Iterable[K]) -> None:
        """:meth:`add` each of ``keys``, under one lock (a batch of changes costs one wake-up)."""
        with self._lock:
            if self._shutdown:
                return
            queued, held, changed, queue, max_depth = self._queued, self._held, self._changed, self._queue, self.max_depth
            added = appended = 0
            for key in keys:  # the dispatch thread's hot path: _put_locked inlined but for a full queue
                if key in queued:
                    continue
                if key in held:
                    if key not in changed:
                        changed.add(key)
                        added += 1
                elif len(queue) < max_depth:
                    queued.add(key)
                    queue.append(key)
                    appended += 1
                else:
                    if appended:
                        self._stamp_locked(self._clock(), appended)
                        added, appended = added + appended, 0
                    self._put_locked(key)  # waits for room, the lock released meanwhile
                    if self._shutdown:
                        break
            if appended:
                self._stamp_locked(self._clock(), appended)
                added += appended
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
        so they need no second run after :meth:`done`. Lock-free: one atomic set removal, and
        none while no held key changed (the common case)."""
        if self._changed:
            self._changed.discard(key)

    # -- state ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys waiting for a worker (not counting delayed retries nor keys being processed)."""
        return len(self._queue)

    def oldest_age(self) -> float:
        """Seconds the longest-waiting key has waited (0 when none waits)."""
        with self._lock:
            if not self._queue:
                return 0.0
            return max(0.0, self._clock() - self._stamps[0][0])

    def delayed(self) -> int:
        """Keys waiting for their retry delay."""
        with self._lock:
            return len(self._due)

    def idle(self) -> bool:
        """Nothing queued and nothing being processed (delayed retries do not count)."""
        with self._lock:
            return not self._queue and not self._held

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until :meth:`idle` (or shutdown); return whether the queue was idle."""
        with self._lock:
            self._idlers += 1
            try:
                return self._idle.wait_for(lambda: self._shutdown or not (self._queue or self._held),
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
            self._idle.notify_all()

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
        popleft, unqueue, due, held = self._queue.popleft, self._queued.remove, self._due, self._held
        out: deque[K] = deque()
        for _ in range(n):  # a lone worker's hot path, a batch of keys at a time
            key = popleft()
            unqueue(key)
            # This run reads the newest state and decides about retries itself:
            # a retry still pending would only run it again for nothing.
            if due:
                due.pop(key, None)
            held[key] = now
            out.append(key)
        # The keys' waits, a run of keys queued together at a time.
        stamps, observe = self._stamps, self._wait.observe
        while n:
            run = stamps[0]
            if run[1] > n:
                run[1] -= n
                observe(now - run[0], n)
                break
            stamps.popleft()
            observe(now - run[0], int(run[1]))
            n -= int(run[1])
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
        release, changed, now = self._held.pop, self._changed, self._clock()
        observe = self._work.observe
        requeue: list[K] = []
        since, run = now, 0  # keys taken together share their time: one observation per run
        for key in keys:
            t = release(key, None)
            if t is not None:
                if t != since:
                    if run:
                        observe(now - since, run)
                    since, run = t, 0
                run += 1
            if changed and key in changed:
                changed.remove(key)
                requeue.append(key)
        if run:
            observe(now - since, run)
        if requeue and not self._shutdown:
            self._queue.extend(requeue)
            self._queued.update(requeue)
            self._stamp_locked(now, len(requeue))
            if self._getters:
                self._not_empty.notify(len(requeue))
        if self._idlers:
            self._idle.notify_all()

    def _put_locked(self, key: K) -> None:
        if self._shutdown or key in self._queued:
            return
        if key not in self._held and len(self._queue) >= self.max_depth:
            self.stats.inc("workqueue_full")
            self._adders += 1
            try:
                while len(self._queue) >= self.max_depth and not self._shutdown:
                    self._not_full.wait()
            finally:
                self._adders -= 1
            if self._shutdown:
                return
        self._add_locked(key, self._clock())

    def _add_locked(self, key: K, now: float) -> None:
        if key in self._queued:
            return
        if key in self._held:  # queued again by done()
            if key not in self._changed:
                self._changed.add(key)
                self.stats.inc("workqueue_adds")
            return
        self.stats.inc("workqueue_adds")
        self._queued.add(key)
        self._queue.append(key)
        self._stamp_locked(now, 1)
        if self._getters:
            self._not_empty.notify()

    def _stamp_locked(self, now: float, n: int) -> None:
        """``n`` keys joined the queue at ``now``."""
        stamps = self._stamps
        if stamps and stamps[-1][0] == now:
            stamps[-1][1] += n
        else:
            stamps.append([now, n])

    def _promote_locked(self, now: float) -> None:
        delayed, due = self._delayed, self._due
        while delayed and delayed[0][0] <= now:
            when, _, key = heapq.heappop(delayed)
            if due.get(key) == when:  # else superseded by an earlier due time
                del due[key]
                self._add_locked(key, now)


class _YieldingLock:
    """A lock for short critical sections between Python threads that does not convoy under the GIL.

    A thread blocked on a plain lock wakes holding the lock but not the GIL, while the thread
    holding the GIL soon needs the lock: each turns the other away, and every lock round of the
    dispatch thread and a worker becomes a GIL hand-off (measured: ~600 a second each way, for
    50k events, and 12% fewer events a second; tools/bench/controller.py). A waiter here gives
    the GIL up (``sleep(0)``) and retries, so the holder, which needs the GIL to leave the
    section, goes first; only after many tries does it block as a plain lock does.
    """

    __slots__ = ("_lock", "release", "locked")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.release = self._lock.release
        self.locked = self._lock.locked

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        lock = self._lock
        if lock.acquire(False):
            return True
        if not blocking:
            return False
        for _ in range(100):
            time.sleep(0)  # releases the GIL: the holder runs
            if lock.acquire(False):
                return True
        return lock.acquire(True, timeout)

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
