"""``deadletters`` and ``notifications``: what could not be delivered, and what is notified where."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from dfpubsub.errors import DfPubSubError
from dfpubsub.notify import NotificationRegistry

from .context import CliState, confirm, public_url, state
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
    docs: list[dict[str, Any]] = [{"queue": d.queue, "marker": d.marker, "reason": d.reason, "at": d.at, "bytes": len(d.data),
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
def redrive(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="The queue whose dead letters go back.")],
    markers: Annotated[list[str] | None, typer.Argument(metavar="[MARKER]...",
                                                        help="These dead letters (default: all of the queue).")] = None,
    older_than: Annotated[float | None, typer.Option("--older-than", metavar="SECONDS", min=0,
                                                     help="Only letters set aside this long ago or more.")] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Only letters set aside for this reason.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Put dead letters back at the end of their queue for another delivery (each one atomically:
    never lost nor duplicated); stops at the first that does not fit."""
    st = state(ctx)
    with st.open_queues() as store:
        store.queue_info(queue)
        letters = store.list_dead_letters(queue, 1 << 30)
        wanted = {m.zfill(20) for m in markers or ()}
        now = time.time()
        chosen = [d for d in letters if (not wanted or d.marker in wanted)
                  and (older_than is None or now - d.at >= older_than) and (reason is None or d.reason == reason)]
        if not chosen:
            if st.out.json:
                st.out.document([])
            else:
                st.out.note(f"no dead letters of {queue} match")
            return
        confirm(f"redrive {len(chosen)} dead letter(s) of {queue}", yes or bool(markers))
        moved: list[dict[str, Any]] = []
        try:
            for d in chosen:
                new = store.redrive(queue, d.marker)
                if new is not None:
                    moved.append({"queue": queue, "marker": d.marker, "entry": new, "reason": d.reason})
        except DfPubSubError:
            if moved:  # what did move, before the one-line error
                _show_moved(st, moved)
            raise
        _show_moved(st, moved)


def _show_moved(st: CliState, moved: list[dict[str, Any]]) -> None:
    if st.out.json:
        st.out.document(moved)
        return
    st.out.rows(moved, [Column("queue", "queue"), Column("marker", "marker", justify="right"),
                        Column("entry", "entry", justify="right"), Column("reason", "reason")])


@app.command("purge-deadletters")
def purge_deadletters(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Argument(help="Only this queue (default: every queue).")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete dead letters for good."""
    st = state(ctx)
    with st.open_queues() as store:
        if queue is not None:
            store.queue_info(queue)
        confirm(f"delete the dead letters of {queue or 'every queue'}", yes)
        n = store.purge_dead_letters(queue)
    if st.out.json:
        st.out.document({"purged": n})
    else:
        st.out.note(f"purged {n} dead letter(s)")


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
