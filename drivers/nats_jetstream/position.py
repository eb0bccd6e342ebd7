"""The position file: the last stream sequence a subscriber handed to the core, kept across its restarts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

__all__ = ["Position", "PositionFile"]


class Position(NamedTuple):
    stream: str
    #: When the stream was created: a stream deleted and made again under the same name is another one.
    created: str
    seq: int


class PositionFile:
    """One JSON object in a file, replaced whole (write, then rename) so a crash leaves the old or
    the new position, never half of one."""

    def __init__(self, path: str):
        self.path = path

    def load(self) -> Position | None:
        """The saved position, or None (no file yet, or a file this driver did not write)."""
        try:
            data = json.loads(Path(self.path).read_text(encoding="utf-8"))
            position = Position(str(data["stream"]), str(data["created"]), int(data["seq"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable or foreign: start where the stream ends, as without a file
        return position if position.seq >= 0 else None

    def save(self, position: Position) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(position._asdict(), f)
        os.replace(tmp, self.path)
