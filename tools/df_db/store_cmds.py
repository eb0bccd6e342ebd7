"""Store commands: read through the store, write through NbApi (so writes publish)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dfpubsub.controller.snapfile import store_name
from dfpubsub.errors import DfPubSubError, NotFound
from dfpubsub.events import VersionedObject

from .context import CliState, confirm, public_url, state
from .items import Item, parse_items, read_input
from .output import Column, compact

__all__ = ["app"]

app = typer.Typer()

Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
Publish = Annotated[bool, typer.Option(
    "--publish/--no-publish", help="Publish each change on the configured driver (as NbApi does).")]
Data = Annotated[str | None, typer.Argument(metavar="[JSON]", help="The object(s) as JSON (see docs/df-db.md).")]
File = Annotated[str | None, typer.Option("--file", "-f", metavar="PATH", help="Read the JSON from PATH (- : stdin).")]

_OBJECT_COLUMNS = [Column("table", "table"), Column("key", "key"), Column("topic", "topic"),
                   Column("version", "version", justify="right")]


def _doc(obj: VersionedObject, value: bool = True) -> dict[str, Any]:
    doc = {"table": obj.table, "key": obj.key, "topic": obj.topic, "version": obj.version}
    if value:
        doc["value"] = obj.value
    return doc


def _sorted(objects: list[VersionedObject]) -> list[VersionedObject]:
    return sorted(objects, key=lambda o: (o.table, o.key))


@app.command()
def tables(ctx: typer.Context) -> None:
    """The tables of the schema and how many objects each holds."""
    st = state(ctx)
    with st.open_store() as store:
        rows = [{"table": t, "objects": store.count(t)} for t in sorted(store.tables)]
    st.out.rows(rows, [Column("table", "table"), Column("objects", "objects", justify="right")])


@app.command()
def ls(
    ctx: typer.Context,
    table: Annotated[str, typer.Argument(help="A table of the schema.")],
    prefix: Annotated[str, typer.Option("--prefix", "-p", help="Only the keys that start with this.")] = "",
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, help="At most this many keys, the first in order "
                                       "(0: all); a note on stderr says how many more there are.")] = 0,
) -> None:
    """The keys of TABLE with their topic and version (in key order)."""
    st = state(ctx)
    with st.open_store() as store:
        objects = _sorted([o for o in store.list(table) if o.key.startswith(prefix)])
    shown = objects[:limit] if limit else objects
    st.out.rows([_doc(o, value=False) for o in shown], _OBJECT_COLUMNS[1:], title=table)
    if len(shown) < len(objects):
        st.out.note(f"{len(objects) - len(shown)} more key(s); raise --limit to see them")


@app.command()
def get(ctx: typer.Context, table: str, key: str) -> None:
    """One object, with its value."""
    st = state(ctx)
    with st.open_store() as store:
        obj = store.get(table, key)
    if obj is None:
        raise NotFound(f"{table}/{key} does not exist")
    st.out.record(_doc(obj))


@app.command()
def dump(
    ctx: typer.Context, table: Annotated[str | None, typer.Argument(help="Only this table (default: all).")] = None
) -> None:
    """Every object (of TABLE) with its value."""
    st = state(ctx)
    objects: list[VersionedObject] = []
    with st.open_store() as store:
        names = [table] if table is not None else sorted(store.tables)
        with st.out.progress(len(names), "reading tables") as advance:
            for name in names:
                objects.extend(_sorted(store.list(name)))
                advance(1)
    st.out.rows([_doc(o) for o in objects], [*_OBJECT_COLUMNS, Column("value", "value", compact)])


def _write(st: CliState, table: str, items: list[Item], publish: bool, update: bool) -> None:
    done: list[VersionedObject] = []
    with st.open_api(publish) as api:
        for item in items:
            try:
                done.append(api.update(table, item.key, item.value, item.version) if update
                            else api.create(table, item.key, item.value, item.topic))
            except DfPubSubError:
                if done:
                    st.out.note(f"{len(done)} of {len(items)} objects were written before the error: "
                                + ", ".join(o.key for o in done))
                raise
    st.out.rows([_doc(o, value=False) for o in done], _OBJECT_COLUMNS)


def _items(data: str | None, path: str | None, update: bool) -> list[Item]:
    if (data is None) == (path is None):
        raise typer.BadParameter("give the JSON either as an argument or with --file PATH, exactly one of them")
    return parse_items(*read_input(data, path), update=update)


@app.command()
def add(ctx: typer.Context, table: str, data: Data = None, file: File = None, publish: Publish = True) -> None:
    """Create objects from JSON: {"key": K, "value": V, "topic": T?} or a list of them."""
    _write(state(ctx), table, _items(data, file, update=False), publish, update=False)


@app.command()
def update(ctx: typer.Context, table: str, data: Data = None, file: File = None, publish: Publish = True) -> None:
    """Replace objects' values from JSON: {"key": K, "value": V, "version": N?} or a list of them."""
    _write(state(ctx), table, _items(data, file, update=True), publish, update=True)


