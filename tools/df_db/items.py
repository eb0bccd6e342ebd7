"""The JSON input of ``add`` and ``update``.

One object or a list of them::

    {"key": "p1", "value": {"mac": "fa:16:3e:00:00:01"}, "topic": "tenant-a"}   # add; topic optional
    {"key": "p1", "value": {"mac": "fa:16:3e:00:00:02"}, "version": 7}         # update; version optional

``topic`` defaults to the table's name; an object's topic is fixed once
created. ``version`` makes the update compare-and-set: it fails unless the
object is at that version. Any other field is an error, so a typo never goes
unnoticed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from dfpubsub.errors import InputError

__all__ = ["Item", "read_input", "parse_items"]

#: How deep an input document may nest (a value nests two levels less).
MAX_DEPTH = 100
_ADD_FIELDS = {"key", "value", "topic"}
_UPDATE_FIELDS = {"key", "value", "version"}


@dataclass(frozen=True, slots=True)
class Item:
    """One object to write."""

    key: str
    value: Any
    topic: str | None = None
    version: int | None = None


def read_input(data: str | None, path: str | None) -> tuple[str, str]:
    """The JSON text from the argument or from ``--file`` (``-``: stdin), and where it came from."""
    if data is not None:
        return data, "the argument"
    assert path is not None
    if path == "-":
        return sys.stdin.read(), "stdin"
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(), path
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from exc


def parse_items(text: str, source: str, update: bool) -> list[Item]:
    """Parse and check every item before anything is written; InputError says what is wrong and where."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"bad JSON in {source}: {exc}") from exc
    except RecursionError as exc:
        raise InputError(f"bad JSON in {source}: nested too deeply") from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InputError(f"bad JSON in {source}: {exc}") from exc
    if _too_deep(doc):
        raise InputError(f"bad JSON in {source}: nested more than {MAX_DEPTH} levels deep")
    many = isinstance(doc, list)
    docs = doc if many else [doc]
    if not docs:
        raise InputError(f"no objects in {source}: the list is empty")
    allowed = _UPDATE_FIELDS if update else _ADD_FIELDS
    return [_item(d, allowed, f"{source}, item {i}" if many else source) for i, d in enumerate(docs)]


def _too_deep(doc: Any) -> bool:
    """Whether ``doc`` nests more than MAX_DEPTH lists and objects: every reader of the value
    (msgpack, JSON output, a subscriber's handler) would have to survive it."""
    level: list[Any] = [doc]
    for _ in range(MAX_DEPTH + 1):
        level = [v for x in level if isinstance(x, (list, dict)) for v in (x.values() if isinstance(x, dict) else x)]
        if not level:
            return False
    return True


def _no_constant(name: str) -> Any:
    # NaN and the infinities are not JSON: stored, they would make every later JSON output invalid.
    raise ValueError(f"{name} is not a JSON number")


def _item(doc: Any, allowed: set[str], where: str) -> Item:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: expected an object like {{\"key\": ..., \"value\": ...}}, got {type(doc).__name__}")
    unknown = sorted(set(doc) - allowed)
    if unknown:
        hint = "; an object's topic cannot change (rm and add it)" if "topic" in unknown else ""
        raise InputError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}{hint}")
    for name in ("key", "value"):
        if name not in doc:
            raise InputError(f"{where}: missing field {name!r}")
    key, topic, version = doc["key"], doc.get("topic"), doc.get("version")
    if not isinstance(key, str) or not key:
        raise InputError(f"{where}: key must be a non-empty string, got {key!r}")
    if topic is not None and (not isinstance(topic, str) or not topic):
        raise InputError(f"{where}: topic must be a non-empty string, got {topic!r}")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise InputError(f"{where}: version must be a positive integer, got {version!r}")
    return Item(key, doc["value"], topic, version)
