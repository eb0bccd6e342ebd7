"""Publishers and recording subscribers on real ZeroMQ sockets, shared by the zmq tests."""

import threading

from dfpubsub import Publisher, PublisherOptions, Subscriber, SubscriberOptions, load_driver
from dfpubsub.codec import BatchHeader, encode_batch, pack_event
from dfpubsub.metrics import Stats
from tests.conftest import wait_for


def make_pub(name="pub", url="zmq+tcp://127.0.0.1:*", options=None, **opts):
    stats = Stats("publisher", name)
    transport = load_driver(url, options or {}).publisher(stats)
    return Publisher(transport, name, PublisherOptions(**{"batch_linger": 0.001, **opts}), stats)


class Sink:
    def __init__(self, topics, endpoints=(), options=None, resync=True, **opts):
        self.events = []
        self.resyncs = []
        self.gaps = []
        self.lock = threading.Lock()
        self.stats = Stats("subscriber", "sink")
        self.sub = Subscriber(
            load_driver("zmq", options or {}).subscriber(self.stats), topics, self.on_event,
            self.resyncs.append if resync else None,
            SubscriberOptions(**{"message_delay_window": 0.2, **opts}), "sink", self.gaps.append, self.stats,
        )
        for ep in endpoints:
            self.sub.connect(ep)

    def on_event(self, e):
        with self.lock:
            self.events.append(e)

    def keys(self, topic=None):
        with self.lock:
            return [e.key for e in self.events if topic is None or e.topic == topic]


def joined(pub, n=1):
    wait_for(lambda: pub.stats.get("subscribers_joined") >= n, what="subscriber to join")


def raw_envelope(topic, seq, key, version=1):
    return encode_batch(BatchHeader("raw-pub", "raw", topic), seq, 1.0, [pack_event("t", key, "create", version, None, 0.0)])
