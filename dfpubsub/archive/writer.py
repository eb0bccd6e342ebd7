"""The segment writer: rows in, whole Parquet segments out, rolled by size and age.

Rows go to the journal first (one write(2) each, safe from a crash of the
process), then to an in-memory buffer per partition (topic, date). A roll
writes each partition's rows as one Parquet file under a temporary name,
renames it into place, then removes the journal. At start, :meth:`recover`
publishes what a crashed writer left in its journals, under the segment names
those journals had, so publishing twice replaces a segment with the same rows
rather than adding duplicates.

Several writers may share a root: each keeps its journals in a directory of
its own, ``_journal/<writer id>/``, holding an exclusive ``flock`` on its
``.lock`` for as long as it lives. The kernel drops the lock when the process
dies, however it dies, so a directory whose lock can be taken belongs to a
crashed writer and is recovered; one still locked belongs to a live writer and
is left alone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable

from ..errors import ArchiveError
from ..events import Event
from ..metrics import Stats
from .journal import Journal, read_journal
from .layout import JOURNAL_DIR, SEGMENT_SUFFIX, fsync_dir, partition_dir, publish_file, utc_date
from .schema import Row, event_row, require_pyarrow, rows_to_table

__all__ = ["SegmentWriter"]

log = logging.getLogger(__name__)

_JOURNAL_SUFFIX = ".journal"
_LOCK = ".lock"
#: Bytes a row costs besides its strings and value (numbers, Parquet framing): for the size estimate.
_ROW_OVERHEAD = 48


class SegmentWriter:
    """Appends rows to the log under ``root``; thread-safe.

    A segment rolls when its rows reach ``max_bytes`` (an estimate of their
    encoded size) or when its first row is ``max_age`` seconds old (checked on
    every append and by :meth:`maybe_roll`, which a timer should call). With
    ``fsync`` segments, their directories and journals are fsynced when
    published, surviving a power loss too.
    """

    def __init__(
        self,
        root: str,
        max_bytes: int = 32 << 20,
        max_age: float = 60.0,
        fsync: bool = True,
        stats: Stats | None = None,
        clock: Callable[[], float] = time.time,
    ):
        require_pyarrow()
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.fsync = fsync
        self.stats = stats or Stats("archiver", "segments")
        self._clock = clock
        self._writer_id = secrets.token_hex(4)
        self._counter = 0
        self._lock = threading.Lock()
        self._journals = os.path.join(self.root, JOURNAL_DIR)
        self._journal_dir = os.path.join(self._journals, self._writer_id)
        self._dates: dict[int, str] = {}
        self._closed = False
        self._reset()
        try:
            os.makedirs(self._journal_dir, exist_ok=True)
            lock_fd = _try_lock(self._journal_dir)
        except OSError as exc:
            raise ArchiveError(f"cannot create the event log at {self.root}: {exc}") from exc
        if lock_fd is None:  # a fresh random name: only a broken file system gets here
            raise ArchiveError(f"cannot lock {self._journal_dir}")
        self._lock_fd: int = lock_fd

    def _reset(self) -> None:
        self._segment = ""
        self._journal: Journal | None = None
        self._parts: dict[tuple[str, str], list[Row]] = {}
        self._bytes = 0
        self._rows = 0
        self._opened = 0.0

    # -- writing ---------------------------------------------------------------------

    def append_event(self, event: Event, received_at: float | None = None) -> str:
        """Archive an event a subscriber delivered (``received_at`` defaults to now); the name of
        the segment it went to."""
        return self.append(event_row(event, self._clock() if received_at is None else received_at))

    def append(self, row: Row) -> str:
        """Journal ``row`` and buffer it for the current segment; roll if it is full or old. The
        name of the segment the row went to."""
        with self._lock:
            if self._closed:
                raise ArchiveError(f"the segment writer of {self.root} is closed")
            if self._journal is None:
                self._open_locked()
            assert self._journal is not None
            self._journal.append(row)
            self._parts.setdefault((row[0], self._date(row[10])), []).append(row)
            value = row[5]
            self._bytes += len(row[0]) + len(row[1]) + len(row[2]) + len(row[7]) + _ROW_OVERHEAD + (
                len(value) if value is not None else 0)
            self._rows += 1
            segment = self._segment
            if self._bytes >= self.max_bytes or self._clock() - self._opened >= self.max_age:
                self._roll_locked()
            return segment

    def maybe_roll(self) -> bool:
        """Roll the current segment if it is ``max_age`` old; return whether it did."""
        with self._lock:
            if self._journal is None or self._clock() - self._opened < self.max_age:
                return False
            self._roll_locked()
            return True

    def roll(self) -> list[str]:
        """Publish the current segment now; the paths of its files (relative to the root)."""
        with self._lock:
            return self._roll_locked()

    def close(self) -> None:
        """Publish what is buffered, then give up the journal directory."""
        with self._lock:
            if self._closed:
                return
            self._roll_locked()
            self._closed = True
            _remove_dir(self._journal_dir)
            os.close(self._lock_fd)

    @property
    def buffered(self) -> int:
        """Rows waiting for the next roll."""
        return self._rows

    def _date(self, ts: float) -> str:
        day = int(ts // 86400)
        date = self._dates.get(day)
        if date is None:
            if len(self._dates) > 64:
                self._dates.clear()
            date = self._dates[day] = utc_date(ts)
        return date

    def _open_locked(self) -> None:
        self._counter += 1
        now = self._clock()
        self._segment = f"seg-{int(now * 1000):013d}-{self._writer_id}-{self._counter:06d}"
        self._journal = Journal(os.path.join(self._journal_dir, self._segment + _JOURNAL_SUFFIX))
        self._opened = now

    def _roll_locked(self) -> list[str]:
        if self._journal is None:
            return []
        journal, segment, parts, rows = self._journal, self._segment, self._parts, self._rows
        journal.close(fsync=self.fsync)
        self._reset()
        published = self._publish(segment, parts)
        self._remove_journal(journal.path)
        self.stats.inc("segments_published", len(published))
        self.stats.inc("events_archived", rows)
        return published

    # -- publishing and recovery --------------------------------------------------------

    def _publish(self, segment: str, parts: dict[tuple[str, str], list[Row]]) -> list[str]:
        require_pyarrow()
        import pyarrow.parquet as pq
        published = []
        for (topic, date), rows in sorted(parts.items()):
            rel = partition_dir(topic, date)
            folder = os.path.join(self.root, rel)
            tmp = os.path.join(folder, f".{segment}{SEGMENT_SUFFIX}.tmp")
            try:
                os.makedirs(folder, exist_ok=True)
                pq.write_table(rows_to_table(rows), tmp, compression="zstd")
                publish_file(tmp, os.path.join(folder, segment + SEGMENT_SUFFIX), self.fsync)
            except OSError as exc:
                raise ArchiveError(f"cannot publish segment {rel}/{segment}: {exc}") from exc
            self.stats.inc("segment_bytes", os.path.getsize(os.path.join(folder, segment + SEGMENT_SUFFIX)))
            published.append(f"{rel}/{segment}{SEGMENT_SUFFIX}")
        return published

    def _remove_journal(self, path: str) -> None:
        try:
            os.unlink(path)
            if self.fsync:
                fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise ArchiveError(f"cannot remove journal {path}: {exc}") from exc

    def recover(self) -> int:
        """Publish the journals crashed writers left under this root; return the rows recovered.

        Call it before the first append. Journals of live writers are left
        alone. A journal whose segment was already published (the crash came
        between the rename and the unlink) is published again under the same
        name: same rows, no duplicates.
        """
        recovered = 0
        with self._lock:
            for writer in sorted(os.listdir(self._journals)):
                folder = os.path.join(self._journals, writer)
                if writer == self._writer_id or not os.path.isdir(folder):
                    continue
                try:
                    fd = _try_lock(folder)
                except FileNotFoundError:  # another writer recovered it meanwhile
                    continue
                if fd is None:  # alive
                    continue
                try:
                    recovered += self._recover_dir(folder)
                    _remove_dir(folder)
                finally:
                    os.close(fd)
        return recovered

    def _recover_dir(self, folder: str) -> int:
        recovered = 0
        for name in sorted(os.listdir(folder)):
            if not name.endswith(_JOURNAL_SUFFIX):
                continue
            path = os.path.join(folder, name)
            parts: dict[tuple[str, str], list[Row]] = {}
            for row in read_journal(path):
                parts.setdefault((row[0], self._date(row[10])), []).append(row)
            published = self._publish(name[:-len(_JOURNAL_SUFFIX)], parts)
            self._remove_journal(path)
            rows = sum(len(r) for r in parts.values())
            recovered += rows
            self.stats.inc("journals_recovered")
            self.stats.inc("events_archived", rows)
            log.info("recovered a journal", extra={"journal": name, "rows": rows, "segments": published})
        return recovered


def _try_lock(folder: str) -> int | None:
    """An fd holding the exclusive lock of ``folder``'s writer, or None if a live writer holds it."""
    fd = os.open(os.path.join(folder, _LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _remove_dir(folder: str) -> None:
    """Remove a writer's journal directory (its lock file; journals are gone by then)."""
    try:
        os.unlink(os.path.join(folder, _LOCK))
        os.rmdir(folder)
    except FileNotFoundError:
        pass
    except OSError as exc:  # a journal that could not be published is still there: keep it for the next start
        log.warning("journal directory left in place", extra={"folder": folder, "error": str(exc)})
