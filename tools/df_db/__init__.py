"""df-db: inspect and administer the store, the pub/sub and the notification queues (docs/df-db.md).

Installed as ``dfpubsub.tools.df_db``; the console script ``df-db`` runs :func:`main`.
Modules: :mod:`.app` (global options, errors, exit codes), :mod:`.context`
(settings and the backends they select), :mod:`.output` (rich tables, JSON,
progress bars), :mod:`.items` (the JSON input of ``add`` / ``update``),
:mod:`.store_cmds`, :mod:`.pubsub_cmds`, :mod:`.watch`, :mod:`.queue_cmds` and
:mod:`.notify_cmds`.
"""

from .app import app, main

__all__ = ["app", "main"]
