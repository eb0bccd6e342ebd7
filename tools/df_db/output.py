"""Rendering: rich tables for people, JSON or YAML for scripts, progress bars only on a terminal.

In JSON mode stdout carries exactly one JSON document (or, for ``watch``, one
JSON object per line) and nothing else; YAML mode the same document as YAML
(for ``watch``, a ``---`` document per item). Messages always go to stderr.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
from rich.console import Console, JustifyMethod
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dfpubsub.backends.foreign import SkippedRecord

__all__ = ["Column", "Output", "fail", "to_json", "to_yaml", "compact", "duration", "clock", "when"]


def _jsonable(obj: Any) -> Any:
    # msgpack values may hold bytes, which JSON cannot: they are shown as base64 text.
    if isinstance(obj, (bytes, bytearray)):
        return base64.b64encode(obj).decode()
    return str(obj)


def to_json(doc: Any, indent: int | None = None) -> str:
    """``doc`` as strict JSON (bytes as base64, anything else unknown as its str).

    df-db refuses NaN and infinities on input, but another writer may have
    stored them: they are shown as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``, never as the bare tokens no JSON parser must accept.
    """
    separators = None if indent else (",", ":")
    try:
        return json.dumps(doc, indent=indent, separators=separators, default=_jsonable, ensure_ascii=False,
                          allow_nan=False)
    except (ValueError, TypeError):  # rare: a foreign value; its keys or floats made presentable
        return json.dumps(_strict(doc), indent=indent, separators=separators, default=_jsonable,
                          ensure_ascii=False, allow_nan=False)


def to_yaml(doc: Any) -> str:
    """``doc`` as block-style YAML: the values :func:`to_json` gives (so the same bytes as base64,
    the same strings for NaN), every string double-quoted, as YAML reads JSON's strings."""
    return "\n".join(_yaml(json.loads(to_json(doc)))) + "\n"


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _yaml(value: Any) -> list[str]:
    if isinstance(value, dict) and value:
        lines = []
        for key, item in value.items():
            name = key if _PLAIN_KEY.match(key) and key.lower() not in _YAML_WORDS else json.dumps(key, ensure_ascii=False)
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{name}:")
                lines += ["  " + line for line in _yaml(item)]
            else:
                lines.append(f"{name}: {_yaml(item)[0]}")
        return lines
    if isinstance(value, list) and value:
        lines = []
        for item in value:
            first, *rest = _yaml(item)
            lines += ["- " + first] + ["  " + line for line in rest]
        return lines
    if isinstance(value, (dict, list)):
        return ["{}" if isinstance(value, dict) else "[]"]
    return [json.dumps(value, ensure_ascii=False)]  # null, true, numbers and quoted strings read the same in YAML


def _strict(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k if isinstance(k, (str, int, bool)) or k is None else str(k): _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def compact(value: Any) -> str:
    """A value on one line, for a table cell."""
    return to_json(value)


def duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``4.2s``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 48 else f"{hours // 24}d{hours % 24:02d}h"


def clock(ts: float) -> str:
    """Local wall-clock time with milliseconds."""
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def when(ts: float | None) -> str:
    """Local date and time to the second; ``-`` for none."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def fail(message: str) -> NoReturn:
    """Print ``df-db: message`` on stderr and exit with status 1."""
    print(f"df-db: {message}", file=sys.stderr)
    raise typer.Exit(1)


@dataclass(frozen=True)
class Column:
    """One column of a table: its header, the row's key and how a cell is shown."""

    header: str
    key: str
    show: Callable[[Any], str] = str
    justify: JustifyMethod = "left"


class Output:
    """Where a command's result goes, in the chosen format: ``table``, ``json`` or ``yaml``
    (:attr:`json` is true for both of the last: a document for scripts, not a table)."""

    def __init__(self, fmt: str = "table"):
        self.json = fmt != "table"
        self.yaml = fmt == "yaml"
        #: The foreign records the command's reads skipped (dfpubsub.backends.foreign), shown with the result.
        self.skipped: list[SkippedRecord] = []
        # Piped, a table keeps each row on one line (for grep) instead of wrapping at 80 columns.
        self.console = Console(highlight=False, width=None if sys.stdout.isatty() else 1000)
        self.err = Console(stderr=True, highlight=False)

    def document(self, doc: Any) -> None:
        """One JSON (or YAML) document on stdout."""
        sys.stdout.write(to_yaml(doc) if self.yaml else to_json(doc, indent=2) + "\n")

    def rows(self, rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str | None = None) -> None:
        """A list of objects: a JSON array, or a table with ``columns``."""
        if self.json:
            # Only with something skipped does the array become {"items": [...], "skipped": [...]}:
            # a script that reads the usual array then fails loudly instead of missing records silently.
            self.document({"items": list(rows), "skipped": self._skipped()} if self.skipped else list(rows))
            return
        table = Table(title=title, show_edge=False, header_style="bold")
        for col in columns:
            table.add_column(col.header, justify=col.justify)
        for row in rows:
            table.add_row(*(Text(col.show(row.get(col.key))) for col in columns))
        self.console.print(table)
        if not rows:
            self.err.print("(none)")
        self.footer()

    def record(self, doc: dict[str, Any], show: dict[str, Callable[[Any], str]] | None = None) -> None:
        """One object: a JSON object, or a two-column table of its fields."""
        if self.json:
            self.document({**doc, "skipped": self._skipped()} if self.skipped else doc)
            return
        table = Table(show_header=False, show_edge=False)
        table.add_column(style="bold")
        table.add_column()
        for name, value in doc.items():
            shown: Callable[[Any], str] = (show or {}).get(name, compact if not isinstance(value, str) else str)
            table.add_row(name, Text(shown(value)))
        self.console.print(table)
        self.footer()

    def footer(self) -> None:
        """In table mode, one line on stderr saying what the reads skipped, if anything."""
        if self.skipped and not self.json:
            kinds = Counter(f"{r.kind} {r.reason}" for r in self.skipped)
            self.err.print(f"skipped {len(self.skipped)} record(s) that do not decode ("
                           + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
                           + "); df-db doctor lists their keys", markup=False, soft_wrap=True)

    def _skipped(self) -> list[dict[str, str]]:
        return [r._asdict() for r in self.skipped]

    def line(self, doc: dict[str, Any], text: Text) -> None:
        """One streamed item: a JSON line, or ``text``."""
        if self.json:
            sys.stdout.write("---\n" + to_yaml(doc) if self.yaml else to_json(doc) + "\n")
            sys.stdout.flush()
        else:
            self.console.print(text, soft_wrap=True)

    def note(self, message: str) -> None:
        """A message for people, on stderr."""
        self.err.print(message, markup=False)

    @contextlib.contextmanager
    def progress(self, total: int, what: str) -> Iterator[Callable[[int], None]]:
        """Yields ``advance(n)``; draws a bar on stderr only in table mode with stdout on a terminal."""
        if self.json or not sys.stdout.isatty():
            yield lambda n: None
            return
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=self.err, transient=True)
        with bar:
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)
