"""msgpack codec for envelopes (schema versions 1 and 2, specified in docs/protocol.md).

The publisher packs each event once, when it is published, so that the exact
size of a batch is known before it is sent; :func:`encode_batch` then frames the
pre-packed events without packing them again. :func:`decode` validates every
field and raises :class:`~dfpubsub.errors.DecodeError` with a countable reason
for anything that is not a well-formed envelope.

Schema 2 differs in one thing: an event's value travels as a msgpack ``bin``
holding the value's own msgpack bytes (the store's bytes, where the publisher
has them). A receiver checks each such value's structure (one map within the
depth limit: a skip, not a decode) with the rest of the events, and decodes it
only where code needs the value (:func:`unpack_value`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack

from .errors import BadValue, DecodeError, InvalidEvent
from .events import ACTIONS, Action, Bye, Envelope, Event, EventBatch, Hello

__all__ = [
    "SCHEMA_VERSION",
    "PACKED_SCHEMA",
    "SCHEMAS",
    "pack_value",
    "unpack_value",
    "check_packed",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_SEQ",
    "MAX_REV",
    "pack_event",
    "BatchHeader",
    "encode_batch",
    "encode_hello",
    "encode_bye",
    "hello_parts",
    "decode",
    "decode_header",
    "decode_events",
    "topic_frame",
]

#: The schema publishers send unless configured otherwise, and the one of hellos and byes.
SCHEMA_VERSION = 1
#: Values as the bytes of their msgpack encoding (a bin per event value).
PACKED_SCHEMA = 2
#: The schemas a receiver accepts.
SCHEMAS = frozenset({SCHEMA_VERSION, PACKED_SCHEMA})
#: Deepest a value may nest, in containers (the value's own map included): what it has room
#: for in a schema 1 frame of depth 1024 (envelope, events, event array), so that both schemas
#: carry the same values.
MAX_VALUE_DEPTH = 1021
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
#: Largest sequence number, and largest last sequence of an envelope: a signed
#: 64-bit integer holds every sequence in every language.
MAX_SEQ = (1 << 63) - 1
#: Largest store revision a bookmark may name: versions are unsigned 64-bit.
MAX_REV = (1 << 64) - 1

_packb: Callable[[Any], bytes] = msgpack.packb
_DELETE = Action.DELETE
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


_MAPS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))


def pack_value(value: Any) -> bytes:
    """A value's msgpack bytes as schema 2 carries them; :class:`InvalidEvent` if it is not a map
    or cannot be serialised."""
    if not isinstance(value, dict):
        raise InvalidEvent(f"schema 2 carries maps as values, got {type(value).__name__}")
    try:
        return _packb(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"value is not serialisable: {exc}") from exc


def unpack_value(packed: bytes) -> Any:
    """The value of a schema 2 event's bytes, decoded as schema 1 decodes a value (map keys any
    scalar, the last of repeated keys kept). What the structural check at receipt cannot prove
    is proved here: :class:`BadValue` for invalid UTF-8, a container as a map key, a malformed
    timestamp or a reserved extension type (docs/protocol.md §6.4)."""
    try:
        return msgpack.unpackb(packed, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # UnicodeDecodeError is a ValueError
        raise BadValue(str(exc)[:200]) from exc


# Three containers around each value: a skip then refuses a value nested deeper than
# MAX_VALUE_DEPTH, since msgpack's own limit is 1024.
_DEPTH_PAD = b"\x91" * (1024 - MAX_VALUE_DEPTH)


def check_packed(values: list[bytes]) -> None:
    """Prove the structure of schema 2 values without decoding them: each is exactly one msgpack
    object nested at most :data:`MAX_VALUE_DEPTH` deep (else ``not_msgpack``), and a map (else
    ``malformed``); :class:`DecodeError` for the first that is not (docs/protocol.md §6.2).

    One C-level skip per value over one buffer: a value that ends early runs into the next
    one's padding and ends elsewhere than its own end, so each end is checked."""
    if not values:
        return
    pad = len(_DEPTH_PAD)
    unpacker = msgpack.Unpacker(max_buffer_size=sum(map(len, values)) + pad * len(values),
                                max_str_len=_NO_LIMIT, max_bin_len=_NO_LIMIT, max_array_len=_NO_LIMIT,
                                max_map_len=_NO_LIMIT, max_ext_len=_NO_LIMIT)
    unpacker.feed(b"".join(_DEPTH_PAD + v for v in values))
    end, skip, tell = 0, unpacker.skip, unpacker.tell
    for v in values:
        end += pad + len(v)
        try:
            skip()
        except (ValueError, TypeError, msgpack.UnpackException) as exc:  # OutOfData included
            raise DecodeError("not_msgpack", f"a value is not one msgpack object within depth {MAX_VALUE_DEPTH} "
                              f"({type(exc).__name__})") from exc
        if tell() != end:
            raise DecodeError("not_msgpack", "a value is not exactly one msgpack object")
    for v in values:
        if v[0] not in _MAPS:
            raise _malformed(f"a value must be a map, got type byte 0x{v[0]:02x}")


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


