"""Typed exceptions raised by dfpubsub.

Every error the framework raises derives from :class:`DfPubSubError`, so callers
can catch the family without catching unrelated bugs.
"""

from __future__ import annotations

__all__ = [
    "DfPubSubError",
    "ConfigError",
    "DriverNotFound",
    "TransportError",
    "ProtocolError",
    "DecodeError",
    "InvalidEvent",
    "PayloadTooLarge",
    "ClosedError",
]


class DfPubSubError(Exception):
    """Base class of every error raised by dfpubsub."""


class ConfigError(DfPubSubError, ValueError):
    """The configuration is invalid; the message names the setting and the fix."""


class DriverNotFound(DfPubSubError, LookupError):
    """No pub/sub driver is registered under the requested name."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"unknown pub/sub driver {name!r}; known drivers: {', '.join(self.known) or 'none'}"
        )


class TransportError(DfPubSubError):
    """The transport under a driver failed (connection refused, server gone, ...)."""


class ProtocolError(DfPubSubError):
    """A peer broke the wire protocol described in docs/protocol.md."""


class DecodeError(ProtocolError):
    """A frame could not be decoded; ``reason`` is a short, countable code.

    Reasons: ``oversize``, ``not_msgpack``, ``truncated``, ``schema_version``,
    ``malformed``, ``bad_frames``.
    """

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class InvalidEvent(DfPubSubError, ValueError):
    """An event handed to a publisher is not valid (wrong type, bad topic, ...)."""


class PayloadTooLarge(InvalidEvent):
    """An event does not fit in one frame of ``max_message_bytes``."""


class ClosedError(DfPubSubError):
    """The publisher or subscriber was already closed."""
