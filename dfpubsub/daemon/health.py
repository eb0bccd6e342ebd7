"""What a daemon's /livez and /readyz answer, and the gauges that tell Prometheus the same.

As controller-runtime's healthz: named checks, each passing (None) or failing with a reason.
Liveness says the process is worth keeping (its threads alive, its loops turning): a failure
means "restart me". Readiness says it does its job now (synced, its backend reachable, its
reader caught up): a failure means "do not count on me yet", and names why. A check that is
slow or talks to a server (a store ping) is *polled* by a thread of its own and the probe reads
its last answer, so a probe never hangs on a dead server.

Gauges (labels ``role`` = the daemon, ``name``): ``dfpubsub_up`` 1 while the process runs,
``dfpubsub_synced`` 1 once the first sync is done, ``dfpubsub_ready`` 1 while every readiness
check passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ..console import one_line
from ..metrics import Stats

__all__ = ["Check", "Health"]

log = logging.getLogger("dfpubsub.daemon")

#: A check: None while it passes, else why it fails (one line).
Check = Callable[[], str | None]


class Health:
    """The named liveness and readiness checks of daemon ``role`` (``df-controller``...) ``name``.

    ``synced`` is set once the daemon did its first sync; until then readiness fails with the
    check ``synced``. :meth:`problem` sets or clears a readiness failure from outside (the
    start-up policy says which backend it is still waiting for).
    """

    def __init__(self, role: str, name: str):
        self.role = role
        self.name = name
        self.synced = threading.Event()
        self._live: dict[str, Check] = {}
        self._ready: dict[str, Check] = {"synced": lambda: None if self.synced.is_set() else "first sync not done"}
        self._problems: dict[str, str] = {}
        self._closed = threading.Event()
        self.stats = Stats(role, name)
        self.stats.set("up", 1.0)
        self.stats.set("synced", lambda: float(self.synced.is_set()))
        self.stats.set("ready", lambda: 0.0 if self.failing("ready") else 1.0)

    def liveness(self, name: str, check: Check) -> None:
        """Add liveness check ``name``."""
        self._live[name] = check

    def readiness(self, name: str, check: Check) -> None:
        """Add readiness check ``name``."""
        self._ready[name] = check

    def problem(self, name: str, reason: str | None) -> None:
        """Fail readiness check ``name`` with ``reason``, or (None) let it pass."""
        if reason is None:
            self._problems.pop(name, None)
        else:
            self._problems[name] = reason
            self._ready.setdefault(name, lambda: self._problems.get(name))

    def threads(self, name: str, threads: Callable[[], Iterable[threading.Thread]]) -> None:
        """Liveness check ``name``: every thread ``threads()`` gives is alive."""

        def check() -> str | None:
            dead = sorted(t.name for t in threads() if not t.is_alive())
            return f"threads ended: {', '.join(dead)}" if dead else None

        self.liveness(name, check)

    def heartbeat(self, name: str, max_silence: float) -> Callable[[], None]:
        """Liveness check ``name``: the function returned (a loop calls it at every turn) was called
        within ``max_silence`` seconds."""
        last = [time.monotonic()]

        def beat() -> None:
            last[0] = time.monotonic()

        def check() -> str | None:
            silent = time.monotonic() - last[0]
            return f"loop silent for {silent:.1f} s (limit {max_silence:g} s)" if silent > max_silence else None

        self.liveness(name, check)
        return beat

    def polled(self, name: str, probe: Callable[[], str | None], interval: float, timeout: float) -> None:
        """Readiness check ``name`` answered by ``probe`` (which may block, or raise: a failure
        with the error's message), run every ``interval`` seconds by a thread of its own; a probe
        still running after ``timeout`` seconds fails the check too."""
        state: dict[str, float | str | None] = {"reason": "not checked yet", "since": 0.0}

        def run() -> None:
            while not self._closed.is_set():
                state["since"] = time.monotonic()
                try:
                    reason = probe()
                except Exception as exc:  # the server's failure is the check's answer
                    reason = one_line(exc)
                state["reason"], state["since"] = reason, 0.0
                self._closed.wait(interval)

        def check() -> str | None:
            since = state["since"]
            if isinstance(since, float) and since and time.monotonic() - since > timeout:
                return f"no answer for {time.monotonic() - since:.1f} s"
            reason = state["reason"]
            return reason if isinstance(reason, str) else None

        self.readiness(name, check)
        threading.Thread(target=run, name=f"dfpubsub-check-{name}", daemon=True).start()

    def failing(self, kind: str) -> list[tuple[str, str]]:
        """The failing checks of ``kind`` ("live" or "ready") as (name, reason); a check that
        raises fails with its error."""
        checks = self._live if kind == "live" else self._ready
        out = []
        for name, check in list(checks.items()):
            try:
                reason = check()
            except Exception as exc:  # a broken check must not break the probe
                reason = f"check failed: {one_line(exc)}"
            if reason is not None:
                out.append((name, reason))
        return out

    def report(self, kind: str, verbose: bool = False) -> tuple[bool, str]:
        """(passing, body) of probe ``kind``: ``ok``, or one ``[-]name failed: reason`` line per
        failing check (and with ``verbose`` one ``[+]name ok`` line per passing one), as
        Kubernetes' probes print them."""
        failing = dict(self.failing(kind))
        checks = self._live if kind == "live" else self._ready
        lines = [f"[-]{name} failed: {failing[name]}" if name in failing else f"[+]{name} ok"
                 for name in checks if name in failing or verbose]
        if not failing:
            lines.append(f"{'livez' if kind == 'live' else 'readyz'} check passed" if verbose else "ok")
        else:
            lines.append(f"{'livez' if kind == 'live' else 'readyz'} check failed")
        return not failing, "\n".join(lines) + "\n"

    def close(self) -> None:
        """Stop the polling threads; the process is going: ``dfpubsub_up`` 0."""
        self._closed.set()
        self.stats.set("up", 0.0)
