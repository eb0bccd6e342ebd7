"""The start-up policy every daemon follows, and a library user's own daemon through
``open_store_from_settings(settings, wait=...)``: retry what does not answer, refuse what
needs a person.

A backend that does not answer, or refuses the credentials (rotated on the server before the
file, say), may well answer in a moment: a controller restarted during a partition must not
exit, or systemd's restarts add nothing but noise. It is tried again after 0.5 s doubling to
10 s. A store that does not exist (:class:`~dfpubsub.errors.StoreMissing`) or a bad setting
(:class:`~dfpubsub.errors.ConfigError`) is raised at once: no retry can help it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import AuthenticationError, StoreMissing, StoreUnavailable, TransportError
from ..retry import Backoff

__all__ = ["RETRY_BASE", "RETRY_MAX", "retry_unreachable"]

T = TypeVar("T")

#: Seconds between two attempts to reach a backend at start-up: this, doubling to RETRY_MAX.
RETRY_BASE = 0.5
RETRY_MAX = 10.0


def retry_unreachable(opener: Callable[[], T], on_failure: Callable[[Exception], None], *,
                      stop: threading.Event | None = None, wait: float | None = None) -> T | None:
    """``opener()``, tried again with backoff while it raises because a backend does not answer or
    refuses the credentials (``on_failure(error)`` is told of each such failure), for at most
    ``wait`` seconds (None: until it answers), after which the last failure is raised. None if
    ``stop`` was set first. :class:`~dfpubsub.errors.StoreMissing` and any other error are
    raised at once."""
    backoff = Backoff(RETRY_BASE, RETRY_MAX)
    stop = stop or threading.Event()
    deadline = None if wait is None else time.monotonic() + wait
    while not stop.is_set():
        try:
            return opener()
        except StoreMissing:
            raise
        except (StoreUnavailable, TransportError, AuthenticationError) as exc:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise
            on_failure(exc)
            pause = backoff.failed()
            stop.wait(pause if left is None else min(pause, left))
    return None
