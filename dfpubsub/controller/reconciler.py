"""What a controller calls: level-triggered reconcilers, and table handlers adapted onto them.

A :class:`Reconciler` is told only *which* key to look at and the key's
current state in the cache: ``reconcile(key, obj)``, ``obj`` None when the
object is gone. It makes the world match that state and returns
:data:`DONE` (or None), ``Result(requeue=True)`` (again, with backoff) or
``Result(requeue_after=s)``; raising means "retry with backoff". Whatever
happened to the key in between (one update or fifty, a delete and a
re-create) the reconciler sees the newest state once.

The edge-triggered :class:`TableHandler` protocol (``on_create``, ``on_update``,
``on_delete``) runs on top through :class:`HandlerReconciler`, which remembers
what the handler last took and turns the current state into the one call
that brings the handler there; a handler that raises is called again with the
then-current state.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import msgpack

from ..events import VersionedObject
from ..store.api import decode_value

__all__ = ["ObjectKey", "Result", "DONE", "REQUEUE", "Reconciler", "TableHandler", "HandlerReconciler"]

_packb = msgpack.packb


class ObjectKey(NamedTuple):
    """The identity a reconciler is handed: table and key."""

    table: str
    key: str


class Result(NamedTuple):
    """What a reconcile asks for: nothing (done), a rate-limited retry, or a retry after a delay."""

    requeue: bool = False
    requeue_after: float = 0.0


#: The key is in its desired state: forget its backoff.
DONE = Result()
#: Look at the key again after its rate-limited backoff (as if it had failed, without an error).
REQUEUE = Result(requeue=True)


class Reconciler(Protocol):
    """Makes the world match one key's state; level-triggered, retried until it succeeds."""

    def reconcile(self, key: ObjectKey, obj: VersionedObject | None) -> Result | None:
        """Bring ``key`` to ``obj`` (None: deleted; its final state is ``Lister.last_known(key)``)."""


class TableHandler(Protocol):
    """What a controller does when an object of one table changes (edge-triggered)."""

    def on_create(self, obj: VersionedObject) -> None:
        """A new object (or one the handler did not have)."""

    def on_update(self, obj: VersionedObject, previous: VersionedObject) -> None:
        """Another version of an object (newer, unless a resync corrected a forged one);
        ``previous`` is the one the handler last took."""

    def on_delete(self, previous: VersionedObject) -> None:
        """The object is gone; ``previous`` is the version the handler last took."""


class HandlerReconciler:
    """Runs a :class:`TableHandler` as a reconciler: the current state becomes one call.

    The handler's own view (what it last took without raising) is kept per key;
    an object it never took is a create, one that differs from what it took
    (newer, or older after a resync replaced a forged version) an update from
    it, a missing one a delete of what it took. What it already has (a
    periodic re-delivery) calls nothing. A call that raises leaves the view
    unchanged, so the retry brings the handler from there to the then-current
    state. A key is never reconciled by two workers at once, so the view needs
    no lock.

    The view is kept packed, as the cache keeps its objects (topic, version and
    the value's msgpack bytes), not as a second decoded copy of every object:
    ``previous`` is decoded for the call that needs it.
    """

    def __init__(self, handler: TableHandler):
        self.handler = handler
        #: key -> (topic, version, value's msgpack bytes) of what the handler last took
        self.seen: dict[str, tuple[str, int, bytes]] = {}

    def reconcile(self, key: ObjectKey, obj: VersionedObject | None) -> None:
        took = self.seen.get(key.key)
        if obj is None:
            if took is not None:
                self.handler.on_delete(_unpacked(key, took))
                del self.seen[key.key]
            return
        blob = _packb(obj.value)  # msgpack.packb, not a shared Packer: workers call this at once
        if took is None:
            self.handler.on_create(obj)
        elif obj.version != took[1] or blob != took[2]:
            # Not only newer: a resync may have replaced a forged version above the truth.
            self.handler.on_update(obj, _unpacked(key, took))
        else:
            return
        self.seen[key.key] = (obj.topic, obj.version, blob)


def _unpacked(key: ObjectKey, took: tuple[str, int, bytes]) -> VersionedObject:
    return VersionedObject(took[0], key.table, key.key, took[1], decode_value(took[2]))
