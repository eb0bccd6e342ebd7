"""Coalescing and rate-limiting of resync requests.

Gaps tend to come in storms (a stalled subscriber loses thousands of messages
on every topic at once). Requests for a topic that is already pending merge
into one; runs are spaced by an interval that doubles, with jitter, while
requests keep coming back to back, and falls back to the base interval after
a quiet period. A failed run keeps its topics pending and backs off too.
"""

from __future__ import annotations

import random
import threading

__all__ = ["ResyncScheduler"]


class ResyncScheduler:
    """Thread-safe set of topics waiting for a resync, and when the next run may start.

    ``base_interval`` is the least time between two runs; ``max_interval``
    caps the backoff. Times are ``time.monotonic()`` values passed in.
    """

    def __init__(self, base_interval: float = 0.1, max_interval: float = 5.0, rng: random.Random | None = None):
        self.base_interval = base_interval
        self.max_interval = max_interval
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._interval = base_interval
        self._not_before = float("-inf")
        self._last_end = float("-inf")

    def request(self, topics: set[str] | list[str] | tuple[str, ...]) -> None:
        """Ask for a resync of ``topics``; merges with what is pending."""
        with self._lock:
            self._pending.update(topics)

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
            if now - self._last_end > self.max_interval:
                self._interval = self.base_interval
            topics, self._pending = self._pending, set()
            return topics

    def done(self, topics: set[str], ok: bool, now: float) -> None:
        """Record the end of a run; on failure ``topics`` wait for the next one."""
        with self._lock:
            if not ok:
                self._pending.update(topics)
            if self._pending or not ok:
                # Back to back (or failing): widen the spacing.
                self._interval = min(self._interval * 2, self.max_interval)
            half = self._interval / 2
            self._not_before = now + half + self._rng.uniform(0, half)
            self._last_end = now
