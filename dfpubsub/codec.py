"""msgpack codec for envelopes (schema version 1, specified in docs/protocol.md).

The publisher packs each event once, when it is published, so that the exact
size of a batch is known before it is sent; :func:`encode_batch` then frames the
pre-packed events without packing them again. :func:`decode` validates every
field and raises :class:`~dfpubsub.errors.DecodeError` with a countable reason
for anything that is not a well-formed envelope.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from .errors import DecodeError, InvalidEvent
from .events import ACTIONS, Bye, Envelope, Event, EventBatch, Hello

__all__ = [
    "SCHEMA_VERSION",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "pack_event",
    "BatchHeader",
    "encode_batch",
    "encode_hello",
    "encode_bye",
    "decode",
    "topic_frame",
]

SCHEMA_VERSION = 1
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20

_packb = msgpack.packb
_EVENTS_KEY = _packb("events")


def topic_frame(topic: str) -> bytes:
    """First frame of a ZeroMQ message: the UTF-8 topic and a NUL terminator.

    The terminator turns ZeroMQ's prefix matching into exact matching: a
    subscription to ``b"port\\0"`` cannot match ``b"portbinding\\0"``.
    """
    return topic.encode("utf-8") + b"\x00"


def pack_event(table: str, key: str, action: str, version: int, value: Any, timestamp: float) -> bytes:
    """Pack one event body (an array of six) and return its bytes.

    Raises :class:`InvalidEvent` when the value cannot be serialised.
    """
    try:
        return _packb((table, key, action, version, value, timestamp))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"event {table}/{key} is not serialisable: {exc}") from exc


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


class BatchHeader:
    """The constant part of every event envelope a publisher sends on one topic."""

    __slots__ = ("prefix", "overhead")

    def __init__(self, publisher_id: str, publisher_name: str, topic: str):
        # A map of 8 entries: these 5, then "seq", "sent_at" and "events" per batch.
        self.prefix = b"\x88" + b"".join(
            _packb(x)
            for x in (
                "v", SCHEMA_VERSION, "kind", "event", "pub", publisher_id,
                "name", publisher_name, "topic", topic,
            )
        )
        # seq (uint64) + sent_at (float64) + keys + largest array header.
        self.overhead = len(self.prefix) + len(_packb("seq")) + 9 + len(_packb("sent_at")) + 9 + len(_EVENTS_KEY) + 5


def encode_batch(header: BatchHeader, seq: int, sent_at: float, packed_events: list[bytes]) -> bytes:
    """Frame pre-packed events (see :func:`pack_event`) as one event envelope."""
    return b"".join(
        (
            header.prefix,
            b"\xa3seq", _packb(seq),
            b"\xa7sent_at", _packb(float(sent_at)),
            _EVENTS_KEY, _array_header(len(packed_events)),
            *packed_events,
        )
    )


def encode_hello(hello: Hello) -> bytes:
    """Encode a :class:`Hello` control envelope."""
    return _packb(
        {
            "v": SCHEMA_VERSION, "kind": "hello", "pub": hello.publisher_id,
            "name": hello.publisher_name, "sent_at": float(hello.sent_at),
            "seqs": hello.seqs, "reason": hello.reason,
            "max_idle": float(hello.max_idle_time), "host": hello.host,
        }
    )


def encode_bye(bye: Bye) -> bytes:
    """Encode a :class:`Bye` control envelope."""
    return _packb(
        {
            "v": SCHEMA_VERSION, "kind": "bye", "pub": bye.publisher_id,
            "name": bye.publisher_name, "sent_at": float(bye.sent_at), "seqs": bye.seqs,
        }
    )


def _malformed(detail: str) -> DecodeError:
    return DecodeError("malformed", detail)


def _field(obj: dict, name: str, types: tuple[type, ...]) -> Any:
    value = obj.get(name)
    if type(value) not in types:
        raise _malformed(f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}")
    return value


def _seqs(obj: dict) -> dict[str, int]:
    seqs = _field(obj, "seqs", (dict,))
    for topic, seq in seqs.items():
        if type(topic) is not str or not topic or type(seq) is not int or seq < 0:
            raise _malformed(f"bad sequence {seq!r} for topic {topic!r}")
    return seqs


def decode(data: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Envelope:
    """Decode one envelope frame; raise :class:`DecodeError` if it is not valid."""
    if len(data) > max_bytes:
        raise DecodeError("oversize", f"{len(data)} bytes > limit {max_bytes}")
    try:
        # Map keys may be any scalar (values are the publisher's objects, packed as given);
        # extension types arrive as msgpack.ExtType / msgpack.Timestamp, opaque to the core.
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.ExtraData as exc:
        raise DecodeError("malformed", "trailing bytes after the envelope") from exc
    except ValueError as exc:
        if "incomplete input" in str(exc):
            raise DecodeError("truncated", "frame ends inside the envelope") from exc
        raise DecodeError("not_msgpack", str(exc)[:200]) from exc
    except (TypeError, msgpack.UnpackException) as exc:
        raise DecodeError("not_msgpack", str(exc)[:200]) from exc
    if type(obj) is not dict:
        raise _malformed(f"envelope must be a map, got {type(obj).__name__}")
    version = obj.get("v")
    if type(version) is not int:
        raise _malformed("missing or non-integer schema version 'v'")
    if version != SCHEMA_VERSION:
        raise DecodeError("schema_version", f"unsupported schema version {version}")
    kind = obj.get("kind")
    pid = _field(obj, "pub", (str,))
    name = _field(obj, "name", (str,))
    sent_at = float(_field(obj, "sent_at", (float, int)))
    if not pid:
        raise _malformed("empty publisher id")
    if kind == "event":
        return _decode_batch(obj, pid, name, sent_at)
    if kind == "hello":
        return Hello(
            pid, name, sent_at, _seqs(obj), _field(obj, "reason", (str,)),
            float(_field(obj, "max_idle", (float, int))), _field(obj, "host", (str,)),
        )
    if kind == "bye":
        return Bye(pid, name, sent_at, _seqs(obj))
    raise _malformed(f"unknown envelope kind {kind!r}")


def _decode_batch(obj: dict, pid: str, name: str, sent_at: float) -> EventBatch:
    topic = _field(obj, "topic", (str,))
    seq = _field(obj, "seq", (int,))
    raw = _field(obj, "events", (list,))
    if not topic or seq < 1 or not raw:
        raise _malformed("an event envelope needs a topic, seq >= 1 and at least one event")
    events = []
    append = events.append
    actions = ACTIONS
    s = seq
    for item in raw:
        if type(item) is not list or len(item) < 6:
            raise _malformed("an event must be an array of at least 6 items")
        table, key, action, version, value, ts = item[:6]
        act = actions.get(action) if type(action) is str else None
        if (
            type(table) is not str
            or not table
            or type(key) is not str
            or act is None
            or type(version) is not int
            or version < 0
            or type(ts) not in (float, int)
        ):
            raise _malformed(f"bad event at seq {s}: {item[:4]!r}")
        append(Event(topic, table, key, act, version, value, ts, pid, s))
        s += 1
    return EventBatch(pid, name, topic, seq, sent_at, events)
