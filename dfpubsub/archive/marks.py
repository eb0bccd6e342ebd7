"""What the event log says about its own completeness, read back at an archiver's start.

An archiver that follows the store's change feed (docs/pipeline.md, "No hole")
puts a :data:`~.schema.REACH` marker in each topic's partition now and then:
every committed write of its topics up to the marker's ``version`` is in the
log. Writes above it may be in the log too (received, not yet matched with the
feed); the marker names the oldest segment that can hold one (``scan_from``).
The next archiver of the log, after a crash, a restart or a change of leader,
reads the newest marker and those segments, and so knows where to resume the
feed and which writes it need not read again.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import msgpack

from ..errors import ArchiveError
from .layout import SEGMENT_SUFFIX, segment_files, utc_date
from .schema import OBJECT_ACTIONS, REACH, require_pyarrow

__all__ = ["Reach", "archived_above", "newest_reach", "reach_note"]


class Reach(NamedTuple):
    """The newest reach marker: its revision, and the oldest segment that may hold writes above it."""

    revision: int
    scan_from: str


def reach_note(scan_from: str) -> bytes:
    """A reach marker's ``value``: ``scan_from`` ("" for the marker's own segment)."""
    note: bytes = msgpack.packb({"scan_from": scan_from})
    return note


def _segment_name(rel: str) -> str:
    return os.path.basename(rel)[:-len(SEGMENT_SUFFIX)]


def _read(root: str, rel: str, columns: list[str]) -> dict[str, list[Any]]:
    require_pyarrow()
    import pyarrow.parquet as pq

    try:
        columns_read: dict[str, list[Any]] = pq.read_table(os.path.join(root, rel), columns=columns).to_pydict()
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"cannot read segment {rel} of {root}: {exc}") from exc
    return columns_read


def newest_reach(root: str, topics: list[str]) -> Reach | None:
    """The newest reach marker in the partitions of ``topics`` (each read from its newest segment
    back to the first that holds one); None if the log has none."""
    best: Reach | None = None
    for topic in topics:
        for rel in reversed(list(segment_files(root, _only(topic)))):
            cols = _read(root, rel, ["action", "version", "value"])
            marks = [(int(v), note) for a, v, note in zip(cols["action"], cols["version"], cols["value"]) if a == REACH]
            if not marks:
                continue
            version, note = max(marks, key=lambda m: m[0])
            scan_from = str(msgpack.unpackb(note).get("scan_from", "")) if note else ""
            found = Reach(version, scan_from or _segment_name(rel))
            if best is None or found.revision > best.revision:
                best = found
            break
    return best


def _only(topic: str) -> Any:
    return lambda t, _date: t == topic


def archived_above(root: str, topics: list[str], reach: Reach) -> set[tuple[str, str, int]]:
    """(table, key, version) of the writes in the log above ``reach``: those of the segments from
    ``reach.scan_from`` on, in the partitions of ``topics``."""
    wanted = set(topics)
    try:
        first_day = utc_date(int(reach.scan_from.split("-")[1]) / 1000)
    except (IndexError, ValueError):
        first_day = ""  # not a name this writer makes: read every date

    def accept(topic: str, date: str) -> bool:
        return topic in wanted and date >= first_day

    out: set[tuple[str, str, int]] = set()
    for rel in segment_files(root, accept):
        if _segment_name(rel) < reach.scan_from:
            continue
        cols = _read(root, rel, ["table", "key", "version", "action"])
        for table, key, version, action in zip(cols["table"], cols["key"], cols["version"], cols["action"]):
            if action in OBJECT_ACTIONS and version > reach.revision:
                out.add((table, key, int(version)))
    return out
