"""NbApi: write to the northbound store, then publish the change with its version.

The store assigns the version; the event carries it, so every cache can tell
newer from older whatever order events arrive in. If publishing fails the
write still stands (the store is the truth) and subscribers find the hole by
sequence and resync. A process that dies between the write and the publish,
or a write whose answer was lost (:class:`~dfpubsub.errors.WriteOutcomeUnknown`:
the server may have applied it), sends no event itself: the store's change
feed has every committed write and df-feed publishes it (docs/feed.md).
``[nbapi] publish`` chooses: ``direct`` (publish here only), ``feed`` (only
write; df-feed publishes) or ``both`` (the default: here for latency, df-feed
as the safety net; subscribers drop the repeat by version).

With a :class:`~dfpubsub.notify.producer.Notifier`, a write that persistent
notification topics want enqueues their notifications: in the write's own
transaction when the queues live in the store's backend, else by reserving
room first and committing once the store assigned the version. Either way a
full queue fails the write with :class:`~dfpubsub.errors.QueueFull`, the store
untouched (docs/notifications.md).

:class:`NbApi` is synchronous, for forked web workers; :class:`AsyncNbApi`
is the same for asyncio daemons.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .config import Settings
from .events import Action, VersionedObject
from .factory import create_publisher
from .publisher import Publisher
from .store import Store, open_store_from_settings

if TYPE_CHECKING:
    from .multiproc import WorkerPublisher
    from .notify.producer import Notifier

__all__ = ["NbApi", "AsyncNbApi"]


class NbApi:
    """Northbound API: store writes that publish. ``publisher`` None writes without publishing;
    ``notifier`` None enqueues no persistent notifications."""

    def __init__(self, store: Store, publisher: Publisher | WorkerPublisher | None = None,
                 notifier: Notifier | None = None):
        self.store = store
        self.publisher = publisher
        self.notifier = notifier

    @classmethod
    def from_settings(cls, settings: Settings, publish: bool = True) -> NbApi:
        """Open the configured store and, if ``publish`` and ``[nbapi] publish`` is not "feed", a
        publisher on the configured driver; with ``[notify] enabled``, a notifier on the configured
        queues."""
        publish = publish and settings.nbapi.publish != "feed"
        store = open_store_from_settings(settings, create=True)  # a writer's first write makes the store
        notifier = None
        if settings.notify.enabled:
            from .notify.producer import Notifier
            from .notify.wiring import queues_from_settings, registry_from_settings

            queues = queues_from_settings(settings)
            notifier = Notifier(registry_from_settings(settings, queues), queues,
                                publisher=settings.pubsub.publisher_name, close_queues=True)
        return cls(store, create_publisher(settings) if publish else None, notifier)

    def get(self, table: str, key: str) -> VersionedObject | None:
        """See :meth:`Store.get`."""
        return self.store.get(table, key)

    def list(self, table: str | None = None, topic: str | None = None) -> list[VersionedObject]:
        """See :meth:`Store.list`."""
        return self.store.list(table, topic)

    def create(self, table: str, key: str, value: Any, topic: str | None = None) -> VersionedObject:
        """Create and publish; raises the store's typed errors, or QueueFull (nothing is
        written nor published then). WriteOutcomeUnknown (a StoreUnavailable): the write may
        have been applied; if it was, the change feed publishes it, so nothing here does."""
        if self.notifier is None:
            obj = self.store.create(table, key, value, topic)
        else:
            obj = self.notifier.write(self.store, table, key, "create", value,
                                      lambda outbox: self.store.create(table, key, value, topic, outbox=outbox))
        self._publish(Action.CREATE, obj)
        return obj

    def update(self, table: str, key: str, value: Any, expected_version: int | None = None) -> VersionedObject:
        """Update and publish. An object's topic is fixed: to move it, delete and create it."""
        if self.notifier is None:
            obj = self.store.update(table, key, value, expected_version)
        else:
            obj = self.notifier.write(self.store, table, key, "update", value, lambda outbox: self.store.update(
                table, key, value, expected_version, outbox=outbox))
        self._publish(Action.UPDATE, obj)
        return obj

    def delete(self, table: str, key: str, expected_version: int | None = None) -> VersionedObject:
        """Delete and publish (the event carries the deletion's version)."""
        if self.notifier is None:
            obj = self.store.delete(table, key, expected_version)
        else:
            obj = self.notifier.write(self.store, table, key, "delete", None,
                                      lambda outbox: self.store.delete(table, key, expected_version, outbox=outbox))
        self._publish(Action.DELETE, obj)
        return obj

    def _publish(self, action: Action, obj: VersionedObject) -> None:
        if self.publisher is not None:
            self.publisher.publish(obj.topic, obj.table, obj.key, action, obj.version, obj.value)

    def close(self) -> None:
        """Close the publisher (flush, bye), the notifier (its unused reservations) and the store."""
        if self.publisher is not None:
            self.publisher.close()
        if self.notifier is not None:
            self.notifier.close()
        self.store.close()

    def __enter__(self) -> NbApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncNbApi:
    """:class:`NbApi` for asyncio code; each call runs in a worker thread."""

    def __init__(self, api: NbApi):
        self.api = api

    async def get(self, table: str, key: str) -> VersionedObject | None:
        """See :meth:`NbApi.get`."""
        return await asyncio.to_thread(self.api.get, table, key)

    async def list(self, table: str | None = None, topic: str | None = None) -> list[VersionedObject]:
        """See :meth:`NbApi.list`."""
        return await asyncio.to_thread(self.api.list, table, topic)

    async def create(self, table: str, key: str, value: Any, topic: str | None = None) -> VersionedObject:
        """See :meth:`NbApi.create`."""
        return await asyncio.to_thread(self.api.create, table, key, value, topic)

    async def update(self, table: str, key: str, value: Any, expected_version: int | None = None) -> VersionedObject:
        """See :meth:`NbApi.update`."""
        return await asyncio.to_thread(self.api.update, table, key, value, expected_version)

    async def delete(self, table: str, key: str, expected_version: int | None = None) -> VersionedObject:
        """See :meth:`NbApi.delete`."""
        return await asyncio.to_thread(self.api.delete, table, key, expected_version)

    async def close(self) -> None:
        """See :meth:`NbApi.close`."""
        await asyncio.to_thread(self.api.close)
