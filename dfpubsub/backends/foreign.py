"""Foreign records: what a backend hands back that this code did not write, or not like this.

Another tool (etcdctl, redis-cli, an older or newer dfpubsub, a half-finished
migration) can write anything beside our records. One such record must never
fail a listing, a shard, a daemon or a write, so every place that decodes a
record read back from a backend goes through :func:`decode` (or calls
:func:`skip` itself): a record that does not decode is skipped, counted in
``dfpubsub_skipped_records_total{kind, reason}``, and named (its backend key)
in a rate-limited warning, and the caller goes on with the others.

``with collect() as skipped:`` gathers the records skipped by the calls made
inside it (threads started through :func:`asyncio.to_thread` included), for a
tool that reports them (``df-db`` footers, ``df-db doctor``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import struct
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

import msgpack

from ..logs import RateLimitedLog
from ..metrics import LabelledCounter

__all__ = ["SkippedRecord", "skip", "skip_error", "decode", "collect", "reason_of", "key_text", "SKIPPED",
           "DECODE_ERRORS"]

T = TypeVar("T")

log = logging.getLogger("dfpubsub.backends.foreign")
_warn = RateLimitedLog(log, interval=10.0)

#: The counter every skip adds to, by record kind and reason.
SKIPPED = LabelledCounter("skipped_records", "Records read back from a backend that did not decode, skipped.",
                          ("kind", "reason"))

#: What decoding a foreign record can raise. Anything else is a bug and propagates.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError,
    msgpack.UnpackException, struct.error,
)

_collector: contextvars.ContextVar[list[SkippedRecord] | None] = contextvars.ContextVar(
    "dfpubsub_foreign_collector", default=None)


class SkippedRecord(NamedTuple):
    """One record that was skipped: its kind, its backend key (printable), why, and the error."""

    kind: str
    key: str
    reason: str
    detail: str


def key_text(key: object) -> str:
    """A backend key as text an operator can paste into etcdctl or redis-cli (bytes escaped)."""
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return str(key)


def reason_of(exc: BaseException) -> str:
    """A short, stable reason label for a decoding error."""
    if isinstance(exc, UnicodeError):
        return "not_utf8"
    if isinstance(exc, json.JSONDecodeError):
        return "not_json"
    if isinstance(exc, (msgpack.UnpackException, msgpack.ExtraData)) or str(exc).startswith("Unpack failed"):
        return "not_msgpack"
    if isinstance(exc, (OverflowError, RecursionError)):
        return "out_of_range"
    if isinstance(exc, ValueError):
        return "bad_value"
    return "wrong_type"


def skip(kind: str, key: object, reason: str, detail: str = "") -> None:
    """Count and report one record of ``kind`` at backend ``key`` that does not decode."""
    record = SkippedRecord(kind, key_text(key), reason, detail)
    SKIPPED.inc(kind, reason)
    collected = _collector.get()
    if collected is not None:
        collected.append(record)
    _warn.warning(f"{kind}:{reason}", "skipped a record that does not decode", kind=kind, key=record.key,
                  reason=reason, error=detail)


def skip_error(kind: str, key: object, exc: BaseException) -> None:
    """:func:`skip` for the decoding error ``exc``."""
    skip(kind, key, reason_of(exc), f"{type(exc).__name__}: {exc}"[:200])


def decode(kind: str, key: object, fn: Callable[..., T], *args: object) -> T | None:
    """``fn(*args)``, or None (the record skipped, see :func:`skip`) when it raises a decoding error."""
    try:
        return fn(*args)
    except DECODE_ERRORS as exc:
        skip_error(kind, key, exc)
        return None


@contextlib.contextmanager
def collect() -> Iterator[list[SkippedRecord]]:
    """Gather the records skipped inside the block (see the module's doc)."""
    records: list[SkippedRecord] = []
    token = _collector.set(records)
    try:
        yield records
    finally:
        _collector.reset(token)
