"""In-process driver: a named bus shared by the publishers and subscribers of one process.

For unit tests and examples. It behaves like a PUB/SUB transport: each
subscriber has a bounded inbox, and a full inbox drops the frame (counted on
the publisher, like ZeroMQ at its high-water mark), which the reliability
layer then detects as a gap.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dfpubsub.errors import ClosedError, ConfigError
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.metrics import Stats
from dfpubsub.transport import Driver, PublisherTransport, SubscriberTransport

__all__ = ["MemoryDriver", "MemoryBus"]

_buses: dict[str, MemoryBus] = {}
_buses_lock = threading.Lock()


class MemoryBus:
    """The subscribers of one bus name; the control-topic subscription count says who joined."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.subscribers: list[_MemorySubscriber] = []
        self.joins = 0

    @classmethod
    def named(cls, name: str) -> MemoryBus:
        """The process-wide bus called ``name``."""
        with _buses_lock:
            bus = _buses.get(name)
            if bus is None:
                bus = _buses[name] = cls()
            return bus


class _MemoryPublisher(PublisherTransport):
    def __init__(self, bus: MemoryBus, stats: Stats, name: str):
        self.bus = bus
        self.stats = stats
        self._name = name
        self._joins_seen = bus.joins
        self._closed = False

    @property
    def uri(self) -> str:
        return f"memory://{self._name}"

    def send(self, topic: str, frame: bytes) -> None:
        if self._closed:
            raise ClosedError("memory publisher is closed")
        with self.bus.lock:
            subscribers = list(self.bus.subscribers)
        for sub in subscribers:
            if topic in sub.topics and not sub.offer(frame):
                self.stats.inc("drops", reason="hwm")

    def new_subscribers(self) -> int:
        joins = self.bus.joins
        seen, self._joins_seen = self._joins_seen, joins
        return joins - seen

    def close(self) -> None:
        self._closed = True


class _MemorySubscriber(SubscriberTransport):
    def __init__(self, bus: MemoryBus, queue_size: int):
        self.bus = bus
        self.queue_size = queue_size
        self.topics: frozenset[str] = frozenset()
        self._inbox: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._closed = False
        with bus.lock:
            bus.subscribers.append(self)

    def offer(self, frame: bytes) -> bool:
        with self._cond:
            if len(self._inbox) >= self.queue_size or self._closed:
                return False
            self._inbox.append(frame)
            self._cond.notify()
            return True

    def subscribe(self, topic: str) -> None:
        self.topics = self.topics | {topic}
        if topic == CONTROL_TOPIC:
            with self.bus.lock:
                self.bus.joins += 1

    def unsubscribe(self, topic: str) -> None:
        self.topics = self.topics - {topic}

    def recv(self, timeout: float) -> list[bytes]:
        with self._cond:
            if not self._inbox and not self._closed:
                self._cond.wait(timeout)
            if self._closed:
                raise ClosedError("memory subscriber is closed")
            frames = list(self._inbox)
            self._inbox.clear()
            return frames

    def close(self) -> None:
        with self.bus.lock:
            if self in self.bus.subscribers:
                self.bus.subscribers.remove(self)
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class MemoryOptions(BaseModel):
    """Options of the ``memory`` driver (config table ``[driver.memory]``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queue_size: int = Field(100_000, ge=1, description="Frames each subscriber's inbox holds before it drops.")


class MemoryDriver(Driver):
    """``memory`` or ``memory://NAME``: an in-process bus (default name ``default``)."""

    name = "memory"
    options_model = MemoryOptions

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        self.bus_name = (url or "memory://default").split("://", 1)[-1] or "default"
        try:
            self.queue_size = MemoryOptions.model_validate(self.options).queue_size
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"invalid [driver.memory] options: {problems}") from exc
        self.bus = MemoryBus.named(self.bus_name)

    def publisher(self, stats: Stats) -> PublisherTransport:
        return _MemoryPublisher(self.bus, stats, self.bus_name)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        return _MemorySubscriber(self.bus, self.queue_size)
