"""Rate limiting of a work queue's retries, in the manner of client-go's default controller limiter.

A failing key waits ``max(per-key exponential backoff, overall token bucket)``:
the backoff (``base * 2**failures``, capped at ``max_delay``, computed by
:func:`dfpubsub.retry.backoff_delay`) keeps one broken key from spinning, the
bucket (``qps`` tokens a second, ``burst`` at most) keeps a storm of failing
keys from hammering what they call. ``forget(key)`` resets
the key's backoff once it succeeds. Times come from an injectable clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping

from ..retry import backoff_delay

__all__ = ["ExponentialBackoff", "TokenBucket", "RateLimiter"]


class ExponentialBackoff:
    """Per-key delay ``base * 2**failures``, at most ``max_delay`` (client-go: 5 ms .. 1000 s)."""

    def __init__(self, base: float = 0.005, max_delay: float = 1000.0):
        if base <= 0 or max_delay < base:
            raise ValueError("backoff needs 0 < base <= max_delay")
        self.base = base
        self.max_delay = max_delay
        self._failures: dict[Hashable, int] = {}
        #: The keys with failures, for a membership test without the lock (writes hold it).
        self.failing: Mapping[Hashable, int] = self._failures
        self._lock = threading.Lock()

    def when(self, key: Hashable) -> float:
        """Record one more failure of ``key``; return how long it waits."""
        with self._lock:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        return backoff_delay(self.base, self.max_delay, n)

    def failures(self, key: Hashable) -> int:
        """Failures of ``key`` since it was last forgotten."""
        with self._lock:
            return self._failures.get(key, 0)

    def forget(self, key: Hashable) -> None:
        """``key`` succeeded: its next failure starts from ``base`` again."""
        if key in self._failures:  # most keys never failed: no lock for them
            with self._lock:
                self._failures.pop(key, None)


class TokenBucket:
    """``qps`` tokens a second up to ``burst``; each reservation takes one, possibly in advance.

    A reservation made while the bucket is empty is still granted, at the time
    the bucket will have refilled that far (the debt carries over), as
    golang.org/x/time/rate's ``Reserve().Delay()`` does.
    """

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Callable[[], float] = time.monotonic):
        if qps <= 0 or burst < 1:
            raise ValueError("token bucket needs qps > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token; return the seconds until it is really available (0 when at once)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


class RateLimiter:
    """The delay of a key's retry: the larger of its backoff and the bucket's reservation."""

    def __init__(self, backoff: ExponentialBackoff | None = None, bucket: TokenBucket | None = None):
        self.backoff = backoff or ExponentialBackoff()
        self.bucket = bucket or TokenBucket()
        self.failing = self.backoff.failing

    def when(self, key: Hashable) -> float:
        """One more failure of ``key``: seconds until it may be retried."""
        return max(self.backoff.when(key), self.bucket.reserve())

    def failures(self, key: Hashable) -> int:
        """Retries of ``key`` since it was last forgotten."""
        return self.backoff.failures(key)

    def forget(self, key: Hashable) -> None:
        """``key`` succeeded: reset its backoff."""
        self.backoff.forget(key)
