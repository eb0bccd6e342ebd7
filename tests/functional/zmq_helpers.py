"""Publishers and recording subscribers on real ZeroMQ sockets, shared by the zmq tests."""

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.codec import BatchHeader, encode_batch, pack_event
from dfpubsub.metrics import Stats
from tests.conftest import wait_for
from tests.functional.sink_helpers import RecordingSink


def make_pub(name="pub", url="zmq+tcp://127.0.0.1:*", options=None, **opts):
    stats = Stats("publisher", name)
    transport = load_driver(url, options or {}).publisher(stats)
    return Publisher(transport, name, PublisherOptions(**{"batch_linger": 0.001, **opts}), stats)


class Sink(RecordingSink):
    def __init__(self, topics, endpoints=(), options=None, resync=True, **opts):
        stats = Stats("subscriber", "sink")
        super().__init__(load_driver("zmq", options or {}).subscriber(stats), topics, stats, resync, **opts)
        for ep in endpoints:
            self.sub.connect(ep)


def joined(pub, n=1):
    wait_for(lambda: pub.stats.get("subscribers_joined") >= n, what="subscriber to join")


def subscribed(pub, topic, n=1, timeout=10.0):
    """Wait until ``pub`` (a Publisher on the zmq driver) has taken ``n`` subscriptions to ``topic``.

    A join is not enough before publishing to a subscriber that subscribed before it connected
    (through discovery, a connect at run time, a reconnect, the new socket after a disconnect):
    libzmq then sends its subscriptions in byte order, the control topic's first, so the join is
    counted before the topic's subscription is in place, and an event published in between is
    lost to it (a gap it notices, not the event the test waits for)."""
    transport = getattr(pub.transport, "inner", pub.transport)  # under a LossyTransport, its own
    wait_for(lambda: transport.subscriptions(topic) >= n, timeout=timeout,
             what=f"{n} subscription(s) to {topic!r} to reach the publisher")


def raw_envelope(topic, seq, key, version=1):
    return encode_batch(BatchHeader("raw-pub", "raw", topic), seq, 1.0, [pack_event("t", key, "create", version, None, 0.0)])
