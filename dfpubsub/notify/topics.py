"""Notification topics and configurations: where notifications go, and which changes make them.

A :class:`Topic` names an endpoint and a delivery policy (SNS-style, as in
Ceph's RGW). A :class:`NotificationConfig` binds a source (a table of the
store, or a bucket) with key filters and actions to a topic: the analogue of
one ``TopicConfiguration`` of S3's PutBucketNotificationConfiguration.

Actions are the store's (``create``, ``update``, ``delete``) or S3 event
names and patterns. Each store action has an S3 event name
(:data:`S3_EVENT_NAMES`): ``create`` and ``update`` are both
``s3:ObjectCreated:Put`` (S3 has no update: a PUT over an existing object is
another ObjectCreated:Put), ``delete`` is ``s3:ObjectRemoved:Delete``. A
configuration listing ``create`` matches creates only; one listing
``s3:ObjectCreated:*`` or ``s3:ObjectCreated:Put`` matches creates and
updates; no actions at all matches every change.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import InvalidValue
from ..queues import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_STALE_AFTER

__all__ = [
    "Topic",
    "NotificationConfig",
    "S3_EVENT_NAMES",
    "FORMATS",
    "event_name",
]

#: The S3 event name of each store action.
S3_EVENT_NAMES: dict[str, str] = {
    "create": "s3:ObjectCreated:Put",
    "update": "s3:ObjectCreated:Put",
    "delete": "s3:ObjectRemoved:Delete",
}
#: The event names and patterns a configuration may list, besides the store's actions.
_S3_EVENTS = frozenset({
    "s3:*",
    "s3:ObjectCreated:*", "s3:ObjectCreated:Put", "s3:ObjectCreated:Post", "s3:ObjectCreated:Copy",
    "s3:ObjectCreated:CompleteMultipartUpload",
    "s3:ObjectRemoved:*", "s3:ObjectRemoved:Delete", "s3:ObjectRemoved:DeleteMarkerCreated",
})
FORMATS = ("s3", "cloudevents")
# Topic names may not end in ".<digits>": those are the names of shards (topic.1, topic.2, ...).
_TOPIC = re.compile(r"^[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,127}$")
_SHARD_SUFFIX = re.compile(r"\.[0-9]+$")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_SOURCE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_MAX_SHARDS = 1024


def event_name(action: str) -> str:
    """The S3 event name of a store action; InvalidValue for another."""
    try:
        return S3_EVENT_NAMES[action]
    except KeyError:
        raise InvalidValue(f"unknown action {action!r}; actions: {', '.join(S3_EVENT_NAMES)}") from None


def _number(value: Any, what: str, minimum: float, integer: bool = False) -> None:
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        raise InvalidValue(f"{what} must be {'an int' if integer else 'a number'} >= {minimum}, not {value!r}")


@dataclass(frozen=True, slots=True)
class Topic:
    """A notification topic.

    ``shards`` None takes the registry's default when the topic is created;
    a created topic keeps its count. ``max_bytes`` and ``max_entries`` bound
    each shard's queue. ``time_to_live`` (seconds; 0 = forever) and
    ``max_retries`` (0 = unlimited) send an entry to the dead letters;
    ``retry_sleep`` is the pause between attempts; ``opaque_data`` is copied
    into every notification; ``endpoint_options`` tune the endpoint
    (docs/endpoints.md: ``max_batch``, ``timeout``, ``mode``, ``header.<Name>``...).
    """

    name: str
    endpoint: str
    persistent: bool = False
    shards: int | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    max_entries: int = DEFAULT_MAX_ENTRIES
    stale_after: float = DEFAULT_STALE_AFTER
    time_to_live: float = 0.0
    max_retries: int = 0
    retry_sleep: float = 1.0
    format: str = "s3"
    opaque_data: str = ""
    endpoint_options: dict[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOPIC.match(self.name) or _SHARD_SUFFIX.search(self.name):
            raise InvalidValue(f"topic name {self.name!r} must match {_TOPIC.pattern} and not end in .<digits>")
        if not isinstance(self.endpoint, str) or not urlsplit(self.endpoint).scheme or "://" not in self.endpoint:
            raise InvalidValue(f"topic {self.name}: endpoint must be a URL, not {self.endpoint!r}")
        if not isinstance(self.persistent, bool):
            raise InvalidValue(f"topic {self.name}: persistent must be a bool")
        if self.shards is not None:
            _number(self.shards, f"topic {self.name}: shards", 1, integer=True)
            if self.shards > _MAX_SHARDS:
                raise InvalidValue(f"topic {self.name}: at most {_MAX_SHARDS} shards")
        _number(self.max_bytes, f"topic {self.name}: max_bytes", 1, integer=True)
        _number(self.max_entries, f"topic {self.name}: max_entries", 1, integer=True)
        _number(self.stale_after, f"topic {self.name}: stale_after", 0.001)
        _number(self.time_to_live, f"topic {self.name}: time_to_live", 0)
        _number(self.max_retries, f"topic {self.name}: max_retries", 0, integer=True)
        _number(self.retry_sleep, f"topic {self.name}: retry_sleep", 0)
        if self.format not in FORMATS:
            raise InvalidValue(f"topic {self.name}: format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if not isinstance(self.opaque_data, str):
            raise InvalidValue(f"topic {self.name}: opaque_data must be a str")
        if not isinstance(self.endpoint_options, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.endpoint_options.items()
        ):
            raise InvalidValue(f"topic {self.name}: endpoint_options must map names to strings")

    def with_shards(self, shards: int) -> Topic:
        """The same topic with ``shards`` shards."""
        return replace(self, shards=shards)

    def to_json(self) -> bytes:
        """The stored form."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> Topic:
        """Inverse of :meth:`to_json`; InvalidValue for anything else."""
        return _build(cls, _load(blob, cls.__name__))


