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

from ..events import VersionedObject

__all__ = ["ObjectKey", "Result", "DONE", "REQUEUE", "Reconciler", "TableHandler", "HandlerReconciler"]


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
    """

    def __init__(self, handler: TableHandler):
        self.handler = handler
        self.seen: dict[str, VersionedObject] = {}

    def reconcile(self, key: ObjectKey, obj: VersionedObject | None) -> None:
        previous = self.seen.get(key.key)
        if obj is None:
            if previous is not None:
                self.handler.on_delete(previous)
                del self.seen[key.key]
        elif previous is None:
            self.handler.on_create(obj)
            self.seen[key.key] = obj
        elif obj.version != previous.version or obj.value != previous.value:
            # Not only newer: a resync may have replaced a forged version above the truth.
            self.handler.on_update(obj, previous)
            self.seen[key.key] = obj
