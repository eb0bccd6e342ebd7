"""The skeleton every dfpubsub daemon runs in: one start-up policy, probes, systemd, a bounded stop.

A daemon's ``main`` makes a :class:`Daemon` from its settings (checked by
:func:`~dfpubsub.daemon.preflight.check_settings` first), which serves the probes at once (so
they say what a start waits for), opens its parts through :meth:`Daemon.open`, adds its health
checks, runs its loop until :attr:`Daemon.stop` is set, and closes. The policy, the same for every daemon (docs/deploy.md):

- a bad setting is one line and exit 2, before anything is opened;
- a store that does not exist (a SQLite file never created, an etcd or Redis store nobody
  made nor wrote to) is one line and exit 1: it is created only by ``df-db init``,
  ``[store] create = true`` or a writer, never by a typo;
- a backend that does not answer (or refuses the credentials: rotated on the server before
  the file, say) is retried with backoff (0.5 s doubling to 10 s) while ``/readyz`` names it
  and a warning is logged at most every 10 s; SIGTERM ends the wait;
- SIGTERM or SIGINT sets :attr:`Daemon.stop`; every wait on the way out has a timeout.

systemd (``Type=notify``) gets ``READY=1`` once the daemon is synced, ``WATCHDOG=1`` every
half ``WatchdogSec`` while its liveness checks pass (its loop turning), ``STATUS=`` naming
what readiness waits for, and ``STOPPING=1`` on the way out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from ..backends.startup import retry_unreachable
from ..config import Settings
from ..console import one_line, stop_on_signals
from ..errors import AuthenticationError
from ..leader import Leadership, lead
from ..logs import RateLimitedLog
from .health import Health
from .probes import ProbeServer
from .systemd import sd_notify, watchdog_interval

__all__ = ["Daemon"]

T = TypeVar("T")
log = logging.getLogger("dfpubsub.daemon")

class Daemon:
    """Daemon ``prog`` (``df-feed``...) named ``name``; ``settings`` already checked. Serves
    ``/metrics``, ``/livez`` and ``/readyz`` on ``[metrics] port`` (if not 0; ConfigError if it
    cannot be bound) and starts telling systemd how the daemon is doing."""

    def __init__(self, prog: str, name: str, settings: Settings):
        self.prog = prog
        self.name = name
        self.settings = settings
        #: Set by SIGTERM or SIGINT: the daemon's loop returns.
        self.stop = stop_on_signals()
        self.health = Health(prog, name)
        self._warn = RateLimitedLog(log, interval=10.0)
        metrics = settings.metrics
        self._server = ProbeServer(self.health, metrics.port, metrics.addr) if metrics.port else None
        self._supervisor = threading.Thread(target=self._supervise, name="dfpubsub-supervisor", daemon=True)
        self._supervisor.start()

    def open(self, what: str, opener: Callable[[], T]) -> T | None:
        """``opener()``, retried with backoff while it fails because a backend (``what``: "store",
        "queues"...) does not answer or refuses the credentials; readiness check ``what`` says why
        meanwhile. None if the daemon was told to stop first. Any other error (a missing store, a
        bad setting) is raised: it needs a person, not a retry (:mod:`dfpubsub.backends.startup`)."""

        def failed(exc: Exception) -> None:
            reason = one_line(exc)
            self.health.problem(what, f"{'refused' if isinstance(exc, AuthenticationError) else 'unreachable'}: {reason}")
            self._warn.warning(what, f"cannot reach the {what}; retrying", daemon=self.prog, error=reason)

        value = retry_unreachable(opener, failed, stop=self.stop)
        if value is not None:
            self.health.problem(what, None)
        return value

    def lead(self) -> Leadership | None:
        """The lease to act under: with ``[leader] enabled``, stand by until this instance holds it
        (docs/leader.md). Meanwhile systemd is told the daemon started (a standby is a unit that
        runs, not one that is still starting) and ``/readyz`` says it stands by. None if the
        daemon was told to stop first."""
        leadership = lead(self.settings, self.prog)
        if leadership.elector is None:
            return leadership
        self.health.problem("leader", "standing by for the leader lease")
        sd_notify("READY=1")
        if not leadership.wait(self.stop):
            return None
        self.health.problem("leader", None)
        return leadership

    def _supervise(self) -> None:
        watchdog = watchdog_interval()
        tick = min(watchdog / 2, 1.0) if watchdog else 1.0
        ready = False
        status = ""
        while not self.stop.is_set():
            if not ready and self.health.synced.is_set():
                sd_notify("READY=1")
                log.info("ready: synced", extra={"daemon": self.prog, "instance": self.name})
                ready = True
            failing = self.health.failing("ready")
            now = "; ".join(f"{name}: {reason}" for name, reason in failing) or "ready"
            if now != status:
                status = now
                sd_notify(f"STATUS={status}")
            if watchdog and not self.health.failing("live"):
                sd_notify("WATCHDOG=1")
            self.stop.wait(tick if ready else min(tick, 0.1))
        sd_notify("STOPPING=1")  # as the stop begins, not once it is done

    def close(self) -> None:
        """Stop telling systemd how the daemon is doing and stop serving probes (bounded: each
        part waits at most a second)."""
        self.stop.set()
        self._supervisor.join(timeout=1.0)
        self.health.close()
        if self._server is not None:
            self._server.close()
