"""Where the event log keeps things: partitions by topic and date, segment names, atomic publish.

::

    <root>/topic=<topic, percent-encoded>/date=<YYYY-MM-DD, UTC of received_at>/<segment>.parquet
    <root>/_journal/<segment>.journal         rows of the segment being filled
    <root>/topic=.../date=.../.<segment>.parquet.tmp   a segment being written

Names starting with ``_`` or ``.`` are skipped by Spark, pyarrow datasets and
:func:`segment_files`, so a reader sees published segments only. A segment is
written to its temporary name, fsynced, renamed to its final name and its
directory fsynced: a reader finds it whole or not at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote, unquote

from ..errors import ArchiveError

__all__ = ["JOURNAL_DIR", "SEGMENT_SUFFIX", "partition_dir", "parse_partition", "segment_files", "publish_file",
           "fsync_dir", "utc_date"]

JOURNAL_DIR = "_journal"
SEGMENT_SUFFIX = ".parquet"


def utc_date(ts: float) -> str:
    """``YYYY-MM-DD`` of Unix time ``ts`` in UTC."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def partition_dir(topic: str, date: str) -> str:
    """The partition's path relative to the root (Hive style, the topic percent-encoded)."""
    return f"topic={quote(topic, safe='')}/date={date}"


def parse_partition(rel_dir: str) -> tuple[str, str] | None:
    """(topic, date) of a partition path relative to the root, or None if it is not one."""
    parts = rel_dir.replace(os.sep, "/").split("/")
    if len(parts) != 2 or not parts[0].startswith("topic=") or not parts[1].startswith("date="):
        return None
    return unquote(parts[0][len("topic="):]), parts[1][len("date="):]


def segment_files(
    root: str, accept: Callable[[str, str], bool] | None = None, listdir: Callable[[str], list[str]] | None = None
) -> Iterator[str]:
    """Paths, relative to ``root``, of the published segments, partition by partition.

    ``accept(topic, date)`` prunes partitions before their directory is listed.
    ``listdir(path)`` lists a directory (empty if absent); the local one by default.
    """
    ls = listdir or _entries
    for topic_entry in sorted(ls(root)):
        if not topic_entry.startswith("topic="):
            continue
        for date_entry in sorted(ls(f"{root}/{topic_entry}")):
            rel = f"{topic_entry}/{date_entry}"
            part = parse_partition(rel)
            if part is None or (accept is not None and not accept(*part)):
                continue
            for name in sorted(ls(f"{root}/{rel}")):
                if name.endswith(SEGMENT_SUFFIX) and not name.startswith(("_", ".")):
                    yield f"{rel}/{name}"


def _entries(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ArchiveError(f"cannot list {path}: {exc}") from exc


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (a rename, an unlink) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_file(tmp: str, final: str, fsync: bool) -> None:
    """Rename the written file ``tmp`` to ``final`` atomically (replacing a same-named one)."""
    if fsync:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, final)
    if fsync:
        fsync_dir(os.path.dirname(final))
