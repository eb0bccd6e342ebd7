"""A subscriber that records what it is handed, shared by the driver and service tests."""

import os
import signal
import threading
import time
from contextlib import contextmanager

from dfpubsub import Subscriber, SubscriberOptions
from dfpubsub.metrics import Stats
from dfpubsub.tracker import ResyncRequest
from tests.conftest import undetected, wait_for


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


class GatedSink(RecordingSink):
    """A RecordingSink whose transport's ``recv()`` waits while ``gate`` is clear: a receive thread
    that stalls, so the transport falls behind its server."""

    def __init__(self, transport, topics, stats, **opts):
        self.transport = transport
        self.gate = threading.Event()
        self.gate.set()
        inner = transport.recv

        def gated_recv(timeout):
            self.gate.wait()
            return inner(timeout)

        transport.recv = gated_recv
        super().__init__(transport, topics, stats, **opts)

    def close(self):
        self.gate.set()
        self.sub.close()


@contextmanager
def publishing_forever(pub, topics="ab"):
    """Publish ~200-byte updates round-robin on ``topics`` from a thread until the block ends."""
    stop = threading.Event()

    def run():
        i = 0
        while not stop.is_set():
            pub.publish(topics[i % len(topics)], "t", f"k{i % 500}", "update", i + 1, {"blob": "x" * 200})
            i += 1
            if i % 20 == 0:
                time.sleep(0.001)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def light_traffic_while_stopped(pub, server, events=20):
    """Publish ``events`` on topic ``t`` at 500/s at most while ``server`` is stopped (SIGSTOP: a
    server starved or stuck); return the publisher transport's backlog just before it resumes."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        for i in range(events):
            pub.publish("t", "tbl", f"k{i}", "update", i + 1)
            time.sleep(0.002)
        return pub.transport.backlog
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def assert_outage_accounted(pub, live, paused):
    """After a server outage under :func:`publishing_forever`: every event either subscriber missed
    is covered by a resync, both saw the disconnection, and the outage really lost events that the
    live subscriber saw as a hole."""
    sent = pub.sequences()
    for s in (live, paused):
        wait_for(lambda: s.undetected_losses(pub.id, sent) == {t: [] for t in sent},
                 timeout=20, interval=0.2, what="every loss to be delivered or detected")
        assert s.stats.get("drops", "disconnected") >= 1, (s.stats.snapshot(), s is live)
    assert pub.stats.get("drops", "send_failed") > 0  # events really were lost on the way in
    assert any(g.missing for g in live.gaps)  # ...and the subscribers saw the hole


def record_lost(transport):
    """The ``(topic, reason)`` pairs ``transport`` reports lost, as they come."""
    lost = []
    transport.on_lost = lambda topic, reason: lost.append((topic, reason))
    return lost


def recv_all(transport, want, timeout=5.0):
    """Frames from ``transport.recv`` until ``want`` of them came or ``timeout`` passed."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += transport.recv(0.1)
    return got