class BatchHeader:
    """The constant part of every event envelope a publisher sends on one topic."""

    __slots__ = ("prefix", "overhead")

    def __init__(self, publisher_id: str, publisher_name: str, topic: str, schema: int = SCHEMA_VERSION):
        # A map of 8 entries: these 5, then "seq", "sent_at" and "events" per batch.
        self.prefix = b"\x88" + b"".join(
            _packb(x)
            for x in (
                "v", schema, "kind", "event", "pub", publisher_id,
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
    """Encode a :class:`Hello` control envelope (``more`` only on a part that is not the last)."""
    fields = {
        "v": SCHEMA_VERSION, "kind": "hello", "pub": hello.publisher_id,
        "name": hello.publisher_name, "sent_at": float(hello.sent_at),
        "seqs": hello.seqs, "reason": hello.reason,
        "max_idle": float(hello.max_idle_time), "host": hello.host,
    }
    if hello.more:
        fields["more"] = True
    if hello.rev is not None:
        fields["rev"] = hello.rev
    return _packb(fields)


def hello_parts(hello: Hello, max_message_bytes: int) -> list[Hello]:
    """Split a hello so that no part exceeds ``max_message_bytes``; every part but the last says ``more``.

    Subscribers take each topic of a hello on its own, so the parts say what
    one hello would, except that only the last one tells that the listing is
    complete (a subscribed topic absent from all of them has not been used).
    """
    # A topic costs at most 255 bytes of name and 9 of sequence, plus framing.
    per_topic = 270
    room = max(1, (max_message_bytes - 1024) // per_topic)
    if len(hello.seqs) <= room:
        return [hello]
    items = list(hello.seqs.items())
    starts = range(0, len(items), room)
    return [
        Hello(hello.publisher_id, hello.publisher_name, hello.sent_at, dict(items[i:i + room]),
              hello.reason, hello.max_idle_time, hello.host, more=i + room < len(items), rev=hello.rev)
        for i in starts
    ]


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


def _field(obj: dict[Any, Any], name: str, types: tuple[type, ...]) -> Any:
    value = obj.get(name)
    if type(value) not in types:
        raise _malformed(f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}")
    return value


def _seqs(obj: dict[Any, Any]) -> dict[str, int]:
    seqs: dict[str, int] = _field(obj, "seqs", (dict,))
    for topic, seq in seqs.items():
        if type(topic) is not str or not topic or type(seq) is not int or not 0 <= seq <= MAX_SEQ:
            raise _malformed(f"bad sequence {seq!r} for topic {topic!r}")
    return seqs


def _check_size(data: bytes | memoryview, max_bytes: int) -> None:
    if len(data) > max_bytes:
        raise DecodeError("oversize", f"{len(data)} bytes > limit {max_bytes}")


def _msgpack_error(exc: Exception, data: bytes | memoryview) -> DecodeError:
    """The reason of a frame msgpack could not read: the structure decides before the content
    (docs/protocol.md §6.1), so a frame that ends inside its object is ``truncated`` even if
    a str before the end is not UTF-8, or a container counts more items than bytes are left."""
    if isinstance(exc, msgpack.OutOfData) or "incomplete input" in str(exc) or _ends_early(data):
        return DecodeError("truncated", "frame ends inside the envelope")
    return DecodeError("not_msgpack", str(exc)[:200])


_NO_LIMIT = (1 << 31) - 1


def _ends_early(data: bytes | memoryview) -> bool:
    """Whether the structure of the frame's object runs past its end, content not looked at.

    Skipping builds no object, so the counts a header claims need no limit.
    """
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1), max_str_len=_NO_LIMIT, max_bin_len=_NO_LIMIT,
                                max_array_len=_NO_LIMIT, max_map_len=_NO_LIMIT, max_ext_len=_NO_LIMIT)
    unpacker.feed(data)
    try:
        unpacker.skip()
    except msgpack.OutOfData:
        return True
    except (ValueError, TypeError, msgpack.UnpackException):
        return False  # 0xc1 or nesting too deep: met before the end
    return False


def decode(data: bytes | memoryview, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Envelope:
    """Decode and validate one envelope frame completely; raise :class:`DecodeError` if invalid."""
    _check_size(data, max_bytes)
    try:
        # Map keys may be any scalar (values are the publisher's objects, packed as given);
        # extension types arrive as msgpack.ExtType / msgpack.Timestamp, opaque to the core.
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.ExtraData as exc:
        raise DecodeError("malformed", "trailing bytes after the envelope") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise _msgpack_error(exc, data) from exc
    if type(obj) is not dict:
        raise _malformed(f"envelope must be a map, got {type(obj).__name__}")
    env = _envelope(obj, data)
    if type(env) is EventBatch:
        env.events = _events(_field(obj, "events", (list,)), env.topic, env.seq, env.publisher_id, env.sent_at,
                             env.schema)
        env.count = len(env.events)
        env.frame = b""
    return env


def decode_header(data: bytes | memoryview, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, check_events: bool = True) -> Envelope:
    """Decode an envelope but only count the events of an event envelope.

    The result's ``events`` is None and ``frame`` keeps the bytes for
    :func:`decode_events`. Skipping the events costs a tenth of decoding them,
    and a queue of frames is bytes to the garbage collector, not a heap of
    small objects it must traverse.
    """
    _check_size(data, max_bytes)
    fast = _event_header(data)
    if fast is not None:
        if check_events:
            _check_events(data, fast[1])
        return fast[0]
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    obj: dict[str, object] = {}
    unchecked = False  # an events array skipped without looking inside its items
    try:
        try:
            n = unpacker.read_map_header()
        except ValueError:
            # Not a map: decode it whole, so that the reason is the one the checks' order gives
            # (broken msgpack or trailing bytes before "not a map").
            decode(data, max_bytes)
            raise AssertionError("decode accepted what is not a map") from None
        for i in range(n):
            key = unpacker.unpack()
            if key == "events":
                try:
                    count = unpacker.read_array_header()
                except ValueError:
                    # Not an array: wrong in an event envelope, an unknown key in a hello or bye.
                    unpacker.unpack()
                    obj[key] = None
                    continue
                obj[key] = count
                unchecked = True
                if not check_events and i == n - 1:
                    break
                for _ in range(count):
                    unpacker.skip()
            else:
                obj[key] = unpacker.unpack()
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise _msgpack_error(exc, data) from exc
    if check_events and unpacker.tell() != len(data):
        raise _malformed("trailing bytes after the envelope")
    env = _envelope(obj, data)
    if unchecked and type(env) is not EventBatch:
        # Only an event envelope's events wait for stage 2: a hello or bye has none, so the
        # content of an "events" key in it is checked now, like the rest of the frame.
        decode(data, max_bytes)
    if type(env) is EventBatch:
        count = obj.get("events")
        if type(count) is not int:
            raise _malformed("field 'events' must be an array")
        _check_count(env.seq, count)
        env.count = count
    return env


def _check_count(seq: int, count: int) -> None:
    if count < 1:
        raise _malformed("an event envelope needs at least one event")
    if seq + count - 1 > MAX_SEQ:
        raise _malformed(f"last sequence {seq + count - 1} above {MAX_SEQ}")


# The head of every event envelope encode_batch makes, up to the publisher id, per schema.
_EVENT_PREFIXES = {s: b"\x88\xa1v" + _packb(s) + b"\xa4kind\xa5event\xa3pub" for s in SCHEMAS}
_PREFIX_LEN = len(_EVENT_PREFIXES[SCHEMA_VERSION])
# Longest header encode_batch makes: prefix, three str8 of up to 255 bytes, seq, sent_at, keys.
_HEAD_BYTES = 1024
_UINTS = {0xCC: struct.Struct(">B"), 0xCD: struct.Struct(">H"), 0xCE: struct.Struct(">I"), 0xCF: struct.Struct(">Q")}
_DOUBLE = struct.Struct(">d")
_U16, _U32 = struct.Struct(">H"), struct.Struct(">I")


def _str_at(head: bytes, pos: int) -> tuple[str, int]:
    """The msgpack str (fixstr or str8) at ``pos`` and the position after it."""
    b = head[pos]
    if 0xA0 <= b <= 0xBF:
        n, pos = b & 0x1F, pos + 1
    elif b == 0xD9:
        n, pos = head[pos + 1], pos + 2
    else:
        raise ValueError("not a short str")
    end = pos + n
    if end > len(head):
        raise IndexError("str runs past the header")
    return head[pos:end].decode("utf-8"), end


def _event_header(data: bytes | memoryview) -> tuple[EventBatch, int] | None:
    """The header of an event envelope laid out as :func:`encode_batch` lays it out and where
    its events array starts; None for anything else.

    Reads the few header bytes in place of an Unpacker over the whole frame
    (a copy of it): a third of the time. Anything else, malformed included,
    returns None and takes the general path, which accepts or rejects it; what
    this accepts the general path would decode to the same envelope.
    """
    head = bytes(data[:_HEAD_BYTES])
    schema = head[3] if len(head) > 3 else 0
    prefix = _EVENT_PREFIXES.get(schema)
    if prefix is None or not head.startswith(prefix):
        return None
    try:
        pid, pos = _str_at(head, _PREFIX_LEN)
        if not head.startswith(b"\xa4name", pos):
            return None
        name, pos = _str_at(head, pos + 5)
        if not head.startswith(b"\xa5topic", pos):
            return None
        topic, pos = _str_at(head, pos + 6)
        if not head.startswith(b"\xa3seq", pos):
            return None
        b = head[pos + 4]
        if b < 0x80:
            seq, pos = b, pos + 5
        else:
            seq = _UINTS[b].unpack_from(head, pos + 5)[0]
            pos += 5 + _UINTS[b].size
        if not head.startswith(b"\xa7sent_at\xcb", pos):
            return None
        sent_at = _DOUBLE.unpack_from(head, pos + 9)[0]
        pos += 17
        if not head.startswith(_EVENTS_KEY, pos):
            return None
        pos += len(_EVENTS_KEY)
        start = pos
        b = head[pos]
        if 0x90 <= b <= 0x9F:
            count = b & 0x0F
        elif b == 0xDC:
            count = _U16.unpack_from(head, pos + 1)[0]
        elif b == 0xDD:
            count = _U32.unpack_from(head, pos + 1)[0]
        else:
            return None
    except (IndexError, KeyError, ValueError, struct.error):  # UnicodeDecodeError is a ValueError
        return None
    if not pid or not topic or seq < 1 or count < 1 or seq + count - 1 > MAX_SEQ:
        return None
    return EventBatch(pid, name, topic, seq, sent_at, None, count, data, schema), start


def _check_events(data: bytes | memoryview, start: int) -> None:
    """Check that the events array at ``start`` is well-formed msgpack and ends the frame.

    One C-level skip of the whole array, rather than one skip per event.
    """
    rest = len(data) - start
    unpacker = msgpack.Unpacker(max_buffer_size=max(rest, 1))
    unpacker.feed(memoryview(data)[start:])
    try:
        unpacker.skip()
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise _msgpack_error(exc, data) from exc
    if unpacker.tell() != rest:
        raise _malformed("trailing bytes after the envelope")


def decode_events(batch: EventBatch, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[Event]:
    """The events of a batch from :func:`decode_header`, from ``batch.seq`` on.

    The tracker may have trimmed the batch's head (duplicates), which shows as
    a ``seq`` past the frame's own first sequence.
    """
    if batch.events is not None:
        return batch.events
    full = decode(batch.frame, max_bytes)
    assert type(full) is EventBatch  # same bytes as the header already decoded
    events = full.events or []
    skip = batch.seq - full.seq
    return events[skip:skip + batch.count] if skip else events


def _envelope(obj: dict[Any, Any], data: bytes | memoryview) -> Envelope:
    """Validate the fields every kind shares and build the envelope (events left to the caller)."""
    version = obj.get("v")
    if type(version) is not int:
        raise _malformed("missing or non-integer schema version 'v'")
    if version not in SCHEMAS:
        raise DecodeError("schema_version", f"unsupported schema version {version}")
    kind = obj.get("kind")
    pid = _field(obj, "pub", (str,))
    name = _field(obj, "name", (str,))
    sent_at = float(_field(obj, "sent_at", (float, int)))
    if not pid:
        raise _malformed("empty publisher id")
    if kind == "event":
        topic = _field(obj, "topic", (str,))
        seq = _field(obj, "seq", (int,))
        if not topic or not 1 <= seq <= MAX_SEQ:
            raise _malformed(f"an event envelope needs a topic and 1 <= seq <= {MAX_SEQ}")
        return EventBatch(pid, name, topic, seq, sent_at, None, 0, data, version)
    if kind == "hello":
        more = obj.get("more", False)
        if type(more) is not bool:
            raise _malformed(f"field 'more' must be bool, got {type(more).__name__}")
        rev = obj.get("rev")
        if "rev" in obj and (type(rev) is not int or not 0 <= rev <= MAX_REV):
            raise _malformed(f"field 'rev' must be an int from 0 to {MAX_REV}, got {rev!r:.40}")
        return Hello(
            pid, name, sent_at, _seqs(obj), _field(obj, "reason", (str,)),
            float(_field(obj, "max_idle", (float, int))), _field(obj, "host", (str,)), more, rev,
        )
    if kind == "bye":
        return Bye(pid, name, sent_at, _seqs(obj))
    raise _malformed(f"unknown envelope kind {kind!r}")


def _events(raw: list[Any], topic: str, seq: int, pid: str, sent_at: float, schema: int) -> list[Event]:
    _check_count(seq, len(raw))
    events: list[Event] = []
    append = events.append
    actions = ACTIONS
    packed: list[bytes] | None = [] if schema == PACKED_SCHEMA else None
    s = seq
    try:
        for item in raw:
            table, key, action, version, value, ts = item if len(item) == 6 else item[:6]
            if (
                type(item) is not list
                or type(table) is not str
                or not table
                or type(key) is not str
                or type(version) is not int
                or version < 0
                or type(ts) not in (float, int)
            ):
                raise _malformed(f"bad event at seq {s}")
            act = actions[action]
            if act is _DELETE:  # a delete has no value after it, whatever a publisher put there
                append(Event(topic, table, key, act, version, None, ts, pid, s, sent_at))
            elif packed is None:
                append(Event(topic, table, key, act, version, value, ts, pid, s, sent_at))
            elif type(value) is bytes:
                packed.append(value)
                append(Event(topic, table, key, act, version, None, ts, pid, s, sent_at, value))
            else:
                raise _malformed(f"bad event at seq {s}: a schema 2 value must be a bin, got {type(value).__name__}")
            s += 1
    except (TypeError, ValueError, KeyError) as exc:
        # Not an array of six, or an unknown or unhashable action.
        raise _malformed(f"bad event at seq {s}: {exc}") from exc
    if packed:
        check_packed(packed)
    return events
