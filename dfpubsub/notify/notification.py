"""The notification record that travels in the persistent queues, and its msgpack form.

A :class:`Notification` says what happened to one object (S3 style: an event
name such as ``s3:ObjectCreated:Put`` on a key of a bucket or table) and is
enough to render every endpoint format (see :mod:`dfpubsub.notify.records`).

:func:`encode` packs it compactly (schema 2, docs/queues.md "Entry format"): a
msgpack array of its fields in a fixed order, without the id (derived from
topic, bucket, key and version) and, when the writer gives the value's
encoding, with that encoding in place of its size and etag: a writer then
spends no canonical encoding nor MD5 on its request, and :func:`decode`
computes both when df-notify delivers the entry. An entry the store's own
write enqueued has no version and the version in front of the array
(:mod:`dfpubsub.store.outbox`), which :func:`decode` puts in.

:func:`decode` reads schema 2 and the msgpack map of schema 1 that the
previous release wrote (queues may hold those across an upgrade; schema 1 is
read for one more release), validates every field and raises
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
    "encode_change",
    "encode_head",
    "decode",
]

#: The schema :func:`encode` writes; :func:`decode` also reads :data:`PREVIOUS_SCHEMA_VERSION`.
NOTIFICATION_SCHEMA_VERSION = 2
#: The previous release's schema (a msgpack map), still read until the next release.
PREVIOUS_SCHEMA_VERSION = 1
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


# Field name -> accepted types, in the order of the dataclass (and of schema 1's map).
_FIELDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("id", (str,)), ("topic", (str,)), ("event_name", (str,)), ("action", (str,)),
    ("bucket", (str,)), ("key", (str,)), ("version", (int,)), ("size", (int,)),
    ("etag", (str,)), ("event_time", (float, int)), ("value", ()), ("opaque_data", (str,)),
    ("publisher", (str,)), ("config_id", (str,)),
)
# Schema 2's array after its schema number: the dataclass's fields without id, size and etag,
# then the digest (the value's encoding, or [size, etag]). A None version: the store's prefix has it.
_COMPACT: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("topic", (str,)), ("event_name", (str,)), ("action", (str,)), ("bucket", (str,)), ("key", (str,)),
    ("version", (int, type(None))), ("event_time", (float, int)), ("opaque_data", (str,)),
    ("publisher", (str,)), ("config_id", (str,)), ("value", ()), ("digest", (bytes, list)),
)


def encode_change(topic: str, event_name: str, action: str, bucket: str, key: str, version: int | None,
                  event_time: float, opaque_data: str, publisher: str, config_id: str, value: Any,
                  digest: bytes | tuple[int, str]) -> bytes:
    """Schema 2 from its fields: what a notifier writes for each change (see :func:`encode`).

    ``digest`` is the msgpack encoding of the object's value (:func:`decode`
    derives size and etag from it), or ``(size, etag)``; ``version`` None
    leaves it to the store's prefix. Raises :class:`InvalidEvent` when a field
    cannot be serialised.
    """
    try:
        packed: bytes = msgpack.packb([NOTIFICATION_SCHEMA_VERSION, topic, event_name, action, bucket, key, version,
                                       float(event_time), opaque_data, publisher, config_id, value, digest])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"notification of {bucket}/{key} is not serialisable: {exc}") from exc
    return packed


#: msgpack's header of schema 2's array (13 elements), and of the array short of its digest.
_ARRAY, _HEAD = b"\x9d", 0x9C


def encode_head(topic: str, event_name: str, action: str, bucket: str, key: str, event_time: float,
                opaque_data: str, publisher: str, config_id: str, value: Any) -> bytes:
    """Schema 2 of a change short of its last element, the digest, which an outbox built with the
    value appends (the value's encoding as the store writes it: dfpubsub/store/outbox.py), and of
    its version, which the outbox puts in front. :func:`encode_change` of the same fields with
    that digest and no version packs the same bytes."""
    try:
        packed: bytes = msgpack.packb([NOTIFICATION_SCHEMA_VERSION, topic, event_name, action, bucket, key, None,
                                       float(event_time), opaque_data, publisher, config_id, value])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"notification of {bucket}/{key} is not serialisable: {exc}") from exc
    assert packed[0] == _HEAD  # a fixarray of 12: only its count changes
    return _ARRAY + packed[1:]


def encode(n: Notification, digest: bytes | tuple[int, str] | None = None) -> bytes:
    """Pack a notification (schema 2). ``digest`` as for :func:`encode_change` (the value's
    encoding: :func:`decode` computes size and etag from it); None packs ``n``'s own size and
    etag. The id is not packed: :func:`decode` derives it.

    Raises :class:`InvalidEvent` when its value cannot be serialised.
    """
    return encode_change(n.topic, n.event_name, n.action, n.bucket, n.key, n.version, n.event_time, n.opaque_data,
                         n.publisher, n.config_id, n.value, (n.size, n.etag) if digest is None else digest)


def decode(data: bytes, max_bytes: int = MAX_NOTIFICATION_BYTES) -> Notification:
    """Decode and validate one notification (schema 2, or 1); raise :class:`NotificationDecodeError`
    if invalid.

    Fields this version does not know (map keys, array elements past the
    known ones) are ignored, so a later minor addition does not make older
    readers drop records.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise NotificationDecodeError("malformed", f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise NotificationDecodeError("oversize", f"{len(data)} bytes > limit {max_bytes}")
    try:
        stored_version, data = split_versioned(bytes(data))
    except InvalidValue as exc:
        raise NotificationDecodeError("malformed", str(exc)) from exc
    obj = _unpack(data, "the notification")
    if type(obj) is list:
        n = _compact(obj, stored_version)
    elif type(obj) is dict:
        n = _previous(obj)
    else:
        raise NotificationDecodeError("malformed", f"a notification is an array or a map, got {type(obj).__name__}")
    if stored_version is not None:  # enqueued by the store's write, which knew the version only then
        n.version = stored_version
        n.id = notification_id(n.topic, n.bucket, n.key, stored_version)
    if not n.id or not n.topic or not n.event_name or not n.bucket:
        raise NotificationDecodeError("malformed", "empty id, topic, event_name or bucket")
    if n.action not in ACTIONS or n.version < 0 or n.size < 0:
        raise NotificationDecodeError("malformed", f"bad action {n.action!r}, version or size")
    n.event_time = float(n.event_time)
    return n


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.ExtraData as exc:
        raise NotificationDecodeError("malformed", f"trailing bytes after {what}") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        if isinstance(exc, msgpack.OutOfData) or "incomplete input" in str(exc):
            raise NotificationDecodeError("truncated", f"data ends inside {what}") from exc
        raise NotificationDecodeError("not_msgpack", str(exc)[:200]) from exc


def _typed(name: str, value: Any, types: tuple[type, ...]) -> Any:
    if types and type(value) not in types:
        raise NotificationDecodeError(
            "malformed", f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}")
    return value


def _compact(obj: list[Any], stored_version: int | None) -> Notification:
    """Schema 2 (see :func:`encode_change`); size and etag from the digest."""
    if not obj or type(obj[0]) is not int:
        raise NotificationDecodeError("malformed", "missing or non-integer schema version")
    if obj[0] != NOTIFICATION_SCHEMA_VERSION:
        raise NotificationDecodeError("schema_version", f"unsupported notification schema version {obj[0]}")
    if len(obj) <= len(_COMPACT):
        raise NotificationDecodeError("malformed", f"{len(obj) - 1} fields, expected {len(_COMPACT)}")
    (topic, event_name, action, bucket, key, version, event_time, opaque_data, publisher, config_id, value,
     digest) = (_typed(name, v, types) for (name, types), v in zip(_COMPACT, obj[1:]))
    if version is None:
        if stored_version is None:
            raise NotificationDecodeError("malformed", "no version: neither in the entry nor in front of it")
        version = stored_version
    if type(digest) is bytes:  # the value's encoding: its size and etag are computed here, at delivery
        try:
            size, etag = (0, "") if action == "delete" else value_digest(_unpack(digest, "the value"))
        except InvalidEvent as exc:
            raise NotificationDecodeError("malformed", f"the value: {exc}") from exc
    elif len(digest) == 2 and type(digest[0]) is int and type(digest[1]) is str:
        size, etag = digest
    else:
        raise NotificationDecodeError("malformed", "the digest is neither the value's encoding nor [size, etag]")
    return Notification(notification_id(topic, bucket, key, version), topic, event_name, action, bucket, key,
                        version, size, etag, event_time, value, opaque_data, publisher, config_id)


def _previous(obj: dict[Any, Any]) -> Notification:
    """Schema 1: the map the previous release wrote."""
    version = obj.get("v")
    if type(version) is not int:
        raise NotificationDecodeError("malformed", "missing or non-integer schema version 'v'")
    if version != PREVIOUS_SCHEMA_VERSION:
        raise NotificationDecodeError("schema_version", f"unsupported notification schema version {version}")
    values = []
    for name, types in _FIELDS:
        if name not in obj:
            raise NotificationDecodeError("malformed", f"missing field {name!r}")
        values.append(_typed(name, obj[name], types))
    return Notification(*values)
