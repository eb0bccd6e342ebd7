"""``controller-status``: what controllers report in their status files (synced, queue, failed keys, cache objects
and bytes per table, repairs)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from dfpubsub.controller.snapfile import SnapshotRejected, check_seal, read_file, store_name
from dfpubsub.controller.snapshot import check_witness
from dfpubsub.controller.status import read_status
from dfpubsub.errors import DfPubSubError

from .context import state
from .output import Column, fail, when

__all__ = ["app"]

app = typer.Typer()


@app.command("controller-status")
def controller_status(
    ctx: typer.Context,
    files: Annotated[list[str], typer.Argument(metavar="FILE...", help="Status files ([controller] status_file).")],
    failed: Annotated[bool, typer.Option("--failed", help="List the failed keys instead.")] = False,
) -> None:
    """Controllers' status: synced, work-queue depth, keys given up after max_retries, the cache's objects and
    bytes per table, repairs by replay and by relist (docs/controller.md, docs/reliability.md)."""
    st = state(ctx)
    docs: list[dict[str, Any]] = []
    for path in files:
        try:
            docs.append({**read_status(path), "file": path})
        except ValueError as exc:
            if len(files) == 1:
                fail(str(exc))
            docs.append({"file": path, "error": str(exc)})
    if failed:
        keys = [{"controller": d["controller"], **k} for d in docs if "error" not in d for k in d["failed"]]
        if st.out.json:
            st.out.document(keys)
            return
        st.out.rows(keys, [Column("controller", "controller"), Column("table", "table"), Column("key", "key"),
                           Column("failures", "failures", justify="right"), Column("since", "since", when),
                           Column("error", "error")])
        return
    if st.out.json:
        st.out.document(docs)
        return
    now = time.time()
    st.out.rows([{**d, "age": f"{now - d['written_at']:.0f}s", "last": _last_repair(d)} if "error" not in d else d
                 for d in docs], [
        Column("file", "file"), Column("controller", "controller"), Column("synced", "synced"),
        Column("queue", "queue_depth", justify="right"), Column("failed", "failed_total", justify="right"),
        Column("position", "position", lambda v: "" if v is None else str(v), justify="right"),
        Column("cache", "cache", _cache), Column("repairs", "repairs", _repairs),
        Column("last repair", "last", lambda v: v or ""),
        Column("start", "start", lambda v: f"{v.get('result')}:{v.get('reason')}" if isinstance(v, dict) else ""),
        Column("written", "age", justify="right"), Column("error", "error", lambda e: e or "")])


def _cache(tables: object) -> str:
    """``port 200,000 (41.2 MB), network 3 (0.0 MB)``: objects and bytes per table; "" from a controller too
    old to report them."""
    if not isinstance(tables, dict):
        return ""
    parts = []
    for table, usage in sorted(tables.items()):
        if isinstance(usage, dict) and isinstance(usage.get("objects"), int) and isinstance(usage.get("bytes"), int):
            parts.append(f"{table} {usage['objects']:,} ({usage['bytes'] / 1e6:.1f} MB)")
    return ", ".join(parts)


def _repairs(counts: object) -> str:
    """``replay:gap 3, relist:first_sync 1``; "" from a controller too old to report them."""
    if not isinstance(counts, dict):
        return ""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _last_repair(doc: dict[str, Any]) -> str:
    last = doc.get("last_repair")
    if not isinstance(last, dict):
        return ""
    return (f"{last.get('kind')} ({last.get('cause')}): {last.get('entries')} entries, "
            f"{last.get('objects')} objects read")


@app.command("controller-state")
def controller_state(
    ctx: typer.Context,
    directory: Annotated[str, typer.Argument(metavar="DIR", help="A controller's [controller] state_dir.")],
) -> None:
    """A controller's snapshot: the store it came from, its positions, objects, tombstones and age, and whether
    a start would resume from it, checked against the configured store (its identity, the snapshot's seal, the
    feed's history at the positions); exit status 1 when it would not (docs/controller.md#warm-restarts)."""
    st = state(ctx)
    try:
        snapshot = read_file(directory)
    except SnapshotRejected as exc:
        st.out.record({"directory": directory, "would_resume": False, "reason": exc.reason, "error": str(exc)})
        raise typer.Exit(1) from None
    header = snapshot.header
    positions = header.get("positions") or {}
    doc: dict[str, Any] = {
        "directory": directory, "controller": header.get("controller"), "store": header.get("store"),
        "bytes": snapshot.size, "written_at": header.get("written_at"),
        "age": f"{time.time() - float(header.get('written_at') or 0):.0f}s", "positions": positions,
        "objects": header.get("objects"), "tombstones": header.get("tombstones"), "topics": header.get("topics"),
    }
    try:
        with st.open_store() as store:
            identity = store.identity()
            doc["store_now"] = store_name(identity)
            if header.get("store") != doc["store_now"]:
                raise SnapshotRejected("other_store", "written from another store")
            check_seal(snapshot, identity)
            check_witness(store, header)
            head, entries = store.feed_since(min(positions.values(), default=0))
            doc["feed_head"], doc["revisions_since"] = head, entries
        doc["would_resume"], doc["reason"] = True, "replay"
    except SnapshotRejected as exc:
        doc["would_resume"], doc["reason"] = False, exc.reason
    except (DfPubSubError, NotImplementedError) as exc:
        doc["would_resume"], doc["reason"], doc["error"] = None, "store", str(exc)
    st.out.record(doc, {"positions": lambda p: ", ".join(f"{t} {r}" for t, r in sorted(p.items())),
                        "topics": lambda t: ", ".join(t or ())})
    if doc["would_resume"] is not True:
        raise typer.Exit(1)
