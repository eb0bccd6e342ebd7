"""The elector: one thread that takes the lease when it is free, renews it while held, and says at
every moment whether this process may act.

The timing follows client-go's ``leaderelection``. A standby tries to take
the lease every ``retry_period`` (jittered). The holder renews it every
``retry_period``; each renewal that succeeds moves its *deadline* to
``renew_deadline`` after the moment the renewal was sent. Past the deadline
the holder stops acting, whether or not it could reach the backend: the
backend counts ``lease_duration`` from when it received the renewal, which is
later, so the holder stops at least ``lease_duration - renew_deadline``
(at least ``clock_skew``) before the lease can pass to anyone. A standby takes
over at most ``lease_duration + retry_period`` after the holder's last
renewal, sooner when the holder releases the lease on a clean stop.

The act path asks :meth:`LeaderElector.token` (or :meth:`~LeaderElector.check`)
right before it acts; the answer uses the monotonic clock, which keeps running
while a process is stopped (SIGSTOP), so a holder resumed past its deadline
finds it is no longer leader before the elector thread has even woken up. An
act that may take longer than the margin should carry the fencing token to the
resource it writes, which refuses tokens lower than one it has seen.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from ..errors import DfPubSubError, NotLeader
from ..logs import RateLimitedLog
from ..metrics import Stats
from .api import LeaseBackend

__all__ = ["LeaderElector", "check_timing"]

log = logging.getLogger("dfpubsub.leader")
_JITTER = 0.2  # a standby's pause is retry_period times 1 to 1.2, so standbys do not try in step


def check_timing(lease_duration: float, renew_deadline: float, retry_period: float, clock_skew: float) -> None:
    """ValueError unless the holder stops acting at least ``clock_skew`` before its lease can pass to
    another, and tries to renew at least twice before it gives up (``[leader]`` checks the same)."""
    if min(lease_duration, renew_deadline, retry_period) <= 0 or clock_skew < 0:
        raise ValueError("lease_duration, renew_deadline and retry_period must be positive, clock_skew not negative")
    if renew_deadline + clock_skew > lease_duration:
        raise ValueError(f"renew_deadline ({renew_deadline:g} s) + clock_skew ({clock_skew:g} s) must be at most "
                         f"lease_duration ({lease_duration:g} s)")
    if 2 * retry_period > renew_deadline:
        raise ValueError(f"retry_period ({retry_period:g} s) must be at most renew_deadline / 2")


class LeaderElector:
    """Campaigns for the lease ``name`` in ``backend`` as ``identity`` (see the module's doc).

    ``on_stopped(reason)`` is called from the elector's thread when a term ends
    other than by :meth:`close` (``lost``: the backend says another holds it;
    ``expired``: no renewal within ``renew_deadline``). Metrics under role
    ``leader``: the ``leader`` gauge (1 while :meth:`token` is not None), the
    ``leader_token`` gauge, ``leader_transitions`` by reason and ``leader_errors``.
    """

    def __init__(self, backend: LeaseBackend, name: str, identity: str, *, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0, clock_skew: float = 1.0,
                 on_stopped: Callable[[str], None] | None = None):
        check_timing(lease_duration, renew_deadline, retry_period, clock_skew)
        self.backend = backend
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_stopped = on_stopped
        self.stats = Stats("leader", name)
        self.stats.set("leader", lambda: 1.0 if self.token() is not None else 0.0)
        self.stats.set("leader_token", 0.0)
        self._changed = threading.Condition(threading.Lock())  # guards the two fields below
        self._token: int | None = None  # the term's fencing token, while the thread believes it holds
        self._deadline = 0.0  # monotonic: the term ends here unless a renewal moves it on
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._trouble = RateLimitedLog(log, 10.0)

    # -- the act path -----------------------------------------------------------------------

    def token(self) -> int | None:
        """The fencing token while this process surely holds the lease; None otherwise."""
        with self._changed:
            return self._token if self._token is not None and time.monotonic() < self._deadline else None

    def check(self) -> int:
        """The fencing token, or :class:`~dfpubsub.errors.NotLeader`: what an act calls first."""
        token = self.token()
        if token is None:
            raise NotLeader(f"{self.identity} does not hold the leader lease {self.name!r}")
        return token

    def wait_leading(self, timeout: float | None = None, stop: threading.Event | None = None) -> int | None:
        """Wait until this process leads (its token), ``timeout`` passes or ``stop`` is set (None)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                if self._token is not None and time.monotonic() < self._deadline:
                    return self._token
                left = None if end is None else end - time.monotonic()
                if (left is not None and left <= 0) or (stop is not None and stop.is_set()) or self._closed.is_set():
                    return None
                # A short wait when ``stop`` is given: setting an Event does not notify this condition.
                self._changed.wait(0.05 if stop is not None else 1.0 if left is None else min(left, 1.0))

    # -- the elector's thread ---------------------------------------------------------------

    def start(self) -> LeaderElector:
        """Start campaigning in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop campaigning; a lease held is released, so a standby takes over at once."""
        self._closed.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.retry_period + self.renew_deadline)
        self._step_down("released", release=True)
        self.backend.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._round()
            except Exception:  # a bug must not end the campaign: the act path would say no for good
                self.stats.inc("background_errors")
                log.exception("leader election round failed", extra={"election": self.name})
                self._closed.wait(self.retry_period)

    def _round(self) -> None:
        """Take or renew the lease, wait a retry period (or until the deadline), step down if it passed."""
        with self._changed:
            token = self._token
        if token is None:
            self._try_acquire()
            pause = self.retry_period * (1 + random.uniform(0, _JITTER))
        else:
            self._try_renew(token)
            pause = self.retry_period
        with self._changed:
            if self._token is not None:  # wake at the deadline at the latest, to step down on time
                pause = min(pause, max(0.0, self._deadline - time.monotonic()))
        self._closed.wait(pause)
        with self._changed:
            due = self._token is not None and time.monotonic() >= self._deadline
        if due and not self._closed.is_set():
            self._step_down("expired", release=True)

    def _try_acquire(self) -> None:
        sent = time.monotonic()
        try:
            token = self.backend.acquire(self.identity, self.lease_duration)
        except DfPubSubError as exc:
            self._failed("acquire", exc)
            return
        if token is None:
            return
        with self._changed:
            self._token, self._deadline = token, sent + self.renew_deadline
            self._changed.notify_all()
        self.stats.set("leader_token", float(token))
        self.stats.inc("leader_transitions", reason="acquired")
        log.info("leading", extra={"election": self.name, "identity": self.identity, "token": token})

    def _try_renew(self, token: int) -> None:
        sent = time.monotonic()
        try:
            held = self.backend.renew(self.identity, token, self.lease_duration)
        except DfPubSubError as exc:
            self._failed("renew", exc)  # the deadline stays: past it, the term ends
            return
        if not held:
            self._step_down("lost", release=False)
            return
        with self._changed:
            if self._token == token:
                self._deadline = max(self._deadline, sent + self.renew_deadline)

    def _failed(self, what: str, exc: DfPubSubError) -> None:
        self.stats.inc("leader_errors")
        self._trouble.warning(what, f"leader lease {what} failed", election=self.name, identity=self.identity,
                              error=str(exc))

    def _step_down(self, reason: str, release: bool) -> None:
        with self._changed:
            token, self._token = self._token, None
            self._changed.notify_all()
        if token is None:
            return
        self.stats.inc("leader_transitions", reason=reason)
        level = logging.INFO if reason == "released" else logging.WARNING
        log.log(level, "stopped leading", extra={"election": self.name, "identity": self.identity, "token": token,
                                                 "reason": reason})
        if release:
            try:
                self.backend.release(self.identity, token)
            except DfPubSubError as exc:  # unreachable: the lease expires by itself
                self._failed("release", exc)
        if reason != "released" and self.on_stopped is not None:
            self.on_stopped(reason)
