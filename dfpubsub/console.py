"""The guard around every console script: an error is one line on stderr, never a traceback.

A bad flag, config file, environment variable, URL or port is the user's to
fix, and a traceback hides the one line that says how. :func:`console_main`
wraps a script's ``main(argv) -> int``: a :class:`~dfpubsub.errors.ConfigError`
prints ``prog: message`` and exits 2 (as argparse does for a bad flag); any
other error prints ``prog: message`` and exits 1. The traceback still goes to
the log at debug level, for whoever debugs the script itself.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from typing import NoReturn, Protocol

from ._version import __version__
from .errors import ConfigError, DfPubSubError

__all__ = ["console_main", "one_line", "ArgumentParser", "command_parser", "stop_on_signals", "close_all"]

log = logging.getLogger("dfpubsub.console")

#: A script's ``main(argv) -> int``, as written.
Main = Callable[[list[str] | None], int]


class GuardedMain(Protocol):
    """A ``main`` as :func:`console_main` returns it: ``argv`` is optional (None: ``sys.argv[1:]``),
    as the console script's entry point calls it with no argument."""

    def __call__(self, argv: list[str] | None = None) -> int: ...


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: ...; see --help``), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_parser(prog: str, doc: str) -> tuple[ArgumentParser, argparse._SubParsersAction[ArgumentParser]]:
    """The parser of a tool made of subcommands: ``--version``, its description (the first line of
    ``doc``), and the subparsers, one of which is required."""

    parser = ArgumentParser(prog=prog, description=doc.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser, parser.add_subparsers(dest="command", required=True)


def one_line(exc: BaseException | str) -> str:
    """``exc``'s message (or ``exc``, a message) on one line (its lines joined by ``; ``); an exception
    without a message gives its type's name."""
    text = exc if isinstance(exc, str) else str(exc)
    joined = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    return joined or ("" if isinstance(exc, str) else type(exc).__name__)


def console_main(prog: str) -> Callable[[Main], GuardedMain]:
    """Decorate the ``main`` of console script ``prog`` with the guard (see the module's doc)."""

    def wrap(main: Main) -> GuardedMain:
        @functools.wraps(main)
        def guarded(argv: list[str] | None = None) -> int:
            warnings.showwarning = functools.partial(_show_warning, prog)
            try:
                return main(argv)
            except KeyboardInterrupt:
                return 130
            except ConfigError as exc:
                return _fail(prog, exc, 2, one_line(exc))
            except (DfPubSubError, OSError, ValueError) as exc:  # the environment's or the input's fault
                return _fail(prog, exc, 1, one_line(exc))
            except Exception as exc:  # a bug: still one line, the traceback at debug level
                return _fail(prog, exc, 1, f"unexpected error: {type(exc).__name__}: {one_line(exc)}")

        return guarded

    return wrap


def _show_warning(prog: str, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    """A warning (one meant for the user, such as a deprecated URL form) as one line, like an error."""
    print(f"{prog}: warning: {one_line(str(message))}", file=sys.stderr)


def _fail(prog: str, exc: BaseException, status: int, message: str) -> int:
    log.debug("%s failed", prog, exc_info=exc)
    print(f"{prog}: {message}", file=sys.stderr)
    return status


def stop_on_signals(stop: threading.Event | None = None) -> threading.Event:
    """An event (``stop``, or a new one) that SIGTERM and SIGINT set: a daemon's main loop runs
    until it is set, then stops gracefully (drain, bye, release leases).

    The handler only writes a byte to a pipe, and a thread reading it sets the event. A handler
    that set the event itself could hang for ever: it runs in the main thread between two
    bytecodes, possibly while that thread holds the event's lock inside ``Event.wait``, and
    ``Event.set`` takes the same lock (a SIGTERM ignored for minutes, once in many tries).
    """
    stop = stop if stop is not None else threading.Event()
    readable, writable = os.pipe()
    os.set_blocking(writable, False)

    def on_signal(signum: int, frame: object) -> None:
        try:
            os.write(writable, b"\0")
        except BlockingIOError:  # the pipe is full of earlier signals: one is enough
            pass

    def watch() -> None:
        while os.read(readable, 1):
            stop.set()

    threading.Thread(target=watch, name="dfpubsub-signals", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return stop


class _Closable(Protocol):
    def close(self) -> object: ...


def close_all(*closables: _Closable | None) -> None:
    """Close each of ``closables`` that was opened (not None), in the order given: a daemon
    lists them last opened first, so it unregisters before its publisher says bye."""
    for closable in closables:
        if closable is not None:
            closable.close()
