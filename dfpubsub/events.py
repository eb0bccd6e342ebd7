"""The event model: change events and the envelopes that carry them.

An :class:`Event` is the change of one object. Events travel in envelopes:
an :class:`EventBatch` carries one or more events of one topic with consecutive
sequence numbers; a :class:`Hello` and a :class:`Bye` are control messages
that tell subscribers the publisher's current sequence per topic.
See docs/protocol.md for the wire form.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import InvalidEvent

__all__ = [
    "Action",
    "Event",
    "EventBatch",
    "Hello",
    "Bye",
    "Bookmark",
    "Envelope",
    "VersionedObject",
    "CONTROL_TOPIC",
    "MAX_TOPIC_BYTES",
    "validate_topic",
    "MAX_KEPT_ID",
    "MAX_KEPT_TEXT",
    "kept_id",
    "kept_text",
]

#: Topic on which hellos and byes travel; every subscriber listens to it.
CONTROL_TOPIC = "$ctl"
#: Longest topic name, in UTF-8 bytes.
MAX_TOPIC_BYTES = 255
#: Longest publisher id a receiver keeps as it is, in characters (dfpubsub's are 32).
MAX_KEPT_ID = 128
#: Longest informational string (publisher name, host) a receiver keeps, in characters.
MAX_KEPT_TEXT = 255


class Action(str, enum.Enum):
    """What happened to the object."""

    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


#: Wire string -> Action; a dict lookup is much cheaper than ``Action(s)`` on the hot path.
ACTIONS: dict[str, Action] = {a.value: a for a in Action}


@dataclass(slots=True)
class Event:
    """A change of one object.

    ``version`` is assigned by the northbound DB and strictly increases per
    object; ``value`` is the object after the change (``None`` on delete);
    ``timestamp`` is when the change was made (Unix seconds).
    ``publisher_id``, ``seq`` and ``sent_at`` (when the envelope was sent,
    Unix seconds) are filled in on the subscriber side from the envelope; a
    publisher ignores them. ``packed``: the value's msgpack bytes as a schema 2
    envelope carried them (None otherwise); ``value`` is then None until
    something decodes them (:func:`dfpubsub.codec.unpack_value`), unless the
    subscriber decodes every value for its handler.
    """

    topic: str
    table: str
    key: str
    action: Action
    version: int
    value: Any = None
    timestamp: float = 0.0
    publisher_id: str = ""
    seq: int = 0
    sent_at: float = 0.0
    packed: bytes | None = None


class VersionedObject(NamedTuple):
    """An object as the northbound DB and the caches hold it.

    A named tuple rather than a frozen dataclass: resyncs build hundreds of
    thousands of them, and a frozen dataclass's constructor is several times slower.
    """

    topic: str
    table: str
    key: str
    version: int
    value: Any


@dataclass(slots=True)
class EventBatch:
    """Events of one topic from one publisher; event ``i`` has sequence ``seq + i``.

    A subscriber's receive thread decodes only the envelope (``events`` is
    None, ``count`` says how many, ``frame`` keeps the bytes); the dispatch
    thread decodes the events with :func:`dfpubsub.codec.decode_events`.
    """

    publisher_id: str
    publisher_name: str
    topic: str
    seq: int
    sent_at: float
    events: list[Event] | None
    count: int = -1
    frame: bytes | memoryview = b""
    #: The envelope's schema version (docs/protocol.md §4.2).
    schema: int = 1

    def __post_init__(self) -> None:
        if self.count < 0:
            self.count = len(self.events or ())

    @property
    def last_seq(self) -> int:
        """Sequence number of the last event in the batch."""
        return self.seq + self.count - 1


@dataclass(slots=True)
class Hello:
    """Heartbeat: the last sequence number sent on each topic the publisher used.

    ``reason`` is ``start``, ``idle`` or ``welcome`` (a new subscriber was seen).
    ``max_idle_time`` lets subscribers tell a silent publisher from a dead one
    (0 or less: it sends no idle hellos, do not expect any). ``more`` marks
    every part but the last of a hello split to fit the size limit: a topic
    missing from one part may be in the next.
    """

    publisher_id: str
    publisher_name: str
    sent_at: float
    seqs: dict[str, int] = field(default_factory=dict)
    reason: str = "idle"
    max_idle_time: float = 0.0
    host: str = ""
    more: bool = False
    #: A bookmark (docs/protocol.md §4.4): every change of the store's change feed up to this
    #: revision was published on these topics' streams at sequences up to ``seqs``. Only a
    #: publisher that follows the feed (df-feed) sets it; None: no such claim.
    rev: int | None = None


@dataclass(frozen=True, slots=True)
class Bookmark:
    """A hello's bookmark as a subscriber's tracker passes it on, in band behind the envelopes
    of the streams it vouches for: ``seqs`` holds, for each subscribed topic whose stream was
    in agreement with the hello (nothing held, no gap open, nothing expected beyond), the
    hello's sequence; 0 for a topic the publisher has not used."""

    publisher_id: str
    rev: int
    seqs: dict[str, int]


@dataclass(slots=True)
class Bye:
    """Sent by a publisher that closes cleanly, with its final sequence per topic."""

    publisher_id: str
    publisher_name: str
    sent_at: float
    seqs: dict[str, int] = field(default_factory=dict)


Envelope = EventBatch | Hello | Bye


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic name, else raise :class:`InvalidEvent`.

    A topic is a non-empty UTF-8 string of at most 255 bytes, without NUL
    (ZeroMQ frames end topics with NUL) and not starting with ``$`` (reserved
    for control topics).
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidEvent(f"topic must be a non-empty str, got {topic!r}")
    if "\x00" in topic:
        raise InvalidEvent(f"topic must not contain NUL: {topic!r}")
    if topic.startswith("$"):
        raise InvalidEvent(f"topics starting with '$' are reserved: {topic!r}")
    if len(topic.encode("utf-8")) > MAX_TOPIC_BYTES:
        raise InvalidEvent(f"topic longer than {MAX_TOPIC_BYTES} bytes: {topic[:40]!r}...")
    return topic


def kept_id(pid: str) -> str:
    """``pid`` itself, or for one longer than :data:`MAX_KEPT_ID` a stand-in of bounded size
    that still tells ids apart: its head and a 128-bit digest of the whole.

    Anyone who reaches a subscriber chooses the ids it keeps state under: a megabyte id must
    not cost a megabyte per publisher tracked (docs/security.md).
    """
    if len(pid) <= MAX_KEPT_ID:
        return pid
    return pid[:64] + "~" + hashlib.blake2b(pid.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def kept_text(text: str) -> str:
    """``text`` cut to :data:`MAX_KEPT_TEXT` characters (for strings that only inform)."""
    return text if len(text) <= MAX_KEPT_TEXT else text[:MAX_KEPT_TEXT]
