"""The publisher of forked API workers: one :class:`Publisher` per process, made after fork.

A pre-fork server (gunicorn, uWSGI) may build its NbApi, and so its
publisher, in the master before forking the workers. Sockets, contexts and
threads must not cross a fork, and sequences must not either: two workers
counting on from the same sequence would look like duplicates. So a
:class:`WorkerPublisher` creates its real publisher lazily, in the process
that first publishes, and a fork hook makes every child forget the parent's,
so the child's first event builds its own (new id, new transport, new thread).
The parent's copy is abandoned in the child, never closed there: its lock may
have been held by a thread that does not exist in the child.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .errors import ClosedError
from .events import Action, Event
from .publisher import Publisher

__all__ = ["WorkerPublisher"]

_live: weakref.WeakSet[WorkerPublisher] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for wp in list(_live):
        wp._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


class WorkerPublisher:
    """A fork-safe stand-in for :class:`Publisher` with the same publishing methods.

    ``factory`` builds the process's publisher; it is called at the first
    use in each process (and never in a master that only forks).
    """

    def __init__(self, factory: Callable[[], Publisher]):
        self._factory = factory
        self._publisher: Publisher | None = None
        self._lock = threading.Lock()
        self._closed = False
        _live.add(self)

    def _forget(self) -> None:
        self._publisher = None
        self._lock = threading.Lock()

    @property
    def publisher(self) -> Publisher:
        """This process's publisher (created now if it does not exist yet)."""
        pub = self._publisher
        if pub is None:
            with self._lock:
                if self._closed:
                    raise ClosedError("publisher is closed")
                pub = self._publisher
                if pub is None:
                    pub = self._publisher = self._factory()
        return pub

    @property
    def id(self) -> str:
        """This process's publisher id."""
        return self.publisher.id

    @property
    def name(self) -> str:
        """This process's publisher name."""
        return self.publisher.name

    def publish(
        self,
        topic: str,
        table: str,
        key: str,
        action: Action | str,
        version: int,
        value: Any = None,
        timestamp: float | None = None,
        packed: bytes | None = None,
    ) -> int:
        """See :meth:`Publisher.publish`."""
        pub = self._publisher  # the hot path: no property call once the publisher exists
        if pub is None:
            pub = self.publisher
        return pub.publish(topic, table, key, action, version, value, timestamp, packed)

    def publish_event(self, event: Event) -> int:
        """See :meth:`Publisher.publish_event`."""
        return self.publisher.publish_event(event)

    def flush(self) -> None:
        """See :meth:`Publisher.flush`."""
        if self._publisher is not None:
            self._publisher.flush()

    def hello(self, reason: str = "idle") -> None:
        """See :meth:`Publisher.hello`."""
        self.publisher.hello(reason)

    def sequences(self) -> dict[str, int]:
        """See :meth:`Publisher.sequences` (empty before the first publish in this process)."""
        return {} if self._publisher is None else self._publisher.sequences()

    def close(self) -> None:
        """Close this process's publisher, if it has one (flush, bye)."""
        with self._lock:
            pub, self._publisher = self._publisher, None
            self._closed = True
        if pub is not None:
            pub.close()

    def __enter__(self) -> WorkerPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
