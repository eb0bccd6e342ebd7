"""Bootstrap: full-sync a cache from the compacted snapshot, then catch up from the store.

Instead of reading every object of the store (values included), a controller
reads the snapshot's live objects of its topics (pyarrow, no Spark) and asks
the store only for identities and versions (:meth:`Store.list_versions`).
Objects whose version in the store equals the snapshot's are taken from the
snapshot; the others (changed or created since, or missing from the snapshot
because the archiver missed them) are read with :meth:`Store.get_many`;
objects of the snapshot the store no longer lists were deleted since and are
left out. The result is exactly what :meth:`Store.list_topics` would have
returned, so reconciling the cache with it is a full sync, whatever the age or
completeness of the snapshot: a stale snapshot only costs more reads.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ..archive.schema import require_pyarrow
from ..errors import ArchiveError, PipelineError
from ..events import VersionedObject
from ..store import Store
from ..store.api import decode_value
from .snapshot import Manifest, generation_dir, latest_manifest

__all__ = ["CatchUp", "SnapshotBootstrap", "catch_up", "load_snapshot"]

log = logging.getLogger(__name__)


class _ArrowFs:
    """The SnapshotFs of a path through pyarrow (local, or any URI pyarrow.fs knows)."""

    def __init__(self, root: str):
        require_pyarrow()
        from pyarrow import fs

        if "://" in root:  # hdfs://, s3://, file://...
            self.fs, self.root = fs.FileSystem.from_uri(root)
        else:
            self.fs, self.root = fs.LocalFileSystem(), os.path.abspath(root)
        self._fs_mod = fs

    def listdir(self, path: str) -> list[str]:
        selector = self._fs_mod.FileSelector(path, allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)]

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as fh:
            data: bytes = fh.read()
        return data


def load_snapshot(root: str, topics: Iterable[str]) -> tuple[Manifest, list[VersionedObject]] | None:
    """The newest committed generation's live objects of ``topics``; None if there is no snapshot."""
    wanted = set(topics)
    fs = _ArrowFs(root)
    try:
        manifest = latest_manifest(fs, fs.root)
        if manifest is None:
            return None
        import pyarrow.parquet as pq

        live = f"{generation_dir(fs.root, manifest.generation)}/state=live"
        objects: list[VersionedObject] = []
        for entry in fs.listdir(live):
            topic = unquote(entry[len("topic="):]) if entry.startswith("topic=") else None
            if topic not in wanted:
                continue
            folder = f"{live}/{entry}"
            for name in fs.listdir(folder):
                if name.startswith(("_", ".")):
                    continue
                table = pq.read_table(f"{folder}/{name}", columns=["table", "key", "version", "value"],
                                      filesystem=fs.fs)
                objects.extend(_objects(topic, table.to_pydict()))
    except (OSError, ValueError) as exc:  # pyarrow's errors: unreadable file, not Parquet, missing column
        raise PipelineError(f"cannot read the snapshot under {root}: {exc}") from exc
    return manifest, objects


def _objects(topic: str, columns: dict[str, list[Any]]) -> Iterable[VersionedObject]:
    for table, key, version, blob in zip(columns["table"], columns["key"], columns["version"], columns["value"]):
        yield VersionedObject(topic, table, key, version, decode_value(blob))


@dataclass
class CatchUp:
    """What a catch-up did: objects taken from the snapshot, read from the store, and left out."""

    from_snapshot: int = 0
    fetched: int = 0
    deleted: int = 0
    seconds: float = 0.0


def catch_up(
    store: Store, topics: Iterable[str], snapshot: Iterable[VersionedObject]
) -> tuple[list[VersionedObject], CatchUp]:
    """The store's objects of ``topics``, taking from ``snapshot`` those whose version is current."""
    started = time.monotonic()
    topics = set(topics)
    known = {(o.table, o.key): o for o in snapshot if o.topic in topics}
    truth: list[VersionedObject] = []
    stale: list[tuple[str, str]] = []
    for ref in store.list_versions(topics):
        obj = known.pop((ref.table, ref.key), None)
        if obj is not None and obj.version == ref.version and obj.topic == ref.topic:
            truth.append(obj)
        else:
            stale.append((ref.table, ref.key))
    report = CatchUp(from_snapshot=len(truth), deleted=len(known))
    # Read after the listing: an object changed meanwhile comes back newer, one deleted meanwhile
    # not at all, and either way the events that follow the sync agree.
    fetched = [o for o in store.get_many(stale) if o.topic in topics]
    truth.extend(fetched)
    report.fetched = len(fetched)
    report.seconds = time.monotonic() - started
    return truth, report


class SnapshotBootstrap:
    """The controller's first sync of each topic from the snapshot under ``root`` (see :class:`Controller`).

    Called with the store and the topics to sync; returns the full listing of
    those topics, or None when there is no snapshot (the controller then
    lists the store). ``last`` holds the report of the latest call.
    """

    def __init__(self, root: str):
        self.root = root
        self.last: CatchUp | None = None

    def __call__(self, store: Store, topics: set[str]) -> list[VersionedObject] | None:
        try:
            loaded = load_snapshot(self.root, topics)
        except (PipelineError, ArchiveError) as exc:
            log.warning("cannot bootstrap from the snapshot; listing the store", extra={"error": str(exc)})
            return None
        if loaded is None:
            log.info("no snapshot to bootstrap from; listing the store", extra={"snapshot": self.root})
            return None
        manifest, objects = loaded
        truth, self.last = catch_up(store, topics, objects)
        log.info("bootstrapped from the snapshot", extra={
            "snapshot": self.root, "generation": manifest.generation, "topics": sorted(topics),
            "from_snapshot": self.last.from_snapshot, "fetched": self.last.fetched, "deleted": self.last.deleted,
            "seconds": round(self.last.seconds, 3)})
        return truth
