"""``queues list|stats|dump|reservations|owners``: the persistent notification queues."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from dfpubsub.errors import ForeignRecord, NotificationDecodeError, QueueNotFound
from dfpubsub.notify.notification import decode

from .context import state
from .output import Column, duration, when

__all__ = ["app", "notification_doc"]

app = typer.Typer(no_args_is_help=True)
T = TypeVar("T")

Queues = Annotated[list[str] | None, typer.Argument(metavar="[QUEUE]...", help="Only these queues (default: all).")]
Max = Annotated[int, typer.Option("--max", min=1, help="At most N entries.")]


def notification_doc(data: bytes) -> dict[str, Any]:
    """A queued entry as its notification's fields; an entry that does not decode, as base64 and why."""
    try:
        return dataclasses.asdict(decode(data))
    except NotificationDecodeError as exc:
        return {"undecodable": exc.reason, "data": base64.b64encode(data).decode()}


def _short(marker: str) -> str:
    return marker.lstrip("0") or "0"


def _left(until: float | None, now: float) -> float | None:
    return None if until is None else round(max(0.0, until - now), 3)


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """Every queue with its limits: max bytes and entries, reservation expiry, creation time."""
    st = state(ctx)
    with st.open_queues() as store:
        infos = [info for _, info in _each(store.list_queues(), store.queue_info, listed=True)]
    st.out.rows([{"queue": i.name, "max_bytes": i.max_bytes, "max_entries": i.max_entries,
                  "stale_after": i.stale_after, "created_at": i.created_at} for i in infos], [
        Column("queue", "queue"), Column("max bytes", "max_bytes", justify="right"),
        Column("max entries", "max_entries", justify="right"), Column("stale after", "stale_after", duration, "right"),
        Column("created", "created_at", when),
    ])


def _read_stats(ctx: typer.Context, queues: list[str] | None) -> list[dict[str, Any]]:
    st = state(ctx)
    with st.open_queues() as store:
        names = queues or store.list_queues()
        now = store.clock()
        return [{"queue": name, **s._asdict(), "now": now} for name, s in _each(names, store.stats, not queues)]


def _each(names: list[str], read: Callable[[str], T], listed: bool) -> list[tuple[str, T]]:
    """``(name, read(name))`` for each queue; one whose metadata is foreign (counted, and shown
    in the output's skipped footer) is left out, and so is a ``listed`` one deleted since (a
    queue the user named that does not exist is an error)."""
    out = []
    for name in names:
        try:
            out.append((name, read(name)))
        except ForeignRecord:
            continue
        except QueueNotFound:
            if not listed:
                raise
    return out


#: The owner's columns, named alike in ``stats`` and ``owners``.
_OWNER_COLUMNS = [Column("owner", "owner", lambda o: o or "-"), Column("owner until", "owner_until", when),
                  Column("lease left", "owner_left", duration, "right")]


@app.command()
def stats(ctx: typer.Context, queues: Queues = None) -> None:
    """Entries, bytes and live reservations of each queue against its limits, and its owner."""
    rows = _read_stats(ctx, queues)
    for row in rows:
        row["owner_left"] = _left(row["owner_until"], row.pop("now"))
    state(ctx).out.rows(rows, [
        Column("queue", "queue"), Column("entries", "entries", justify="right"),
        Column("bytes", "bytes", justify="right"), Column("reservations", "reservations", justify="right"),
        Column("reserved bytes", "reserved_bytes", justify="right"),
        Column("max bytes", "max_bytes", justify="right"), Column("max entries", "max_entries", justify="right"),
        *_OWNER_COLUMNS,
    ])


@app.command()
def reservations(ctx: typer.Context, queues: Queues = None) -> None:
    """Live reservations of each queue (room taken by writers that have not committed yet)."""
    rows = [{"queue": r["queue"], "reservations": r["reservations"], "reserved_bytes": r["reserved_bytes"]}
            for r in _read_stats(ctx, queues)]
    state(ctx).out.rows(rows, [Column("queue", "queue"), Column("reservations", "reservations", justify="right"),
                               Column("reserved bytes", "reserved_bytes", justify="right")])


@app.command()
def owners(ctx: typer.Context, queues: Queues = None) -> None:
    """Which worker owns (delivers) each queue, and until when; null: nobody now."""
    rows = [{"queue": r["queue"], "owner": r["owner"], "owner_until": r["owner_until"],
             "owner_left": _left(r["owner_until"], r["now"])} for r in _read_stats(ctx, queues)]
    state(ctx).out.rows(rows, [Column("queue", "queue"), *_OWNER_COLUMNS])


@app.command()
def dump(ctx: typer.Context, queue: str, max: Max = 1000,
         after: Annotated[str | None, typer.Option("--after", metavar="MARKER",
                                                   help="Start after this marker.")] = None) -> None:
    """The entries of QUEUE in commit order, decoded."""
    st = state(ctx)
    with st.open_queues() as store:
        entries, more = store.list(queue, max, after)
    docs: list[dict[str, Any]] = [{"marker": e.marker, "enqueued_at": e.enqueued_at, "bytes": len(e.data),
             "notification": notification_doc(e.data)} for e in entries]
    if st.out.json:
        st.out.document({"queue": queue, "entries": docs, "more": more})
        return
    st.out.rows([{**d, **d["notification"]} for d in docs], [
        Column("marker", "marker", _short, "right"), Column("enqueued", "enqueued_at", when),
        Column("bytes", "bytes", justify="right"), Column("event", "event_name", lambda v: v or "?"),
        Column("table", "bucket", lambda v: v or "?"), Column("key", "key", lambda v: v or "?"),
        Column("version", "version", lambda v: "?" if v is None else str(v), "right"),
    ], title=queue)
    if more:
        st.out.note(f"more entries follow: --after {docs[-1]['marker']}")
