"""``deadletters`` and ``notifications``: what could not be delivered, and what is notified where."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from dfpubsub.notify import NotificationRegistry

from .context import public_url, state
from .output import Column, when
from .queue_cmds import notification_doc

__all__ = ["app"]

app = typer.Typer()


@app.command()
def deadletters(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Argument(help="Only this queue (default: all).")] = None,
    max: Annotated[int, typer.Option("--max", min=1, help="At most N dead letters.")] = 1000,
) -> None:
    """Entries set aside as undeliverable (time to live or retries exhausted), with the reason."""
    st = state(ctx)
    with st.open_queues() as store:
        if queue is not None:
            store.queue_info(queue)  # an unknown queue is an error, not an empty list
        letters = store.list_dead_letters(queue, max)
    docs = [{"queue": d.queue, "marker": d.marker, "reason": d.reason, "at": d.at, "bytes": len(d.data),
             "notification": notification_doc(d.data)} for d in letters]
    if st.out.json:
        st.out.document(docs)
        return
    st.out.rows([{**d, "key": d["notification"].get("key", "?")} for d in docs], [
        Column("queue", "queue"), Column("marker", "marker", lambda m: m.lstrip("0") or "0", "right"),
        Column("at", "at", when), Column("reason", "reason"), Column("key", "key"),
        Column("bytes", "bytes", justify="right"),
    ])


@app.command()
def notifications(
    ctx: typer.Context,
    source: Annotated[str | None, typer.Option("--source", metavar="TABLE",
                                               help="Only the configurations of this source.")] = None,
) -> None:
    """Notification topics (endpoint, delivery policy, queues) and the configurations bound to them."""
    st = state(ctx)
    with st.open_queues() as store:
        registry = NotificationRegistry(store)
        topics = [{**json.loads(t.to_json()), "endpoint": public_url(t.endpoint), "queues": registry.shard_names(t)}
                  for t in registry.list_topics()]
        configs = [json.loads(c.to_json()) for c in registry.get_configurations(source)]
    if st.out.json:
        st.out.document({"topics": topics, "configurations": configs})
        return
    st.out.rows(topics, [
        Column("topic", "name"), Column("endpoint", "endpoint"), Column("persistent", "persistent", _yes_no),
        Column("shards", "shards", justify="right"), Column("format", "format"),
        Column("ttl", "time_to_live", _forever, "right"), Column("retries", "max_retries", _forever, "right"),
    ], title="topics")
    st.out.rows(configs, [
        Column("id", "id"), Column("source", "source"), Column("topic", "topic"),
        Column("actions", "actions", lambda a: ", ".join(a) or "all"), Column("prefix", "prefix"),
        Column("suffix", "suffix"),
    ], title="configurations")


def _yes_no(value: Any) -> str:
    return "yes" if value else "no"


def _forever(value: Any) -> str:
    """A limit where 0 means none."""
    return "∞" if not value else f"{value:g}"
