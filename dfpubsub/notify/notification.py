"""The notification record that travels in the persistent queues, and its msgpack form.

A :class:`Notification` says what happened to one object (S3 style: an event
name such as ``s3:ObjectCreated:Put`` on a key of a bucket or table) and is
enough to render every endpoint format (see :mod:`dfpubsub.notify.records`).
:func:`encode` packs it as a msgpack map tagged with a schema version (an
entry the store's own write enqueued has the version in front of that map,
:mod:`dfpubsub.store.outbox`, which :func:`decode` puts in); :func:`decode` validates every field and raises
:class:`~dfpubsub.errors.NotificationDecodeError` with a countable reason
(``oversize``, ``not_msgpack``, ``truncated``, ``schema_version``,
``malformed``) for anything else. How often delivery was attempted is the
queue's business and is not part of the record.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import InvalidEvent, InvalidValue, NotificationDecodeError
from ..events import ACTIONS
from ..store.outbox import split_versioned

__all__ = [
    "NOTIFICATION_SCHEMA_VERSION",
    "MAX_NOTIFICATION_BYTES",
    "Notification",
    "make_notification",
    "notification_id",
    "value_digest",
    "sequencer",
    "encode",
    "decode",
]

NOTIFICATION_SCHEMA_VERSION = 1
#: Largest encoded notification :func:`decode` accepts (a value of up to the store's 1 MiB, and headroom).
MAX_NOTIFICATION_BYTES = 2 << 20
#: Hex digits of a sequencer: a store version is a 64-bit integer.
SEQUENCER_DIGITS = 16


@dataclass(slots=True)
class Notification:
    """One change of one object, as a notification topic delivers it.

    ``version`` is the store's version of the change (it orders the changes of
    a key); ``size`` and ``etag`` describe the value as the store holds it
    (see :func:`value_digest`), ``etag`` is empty for a delete; ``value`` is
    the object's value when the topic carries values, else None;
    ``opaque_data`` is the topic's, copied into every record as Ceph does;
    ``config_id`` names the notification configuration that matched (S3
    ``configurationId``).
    """

    id: str
    topic: str
    event_name: str
    action: str
    bucket: str
    key: str
    version: int
    size: int = 0
    etag: str = ""
    event_time: float = 0.0
    value: Any = None
    opaque_data: str = ""
    publisher: str = ""
    config_id: str = ""

    @property
    def sequencer(self) -> str:
        """The version as fixed-width upper-case hex: sorts like the version."""
        return sequencer(self.version)


def sequencer(version: int) -> str:
    """``version`` as the S3 ``sequencer``: 16 upper-case hex digits, so string order is version order."""
    return f"{version:0{SEQUENCER_DIGITS}X}"


def notification_id(topic: str, bucket: str, key: str, version: int) -> str:
    """A deterministic id: the same change enqueued twice gets the same id, so receivers can deduplicate."""
    return f"{topic}:{bucket}:{key}:{version}"


def _utf8_len(key: str) -> int:
    return len(key.encode())


#: Types _canonical() returns as they are (it runs on every notified write).
_LEAVES = frozenset((str, int, float, bool, type(None), bytes))
_STR = {str}


def _canonical(value: Any) -> Any:
    # Maps in the order of their keys' msgpack bytes (keys may be of mixed types), so equal
    # values have equal digests whatever order their maps were built in.
    if isinstance(value, dict):
        if set(map(type, value)) == _STR:
            # A str key's bytes are a header growing with its UTF-8 length, then UTF-8, which
            # sorts like the code points: sort by those, then (stably) by length.
            keys = sorted(value)
            keys.sort(key=len if all(map(str.isascii, keys)) else _utf8_len)
        else:
            keys = sorted(value, key=msgpack.packb)
        return {k: v if type(v := value[k]) in _LEAVES else _canonical(v) for k in keys}
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _LEAVES else _canonical(v) for v in value]
    return value


def value_digest(value: Any) -> tuple[int, str]:
    """``(size, etag)`` of a value: the length of its msgpack encoding (what the store
    holds and limits) and the MD5 hex digest of its canonical encoding (maps sorted by key).

    Raises :class:`InvalidEvent` when the value cannot be serialised.
    """
    try:
        blob = msgpack.packb(_canonical(value))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"value is not serialisable: {exc}") from exc
    return len(blob), hashlib.md5(blob, usedforsecurity=False).hexdigest()


def make_notification(
    topic: str,
    event_name: str,
    action: str,
    bucket: str,
    key: str,
    version: int,
    value: Any = None,
    *,
    event_time: float | None = None,
    opaque_data: str = "",
    publisher: str = "",
    config_id: str = "",
    include_value: bool = False,
) -> Notification:
    """Build a notification for a change, computing its id, size and etag.

    ``value`` is the object after the change (ignored for a delete); it is
    carried in the notification only with ``include_value``. ``event_time``
    defaults to now.
    """
    if action not in ACTIONS:
        raise InvalidEvent(f"unknown action {action!r}; expected one of {sorted(ACTIONS)}")
    if action == "delete":
        size, etag, value = 0, "", None
    else:
        size, etag = value_digest(value)
    return Notification(
        notification_id(topic, bucket, key, version), topic, event_name, action, bucket, key, version,
        size, etag, time.time() if event_time is None else float(event_time),
        value if include_value else None, opaque_data, publisher, config_id,
    )


# Field name -> accepted types, in the order of the dataclass (and of the encoded map).
_FIELDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("id", (str,)), ("topic", (str,)), ("event_name", (str,)), ("action", (str,)),
    ("bucket", (str,)), ("key", (str,)), ("version", (int,)), ("size", (int,)),
    ("etag", (str,)), ("event_time", (float, int)), ("value", ()), ("opaque_data", (str,)),
    ("publisher", (str,)), ("config_id", (str,)),
)


def encode(n: Notification) -> bytes:
    """Pack a notification as a msgpack map with schema version ``v``.

    Raises :class:`InvalidEvent` when its value cannot be serialised.
    """
    try:
        packed: bytes = msgpack.packb(
            {
                "v": NOTIFICATION_SCHEMA_VERSION, "id": n.id, "topic": n.topic, "event_name": n.event_name,
                "action": n.action, "bucket": n.bucket, "key": n.key, "version": n.version, "size": n.size,
                "etag": n.etag, "event_time": float(n.event_time), "value": n.value,
                "opaque_data": n.opaque_data, "publisher": n.publisher, "config_id": n.config_id,
            }
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"notification {n.id!r} is not serialisable: {exc}") from exc
    return packed


def decode(data: bytes, max_bytes: int = MAX_NOTIFICATION_BYTES) -> Notification:
    """Decode and validate one notification; raise :class:`NotificationDecodeError` if invalid.

    Keys this version does not know are ignored, so a later minor addition
    does not make older readers drop records.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise NotificationDecodeError("malformed", f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise NotificationDecodeError("oversize", f"{len(data)} bytes > limit {max_bytes}")
    try:
        stored_version, data = split_versioned(bytes(data))
    except InvalidValue as exc:
        raise NotificationDecodeError("malformed", str(exc)) from exc
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.ExtraData as exc:
        raise NotificationDecodeError("malformed", "trailing bytes after the notification") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        if isinstance(exc, msgpack.OutOfData) or "incomplete input" in str(exc):
            raise NotificationDecodeError("truncated", "data ends inside the notification") from exc
        raise NotificationDecodeError("not_msgpack", str(exc)[:200]) from exc
    if type(obj) is not dict:
        raise NotificationDecodeError("malformed", f"a notification is a map, got {type(obj).__name__}")
    version = obj.get("v")
    if type(version) is not int:
        raise NotificationDecodeError("malformed", "missing or non-integer schema version 'v'")
    if version != NOTIFICATION_SCHEMA_VERSION:
        raise NotificationDecodeError("schema_version", f"unsupported notification schema version {version}")
    values = []
    for name, types in _FIELDS:
        if name not in obj:
            raise NotificationDecodeError("malformed", f"missing field {name!r}")
        value = obj[name]
        if types and type(value) not in types:
            raise NotificationDecodeError(
                "malformed",
                f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}",
            )
        values.append(value)
    n = Notification(*values)
    if stored_version is not None:  # enqueued by the store's write, which knew the version only then
        n.version = stored_version
        n.id = notification_id(n.topic, n.bucket, n.key, stored_version)
    if not n.id or not n.topic or not n.event_name or not n.bucket:
        raise NotificationDecodeError("malformed", "empty id, topic, event_name or bucket")
    if n.action not in ACTIONS or n.version < 0 or n.size < 0:
        raise NotificationDecodeError("malformed", f"bad action {n.action!r}, version or size")
    n.event_time = float(n.event_time)
    return n
