"""``doctor``: every record df-db can read that does not decode, by backend key, to repair or remove."""

from __future__ import annotations

import typer

from dfpubsub.errors import ForeignRecord
from dfpubsub.notify import NotificationRegistry

from .context import state
from .output import Column

__all__ = ["app"]

app = typer.Typer()


@app.command()
def doctor(ctx: typer.Context) -> None:
    """Read the store, the queues' metadata and dead letters, the notification topics and
    configurations and the discovery table; list each record that does not decode (another
    writer's: wrong type, not msgpack or JSON, not UTF-8, bad numbers) with its backend key.
    Exit status 1 when there is any."""
    st = state(ctx)
    with st.open_store() as store:
        store.list()
    # Only reads: the queues and the discovery table, never written to, are not opened (which
    # would add their tables to a SQLite file).
    if not st.never_written("queues"):
        with st.open_queues() as queues:
            for name in queues.list_queues():
                for read in (queues.queue_info, queues.stats):
                    try:
                        read(name)
                    except ForeignRecord:  # counted; its other reads would only name it again
                        break
            queues.list_dead_letters(None, 1 << 30)
            registry = NotificationRegistry(queues)
            registry.list_topics()
            registry.get_configurations()
    if not st.never_written("discovery"):
        with st.open_discovery() as discovery:
            discovery.list()
    found, st.out.skipped = st.out.skipped, []  # the rows themselves, not a footer about them
    rows = [r._asdict() for r in sorted(set(found))]
    st.out.rows(rows, [Column("kind", "kind"), Column("key", "key"), Column("reason", "reason"),
                       Column("detail", "detail")], title="records that do not decode")
    if rows:
        raise typer.Exit(1)
