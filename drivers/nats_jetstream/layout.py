"""Where envelopes go: one subject per topic under ``{prefix}.ps.``, and their message ids.

A topic may hold any character but NUL, while a NATS subject token may not hold
``.``, ``*``, ``>``, whitespace or control characters: those bytes (and ``~``,
the escape itself) are written ``~XX`` in hex, so the mapping is one to one and
a subject read back from the stream names exactly one topic.
"""

from __future__ import annotations

from dfpubsub.codec import decode_header
from dfpubsub.errors import DecodeError
from dfpubsub.events import EventBatch

__all__ = ["msg_id", "subject_of", "topic_of"]

_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_$:/+=@#%&!,;'\"()[]{}|<?^`")


def _token(topic: str) -> str:
    raw = topic.encode("utf-8")
    if all(b in _PLAIN for b in raw):
        return topic
    return "".join(chr(b) if b in _PLAIN else f"~{b:02X}" for b in raw)


def subject_of(root: str, topic: str) -> str:
    """The subject of ``topic`` under ``root`` (``{prefix}.ps.``)."""
    return root + _token(topic)


def topic_of(root: str, subject: str) -> str | None:
    """The topic of a subject under ``root``; None for a subject that no topic maps to."""
    if not subject.startswith(root):
        return None
    token = subject[len(root):]
    if "~" not in token:
        return token if token and "." not in token else None
    out = bytearray()
    i = 0
    raw = token.encode("utf-8")
    while i < len(raw):
        if raw[i] == 0x7E:  # ~
            try:
                out.append(int(raw[i + 1:i + 3], 16))
            except ValueError:
                return None
            i += 3
        else:
            out.append(raw[i])
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return None


def msg_id(frame: bytes) -> str | None:
    """``Nats-Msg-Id`` of an event envelope, ``{publisher id}:{first sequence}:{topic}`` (sequences
    count per publisher and topic): a publisher's
    retry within the stream's duplicate window is stored once. None for hellos, byes and
    whatever does not decode (those are never retried into a duplicate that matters)."""
    try:
        env = decode_header(frame, check_events=False)
    except DecodeError:
        return None
    if type(env) is EventBatch:
        return f"{env.publisher_id}:{env.seq}:{env.topic}"
    return None
