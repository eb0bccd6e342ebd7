"""Typed exceptions raised by dfpubsub.

Every error the framework raises derives from :class:`DfPubSubError`, so callers
can catch the family without catching unrelated bugs.
"""

from __future__ import annotations

__all__ = [
    "DfPubSubError",
    "ConfigError",
    "AuthenticationError",
    "DriverNotFound",
    "MissingExtra",
    "TransportError",
    "ProtocolError",
    "DecodeError",
    "BadValue",
    "InvalidEvent",
    "PayloadTooLarge",
    "ClosedError",
    "StoreError",
    "UnknownTable",
    "NotFound",
    "AlreadyExists",
    "VersionConflict",
    "InvalidValue",
    "ValueTooLarge",
    "StoreUnavailable",
    "StoreMissing",
    "WriteOutcomeUnknown",
    "HistoryGone",
    "HistoryRewound",
    "NotEnoughReplicas",
    "QueueError",
    "QueueNotFound",
    "QueueFull",
    "ReservationNotFound",
    "ForeignRecord",
    "TopicNotFound",
    "NotificationDecodeError",
    "EndpointError",
    "EndpointRejected",
    "EndpointConfigError",
    "InputError",
    "ArchiveError",
    "PipelineError",
    "NotLeader",
]


class DfPubSubError(Exception):
    """Base class of every error raised by dfpubsub."""


class ConfigError(DfPubSubError, ValueError):
    """The configuration is invalid; the message names the setting and the fix."""


class AuthenticationError(DfPubSubError, PermissionError):
    """A backend refused the configured credentials (user, password): retrying with the same
    settings cannot help. Not a ValueError, which gRPC's closed channels raise."""


class DriverNotFound(DfPubSubError, LookupError):
    """No pub/sub driver is registered under the requested name."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"unknown pub/sub driver {name!r}; known drivers: {', '.join(self.known) or 'none'}"
        )


class MissingExtra(DfPubSubError, ImportError):
    """A chosen backend needs an optional library that is not installed."""

    def __init__(self, what: str, module: str, extra: str):
        self.what = what
        self.module = module
        self.extra = extra
        super().__init__(f"{what} needs {module}, which is not installed: pip install 'dfpubsub[{extra}]'")


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


class BadValue(ProtocolError, ValueError):
    """A schema 2 value passed the structural check at receipt but does not decode (invalid UTF-8,
    a container as a map key, a malformed timestamp or reserved extension type): counted as
    ``bad_values``, never handed to a reconciler, index or transform, its key repaired from the
    store (docs/protocol.md §6.4)."""


class NotificationDecodeError(DecodeError):
    """A queued notification record could not be decoded (same reasons as :class:`DecodeError`)."""


class InvalidEvent(DfPubSubError, ValueError):
    """An event handed to a publisher is not valid (wrong type, bad topic, ...)."""


class PayloadTooLarge(InvalidEvent):
    """An event does not fit in one frame of ``max_message_bytes``."""


class ClosedError(DfPubSubError):
    """The publisher or subscriber was already closed."""


class StoreError(DfPubSubError):
    """Base class of northbound store errors."""


class UnknownTable(StoreError, LookupError):
    """The table is not declared in the store's schema."""


class NotFound(StoreError, LookupError):
    """No object with that table and key."""


class AlreadyExists(StoreError):
    """create() of an object that exists."""


class VersionConflict(StoreError):
    """Compare-and-set failed: the object's version is not the one expected."""

    def __init__(self, table: str, key: str, expected: int, actual: int):
        self.expected = expected
        self.actual = actual
        super().__init__(f"{table}/{key}: expected version {expected}, found {actual}")


class InvalidValue(StoreError, ValueError):
    """A table name, key, topic or value the store cannot hold."""


class ValueTooLarge(InvalidValue):
    """A value larger than the store's ``max_value_bytes``."""


class StoreUnavailable(StoreError, TransportError):
    """The store's server cannot be reached (the write may or may not have happened)."""


class StoreMissing(StoreUnavailable):
    """The store does not exist (a SQLite file never created) and nobody asked to create it.

    Opening it would create an empty store, and a reconciler would then act as if every object
    had been deleted: daemons refuse, and ``df-db init`` (or ``[store] create``) creates it.
    """