@dataclass(frozen=True, slots=True)
class NotificationConfig:
    """Changes of ``source`` whose key starts with ``prefix``, ends with ``suffix`` and whose
    action is one of ``actions`` (all if empty) are notified to ``topic``."""

    id: str
    source: str
    topic: str
    actions: tuple[str, ...] = ()
    prefix: str = ""
    suffix: str = ""
    _patterns: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.match(self.id):
            raise InvalidValue(f"configuration id {self.id!r} must match {_ID.pattern}")
        if not isinstance(self.source, str) or not _SOURCE.match(self.source):
            raise InvalidValue(f"configuration {self.id}: source {self.source!r} must match {_SOURCE.pattern}")
        if not isinstance(self.topic, str) or not _TOPIC.match(self.topic):
            raise InvalidValue(f"configuration {self.id}: topic {self.topic!r} is not a topic name")
        if not isinstance(self.prefix, str) or not isinstance(self.suffix, str):
            raise InvalidValue(f"configuration {self.id}: prefix and suffix must be str")
        actions = (self.actions,) if isinstance(self.actions, str) else tuple(self.actions)
        for a in actions:
            if a not in S3_EVENT_NAMES and a not in _S3_EVENTS:
                raise InvalidValue(f"configuration {self.id}: unknown action {a!r}; use create, update, delete "
                                   f"or one of {', '.join(sorted(_S3_EVENTS))}")
        object.__setattr__(self, "actions", actions)
        object.__setattr__(self, "_patterns", tuple(a for a in actions if a.startswith("s3:")))

    def matches(self, table: str, key: str, action: str) -> bool:
        """Whether a change of ``key`` in ``table`` by ``action`` is notified."""
        if table != self.source or not key.startswith(self.prefix) or not key.endswith(self.suffix):
            return False
        return self.matches_action(action)

    def matches_action(self, action: str) -> bool:
        """Whether changes by ``action`` are notified (of keys that match)."""
        if not self.actions or action in self.actions:
            return True
        name = S3_EVENT_NAMES.get(action)
        return name is not None and any(fnmatchcase(name, p) for p in self._patterns)

    def to_json(self) -> bytes:
        """The stored form."""
        return json.dumps({"id": self.id, "source": self.source, "topic": self.topic, "actions": list(self.actions),
                           "prefix": self.prefix, "suffix": self.suffix}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> NotificationConfig:
        """Inverse of :meth:`to_json`; InvalidValue for anything else."""
        fields = _load(blob, cls.__name__)
        fields["actions"] = tuple(fields.get("actions") or ())
        return _build(cls, fields)


def _load(blob: bytes, what: str) -> dict[str, Any]:
    try:
        fields = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidValue(f"stored {what} is not JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise InvalidValue(f"stored {what} is not an object")
    return fields


_T = TypeVar("_T")


def _build(cls: type[_T], fields: dict[str, Any]) -> _T:
    try:
        return cls(**fields)
    except TypeError as exc:  # unknown or missing fields
        raise InvalidValue(f"stored {cls.__name__} does not fit: {exc}") from exc