@app.command()
def rm(ctx: typer.Context, table: str, key: str, yes: Yes = False, publish: Publish = True) -> None:
    """Delete one object (only if it is still the version shown when confirming)."""
    st = state(ctx)
    with st.open_store() as store:
        obj = store.get(table, key)
    if obj is None:
        raise NotFound(f"{table}/{key} does not exist")
    # Asked before the publisher is made: nothing about publishing is said of a change refused.
    confirm(f"delete {table}/{key} (version {obj.version})", yes)
    with st.open_api(publish) as api:
        gone = api.delete(table, key, expected_version=obj.version)
    st.out.record(_doc(gone, value=False))


@app.command()
def clean(ctx: typer.Context, yes: Yes = False, publish: Publish = True) -> None:
    """Delete every object through NbApi, so that each delete is published."""
    st = state(ctx)
    with st.open_store() as store:
        objects = store.list()
    if objects:
        confirm(f"delete all {len(objects)} objects of {public_url(st.settings.store.url)}"
                + (", publishing each delete" if publish else ""), yes)
    deleted = 0
    with st.open_api(publish) as api, st.out.progress(len(objects), "deleting") as advance:
        for obj in objects:
            try:
                api.delete(obj.table, obj.key)
                deleted += 1
            except NotFound:  # deleted by someone else meanwhile: the goal is reached
                pass
            advance(1)
    st.out.record({"deleted": deleted})


@app.command()
def init(
    ctx: typer.Context,
    new_identity: Annotated[bool, typer.Option(
        "--new-identity", help="Give the store a new identity: after a restore from backup, so that no controller "
        "resumes from a snapshot of the store as it was (docs/controller.md#warm-restarts).")] = False,
) -> None:
    """Create what the backend needs (SQLite: the file and schema) and the store's identity, and check that it
    answers."""
    st = state(ctx)
    with st.open_store(create=True) as store:
        names = sorted(store.tables)
        if names:
            # A read proves the backend answers; etcd and Redis need nothing created.
            store.get(names[0], "df-db-init-probe")
        doc: dict[str, Any] = {"backend": store.backend, "url": public_url(st.settings.store.url), "tables": names,
                               "identity": store_name(store.identity(renew=new_identity))}
    with st.open_discovery(create=True) as discovery:
        doc["discovery"] = discovery.backend
        doc["publishers"] = len(discovery.list())
    st.out.record(doc, {"tables": ", ".join})


@app.command()
def dropall(ctx: typer.Context, yes: Yes = False) -> None:
    """Delete every object of every table WITHOUT publishing (subscribers will not know)."""
    st = state(ctx)
    with st.open_store() as store:
        confirm(f"drop every object of {public_url(st.settings.store.url)} without publishing", yes)
        dropped = store.drop_all()
    st.out.record({"dropped": dropped})


