"""Backoff: how long to wait after failures before trying again; the one home of that formula.

The pause after ``n`` consecutive failures is ``base * 2**n``, at most ``cap``
(:func:`backoff_delay`). :class:`Backoff` keeps ``n`` for one retry loop:
``failed()`` counts a failure and returns the pause, ``reset()`` is called on
success. Optional jitter draws the pause in its upper half
(:func:`equal_jitter`), so peers that failed together do not retry in step.

The loops that use it wait on their own stop event or condition, so a close
ends the pause at once; this module only computes. Standard library only: it
sits below every other module of the core, the drivers and the services.

tenacity runs the retries that are one call repeated until it answers or a
deadline passes, with nothing else to watch (the private test servers'
start-up wait, :mod:`dfpubsub.testing.servers`). The loops that keep a
:class:`Backoff` are not that: each must end its pause when closed (a stop
event, a condition that close notifies), logs and counts each failure, resets
on a success that does not end the loop (a watch that ran, a step of a run
loop), or fails fast instead of sleeping (the Redis driver's calls).
"""

from __future__ import annotations

import random
import time

__all__ = ["Backoff", "backoff_delay", "equal_jitter"]

#: Doubling stops here: ``2.0 ** 1024`` overflows a float (and the cap wins long before).
_MAX_DOUBLINGS = 1023
_RNG = random.Random()


def backoff_delay(base: float, cap: float, failures: int) -> float:
    """``base * 2**failures``, at most ``cap``: the pause after ``failures`` earlier failures.

    Overflow-safe for any count. ``failures`` 0 gives ``base``.
    """
    return min(base * 2.0 ** min(failures, _MAX_DOUBLINGS), cap)


def equal_jitter(delay: float, rng: random.Random | None = None) -> float:
    """A random pause in the upper half of ``delay``: ``delay/2 + uniform(0, delay/2)``."""
    half = delay / 2
    return half + (rng or _RNG).uniform(0, half)


class Backoff:
    """The pauses of one retry loop: ``base``, doubling up to ``cap``; a success resets them.

    ``failed()`` records a failure and returns the pause before the next
    attempt; :attr:`until` is when that pause ends (monotonic time), for a
    caller that fails fast meanwhile rather than sleeps. With ``jitter`` each
    pause is drawn by :func:`equal_jitter`. Not thread-safe: one loop owns it.
    """

    __slots__ = ("base", "cap", "jitter", "failures", "pause", "until", "_rng")

    def __init__(self, base: float, cap: float, *, jitter: bool = False, rng: random.Random | None = None):
        if not 0 < base <= cap:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self._rng = rng
        #: Consecutive failures since the last reset.
        self.failures = 0
        #: The last pause returned by :meth:`failed` (0.0 after a reset).
        self.pause = 0.0
        #: When that pause ends (``time.monotonic()``); 0.0 after a reset.
        self.until = 0.0

    def failed(self, now: float | None = None) -> float:
        """Record one more failure (at ``now``, monotonic; the current time if None); return the pause."""
        pause = backoff_delay(self.base, self.cap, self.failures)
        if self.jitter:
            pause = equal_jitter(pause, self._rng)
        self.failures += 1
        self.pause = pause
        self.until = (time.monotonic() if now is None else now) + pause
        return pause

    def reset(self) -> None:
        """A success: the next failure pauses ``base`` again."""
        self.failures = 0
        self.pause = self.until = 0.0
