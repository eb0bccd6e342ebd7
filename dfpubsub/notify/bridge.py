"""Enqueuing persistent notifications for changes that arrive over pub/sub.

Writers that do not go through :class:`~dfpubsub.nbapi.NbApi` with a
notifier (another language, an old deployment) still publish their changes;
a :class:`NotificationBridge`, as the ``on_event`` callback of a
:class:`~dfpubsub.subscriber.Subscriber` of their topics, enqueues each
event into the persistent topics that want it (reserve, then commit with the
event's version at once: the change already happened).

The change is done by the time the event arrives, so a full queue cannot
push back on the writer: the event's notifications are dropped and counted
(``drops`` with reason ``queue_full``), logged at most once every few
seconds per topic, and the subscriber carries on. Nor can the bridge notify
what pub/sub lost: a change that reaches the subscriber only through a
resync (a gap) has no event, hence no notification. See
docs/notifications.md.
"""

from __future__ import annotations

import logging

from ..errors import DfPubSubError, QueueFull
from ..events import Event, VersionedObject
from ..logs import RateLimitedLog
from ..metrics import Stats
from .producer import Notifier

__all__ = ["NotificationBridge"]

log = logging.getLogger(__name__)


class NotificationBridge:
    """``on_event`` callback: enqueue the persistent notifications of each event; never raises.

    ``stats`` counts ``events_in`` (events seen) and ``drops`` by reason
    (``queue_full``, or the name of the error that kept the event out);
    the notifier's own stats count what was enqueued.
    """

    def __init__(self, notifier: Notifier, stats: Stats | None = None, name: str = "bridge"):
        self.notifier = notifier
        self.stats = stats or Stats("notify-bridge", name)
        self._badlog = RateLimitedLog(log, 5.0)

    def __call__(self, event: Event) -> None:
        self.stats.inc("events_in")
        try:
            pending = self.notifier.prepare(event.table, event.key, event.action, event.value,
                                            publisher=event.publisher_id, event_time=event.timestamp or None)
        except QueueFull as exc:
            self._drop("queue_full", exc.queue, event, exc)
            return
        except DfPubSubError as exc:
            self._drop(type(exc).__name__, event.table, event, exc)
            return
        if pending:
            self.notifier.commit(pending, VersionedObject(event.topic, event.table, event.key, event.version,
                                                          event.value))

    def _drop(self, reason: str, where: str, event: Event, exc: Exception | None = None) -> None:
        self.stats.inc("drops", reason=reason)
        self._badlog.warning(f"{reason}:{where}", "notification of a pub/sub event dropped", reason=reason,
                             queue=where, table=event.table, key=event.key, version=event.version,
                             error=str(exc) if exc else "")
