"""Pub/sub commands: the publishers in discovery and the topics in the store."""

from __future__ import annotations

from collections import Counter
from typing import Any

import typer

from dfpubsub.discovery import PublisherRecord

from .context import state
from .output import Column, duration

__all__ = ["app"]

app = typer.Typer()


def _publisher_doc(r: PublisherRecord) -> dict[str, Any]:
    return {**r.to_dict(), "age": round(r.age, 3), "lease_left": r.lease_left}


@app.command()
def publishers(ctx: typer.Context) -> None:
    """The publishers registered in discovery: id, name, URIs, host, pid, age and lease left."""
    st = state(ctx)
    records = []
    if not st.never_written("discovery"):
        with st.open_discovery() as discovery:
            records = discovery.list()
    st.out.rows([_publisher_doc(r) for r in records], [
        Column("id", "publisher_id"), Column("name", "name"), Column("uri", "uris", ", ".join),
        Column("host", "host"), Column("pid", "pid", justify="right"), Column("age", "age", duration, "right"),
        Column("lease left", "lease_left", duration, "right"), Column("topics", "topics", ", ".join),
    ])


@app.command()
def topics(ctx: typer.Context) -> None:
    """The topics of the objects in the store, with object counts per table."""
    st = state(ctx)
    with st.open_store() as store:
        counts = Counter((o.topic, o.table) for o in store.list())
    docs: dict[str, dict[str, Any]] = {}
    for (topic, table), n in sorted(counts.items()):
        doc = docs.setdefault(topic, {"topic": topic, "objects": 0, "tables": {}})
        doc["objects"] += n
        doc["tables"][table] = n
    if st.out.json:
        st.out.document(list(docs.values()))
        return
    rows = [{"topic": t, "table": tbl, "objects": n} for (t, tbl), n in sorted(counts.items())]
    st.out.rows(rows, [Column("topic", "topic"), Column("table", "table"),
                       Column("objects", "objects", justify="right")])
