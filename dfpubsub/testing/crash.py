"""Crash points: kill a process (or run any action) when it reaches a named step, for chaos tests.

A crash point is a step of a daemon where dying does the most harm
(``notify.after_send``: an endpoint acknowledged a batch that is not removed
yet; ``notify.after_store_write``: a writer whose queues live apart from its store made its
store write and has not committed its notifications). The code under test only offers the
seam (:mod:`dfpubsub.notify.steps`);
nothing is armed unless a test arms it, explicitly: in its own process with
:func:`arm`, or in a daemon it starts through this module's launcher::

    python -m dfpubsub.testing.crash notify.after_send@2 -- df-notify --notify.url ...

which arms a SIGKILL at the 2nd time the daemon reaches the point (the first
without ``@n``), then runs the console script as its entry point would. No
environment variable arms anything: importing dfpubsub never can kill a process.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from ..notify.steps import STEP_HOOKS, STEPS

__all__ = ["POINTS", "arm", "arm_kill", "disarm", "main"]


#: The hooks of each area, by step.
_SEAMS: dict[str, dict[str, Callable[[], None]]] = {"notify": STEP_HOOKS}


#: The points that can be armed, ``<area>.<step>``.
POINTS = tuple(f"notify.{name}" for name in STEPS)


def _hooks(point: str) -> tuple[dict[str, Callable[[], None]], str]:
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
    area, step = point.split(".", 1)
    return _SEAMS[area], step


def arm(point: str, action: Callable[[], None], times: int = 1) -> None:
    """Run ``action`` the next ``times`` times ``point`` is reached, in this process."""
    hooks, step = _hooks(point)
    left = [times]

    def once() -> None:
        left[0] -= 1
        if left[0] <= 0:
            hooks.pop(step, None)
        action()

    hooks[step] = once


def arm_kill(point: str, nth: int = 1) -> None:
    """SIGKILL this process the ``nth`` time it reaches ``point``."""
    countdown = [nth]

    def kill() -> None:
        countdown[0] -= 1
        if countdown[0] == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    hooks, step = _hooks(point)
    hooks[step] = kill


def disarm(point: str) -> None:
    """Forget what is armed at ``point``."""
    hooks, step = _hooks(point)
    hooks.pop(step, None)


def main(argv: Sequence[str] | None = None) -> int:
    """``POINT[@N] -- SCRIPT ARGS...``: arm a kill at POINT, then run console script SCRIPT."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m dfpubsub.testing.crash POINT[@N] -- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    point, _, nth = args[0].partition("@")
    scripts = [ep for ep in entry_points(group="console_scripts") if ep.name == args[2]]
    if not scripts or not (nth == "" or nth.isdigit() and int(nth) > 0):
        print(f"crash: no console script {args[2]!r} or a bad count {nth!r}", file=sys.stderr)
        return 2
    arm_kill(point, int(nth or 1))
    sys.argv = args[2:]
    result = scripts[0].load()()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
