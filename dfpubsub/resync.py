"""Coalescing and rate-limiting of resync requests.

Gaps tend to come in storms (a stalled subscriber loses thousands of messages
on every topic at once), and a flapping peer or a hostile one can keep asking
forever. Requests for a topic that is already pending merge into one. A
request that arrives while a run is under way, or before the spacing after
the last run has passed, is *back to back*: it doubles the spacing (once per
run), with jitter, up to ``max_interval``. The first request after a quiet
spell of ``max_interval`` starts again from the base interval. A failed run
keeps its topics pending and backs off too.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable

from .retry import equal_jitter

__all__ = ["ResyncScheduler"]


class ResyncScheduler:
    """Thread-safe set of topics waiting for a resync, and when the next run may start.

    ``base_interval`` is the least time between two runs; ``max_interval``
    caps the backoff and is the quiet spell after which it resets. Times are
    ``clock()`` values (``time.monotonic`` unless a test hands in its own).
    """

    def __init__(self, base_interval: float = 0.1, max_interval: float = 5.0, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.base_interval = base_interval
        self.max_interval = max_interval
        self._rng = rng or random.Random()
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._interval = base_interval
        self._not_before = float("-inf")
        self._last_end = float("-inf")
        self._running = False
        self._widened = False  # this run's spacing was already doubled

    @property
    def interval(self) -> float:
        """The current spacing between runs (the jitter draws within its upper half)."""
        with self._lock:
            return self._interval

    def request(self, topics: Iterable[str]) -> None:
        """Ask for a resync of ``topics``; merges with what is pending."""
        now = self._clock()
        with self._lock:
            self._pending.update(topics)
            if self._running or now < self._last_end + self._interval:
                self._widen()
                if not self._running:
                    self._not_before = self._last_end + self._jitter()
            elif now - self._last_end > self.max_interval:
                self._interval = self.base_interval

    def pending(self) -> set[str]:
        """Topics waiting for a resync."""
        with self._lock:
            return set(self._pending)

    def due(self) -> float | None:
        """Earliest time the next run may start, or None when nothing is pending."""
        with self._lock:
            return self._not_before if self._pending else None

    def take(self, now: float) -> set[str]:
        """Return the pending topics if a run may start now (and clear them), else an empty set."""
        with self._lock:
            if not self._pending or now < self._not_before:
                return set()
            topics, self._pending = self._pending, set()
            self._running = True
            self._widened = False
            return topics

    def done(self, topics: set[str], ok: bool, now: float) -> None:
        """Record the end of a run; on failure ``topics`` wait for the next one."""
        with self._lock:
            self._running = False
            if not ok:
                self._pending.update(topics)
                self._widen()
            self._not_before = now + self._jitter()
            self._last_end = now

    def _widen(self) -> None:
        if not self._widened:
            self._interval = min(self._interval * 2, self.max_interval)
            self._widened = True

    def _jitter(self) -> float:
        return equal_jitter(self._interval, self._rng)
