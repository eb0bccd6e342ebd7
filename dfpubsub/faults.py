"""Fault injection: transports that lose frames on purpose, and crash points, for chaos tests.

A lossy network is the failure dfpubsub exists to survive; these wrappers make
one happen on demand, on any driver, without touching the code under test.

A **fault point** is a named step of a daemon (``notify.after_send``: an
endpoint acknowledged a batch that is not removed yet). Nothing happens there
unless a test armed it: in its own process with :func:`arm`, or in a daemon
it starts with ``DFPUBSUB_CRASH_AT=<point>[@<n>]``, which kills the daemon
with SIGKILL the ``n``-th time (default the first) it reaches the point.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from .api import PublisherTransport
from .events import CONTROL_TOPIC

__all__ = ["CRASH_ENV", "KillOnSend", "LossyTransport", "arm", "disarm", "drop_every", "drop_nth", "fault_point"]

#: The environment variable naming the fault point where a daemon kills itself.
CRASH_ENV = "DFPUBSUB_CRASH_AT"

_armed: dict[str, Callable[[], None]] = {}


def fault_point(name: str) -> None:
    """Run what is armed at ``name``; nothing if it is not armed (the normal case)."""
    action = _armed.get(name)
    if action is not None:
        action()


def arm(name: str, action: Callable[[], None], times: int = 1) -> None:
    """Run ``action`` the next ``times`` times ``name`` is reached, in this process."""
    left = [times]

    def once() -> None:
        left[0] -= 1
        if left[0] <= 0:
            _armed.pop(name, None)
        action()

    _armed[name] = once


def disarm(name: str) -> None:
    """Forget what is armed at ``name``."""
    _armed.pop(name, None)


def _crash_from_env() -> None:
    point, _, nth = os.environ.get(CRASH_ENV, "").partition("@")
    if not point:
        return
    countdown = [int(nth) if nth.isdigit() and int(nth) > 0 else 1]

    def crash() -> None:
        countdown[0] -= 1
        if countdown[0] == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    _armed[point] = crash


_crash_from_env()

DropRule = Callable[[str, int], bool]


def drop_nth(topic: str, *positions: int) -> DropRule:
    """Drop the envelopes at these 1-based positions among those sent on ``topic``."""
    wanted = set(positions)
    return lambda t, n: t == topic and n in wanted


def drop_every(k: int) -> DropRule:
    """Drop every ``k``-th envelope of each topic."""
    return lambda t, n: n % k == 0


class LossyTransport(PublisherTransport):
    """Wraps ``inner`` and discards the event envelopes ``rule(topic, n)`` selects.

    Control frames (hellos, byes) pass, as they would on a network that lost
    only some packets; ``dropped`` counts what was discarded.
    """

    def __init__(self, inner: PublisherTransport, rule: DropRule):
        self.inner = inner
        self.rule = rule
        self.dropped = 0
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return self.inner.uri

    def send(self, topic: str, frame: bytes) -> None:
        if topic != CONTROL_TOPIC:
            with self._lock:
                n = self._counts[topic] = self._counts.get(topic, 0) + 1
            if self.rule(topic, n):
                self.dropped += 1
                return
        self.inner.send(topic, frame)

    def new_subscribers(self) -> int:
        return self.inner.new_subscribers()

    def close(self) -> None:
        self.inner.close()


class KillOnSend(PublisherTransport):
    """Wraps ``inner`` and SIGKILLs this process when it is handed its first event envelope.

    A writer publishing through it dies after its store write committed and
    before anything about it left: the write/publish window, on demand.
    """

    def __init__(self, inner: PublisherTransport):
        self.inner = inner

    @property
    def uri(self) -> str:
        return self.inner.uri

    def send(self, topic: str, frame: bytes) -> None:
        if topic != CONTROL_TOPIC:
            os.kill(os.getpid(), signal.SIGKILL)
        self.inner.send(topic, frame)

    def new_subscribers(self) -> int:
        return self.inner.new_subscribers()

    def close(self) -> None:
        self.inner.close()
