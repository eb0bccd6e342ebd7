"""The archiver's write-ahead journal: every row reaches the OS before it is counted as archived.

A segment is written whole and then renamed into place, so until it rolls
its rows live in memory. The journal keeps them safe from a crash of the
process (``kill -9``): each row is appended as one record with one
``write(2)``, which the kernel keeps whatever happens to the process. After a
power loss only what was fsynced survives (the journal is fsynced when its
segment is published, before it is removed). Record: 4-byte big-endian length,
4-byte CRC-32 of the payload, the msgpack payload (a row). Reading stops at the
first short or corrupt record: that is the write a crash cut off.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator

import msgpack

from ..errors import ArchiveError
from .schema import Row

__all__ = ["Journal", "read_journal"]

_HEADER = struct.Struct(">II")
#: A record longer than this is taken as corruption, not as a row.
_MAX_RECORD = 1 << 30


class Journal:
    """An append-only journal file of rows (created on open, never rewritten)."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise ArchiveError(f"cannot open journal {path}: {exc}") from exc

    def append(self, row: Row) -> None:
        """Append ``row`` with one write(2)."""
        payload = msgpack.packb(row)
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        try:
            written = os.write(self._fd, record)
        except OSError as exc:
            raise ArchiveError(f"cannot append to journal {self.path}: {exc}") from exc
        if written != len(record):  # only a full disk makes a regular file's write short
            raise ArchiveError(f"short write to journal {self.path}: {written} of {len(record)} bytes")

    def close(self, fsync: bool = False) -> None:
        """Close the file, fsyncing it first if asked."""
        if self._fd < 0:
            return
        try:
            if fsync:
                os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1


def read_journal(path: str) -> Iterator[Row]:
    """The rows of a journal up to its first short or corrupt record."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos, end = 0, len(data)
    while pos + _HEADER.size <= end:
        size, crc = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        if size > _MAX_RECORD or start + size > end:
            return
        payload = data[start:start + size]
        if zlib.crc32(payload) != crc:
            return
        try:
            row = msgpack.unpackb(payload)
        except (ValueError, msgpack.UnpackException):
            return
        yield tuple(row)
        pos = start + size
