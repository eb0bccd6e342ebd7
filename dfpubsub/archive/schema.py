"""The columns of the event log: one row per event, with its envelope's metadata.

The columns are declared once here, as names and logical types, so that the
pyarrow schema the archiver writes and the Spark schema the pipeline reads
are built from the same list. ``value`` holds the object msgpack-encoded (as
the store keeps it), null on delete. Times are Unix seconds (float64):
``timestamp`` when the change was made, ``sent_at`` when its envelope left the
publisher, ``received_at`` when the archiver got it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack

from ..errors import ArchiveError
from ..events import Event

if TYPE_CHECKING:
    import pyarrow

__all__ = ["COLUMNS", "FEED_PUBLISHER", "HISTORY_GONE", "LOG_SCHEMA_VERSION", "OBJECT_ACTIONS", "REACH",
           "SCHEMA_METADATA_KEY", "Row", "arrow_schema", "event_row", "feed_row", "marker_row", "rows_to_table",
           "require_pyarrow"]

#: (name, logical type) of every column, in file order. Types: string, binary, int64, float64.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("table", "string"),
    ("key", "string"),
    ("action", "string"),
    ("version", "int64"),
    ("value", "binary"),
    ("timestamp", "float64"),
    ("publisher_id", "string"),
    ("seq", "int64"),
    ("sent_at", "float64"),
    ("received_at", "float64"),
)
#: Bumped when a column changes meaning; written to every segment's Parquet metadata.
LOG_SCHEMA_VERSION = 1
SCHEMA_METADATA_KEY = b"dfpubsub.log_schema"

#: One log row: the values of :data:`COLUMNS`, in order.
Row = tuple[str, str, str, str, int, bytes | None, float, str, int, float, float]

#: The ``action`` of a row that is a change of an object; any other row is a marker.
OBJECT_ACTIONS = ("create", "update", "delete")
#: ``publisher_id`` of the rows the archiver wrote itself instead of receiving them: writes read
#: from the store's change feed (``seq`` is then the revision, ``sent_at`` and ``timestamp`` 0)
#: and markers. No publisher has it: theirs are random hex.
FEED_PUBLISHER = "store-feed"
#: Marker: every committed write of the archived topics up to ``version`` is in the log.
REACH = "reach"
#: Marker: the feed's history from ``seq`` (exclusive) to ``version`` was gone when the archiver
#: looked; writes there that it did not receive are not in the log, and nobody can know which.
HISTORY_GONE = "history_gone"


def require_pyarrow() -> Any:
    """The pyarrow module (imported on first use: ``import dfpubsub`` must work without it)."""
    try:
        import pyarrow
    except ImportError as exc:
        raise ArchiveError("the event log needs pyarrow: pip install 'dfpubsub[spark]'") from exc
    return pyarrow


def arrow_schema() -> pyarrow.Schema:
    """The pyarrow schema of a segment (``value`` and nothing else nullable)."""
    pa = require_pyarrow()
    types = {"string": pa.string(), "binary": pa.binary(), "int64": pa.int64(), "float64": pa.float64()}
    fields = [pa.field(name, types[kind], nullable=name == "value") for name, kind in COLUMNS]
    return pa.schema(fields, metadata={SCHEMA_METADATA_KEY: str(LOG_SCHEMA_VERSION).encode()})


def event_row(event: Event, received_at: float) -> Row:
    """The log row of an event a subscriber delivered at ``received_at``."""
    action = event.action.value
    value = None if action == "delete" else msgpack.packb(event.value)
    return (event.topic, event.table, event.key, action, event.version, value, float(event.timestamp),
            event.publisher_id, event.seq, float(event.sent_at), received_at)


def feed_row(topic: str, table: str, key: str, action: str, revision: int, value: bytes | None,
             received_at: float) -> Row:
    """The log row of a write read from the change feed (``value`` msgpack-encoded, or None when
    the store no longer holds that version)."""
    return (topic, table, key, action, revision, value, 0.0, FEED_PUBLISHER, revision, 0.0, received_at)


def marker_row(topic: str, kind: str, version: int, after: int, note: bytes, received_at: float) -> Row:
    """A marker of ``kind`` (:data:`REACH`, :data:`HISTORY_GONE`) in ``topic``'s partition: ``version``
    and ``after`` are revisions, ``note`` what the marker carries (msgpack)."""
    return (topic, "", "", kind, version, note, 0.0, FEED_PUBLISHER, after, 0.0, received_at)


def rows_to_table(rows: list[Row]) -> pyarrow.Table:
    """A pyarrow table of ``rows`` in the log schema."""
    pa = require_pyarrow()
    schema = arrow_schema()
    columns = list(zip(*rows)) if rows else [()] * len(COLUMNS)
    return pa.Table.from_arrays([pa.array(col, f.type) for col, f in zip(columns, schema)], schema=schema)
