"""Opening the notification queues and registry that the settings describe."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..queues import QueueStore, open_queues
from .registry import NotificationRegistry

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["queues_from_settings", "registry_from_settings"]


def queues_from_settings(settings: Settings) -> QueueStore:
    """The queue backend of ``[notify] url`` (default: the store's URL), under the store's key prefix."""
    url = settings.notify.url or settings.store.url
    options: dict[str, Any] = {} if url.startswith("sqlite") else {"prefix": settings.store.prefix}
    return open_queues(url, **options)


def registry_from_settings(settings: Settings, queues: QueueStore) -> NotificationRegistry:
    """The topics and configurations kept in ``queues``, with ``[notify] default_shards``."""
    return NotificationRegistry(queues, default_shards=settings.notify.default_shards)
