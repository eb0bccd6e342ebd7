"""df-db: inspect and administer the store, the pub/sub and the notification queues (docs/df-db.md).

Installed as ``dfpubsub.tools.df_db``; the console script ``df-db`` runs :func:`main`.
Modules: :mod:`.app` (global options, errors, exit codes), :mod:`.context`
(settings and the backends they select), :mod:`.output` (rich tables, JSON,
progress bars), :mod:`.items` (the JSON input of ``add`` / ``update``),
:mod:`.store_cmds`, :mod:`.pubsub_cmds`, :mod:`.watch`, :mod:`.queue_cmds` and
:mod:`.notify_cmds`.

The application is imported on first use, so a missing ``cli`` extra (typer,
rich) is one line naming it, not a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

from dfpubsub.backends.extras import needs_extra
from dfpubsub.errors import MissingExtra

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-db`` (see :func:`.app.main`)."""
    try:
        with needs_extra("df-db"):
            from .app import main as run
    except MissingExtra as exc:
        print(f"df-db: {exc}", file=sys.stderr)
        return 2
    return run(argv)


def __getattr__(name: str) -> Any:
    if name == "app":
        from .app import app

        return app
    raise AttributeError(name)
