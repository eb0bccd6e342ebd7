"""What a daemon with ``[leader] enabled`` calls before it acts: wait for the lease, then act under it.

A daemon calls :func:`lead` early (the elector starts campaigning, the
``dfpubsub_leader`` gauge is 0) and :meth:`Leadership.wait` right before it
starts to act, after its probes serve: a standby waits there (the daemon's stop
event, set by SIGTERM and SIGINT, ends the wait; the daemon exits 0 without having acted). Once leader,
the daemon starts as it would without election and asks
:meth:`Leadership.may_act` on its act path. When the
term ends other than by the daemon's own stop (the lease lost to another, or
not renewed within ``renew_deadline``), the daemon is sent SIGTERM, so it stops
the way it always does, and exits 1 (:meth:`Leadership.exit_status`): its unit
(``Restart=on-failure``) starts it again, as a standby. A clean stop releases
the lease, so a standby takes over at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

from .elector import LeaderElector
from .factory import elector_from_settings

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["Leadership", "lead"]

log = logging.getLogger("dfpubsub.leader")


class Leadership:
    """The lease a daemon acts under; with ``elector`` None ([leader] off) it may always act."""

    def __init__(self, elector: LeaderElector | None):
        self.elector = elector
        #: A signal ended the wait for the lease: exit 0 without acting.
        self.stopped = False
        #: Why the term ended under the daemon ("lost", "expired"), or None.
        self.lost: str | None = None

    def token(self) -> int | None:
        """The fencing token while the daemon may act (0 without election), else None."""
        return 0 if self.elector is None else self.elector.token()

    def may_act(self) -> bool:
        """Whether the daemon may act now: what its act path asks right before it acts."""
        return self.token() is not None

    def check(self) -> int:
        """The fencing token, or :class:`~dfpubsub.errors.NotLeader`."""
        return 0 if self.elector is None else self.elector.check()

    def wait(self, stop: threading.Event) -> bool:
        """Wait until this process holds the lease (at once with [leader] off); False when ``stop``
        (the daemon's SIGTERM or SIGINT) was set first: the lease is then given up, and the daemon
        exits without having acted."""
        if self.elector is None:
            return True
        log.info("standing by for the leader lease", extra={"election": self.elector.name,
                                                            "identity": self.elector.identity})
        while not stop.is_set() and self.elector.wait_leading(stop=stop) is None:
            pass
        if stop.is_set():
            self.stopped = True
            self.elector.close()
            return False
        return True

    def exit_status(self, status: int = 0) -> int:
        """The daemon's exit status: 1 when it stopped because its term ended, else ``status``."""
        return 1 if self.lost else status

    def close(self) -> None:
        """Stop campaigning and release the lease held."""
        if self.elector is not None:
            self.elector.close()

    def _term_ended(self, reason: str) -> None:
        self.lost = reason
        log.error("lost the leader lease: stopping", extra={"reason": reason,
                                                            "election": self.elector.name if self.elector else ""})
        os.kill(os.getpid(), signal.SIGTERM)  # the daemon's own graceful stop


def lead(settings: Settings, daemon: str) -> Leadership:
    """Start campaigning for the lease of ``daemon`` as ``[leader]`` says (nothing with it off);
    :meth:`Leadership.wait` waits for it."""
    if not settings.leader.enabled:
        return Leadership(None)
    elector = elector_from_settings(settings, daemon)
    leadership = Leadership(elector)
    elector.on_stopped = leadership._term_ended
    elector.start()
    return leadership
