"""A subscriber that records what it is handed, shared by the driver and service tests."""

import threading

from dfpubsub import Subscriber, SubscriberOptions
from dfpubsub.metrics import Stats
from dfpubsub.tracker import ResyncRequest
from tests.conftest import undetected


class RecordingSink:
    """A core Subscriber on ``transport`` recording events, resyncs and resync requests (``gaps``).

    ``resync``: True records resyncs, False leaves the subscriber without a
    resync handler, a callable is the handler. ``opts`` are SubscriberOptions
    (the delay window defaults to 0.2 s).
    """

    def __init__(self, transport, topics, stats=None, resync=True, **opts):
        self.events = []
        self.resyncs: list[set[str]] = []
        self.gaps: list[ResyncRequest] = []
        self.lock = threading.Lock()
        self.stats = stats or Stats("subscriber", "sink")
        on_resync = resync if callable(resync) else self.resyncs.append if resync else None
        self.sub = Subscriber(transport, topics, self.on_event, on_resync,
                              SubscriberOptions(**{"message_delay_window": 0.2, **opts}), "sink",
                              self.gaps.append, self.stats)

    def on_event(self, e):
        with self.lock:
            self.events.append(e)

    def keys(self, topic=None):
        with self.lock:
            return [e.key for e in self.events if topic is None or e.topic == topic]

    def seqs(self, topic, pid=None):
        with self.lock:
            return [e.seq for e in self.events if e.topic == topic and pid in (None, e.publisher_id)]

    def undetected_losses(self, pid, sent):
        """Per topic of ``sent`` (topic -> last sequence sent by ``pid``): the sequence numbers
        neither delivered nor inside a resync request's missing range."""
        return {topic: undetected(self.seqs(topic, pid), [g.missing for g in list(self.gaps) if g.topic == topic],
                                  last) for topic, last in sent.items()}
