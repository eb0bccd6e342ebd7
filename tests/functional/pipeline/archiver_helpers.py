"""Running df-archiver as operators do, and reading back what it archived (for the pipeline tests)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import msgpack
import pyarrow.parquet as pq

from dfpubsub.archive import COLUMNS, JOURNAL_DIR, read_journal, segment_files


class DaemonProcess:
    """A console script of this install in a subprocess, its JSON log lines collected."""

    def __init__(self, script: str, *args: str):
        exe = os.path.join(os.path.dirname(sys.executable), script)
        self.proc = subprocess.Popen([exe, *args], stderr=subprocess.PIPE, text=True)
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"msg": line})

    def logged(self, msg: str, **fields: object) -> dict | None:
        """The first line logged with ``msg`` (and ``fields``), if any."""
        return next((rec for rec in list(self.lines)
                     if rec.get("msg") == msg and all(rec.get(k) == v for k, v in fields.items())), None)

    def wait(self, timeout: float = 20) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code


class ArchiverProcess(DaemonProcess):
    """df-archiver in a subprocess."""

    def __init__(self, log: Path, driver: str, topics: str, *extra: str):
        super().__init__("df-archiver", "--pubsub.driver", driver, "--pubsub.topics", topics, "--archive.path",
                         str(log), "--archive.fsync", "false", "--log.format", "json", *extra)


def published_rows(log: Path) -> list[dict]:
    """Every row of every published segment (each file must be a whole Parquet file)."""
    rows = []
    for rel in segment_files(str(log)):
        d = pq.read_table(log / rel).to_pydict()
        rows += [dict(zip(d, values)) for values in zip(*[d[name] for name, _ in COLUMNS])]
    return rows


def journaled(log: Path) -> int:
    """Rows waiting in journals."""
    return sum(1 for path in journal_files(log) for _ in read_journal(path))


def journal_files(log: Path) -> list[str]:
    """The journals of every writer directory."""
    return glob.glob(str(log / JOURNAL_DIR / "*" / "*.journal"))


def value_of(row: dict):
    return None if row["value"] is None else msgpack.unpackb(row["value"])
