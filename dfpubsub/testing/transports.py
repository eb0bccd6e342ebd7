"""Publisher transports that lose frames or kill their process on purpose, for tests and the demo.

A lossy network is the failure dfpubsub exists to survive; these wrappers make
one happen on demand, on any driver, without touching the code under test.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from ..events import CONTROL_TOPIC
from ..transport import PublisherTransport

__all__ = ["DropRule", "KillOnSend", "LossyTransport", "drop_every", "drop_nth"]

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
