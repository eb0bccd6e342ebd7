"""The publisher service's relay: a worker that advertises max_idle 0 (no idle hellos), and
what it keeps of a worker's hello.

Real worker socket (ZeroMQ ipc) in, the in-process bus out. Such a worker's
silence proves nothing: the relay must neither forget it nor re-announce it
with a max_idle of its own, which would make subscribers take it as dead.
"""

import contextlib

from dfpubsub import load_driver
from dfpubsub.codec import BatchHeader, decode, encode_batch, encode_hello, pack_event
from dfpubsub.events import CONTROL_TOPIC, Hello
from dfpubsub.metrics import Stats
from dfpubsub.relay import Relay, RelayOptions
from tests.conftest import free_port, wait_for


@contextlib.contextmanager
def _relay(tmp_path, options: RelayOptions):
    """A relay with a real worker socket (ZeroMQ ipc) in and the in-process bus out; yields it,
    a worker's publisher transport, a subscriber of the bus and the stats."""
    stats = Stats("relay", "test")
    zmq_driver = load_driver(f"zmq+tcp://127.0.0.1:{free_port()}")
    bus = load_driver(f"memory://relay-{free_port()}")
    sock = str(tmp_path / "workers.sock")
    relay = Relay(zmq_driver.worker_ingress(stats, sock), bus.publisher(stats), "svc", options, stats)
    push = zmq_driver.worker_publisher(stats, sock)
    sub = bus.subscriber(stats)
    try:
        yield relay, push, sub, stats
    finally:
        push.close()
        sub.close()
        relay.ingress.close()
        relay.transport.close()


def _welcomes(relay: Relay, sub) -> list:
    """The hellos the relay sends once ``sub`` joined the control topic (at least one)."""
    sub.subscribe(CONTROL_TOPIC)
    hellos: list = []

    def welcomed():
        relay.step(0.05)
        hellos.extend(decode(f) for f in sub.recv(0.05))
        return hellos

    wait_for(welcomed, what="a welcome")
    return hellos


def test_relay_keeps_a_worker_without_idle_hellos_and_welcomes_with_its_max_idle(tmp_path):
    with _relay(tmp_path, RelayOptions(max_idle_time=0.1, dead_after_idles=2.0)) as (relay, push, sub, _):
        push.send(CONTROL_TOPIC, encode_hello(Hello("quiet", "q", 0.0, {"a": 5}, "start", 0.0, "h")))
        push.send(CONTROL_TOPIC, encode_hello(Hello("chatty", "c", 0.0, {"a": 7}, "start", 0.1, "h")))
        wait_for(lambda: relay.step(0.05) >= 0 and set(relay.workers()) == {"quiet", "chatty"},
                 what="both workers' hellos")
        # The control: a worker that promised idle hellos and went silent is forgotten...
        wait_for(lambda: relay.step(0.05) >= 0 and "chatty" not in relay.workers(), 10,
                 what="the silent worker to be forgotten")
        # ...by the same check that keeps the one that promised none.
        assert "quiet" in relay.workers()
        got = [(h.publisher_id, h.seqs, h.reason, h.max_idle_time) for h in _welcomes(relay, sub)]
        assert got == [("quiet", {"a": 5}, "welcome", 0.0)]


def test_relay_keeps_a_workers_strings_bounded(tmp_path):
    """Issue 31: a worker's name and host are kept (and re-sent in welcomes) cut to 255
    characters, and a topic no publisher may send on is not kept at all."""
    with _relay(tmp_path, RelayOptions()) as (relay, push, sub, stats):
        big = "n" * 500_000
        push.send(CONTROL_TOPIC, encode_hello(Hello("w", big, 0.0, {"a": 5, "t" * 300: 9}, "start", 5.0, big)))
        wait_for(lambda: relay.step(0.05) >= 0 and "w" in relay.workers(), what="the worker's hello")
        assert relay.workers() == {"w": "n" * 255}
        assert stats.get("strings_clamped", "name") == 1 and stats.get("strings_clamped", "host") == 1
        assert stats.get("drops", "invalid_topic") == 1
        got = [(h.publisher_name, h.host, h.seqs) for h in _welcomes(relay, sub)]
        assert got == [("n" * 255, "n" * 255, {"a": 5})]


def test_relay_tracks_at_most_max_workers_and_max_topics_and_relays_the_rest(tmp_path):
    """A flood of made-up worker ids or topics costs the service bounded memory; the workers it
    tracks keep their place, and what it does not track is relayed all the same."""
    with _relay(tmp_path, RelayOptions(max_workers=2, max_topics=3)) as (relay, push, sub, stats):
        for topic in ("a", "e"):
            sub.subscribe(topic)
        push.send(CONTROL_TOPIC, encode_hello(Hello("w1", "one", 0.0, {"a": 1, "b": 2, "c": 3, "d": 4}, "start", 5.0, "h")))
        push.send(CONTROL_TOPIC, encode_hello(Hello("w2", "two", 0.0, {"a": 5}, "start", 5.0, "h")))
        for i in range(20):  # more workers than the service tracks, on more topics than it tracks
            push.send("a", _batch(f"flood{i}", "a", 1))
        push.send("e", _batch("w1", "e", 1))
        relayed = []
        wait_for(lambda: relay.step(0.05) >= 0 and relayed.extend(sub.recv(0.05)) is None and len(relayed) >= 21,
                 what="every envelope relayed")
        assert relay.workers() == {"w1": "one", "w2": "two"}
        assert stats.get("untracked", "worker") == 20
        assert stats.get("untracked", "topic") == 2  # w1's fourth and fifth: "d" in its hello, "e"
        assert relay.sequences() == {"a": 20, "e": 1}
        got = sorted((h.publisher_id, h.seqs) for h in _welcomes(relay, sub))
        assert got == [("w1", {"a": 1, "b": 2, "c": 3}), ("w2", {"a": 5})]


def _batch(pid: str, topic: str, seq: int) -> bytes:
    return encode_batch(BatchHeader(pid, pid, topic), seq, 1.0, [pack_event("t", "k", "create", 1, None, 0.0)])
