"""Coalescing and rate-limiting of resync requests.

Gaps tend to come in storms (a stalled subscriber loses thousands of messages
on every topic at once), and a flapping peer or a hostile one can keep asking
forever. Requests for a topic that is already pending merge into one. A
request that arrives while a run is under way, or before the spacing after
the last run has passed, is *back to back*: it doubles the spacing (once per
run), with jitter, up to ``max_interval``. The first request after a quiet
spell of ``max_interval`` starts again from the base interval. A failed run
keeps its topics pending and backs off too.

Each request says why (a gap, a dead publisher, an overflow...): the reasons
coalesce with their topics and travel with them, so whoever runs the resync
knows every reason behind it (a controller counts its repair under one cause),
a failed run's included, with no bookkeeping of its own.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from .retry import equal_jitter

__all__ = ["ResyncScheduler", "ResyncTopics"]


class ResyncTopics(set[str]):
    """The topics of one resync run (a set, as every resync handler takes them), with
    :attr:`reasons`: per topic, why it was asked for since its last run."""

    __slots__ = ("reasons",)

    def __init__(self, reasons: Mapping[str, frozenset[str]] | Iterable[str] = ()):
        # Any iterable of topics too (what copy and pickle hand a set's subclass): no reasons known.
        found = dict(reasons) if isinstance(reasons, Mapping) else dict.fromkeys(reasons, frozenset[str]())
        super().__init__(found)
        self.reasons: dict[str, frozenset[str]] = found

    def only(self, topics: Iterable[str]) -> ResyncTopics:
        """Those of ``topics`` among these, with their reasons."""
        return ResyncTopics({t: r for t, r in self.reasons.items() if t in topics})


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
        self._pending: dict[str, set[str]] = {}  # topic -> the reasons it was asked for
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

    def request(self, topics: Iterable[str], reason: str = "manual") -> None:
        """Ask for a resync of ``topics`` because of ``reason``; merges with what is pending."""
        now = self._clock()
        with self._lock:
            pending = self._pending
            for topic in topics:
                reasons = pending.get(topic)
                if reasons is None:
                    pending[topic] = {reason}
                else:
                    reasons.add(reason)
            if self._running or now < self._last_end + self._interval:
                self._widen()
                if not self._running:
                    self._not_before = self._last_end + self._jitter()
            elif now - self._last_end > self.max_interval:
                self._interval = self.base_interval

    def pending(self) -> set[str]:
        """Topics waiting for a resync."""
        with self._lock:
            return set(self._pending)  # the topics

    def due(self) -> float | None:
        """Earliest time the next run may start, or None when nothing is pending."""
        with self._lock:
            return self._not_before if self._pending else None

    def take(self, now: float) -> ResyncTopics:
        """Return the pending topics (with their reasons) if a run may start now, and clear them;
        else an empty set."""
        with self._lock:
            if not self._pending or now < self._not_before:
                return ResyncTopics({})
            taken, self._pending = self._pending, {}
            self._running = True
            self._widened = False
        return ResyncTopics({t: frozenset(r) for t, r in taken.items()})

    def done(self, topics: set[str], ok: bool, now: float) -> None:
        """Record the end of a run; on failure ``topics`` wait for the next one, with their
        reasons where ``topics`` is the :class:`ResyncTopics` that :meth:`take` returned."""
        reasons = topics.reasons if isinstance(topics, ResyncTopics) else {}
        with self._lock:
            self._running = False
            if not ok:
                for topic in topics:
                    self._pending.setdefault(topic, set()).update(reasons.get(topic) or ("manual",))
                self._widen()
            self._not_before = now + self._jitter()
            self._last_end = now

    def _widen(self) -> None:
        if not self._widened:
            self._interval = min(self._interval * 2, self.max_interval)
            self._widened = True

    def _jitter(self) -> float:
        return equal_jitter(self._interval, self._rng)
