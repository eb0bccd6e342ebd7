"""The snapshot's layout: generations, each committed by its manifest.

::

    <snapshot>/gen-000042/objects/topic=<topic>/part-*.parquet   live objects, one file per topic
    <snapshot>/gen-000042/tombstones/part-*.parquet              recent deletes, for the next run
    <snapshot>/gen-000042/_manifest.json                         written last: the commit

A generation without a manifest is unfinished (a crashed job) and ignored;
readers take the newest generation that has one. Rows keep the log's columns
(``topic`` as the directory of ``objects``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Protocol

from ..errors import PipelineError

__all__ = ["MANIFEST", "MANIFEST_FORMAT", "Manifest", "SnapshotFs", "generation_dir", "generations", "latest_manifest"]

MANIFEST = "_manifest.json"
MANIFEST_FORMAT = 1
_PREFIX = "gen-"


class SnapshotFs(Protocol):
    """What reading a snapshot needs of a file system (HadoopFs, or pyarrow's in bootstrap)."""

    def listdir(self, path: str) -> list[str]: ...

    def read_bytes(self, path: str) -> bytes: ...


@dataclass
class Manifest:
    """What a generation holds and which segments of the log it has consumed.

    ``segments`` maps each partition directory of the log to the names of its
    segments already compacted; ``max_version`` is the highest version in the
    generation (objects and tombstones).
    """

    generation: int
    created_at: float
    segments: dict[str, list[str]] = field(default_factory=dict)
    objects: int = 0
    tombstones: int = 0
    max_version: int = 0
    events: int = 0
    previous: int | None = None
    format: int = MANIFEST_FORMAT

    def to_json(self) -> bytes:
        """The manifest as UTF-8 JSON."""
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse a manifest; PipelineError if it is not one this version reads."""
        try:
            obj = json.loads(data)
            if obj.get("format") != MANIFEST_FORMAT:
                raise PipelineError(f"{where}: unsupported manifest format {obj.get('format')!r}")
            return cls(**obj)
        except (ValueError, TypeError, AttributeError) as exc:
            raise PipelineError(f"{where}: not a snapshot manifest: {exc}") from exc

    def consumed(self) -> set[str]:
        """Paths (relative to the log's root) of the segments compacted so far."""
        return {f"{part}/{name}" for part, names in self.segments.items() for name in names}


def generation_dir(root: str, generation: int) -> str:
    """The directory of ``generation`` under the snapshot root."""
    return f"{root.rstrip('/')}/{_PREFIX}{generation:06d}"


def generations(fs: SnapshotFs, root: str) -> list[int]:
    """Numbers of the generation directories under ``root`` (committed or not), ascending."""
    out = []
    for name in fs.listdir(root):
        if name.startswith(_PREFIX) and name[len(_PREFIX):].isdigit():
            out.append(int(name[len(_PREFIX):]))
    return sorted(out)


def latest_manifest(fs: SnapshotFs, root: str) -> Manifest | None:
    """The manifest of the newest committed generation, or None if there is none."""
    for gen in reversed(generations(fs, root)):
        folder = generation_dir(root, gen)
        if MANIFEST in fs.listdir(folder):
            return Manifest.from_json(fs.read_bytes(f"{folder}/{MANIFEST}"), folder)
    return None