class WriteOutcomeUnknown(StoreUnavailable):
    """A write failed in flight: the server may have committed it or not.

    The connection broke (or timed out) after the request left, so nobody can
    tell from here. A committed write is still published by the change feed
    (docs/feed.md); read the object to learn which way it went.
    """


class NotEnoughReplicas(StoreUnavailable):
    """The server refused a write for want of replicas (Redis ``NOREPLICAS`` under
    ``min-replicas-to-write``, ``MASTERDOWN``): nothing was written; try again later."""


class HistoryGone(StoreError):
    """The change feed no longer holds the revisions asked for (retention or compaction).

    ``horizon`` is the newest revision known to be gone (0 if the backend
    cannot tell). A reader must resync from a listing, never skip ahead silently.
    ``reason`` names the case in metrics (a controller counts its relists under it).
    """

    reason = "history_gone"

    def __init__(self, after: int, horizon: int = 0, detail: str = ""):
        self.after = after
        self.horizon = horizon
        super().__init__(self._describe(after, horizon) + (f": {detail}" if detail else ""))

    @staticmethod
    def _describe(after: int, horizon: int) -> str:
        return f"change feed history after revision {after} is gone" + (f" (compacted up to {horizon})" if horizon else "")


class HistoryRewound(HistoryGone):
    """The store's history went backwards below a position a reader holds: a failover promoted a
    replica that lacked the last writes, or a server restarted without them. Revisions
    ``horizon + 1`` up to ``after`` as the reader saw them are not the store's any more (they
    may be taken again by other writes): what the reader built on them must be relisted.
    """

    reason = "history_rewound"

    @staticmethod
    def _describe(after: int, horizon: int) -> str:
        return (f"the store's history went back to revision {horizon}, below revision {after} read before "
                "(a failover or restart lost the writes between)")


class QueueError(StoreError):
    """Base class of persistent notification queue errors (docs/queues.md)."""


class QueueNotFound(QueueError, LookupError):
    """No queue of that name in the registry of queues."""


class QueueFull(QueueError):
    """No room in a queue for a reservation or a larger-than-reserved entry: back pressure.

    Ceph answers such a write with 503 Slow Down; ``queue`` names the shard.
    """

    def __init__(self, queue: str, detail: str = ""):
        self.queue = queue
        super().__init__(f"queue {queue} is full" + (f": {detail}" if detail else ""))


class ReservationNotFound(QueueError, LookupError):
    """commit() of a reservation that is unknown, already committed or aborted, or expired."""


class ForeignRecord(StoreError):
    """A record a write must change was not written by dfpubsub (wrong type, bad numbers):
    the write is refused before it changes anything; ``key`` names the record to remove."""

    def __init__(self, key: str, detail: str):
        self.key = key
        super().__init__(f"{key}: {detail}; remove or repair that key (see df-db doctor)")


class TopicNotFound(StoreError, LookupError):
    """No notification topic of that name."""


class InputError(DfPubSubError, ValueError):
    """Input handed to a tool is malformed (bad JSON, wrong shape); the message says where."""


class EndpointError(TransportError):
    """A notification endpoint did not acknowledge a batch; retrying may succeed.

    Connection refused or lost, timeouts, HTTP 5xx/408/429, a broker's nack or an
    unroutable message. ``acked`` counts the leading notifications of the batch
    that were acknowledged before the failure (delivery is at least once, so
    resending them is allowed, only wasteful).
    """

    def __init__(self, message: str, acked: int = 0, status: int | None = None):
        self.acked = acked
        self.status = status
        super().__init__(message)


class EndpointRejected(DfPubSubError):
    """A notification endpoint refused a batch for good (HTTP 4xx, a bad URL...): do not retry as is."""

    def __init__(self, message: str, acked: int = 0, status: int | None = None):
        self.acked = acked
        self.status = status
        super().__init__(message)


class EndpointConfigError(EndpointRejected, ConfigError):
    """An endpoint URL or option is invalid; no notification can ever be sent with it."""


class ArchiveError(DfPubSubError):
    """The event log (docs/pipeline.md) cannot be written or read: bad root, full disk, corrupt segment."""


class PipelineError(DfPubSubError):
    """A data pipeline job cannot run: missing input or snapshot, a bad argument, pyspark absent."""


class NotLeader(DfPubSubError):
    """This process does not hold (or can no longer be sure it holds) the leader lease it must hold to act
    (:mod:`dfpubsub.leader`)."""
