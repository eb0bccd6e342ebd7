"""Persistent notifications: topics, configurations, the write path (docs/notifications.md).

The queues themselves are :mod:`dfpubsub.queues`; delivery (df-notify) is
:mod:`dfpubsub.notify.delivery`, which needs the ``notify`` extra.
"""

from .bridge import NotificationBridge
from .notification import Notification, decode, encode, make_notification
from .producer import Notifier
from .registry import DEFAULT_SHARDS, Match, NotificationRegistry, TopicStats
from .topics import FORMATS, S3_EVENT_NAMES, NotificationConfig, Topic, event_name

__all__ = [
    "Notification",
    "NotificationBridge",
    "Notifier",
    "decode",
    "encode",
    "make_notification",
    "Topic",
    "NotificationConfig",
    "NotificationRegistry",
    "TopicStats",
    "Match",
    "DEFAULT_SHARDS",
    "S3_EVENT_NAMES",
    "FORMATS",
    "event_name",
]
