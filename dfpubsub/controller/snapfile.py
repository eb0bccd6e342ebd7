"""The file a controller's snapshot lives in: written atomically, read back only whole and sealed.

Layout (format 1)::

    b"DFSNAPSH"  format (u32, big endian)
    a msgpack stream: the header (a map), then chunks (arrays), then nil
    the file's length (u64)  seal (32 bytes)  checksum (32 bytes)

The *checksum* is the SHA-256 of everything before the seal: a torn, truncated
or damaged file fails it. The *seal* is an HMAC-SHA256 of the checksum keyed
by the store's identity (:meth:`Store.identity`), which the file does not
hold: a file edited by anyone who cannot read the store fails it even with
its checksum made again, and a file from another store fails it too.

A file is written beside the one it replaces (a temporary name in the same
directory), flushed and fsynced, renamed over it, and the directory fsynced:
a crash at any moment (kill -9, a full disk, a power cut) leaves the last good
file or none, never a torn one that reads as good. Chunks are packed one at a
time, so packing a million objects never holds the GIL for long.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import msgpack

__all__ = ["FORMAT", "FILE", "TEMP_PREFIX", "SnapshotRejected", "SnapshotFile", "write_file", "read_file",
           "seal", "check_seal", "store_name", "remove_temporaries"]

MAGIC = b"DFSNAPSH"
FORMAT = 1
#: The snapshot's name in its state directory (one controller per directory).
FILE = "controller.snapshot"
#: What a write in progress is named, until it is renamed to FILE (left by a crash: removed at start).
TEMP_PREFIX = ".controller.snapshot."
_PREFIX = struct.Struct(">8sI")
_LENGTH = struct.Struct(">Q")
_TRAILER = _LENGTH.size + 64


class SnapshotRejected(Exception):
    """A snapshot that cannot be used; ``reason`` names why (the label a warm start is counted under)."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(f"{detail} ({reason})")


class SnapshotFile(NamedTuple):
    """A snapshot file read back whole: its header, its chunks (a fresh iterator each call), its
    checksum and seal (checked against a store by :func:`check_seal`), and its size in bytes."""

    header: dict[str, Any]
    data: bytes
    checksum: bytes
    seal: bytes
    size: int

    def chunks(self) -> Iterator[list[Any]]:
        """The chunks after the header, in the order written."""
        unpacker = _unpacker(self.data)
        next(unpacker)  # the header
        for item in unpacker:
            if item is None:
                return
            yield item


def store_name(identity: bytes) -> str:
    """The public name of a store's identity (what a snapshot and ``df-db init`` show): it names the
    store without giving away the key that seals snapshots."""
    return hashlib.sha256(b"dfpubsub store name\0" + identity).hexdigest()[:24]


def seal(identity: bytes, checksum: bytes) -> bytes:
    """The seal of a file whose checksum is ``checksum``, for the store whose identity is ``identity``."""
    key = hashlib.sha256(b"dfpubsub snapshot seal\0" + identity).digest()
    return hmac.new(key, checksum, hashlib.sha256).digest()


def write_file(directory: str, header: dict[str, Any], chunks: Iterable[list[Any]], identity: bytes) -> int:
    """Write a snapshot of ``header`` and ``chunks`` to ``directory``/FILE atomically; its size.

    OSError (a full disk, a read-only directory) leaves the previous file as it was and no
    temporary behind."""
    os.makedirs(directory, exist_ok=True)  # made again if it was removed
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            digest = hashlib.sha256()
            pack = msgpack.Packer().pack

            def put(blob: bytes) -> None:
                digest.update(blob)
                f.write(blob)

            put(_PREFIX.pack(MAGIC, FORMAT))
            put(pack(header))
            for chunk in chunks:
                put(pack(chunk))
            put(pack(None))
            size = f.tell() + _TRAILER
            put(_LENGTH.pack(size))
            checksum = digest.digest()
            f.write(seal(identity, checksum) + checksum)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, FILE))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself
    finally:
        os.close(dir_fd)
    return size


def read_file(directory: str) -> SnapshotFile:
    """``directory``/FILE read back and checked whole (all but the seal, which needs the store);
    :class:`SnapshotRejected` naming why it cannot be used."""
    path = os.path.join(directory, FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SnapshotRejected("no_snapshot", f"no snapshot at {path}") from None
    except OSError as exc:
        raise SnapshotRejected("unreadable", f"cannot read {path}: {exc.strerror or exc}") from exc
    size = len(data)
    if size < _PREFIX.size + _TRAILER:
        raise SnapshotRejected("truncated", f"{path} holds {size} bytes")
    magic, version = _PREFIX.unpack_from(data)
    if magic != MAGIC or version != FORMAT:
        raise SnapshotRejected("other_format", f"{path} is not a snapshot of format {FORMAT}")
    if _LENGTH.unpack_from(data, size - _TRAILER)[0] != size:
        raise SnapshotRejected("truncated", f"{path} is not the length it was written with")
    checksum = data[-32:]
    if not hmac.compare_digest(hashlib.sha256(memoryview(data)[:-64]).digest(), checksum):
        raise SnapshotRejected("bad_checksum", f"{path} fails its checksum")
    body = data[_PREFIX.size:size - _TRAILER]
    try:
        header = next(_unpacker(body))
    except (ValueError, StopIteration, msgpack.UnpackException) as exc:
        raise SnapshotRejected("other_format", f"{path}: the header does not decode ({exc})") from exc
    if not isinstance(header, dict):
        raise SnapshotRejected("other_format", f"{path}: the header is not a map")
    return SnapshotFile(header, body, checksum, data[-64:-32], size)


def check_seal(snapshot: SnapshotFile, identity: bytes) -> None:
    """:class:`SnapshotRejected` unless ``snapshot`` was sealed for the store of ``identity``."""
    if not hmac.compare_digest(seal(identity, snapshot.checksum), snapshot.seal):
        raise SnapshotRejected("bad_seal", "the snapshot was not sealed by this store's identity (edited, "
                                           "or from a store whose identity was renewed)")


def remove_temporaries(directory: str) -> int:
    """Remove what writes that never finished left (a kill -9, a full disk); how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if name.startswith(TEMP_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
                    removed += 1
    return removed


def _unpacker(body: bytes) -> msgpack.Unpacker:
    return msgpack.Unpacker(io.BytesIO(body), raw=False, strict_map_key=False, max_buffer_size=1 << 30)
